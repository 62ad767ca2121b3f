// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mpi.h>
#include <mlacp/compat.hpp>
#include <mlacp/version.hpp>

#include <ostream>

namespace mlacp {

std::string version() { return MLACP_VERSION_STRING; }

void print_configuration(std::ostream& out) {
  char mpi_library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(mpi_library, &length);
  std::string mpi(mpi_library, static_cast<std::size_t>(length));
  if (const auto newline = mpi.find('\n'); newline != std::string::npos) mpi.resize(newline);
  out << "mlacp " << version() << "\n"
      << "  Kokkos " << KOKKOS_VERSION / 10000 << '.' << KOKKOS_VERSION / 100 % 100 << '.' << KOKKOS_VERSION % 100
      << ", default execution space " << Kokkos::DefaultExecutionSpace::name() << "\n"
      << "  MPI: " << mpi << "\n"
      << "  NCCL backend: " << (MLACP_HAVE_NCCL ? "yes" : "no")
      << ", GPU-aware MPI: " << (MLACP_ENABLE_GPU_AWARE_MPI ? "yes" : "no") << "\n";
}

}  // namespace mlacp
