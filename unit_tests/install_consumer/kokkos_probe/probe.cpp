// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Kokkos and Kokkos Kernels alone, as mlacp's headers use them: whether they compile in the install test's standard.
#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  Kokkos::View<double**, Kokkos::LayoutRight> a("a", 2, 2), b("b", 2, 2), c("c", 2, 2);
  KokkosBlas::gemm("N", "N", 1.0, a, b, 0.0, c);
  return 0;
}
