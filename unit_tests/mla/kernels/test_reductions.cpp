// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the column sums behind the bias gradients: accumulation, host chunks, strided columns.
#include "kernel_test_support.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/kernels/reductions.hpp>

namespace {

using namespace mlacp::test::kernels;

template <class T>
class RowSums : public ::testing::Test {};
TYPED_TEST_SUITE(RowSums, ValueTypes);

// ---- row sums -------------------------------------------------------------------------------------------------------

TYPED_TEST(RowSums, SumRowsAccumulates) {
  using T = TypeParam;
  const int n = 37, c = 5;
  ExecSpace space;
  View2<T> g("g", n, c);
  View1<T> out("out", c);
  const Vec g0 = rounded<T>(random_vec(g.size(), 41));
  const Vec out0 = rounded<T>(random_vec(c, 42));
  from_vec(g, g0);
  from_vec(out, out0);
  Vec sums(c, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < c; ++j) sums[j] += g0[i * c + j];
  }
  for (int times = 1; times <= 2; ++times) {
    mlacp::sum_rows_accumulate(space, g, out);
    space.fence();
    Vec expected(c);
    for (int j = 0; j < c; ++j) expected[j] = out0[j] + times * sums[j];
    EXPECT_LT(rel_error(to_vec(out), expected), tol<T>()) << "after " << times << " call(s)";
  }
}

// Wider than one host chunk of columns (64), with a partial last chunk, and on a strided (column-subview) matrix.
TYPED_TEST(RowSums, SumRowsAccumulatesOverChunksAndStridedColumns) {
  using T = TypeParam;
  const int n = 23, wide = 2 * 150, c = 150;
  ExecSpace space;
  View2<T> full("full", n, wide);
  const Vec f0 = rounded<T>(random_vec(full.size(), 43));
  from_vec(full, f0);
  const auto contiguous = Kokkos::subview(full, std::make_pair(0, n), Kokkos::ALL());
  // Every second column: a LayoutStride View whose column stride is 2.
  Kokkos::View<T**, Kokkos::LayoutStride, MemSpace> strided(full.data(), Kokkos::LayoutStride(n, wide, c, 2));
  View1<T> out_all("out_all", wide), out_strided("out_strided", c);
  mlacp::sum_rows_accumulate(space, contiguous, out_all);
  mlacp::sum_rows_accumulate(space, strided, out_strided);
  space.fence();
  Vec all(wide, 0.0), every_second(c, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < wide; ++j) all[j] += f0[i * wide + j];
  for (int j = 0; j < c; ++j) every_second[j] = all[2 * j];
  EXPECT_LT(rel_error(to_vec(out_all), all), tol<T>());
  EXPECT_LT(rel_error(to_vec(out_strided), every_second), tol<T>());
}

// The table form of RoPE (one table per configuration, out of place) gives the in-place per-call form's numbers.

}  // namespace
