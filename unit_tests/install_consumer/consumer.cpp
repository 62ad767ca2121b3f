// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Built against an installed mlacp by the install test; prints "consumer OK" when the installed headers, library
// and its dependencies work together.
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/version.hpp>

#include <cstdio>
#include <iostream>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ok = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    mlacp::print_configuration(std::cout);
    Kokkos::View<double**, Kokkos::LayoutRight> a("a", 2, 3), b("b", 3, 2), c("c", 2, 2);
    Kokkos::deep_copy(a, 1.0);
    Kokkos::deep_copy(b, 2.0);
    mlacp::compat::gemm(Kokkos::DefaultExecutionSpace(), "N", "N", 1.0, a, b, 0.0, c);
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
    ok = host(1, 1) == 6.0;
    // The bf16 GEMM: its oneDNN backend (where the build has it) is in libmlacp, whose link dependency the installed
    // config must provide.
    Kokkos::View<mlacp::bf16**, Kokkos::LayoutRight> x("x", 2, 3), w("w", 3, 2);
    Kokkos::View<float**, Kokkos::LayoutRight> y("y", 2, 2);
    Kokkos::deep_copy(x, mlacp::bf16(1.0f));
    Kokkos::deep_copy(w, mlacp::bf16(2.0f));
    mlacp::Bf16GemmPlan<> plan;
    plan.gemm(Kokkos::DefaultExecutionSpace(), "N", "N", 1.0f, x, w, 0.0f, y);
    auto host_y = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    ok = ok && host_y(1, 1) == 6.0f;
    std::cout << "bf16 GEMM: " << mlacp::bf16_gemm_backend_name(plan.choices().begin()->second.backend)
              << " (oneDNN ISA " << mlacp::onednn_cpu_isa() << ")\n";
  }
  MPI_Finalize();
  std::printf("C++ standard: %ld\n", static_cast<long>(__cplusplus));
  std::puts(ok ? "consumer OK" : "consumer FAILED");
  return ok ? 0 : 1;
}
