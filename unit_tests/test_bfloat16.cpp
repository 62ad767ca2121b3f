// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// mlacp::bf16 (include/mlacp/bfloat16.hpp, the alias in compat.hpp): two bytes; widening exact; rounding to nearest
// even checked against a reference computed from the two neighbouring bf16 values; +-0, +-Inf, NaN (sign kept,
// quiet), subnormals, overflow at the rounding boundary. The conversions run in kernels on Views of mlacp::bf16
// (device-ready: the host reads device Views only through deep_copy to a mirror).
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/compat.hpp>
#include <mlacp/detail/finite_check.hpp>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

namespace {

using mlacp::bf16;
using Space = Kokkos::DefaultExecutionSpace;

std::uint16_t bits_of(const bf16& v) {
  std::uint16_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

bf16 from_bits(std::uint16_t b) {
  bf16 v;
  std::memcpy(static_cast<void*>(&v), &b, sizeof b);
  return v;
}

std::uint32_t bits_of(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_from_bits(std::uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The value of the finite bf16 magnitude with bits k (0 <= k <= 0x7f7f), from the format's definition (8 exponent
// bits, bias 127, 7 mantissa bits, subnormals at exponent field 0), not from the bit layout of float. k = 0x7f80 (the
// first magnitude past the largest finite one) gives 2^128, where IEEE rounding puts the overflow boundary.
double magnitude_value(int k) {
  const int e = k >> 7, m = k & 127;
  if (e == 0) return std::ldexp(static_cast<double>(m), -133);
  return std::ldexp(static_cast<double>(128 + m), e - 134);
}

// The bf16 nearest to the finite float f, ties to the even mantissa, past the largest finite bf16 by half an ulp or
// more: Inf. Found by a binary search for the neighbour below |f| and a comparison of the distances, in double (every
// value and difference here is exact in double).
std::uint16_t reference_round(float f) {
  const double a = std::fabs(static_cast<double>(f));
  int lo = 0, hi = 0x7f80;  // magnitude_value(lo) <= a < magnitude_value(hi), or a >= 2^128's lower neighbour
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (magnitude_value(mid) <= a ? lo : hi) = mid;
  }
  int k = lo;
  if (magnitude_value(lo) != a) {
    const double below = a - magnitude_value(lo), above = magnitude_value(lo + 1) - a;
    if (above < below || (above == below && (lo & 1) != 0)) k = lo + 1;
  }
  return static_cast<std::uint16_t>((std::signbit(f) ? 0x8000 : 0) | k);
}

// Rounds `in` to bf16 in a kernel on the default execution space (compat::to_bf16), returning the bits.
std::vector<std::uint16_t> round_on_device(const std::vector<float>& in) {
  const auto n = in.size();
  Kokkos::View<float*, Space> x("x", n);
  Kokkos::View<bf16*, Space> y("y", n);
  auto hx = Kokkos::create_mirror_view(x);
  for (std::size_t i = 0; i < n; ++i) hx(i) = in[i];
  Kokkos::deep_copy(x, hx);
  Kokkos::parallel_for(
      "round to bf16", Kokkos::RangePolicy<Space>(0, n),
      KOKKOS_LAMBDA(const std::size_t i) { y(i) = mlacp::compat::to_bf16(x(i)); });
  auto hy = Kokkos::create_mirror_view(y);
  Kokkos::deep_copy(hy, y);
  std::vector<std::uint16_t> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = bits_of(hy(i));
  return out;
}

// The kernels of the tests below are functions of their own: nvcc refuses a device lambda in a TEST body (gtest's
// TestBody is a private member function).

// wide = in widened to float, back = wide rounded to bf16 again, in a kernel on the default execution space.
void widen_and_round_back(const Kokkos::View<bf16*, Space>& in, const Kokkos::View<float*, Space>& wide,
                          const Kokkos::View<bf16*, Space>& back) {
  Kokkos::parallel_for(
      "widen and round back", Kokkos::RangePolicy<Space>(0, in.extent(0)), KOKKOS_LAMBDA(const std::size_t i) {
        wide(i) = mlacp::compat::to_float(in(i));
        back(i) = mlacp::compat::to_bf16(wide(i));
      });
}

// y = x rounded to bf16 from double directly (bf16's own conversion), in a kernel on the default execution space.
void round_doubles(const Kokkos::View<double*, Space>& x, const Kokkos::View<bf16*, Space>& y) {
  Kokkos::parallel_for(
      "round doubles", Kokkos::RangePolicy<Space>(0, x.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { y(i) = bf16(x(i)); });
}

bool is_nan_bits(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0; }

TEST(Bfloat16, IsTwoBytesEverywhere) {
  EXPECT_EQ(sizeof(bf16), 2u);
  EXPECT_EQ(sizeof(mlacp::bfloat16), 2u);
  EXPECT_TRUE(std::is_trivially_copyable_v<bf16>);
  Kokkos::View<bf16*, Space> v("v", 10);
  EXPECT_EQ(v.span() * sizeof(typename decltype(v)::value_type), 20u);
}

// Every one of the 65536 bit patterns widens exactly and rounds back to itself; a NaN back to a quiet NaN of the
// same sign.
TEST(Bfloat16, EveryBitPatternWidensExactlyAndRoundsBackToItself) {
  const std::size_t n = 65536;
  Kokkos::View<bf16*, Space> in("in", n), back("back", n);
  Kokkos::View<float*, Space> wide("wide", n);
  auto hin = Kokkos::create_mirror_view(in);
  for (std::size_t i = 0; i < n; ++i) hin(i) = from_bits(static_cast<std::uint16_t>(i));
  Kokkos::deep_copy(in, hin);
  widen_and_round_back(in, wide, back);
  auto hwide = Kokkos::create_mirror_view(wide);
  auto hback = Kokkos::create_mirror_view(back);
  Kokkos::deep_copy(hwide, wide);
  Kokkos::deep_copy(hback, back);
  int checked = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const float w = hwide(i);
    const std::uint16_t r = bits_of(hback(i));
    const bool negative = (b & 0x8000) != 0;
    if (is_nan_bits(b)) {
      ASSERT_TRUE(std::isnan(w)) << std::hex << b;
      ASSERT_EQ(std::signbit(w), negative) << std::hex << b;
      ASSERT_TRUE(is_nan_bits(r)) << std::hex << b << " -> " << r;
      ASSERT_EQ((r & 0x8000) != 0, negative) << std::hex << b << " -> " << r;
      ASSERT_NE(r & 0x0040, 0) << "quiet: " << std::hex << b << " -> " << r;
      if ((b & 0x0040) != 0) {
        ASSERT_EQ(r, b) << "a quiet NaN is kept as it is: " << std::hex << b;
      }
    } else if ((b & 0x7fff) == 0x7f80) {
      ASSERT_TRUE(std::isinf(w)) << std::hex << b;
      ASSERT_EQ(std::signbit(w), negative);
      ASSERT_EQ(r, b);
    } else {
      const double expected = (negative ? -1.0 : 1.0) * magnitude_value(b & 0x7fff);
      ASSERT_EQ(static_cast<double>(w), expected) << std::hex << b;
      ASSERT_EQ(std::signbit(w), negative) << std::hex << b;  // -0 too
      ASSERT_EQ(r, b) << std::hex << b;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 65536);
}

// Round to nearest even against the reference, on random bit patterns (every exponent), on random moderate values,
// and on constructed ties and their neighbours.
TEST(Bfloat16, RoundsToNearestEvenLikeTheReference) {
  std::mt19937 rng(20);
  std::vector<float> in;
  std::uniform_int_distribution<std::uint32_t> any_bits;
  while (in.size() < (1u << 20)) {
    const float f = float_from_bits(any_bits(rng));
    if (!std::isnan(f)) in.push_back(f);
  }
  std::uniform_real_distribution<float> moderate(-1000.f, 1000.f);
  for (int i = 0; i < (1 << 18); ++i) in.push_back(moderate(rng));
  // Exact ties (the low half 0x8000) at random finite magnitudes, and one unit of the last place either side.
  std::uniform_int_distribution<std::uint32_t> magnitude(0, 0x7f7f);
  for (int i = 0; i < (1 << 16); ++i) {
    const std::uint32_t t = magnitude(rng) | (i % 2 == 0 ? 0u : 0x8000u);
    for (const std::uint32_t low : {0x7fffu, 0x8000u, 0x8001u}) in.push_back(float_from_bits((t << 16) | low));
  }
  const auto out = round_on_device(in);
  std::size_t ties = 0, ties_up = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], reference_round(in[i]))
        << "float " << in[i] << " bits " << std::hex << bits_of(in[i]) << " -> " << out[i];
    if ((bits_of(in[i]) & 0xffffu) == 0x8000u) {
      ++ties;
      if ((out[i] & 0x7fff) != ((bits_of(in[i]) >> 16) & 0x7fff)) ++ties_up;
    }
  }
  // Both directions of a tie were exercised (odd neighbours below round up, even ones stay).
  EXPECT_GT(ties, 60000u);
  EXPECT_GT(ties_up, ties / 4);
  EXPECT_LT(ties_up, 3 * ties / 4);
}

TEST(Bfloat16, SpecialValuesSubnormalsAndOverflow) {
  struct Case {
    std::uint32_t in;
    std::uint16_t out;
    const char* what;
  };
  const std::vector<Case> cases{
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x7f800000u, 0x7f80, "+Inf"},
      {0xff800000u, 0xff80, "-Inf"},
      {0x3f800000u, 0x3f80, "1"},
      {0x3f808000u, 0x3f80, "1 + half an ulp: tie, 1 is even"},
      {0x3f818000u, 0x3f82, "tie above an odd mantissa rounds up"},
      {0x3f80ffffu, 0x3f81, "just below the next value"},
      {0xbf818000u, 0xbf82, "negative tie above an odd mantissa"},
      // Subnormal floats and bf16 subnormals.
      {0x00000001u, 0x0000, "the smallest float subnormal rounds to +0"},
      {0x80000001u, 0x8000, "and its negative to -0"},
      {0x00008000u, 0x0000, "tie at the smallest bf16 subnormal: to 0 (even)"},
      {0x00018000u, 0x0002, "tie above the odd subnormal 1: to 2"},
      {0x00010000u, 0x0001, "the smallest bf16 subnormal"},
      {0x007f0000u, 0x007f, "the largest bf16 subnormal"},
      {0x007fffffu, 0x0080, "the largest float subnormal rounds up into the normals"},
      {0x00800000u, 0x0080, "the smallest normal"},
      // Overflow: the largest finite bf16 is 0x7f7f; half an ulp above it is the boundary, and a tie there goes to
      // the even 0x7f80, which is Inf.
      {0x7f7f0000u, 0x7f7f, "the largest finite bf16"},
      {0x7f7f7fffu, 0x7f7f, "just below the overflow boundary"},
      {0x7f7f8000u, 0x7f80, "the overflow boundary rounds to +Inf"},
      {0x7f7fffffu, 0x7f80, "FLT_MAX rounds to +Inf"},
      {0xff7f8000u, 0xff80, "the negative boundary to -Inf"},
      {0xff7f7fffu, 0xff7f, "just inside the negative boundary"},
      // NaN: stays NaN, sign kept, quiet; top payload bits kept.
      {0x7fc00000u, 0x7fc0, "quiet NaN"},
      {0xffc00000u, 0xffc0, "negative quiet NaN"},
      {0x7f800001u, 0x7fc0, "signalling NaN with only low payload bits: NaN, not Inf"},
      {0xff800001u, 0xffc0, "negative signalling NaN: NaN, not -Inf"},
      {0x7fa00000u, 0x7fe0, "signalling NaN with a top payload bit: quieted, payload kept"},
      {0x7fffffffu, 0x7fff, "NaN with every payload bit: no carry into the sign"},
      {0xffffffffu, 0xffff, "negative NaN with every payload bit"},
  };
  std::vector<float> in;
  for (const auto& c : cases) in.push_back(float_from_bits(c.in));
  const auto out = round_on_device(in);
  for (std::size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(out[i], cases[i].out) << cases[i].what << ": " << std::hex << cases[i].in << " -> " << out[i];
  // The widened subnormal is the exact power of two.
  EXPECT_EQ(mlacp::compat::to_float(from_bits(0x0001)), std::ldexp(1.0f, -133));
  EXPECT_EQ(mlacp::compat::to_float(from_bits(0x8001)), -std::ldexp(1.0f, -133));
}

// A double is rounded once: a value a little above (below) a bf16 tie goes up (down), even where rounding it to float
// first would land exactly on the tie.
TEST(Bfloat16, DoublesAndIntsRoundOnceNotThroughFloat) {
  const std::vector<std::pair<double, std::uint16_t>> cases{
      {1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30), 0x3f81},      // above the tie between 0x3f80 and 0x3f81
      {1.0 + 3 * std::ldexp(1.0, -8) - std::ldexp(1.0, -30), 0x3f81},  // below the tie between 0x3f81 and 0x3f82
      {-(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)), 0xbf81},   // negative, above in magnitude
      {1.0 + std::ldexp(1.0, -8), 0x3f80},                             // an exact tie: to even
      {std::ldexp(1.0, -133) * 0.5 + std::ldexp(1.0, -170), 0x0001},   // above the tie at the smallest subnormal
      {std::ldexp(255.0 + 0.5, 120) - std::ldexp(1.0, 80), 0x7f7f},    // just inside the overflow boundary
  };
  const auto n = cases.size();
  Kokkos::View<double*, Space> x("x", n);
  Kokkos::View<bf16*, Space> y("y", n);
  auto hx = Kokkos::create_mirror_view(x);
  for (std::size_t i = 0; i < n; ++i) hx(i) = cases[i].first;
  Kokkos::deep_copy(x, hx);
  round_doubles(x, y);
  auto hy = Kokkos::create_mirror_view(y);
  Kokkos::deep_copy(hy, y);
  for (std::size_t i = 0; i < n; ++i)
    EXPECT_EQ(bits_of(hy(i)), cases[i].second)
        << std::hexfloat << cases[i].first << " -> " << std::hex << bits_of(hy(i));
  // 2^24 + 2^16 + 1 as an int: float rounds it to 2^24 + 2^16, a bf16 tie (to the even 2^24); the int is above it.
  EXPECT_EQ(bits_of(bf16((1 << 24) + (1 << 16) + 1)), 0x4b81);
}

