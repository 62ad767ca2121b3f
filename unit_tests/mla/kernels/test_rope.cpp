// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of RoPE (docs/spec.md step 4): the formula, the adjoint, rank-3 use, the table form, bad arguments; explicit
// positions (packed documents: positions restart at each document's start; uneven splits of S over ranks); float and
// double on the default execution space.
#include "kernel_test_support.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/kernels/rope.hpp>
#include <mlacp/mla/kernels/view_utils.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace mlacp::test::kernels;

template <class T>
class Rope : public ::testing::Test {};
TYPED_TEST_SUITE(Rope, ValueTypes);

// ---- RoPE -----------------------------------------------------------------------------------------------------------

/// docs/spec.md step 4 directly: rotates columns [first, first+width) of each row of length d, token t at position
/// positions[t].
Vec rope_host_at(Vec x, int n_b, int n_s, int n_h, int d, int first, int width,
                 const std::vector<std::int64_t>& positions) {
  const int half = width / 2;
  for (int b = 0; b < n_b; ++b) {
    for (int t = 0; t < n_s; ++t) {
      for (int n = 0; n < n_h; ++n) {
        double* row = &x[((static_cast<std::size_t>(b) * n_s + t) * n_h + n) * d + first];
        Vec rotated(width);
        for (int e = 0; e < width; ++e) {
          const int j = e % half;
          const double theta = static_cast<double>(positions[t]) * std::pow(10000.0, -2.0 * j / width);
          const double rot_half = e < half ? -row[e + half] : row[e - half];
          rotated[e] = row[e] * std::cos(theta) + rot_half * std::sin(theta);
        }
        for (int e = 0; e < width; ++e) row[e] = rotated[e];
      }
    }
  }
  return x;
}

/// rope_host_at at positions offset + t.
Vec rope_host(Vec x, int n_b, int n_s, int n_h, int d, int first, int width, std::int64_t offset) {
  std::vector<std::int64_t> positions(n_s);
  for (int t = 0; t < n_s; ++t) positions[t] = offset + t;
  return rope_host_at(std::move(x), n_b, n_s, n_h, d, first, width, positions);
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

/// The positions of every rank's tokens for a packed sequence split unevenly (S = 11 over P = 3: the first S mod P
/// ranks hold ceil(S/P) tokens, the rest floor(S/P)): the position within the token's document, restarting at 0 at
/// each document's start, whatever rank the document starts on; with no layout, the global token index.
TEST(RopePositions, RestartPerDocumentAndFollowUnevenSplits) {
  const std::int64_t n_s = 11;
  const int n_ranks = 3;
  const std::vector<std::int64_t> cu = {0, 1, 5, 11};  // documents of 1, 4 and 6 tokens; the last spans two ranks
  const mlacp::DocumentLayout documents(cu, n_s);
  const std::vector<std::int64_t> want = {0, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5};
  ExecSpace space;
  std::int64_t offset = 0;
  for (int r = 0; r < n_ranks; ++r) {
    const std::int64_t count = n_s / n_ranks + (r < n_s % n_ranks ? 1 : 0);
    const auto positions = mlacp::make_rope_positions(space, offset, count, documents);
    const auto plain = mlacp::make_rope_positions(space, offset, count);
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), positions);
    const auto h_plain = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), plain);
    ASSERT_EQ(static_cast<std::int64_t>(h.extent(0)), count);
    for (std::int64_t t = 0; t < count; ++t) {
      EXPECT_EQ(h(t), want[offset + t]) << "rank " << r << " token " << t;
      EXPECT_EQ(h_plain(t), offset + t) << "rank " << r << " token " << t;
    }
    offset += count;
  }
  EXPECT_EQ(offset, n_s);
}

