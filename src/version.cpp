// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/mpi/communicator.hpp>
#include <mlacp/version.hpp>

#include <ostream>

namespace mlacp {

std::string version() { return MLACP_VERSION_STRING; }

void print_configuration(std::ostream& out) {
  out << "mlacp " << version() << "\n"
      << "  Kokkos " << KOKKOS_VERSION / 10000 << '.' << KOKKOS_VERSION / 100 % 100 << '.' << KOKKOS_VERSION % 100
      << ", default execution space " << Kokkos::DefaultExecutionSpace::name() << "\n"
      << "  MPI: " << mpi::library_version() << "\n"
      << "  NCCL backend: " << (MLACP_HAVE_NCCL ? "yes" : "no")
      << ", GPU-aware MPI: " << (MLACP_ENABLE_GPU_AWARE_MPI ? "yes" : "no") << "\n"
      << "  oneDNN bf16 GEMM: " << (MLACP_HAVE_ONEDNN ? "yes, ISA " + onednn_cpu_isa() : std::string("no")) << "\n";
}

}  // namespace mlacp