// Arithmetic happens in float: a compound assignment rounds once, at the store.
TEST(Bfloat16, ArithmeticIsFloatRoundedAtTheStore) {
  bf16 a = 1.0f;
  const float third = 1.0f / 3.0f;
  a += third;  // 1.333.. rounds to 1.3359375 (0x3fab)
  EXPECT_EQ(bits_of(a), 0x3fab);
  const float sum = mlacp::compat::to_float(bf16(256.0f)) + 1.0f;  // float: exactly 257
  EXPECT_EQ(sum, 257.0f);
  EXPECT_EQ(bits_of(mlacp::compat::to_bf16(sum)), bits_of(bf16(256.0f)));  // 257 is a tie: to the even 256
}

// The finite check counts NaN and +-Inf in a bf16 View like in a float one (and nothing else: subnormals, the largest
// finite value and -0 are finite).
TEST(Bfloat16, FiniteCheckCountsNonFiniteBf16) {
  const std::vector<std::uint16_t> values{0x3f80, 0x7f80, 0x0001, 0xff80, 0x7fc0,
                                          0x7f7f, 0x8000, 0xffc1, 0x7f81, 0xff7f};
  Kokkos::View<bf16*, Space> v("v", values.size());
  auto hv = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) hv(i) = from_bits(values[i]);
  Kokkos::deep_copy(v, hv);
  EXPECT_EQ(mlacp::detail::count_non_finite(Space(), v), 5);  // +Inf, -Inf, three NaNs
  Kokkos::View<bf16*, Space> finite("finite", 1000);
  Kokkos::deep_copy(finite, bf16(2.5f));
  EXPECT_EQ(mlacp::detail::count_non_finite(Space(), finite), 0);
  Kokkos::View<float*, Space> f("f", 3);
  auto hf = Kokkos::create_mirror_view(f);
  hf(0) = 1.0f;
  hf(1) = std::numeric_limits<float>::infinity();
  hf(2) = std::numeric_limits<float>::quiet_NaN();
  Kokkos::deep_copy(f, hf);
  EXPECT_EQ(mlacp::detail::count_non_finite(Space(), f), 2);
}

}  // namespace