/// Rotation at explicit positions: the formula at each token's position; a token at a document's start keeps its
/// values (position 0 is the identity); positions from the empty layout are the offset form, bitwise; backward is the
/// inverse and the adjoint; the table built from positions matches only those positions.
TYPED_TEST(Rope, RopeAtExplicitPositionsRestartsPerDocument) {
  using T = TypeParam;
  const int n_b = 2, n_h = 3, d = 9, first = 1, width = 6;
  const std::int64_t n_s = 17, offset = 6, count = 6;  // this rank: global tokens 6..11
  const std::vector<std::int64_t> cu = {0, 4, 9, 10, 17};
  const mlacp::DocumentLayout documents(cu, n_s);
  ExecSpace space;
  const auto positions = mlacp::make_rope_positions(space, offset, count, documents);
  const std::vector<std::int64_t> want = {2, 3, 4, 0, 0, 1};  // tokens 6, 7, 8 | 9 | 10, 11
  View4<T> x("x", n_b, count, n_h, d), y("y", n_b, count, n_h, d), z("z", n_b, count, n_h, d);
  const Vec x0 = rounded<T>(random_vec(x.size(), 51)), y0 = rounded<T>(random_vec(y.size(), 52));
  from_vec(x, x0);
  from_vec(y, y0);
  from_vec(z, x0);
  mlacp::rope_forward(space, x, first, width, positions);
  mlacp::rope_backward(space, y, first, width, positions);
  space.fence();
  const Vec fx = to_vec(x), by = to_vec(y);
  EXPECT_LT(rel_error(fx, rope_host_at(x0, n_b, count, n_h, d, first, width, want)), tol<T>());
  for (int b = 0; b < n_b; ++b)
    for (const int t : {3, 4})  // global tokens 9 and 10 start documents
      for (int n = 0; n < n_h; ++n)
        for (int c = 0; c < d; ++c) {
          const std::size_t i = ((static_cast<std::size_t>(b) * count + t) * n_h + n) * d + c;
          EXPECT_EQ(fx[i], x0[i]) << "token " << t << " column " << c;
        }
  EXPECT_GT(rel_error(fx, x0), 0.1);  // the others did rotate
  const double lhs = dot(fx, y0), rhs = dot(x0, by);
  EXPECT_LT(std::abs(lhs - rhs) / std::abs(lhs), tol<T>()) << lhs << " vs " << rhs;
  mlacp::rope_backward(space, x, first, width, positions);
  space.fence();
  EXPECT_LT(rel_error(to_vec(x), x0), tol<T>());
  // The empty layout's positions are the offset form.
  View4<T> w("w", n_b, count, n_h, d);
  from_vec(w, x0);
  mlacp::rope_forward(space, z, first, width, offset);
  mlacp::rope_forward(space, w, first, width, mlacp::make_rope_positions(space, offset, count));
  space.fence();
  EXPECT_EQ(to_vec(w), to_vec(z));
  // Tables: built from positions, they match those positions only.
  const auto table = mlacp::detail::make_rope_table(space, positions, width, 10000.0);
  EXPECT_TRUE(table.matches(positions, width, 10000.0));
  EXPECT_FALSE(table.matches(positions, width, 500.0));
  EXPECT_FALSE(table.matches(mlacp::make_rope_positions(space, offset, count, documents), width, 10000.0));
  EXPECT_FALSE(table.matches(count, offset, width, 10000.0));
  const auto offset_table = mlacp::detail::make_rope_table(space, count, offset, width, 10000.0);
  EXPECT_TRUE(offset_table.matches(count, offset, width, 10000.0));
  EXPECT_FALSE(offset_table.matches(positions, width, 10000.0));
  from_vec(y, x0);
  mlacp::rope_forward(space, y, first, y, first, table);
  space.fence();
  EXPECT_EQ(to_vec(y), fx);
}

TEST(RopePositions, RejectsRanksOutsideTheLayoutAndMismatchedPositions) {
  ExecSpace space;
  const mlacp::DocumentLayout documents({0, 3, 8}, 8);
  auto positions = [&](std::int64_t offset, std::int64_t count) {
    return invalid_argument_message([&] { mlacp::make_rope_positions(space, offset, count, documents); });
  };
  const std::string past = positions(5, 4);
  EXPECT_NE(past.find("global_offset = 5 + local_count = 4 exceeds the document layout's S = 8"), std::string::npos)
      << past;
  EXPECT_NE(positions(-1, 2).find("global_offset = -1, expected >= 0"), std::string::npos);
  EXPECT_NE(positions(0, -2).find("local_count = -2, expected >= 0"), std::string::npos);
  EXPECT_EQ(positions(5, 3), "");
  EXPECT_EQ(positions(8, 0), "");  // a rank without tokens
  View4<double> x("x", 1, 4, 1, 8);
  const std::string mismatch = invalid_argument_message(
      [&] { mlacp::rope_forward(space, x, 0, 4, mlacp::make_rope_positions(space, 0, 3, documents)); });
  EXPECT_NE(mismatch.find("positions has 3 entries, expected one per token (4)"), std::string::npos) << mismatch;
  const auto short_table = mlacp::detail::make_rope_table(space, 3, 0, 4, 10000.0);
  const std::string too_long = invalid_argument_message([&] { mlacp::rope_forward(space, x, 0, x, 0, short_table); });
  EXPECT_NE(too_long.find("4 tokens, the RoPE table has 3"), std::string::npos) << too_long;
}

// The KV adjoint read from P head blocks (as the inverse all-to-all delivers them) equals the plain adjoint of the
// unpacked tensor.

}  // namespace
