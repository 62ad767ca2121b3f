// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of RoPE (MLA_SPEC step 4): the formula, the adjoint, rank-3 use, the table form, bad arguments; float and
// double on the default execution space.
#include "kernel_test_support.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/rope.hpp>
#include <mlacp/mla/view_utils.hpp>

namespace {

using namespace mlacp::test::kernels;

template <class T>
class Rope : public ::testing::Test {};
TYPED_TEST_SUITE(Rope, ValueTypes);

// ---- RoPE -----------------------------------------------------------------------------------------------------------

/// MLA_SPEC step 4 directly: rotates columns [first, first+width) of each row of length d at position offset + t.
Vec rope_host(Vec x, int n_b, int n_s, int n_h, int d, int first, int width, std::int64_t offset) {
  const int half = width / 2;
  for (int b = 0; b < n_b; ++b) {
    for (int t = 0; t < n_s; ++t) {
      for (int n = 0; n < n_h; ++n) {
        double* row = &x[((static_cast<std::size_t>(b) * n_s + t) * n_h + n) * d + first];
        Vec rotated(width);
        for (int e = 0; e < width; ++e) {
          const int j = e % half;
          const double theta = static_cast<double>(offset + t) * std::pow(10000.0, -2.0 * j / width);
          const double rot_half = e < half ? -row[e + half] : row[e - half];
          rotated[e] = row[e] * std::cos(theta) + rot_half * std::sin(theta);
        }
        for (int e = 0; e < width; ++e) row[e] = rotated[e];
      }
    }
  }
  return x;
}

TYPED_TEST(Rope, RopeForwardMatchesSpecFormulaAndLeavesOtherColumns) {
  using T = TypeParam;
  const int n_b = 2, n_s = 3, n_h = 2, d = 11, first = 3, width = 6;
  const std::int64_t offset = 1000003;
  ExecSpace space;
  View4<T> x("x", n_b, n_s, n_h, d);
  const Vec x0 = rounded<T>(random_vec(x.size(), 1));
  from_vec(x, x0);
  mlacp::rope_forward(space, x, first, width, offset);
  space.fence();
  const Vec got = to_vec(x);
  const Vec expected = rope_host(x0, n_b, n_s, n_h, d, first, width, offset);
  EXPECT_LT(rel_error(got, expected), tol<T>());
  EXPECT_GT(rel_error(got, x0), 0.1);  // it did rotate
  for (std::size_t i = 0; i < got.size(); ++i) {
    const int col = static_cast<int>(i % d);
    if (col < first || col >= first + width) {
      EXPECT_EQ(got[i], x0[i]) << "column " << col << " was touched";
    }
  }
}

TYPED_TEST(Rope, RopeBackwardInvertsForwardAndIsItsAdjoint) {
  using T = TypeParam;
  const int n_b = 2, n_s = 5, n_h = 3, d = 8, first = 2, width = 6;
  const std::int64_t offset = 37;
  ExecSpace space;
  View4<T> x("x", n_b, n_s, n_h, d);
  View4<T> y("y", n_b, n_s, n_h, d);
  const Vec x0 = rounded<T>(random_vec(x.size(), 2));
  const Vec y0 = rounded<T>(random_vec(y.size(), 3));
  from_vec(x, x0);
  from_vec(y, y0);
  mlacp::rope_forward(space, x, first, width, offset);
  mlacp::rope_backward(space, y, first, width, offset);
  space.fence();
  const Vec fx = to_vec(x);
  const Vec by = to_vec(y);
  // <rope(x), y> == <x, rope^T(y)>
  const double lhs = dot(fx, y0), rhs = dot(x0, by);
  EXPECT_LT(std::abs(lhs - rhs) / std::abs(lhs), tol<T>()) << lhs << " vs " << rhs;
  // rope^T(rope(x)) == x
  mlacp::rope_backward(space, x, first, width, offset);
  space.fence();
  EXPECT_LT(rel_error(to_vec(x), x0), tol<T>());
}

TYPED_TEST(Rope, RopeOnRank3ThroughAsRank4) {
  using T = TypeParam;
  const int n_b = 2, n_s = 4, r = 5, dr = 4;
  const std::int64_t offset = 12;
  ExecSpace space;
  View3<T> payload("payload", n_b, n_s, r + dr);
  const Vec p0 = rounded<T>(random_vec(payload.size(), 4));
  from_vec(payload, p0);
  auto p4 = mlacp::as_rank4(payload);
  static_assert(mlacp::compat::view_rank_v<decltype(p4)> == 4);
  ASSERT_EQ(p4.data(), payload.data());
  ASSERT_EQ(p4.extent(2), 1u);
  mlacp::rope_forward(space, p4, r, dr, offset);
  space.fence();
  EXPECT_LT(rel_error(to_vec(payload), rope_host(p0, n_b, n_s, 1, r + dr, r, dr, offset)), tol<T>());
}

TYPED_TEST(Rope, RopeRejectsBadArgumentsNamingTheValue) {
  using T = TypeParam;
  ExecSpace space;
  View4<T> x("x", 1, 2, 1, 8);
  auto rope = [&](int first, int width) { return [=] { mlacp::rope_forward(space, x, first, width, 0); }; };
  EXPECT_NE(invalid_argument_message(rope(0, 3)).find("width = 3"), std::string::npos);
  EXPECT_NE(invalid_argument_message(rope(0, 0)).find("width = 0"), std::string::npos);
  EXPECT_NE(invalid_argument_message(rope(0, -2)).find("width = -2"), std::string::npos);
  EXPECT_NE(invalid_argument_message(rope(-1, 2)).find("first_column = -1"), std::string::npos);
  const std::string too_far = invalid_argument_message(rope(4, 6));
  EXPECT_NE(too_far.find("first_column = 4"), std::string::npos) << too_far;
  EXPECT_NE(too_far.find("width = 6"), std::string::npos) << too_far;
  EXPECT_NE(invalid_argument_message([&] { mlacp::rope_backward(space, x, 0, 5, 0); }).find("width = 5"),
            std::string::npos);
  EXPECT_EQ(invalid_argument_message(rope(2, 6)), "");  // the last valid placement
}

TYPED_TEST(Rope, RopeWithATableOutOfPlaceMatchesInPlace) {
  using T = TypeParam;
  const int n_b = 2, n_s = 5, n_h = 3, d = 10, first = 4, width = 6, dst_first = 1;
  const std::int64_t offset = 17;
  ExecSpace space;
  View4<T> x("x", n_b, n_s, n_h, d), in_place("in_place", n_b, n_s, n_h, d), out("out", n_b, n_s, n_h, width + 2);
  const Vec x0 = rounded<T>(random_vec(x.size(), 44));
  from_vec(x, x0);
  from_vec(in_place, x0);
  mlacp::rope_forward(space, in_place, first, width, offset);
  const auto table = mlacp::detail::make_rope_table(space, n_s, offset, width, 10000.0);
  mlacp::rope_forward(space, x, first, out, dst_first, table);
  space.fence();
  const Vec rotated = to_vec(in_place), got = to_vec(out);
  Vec want(got.size(), 0.0), have(got.size(), 0.0);
  for (int row = 0; row < n_b * n_s * n_h; ++row)
    for (int c = 0; c < width; ++c) {
      want[row * (width + 2) + c] = rotated[row * d + first + c];
      have[row * (width + 2) + c] = got[row * (width + 2) + dst_first + c];
    }
  EXPECT_LT(rel_error(have, want), tol<T>());
  EXPECT_EQ(to_vec(x), x0) << "out of place leaves the source alone";
  mlacp::rope_backward(space, out, dst_first, out, dst_first, table);
  space.fence();
  const Vec back = to_vec(out);
  Vec original(got.size(), 0.0), restored(got.size(), 0.0);
  for (int row = 0; row < n_b * n_s * n_h; ++row)
    for (int c = 0; c < width; ++c) {
      original[row * (width + 2) + c] = x0[row * d + first + c];
      restored[row * (width + 2) + c] = back[row * (width + 2) + dst_first + c];
    }
  EXPECT_LT(rel_error(restored, original), tol<T>());
}

// The KV adjoint read from P head blocks (as the inverse all-to-all delivers them) equals the plain adjoint of the
// unpacked tensor.

}  // namespace
