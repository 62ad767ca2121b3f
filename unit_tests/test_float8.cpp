// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// mlacp::float8_e4m3 (include/mlacp/float8.hpp): one byte; every code widens to the value the OCP E4M3 definition
// gives it (computed here independently, with std::ldexp in double); rounding from float checked against a brute-force
// reference, the nearest of all 254 finite codes with ties to the even code and saturation at +-448, at every midpoint
// between neighbouring codes and one float step either side of it, and at random floats over the whole range; NaN,
// +-Inf, +-0. The conversions run in kernels on the default execution space (device-ready: the host reads device Views
// only through deep_copy to a mirror).
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/float8.hpp>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using mlacp::float8_e4m3;
using Space = Kokkos::DefaultExecutionSpace;

// The OCP E4M3 value of a code, in double: (-1)^s 2^(e-7) (1 + m/8) for e > 0, (-1)^s 2^-6 (m/8) for e = 0; NaN for
// S.1111.111.
double definition(std::uint8_t code) {
  const int s = code >> 7, e = (code >> 3) & 0xf, m = code & 0x7;
  if (e == 0xf && m == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -magnitude : magnitude;
}

// The nearest finite code to f by brute force: ties to the code with an even mantissa; beyond 448 (and +-Inf) the
// largest finite code of f's sign; NaN to the NaN code of f's sign.
std::uint8_t reference_round(float f) {
  const std::uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return sign | 0x7f;
  const double x = std::fabs(static_cast<double>(f));
  if (x >= 448.0) return sign | 0x7e;
  std::uint8_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (std::uint8_t c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(definition(c) - x);
    if (d < best_distance || (d == best_distance && (c & 1) == 0)) {
      best = c;
      best_distance = d;
    }
  }
  return sign | best;
}

// The kernels are functions of their own: nvcc refuses a device lambda in a TEST body (gtest's TestBody is a private
// member function).

// Rounds `in` to E4M3 in a kernel on the default execution space, returning the codes.
std::vector<std::uint8_t> round_on_device(const std::vector<float>& in) {
  const auto n = in.size();
  Kokkos::View<float*, Space> x("x", n);
  Kokkos::View<float8_e4m3*, Space> y("y", n);
  auto hx = Kokkos::create_mirror_view(x);
  for (std::size_t i = 0; i < n; ++i) hx(i) = in[i];
  Kokkos::deep_copy(x, hx);
  Kokkos::parallel_for(
      "round to e4m3", Kokkos::RangePolicy<Space>(0, n),
      KOKKOS_LAMBDA(const std::size_t i) { y(i) = float8_e4m3(x(i)); });
  auto hy = Kokkos::create_mirror_view(y);
  Kokkos::deep_copy(hy, y);
  std::vector<std::uint8_t> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = hy(i).bits();
  return out;
}

// Every code widened to float in a kernel on the default execution space.
std::vector<float> widen_every_code_on_device() {
  Kokkos::View<float*, Space> wide("wide", 256);
  Kokkos::parallel_for(
      "widen e4m3", Kokkos::RangePolicy<Space>(0, 256), KOKKOS_LAMBDA(const int i) {
        wide(i) = static_cast<float>(float8_e4m3::from_bits(static_cast<std::uint8_t>(i)));
      });
  auto h = Kokkos::create_mirror_view(wide);
  Kokkos::deep_copy(h, wide);
  return std::vector<float>(h.data(), h.data() + 256);
}

std::string hex(std::uint8_t b) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02x", b);
  return text;
}

TEST(Float8E4M3, IsOneByte) {
  EXPECT_EQ(sizeof(float8_e4m3), 1u);
  Kokkos::View<float8_e4m3*, Space> v("v", 10);
  EXPECT_EQ(v.span() * sizeof(float8_e4m3), 10u);
}

TEST(Float8E4M3, EveryCodeWidensToItsDefinitionAndRoundsBackToItself) {
  const std::vector<float> wide = widen_every_code_on_device();
  std::vector<float> values;
  std::vector<std::uint8_t> codes;
  for (int i = 0; i < 256; ++i) {
    const auto code = static_cast<std::uint8_t>(i);
    const double expected = definition(code);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(wide[i])) << hex(code);
      EXPECT_EQ(std::signbit(wide[i]), (code & 0x80) != 0) << hex(code);
      continue;
    }
    EXPECT_EQ(static_cast<double>(wide[i]), expected) << hex(code);
    EXPECT_EQ(std::signbit(wide[i]), (code & 0x80) != 0) << hex(code);  // -0 stays -0
    values.push_back(wide[i]);
    codes.push_back(code);
  }
  EXPECT_EQ(values.size(), 254u);  // two NaN codes
  EXPECT_EQ(definition(0x7e), 448.0);
  EXPECT_EQ(definition(0x08), std::ldexp(1.0, -6));
  EXPECT_EQ(definition(0x01), std::ldexp(1.0, -9));
  const std::vector<std::uint8_t> back = round_on_device(values);
  for (std::size_t i = 0; i < values.size(); ++i) EXPECT_EQ(back[i], codes[i]) << values[i];
}

TEST(Float8E4M3, RoundsToNearestEvenLikeTheReference) {
  // Every midpoint between neighbouring codes (a tie: to the even code), one float step below and above it, beyond
  // the largest code, and random floats spread over the whole range (exponents 2^-12 .. 2^10), both signs.
  std::vector<float> in;
  for (std::uint8_t c = 0; c < 0x7e; ++c) {
    const auto mid = static_cast<float>((definition(c) + definition(static_cast<std::uint8_t>(c + 1))) / 2);
    for (const float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      in.push_back(v);
      in.push_back(-v);
    }
  }
  for (const float v : {448.0f, 449.0f, 463.99f, 464.0f, 480.0f, 1e6f, std::numeric_limits<float>::max()}) {
    in.push_back(v);
    in.push_back(-v);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-12, 10);
  for (int i = 0; i < 20000; ++i) in.push_back((i % 2 ? -1.0f : 1.0f) * std::ldexp(mantissa(rng), exponent(rng)));
  const std::vector<std::uint8_t> got = round_on_device(in);
  for (std::size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(hex(got[i]), hex(reference_round(in[i]))) << "rounding " << in[i];
}

TEST(Float8E4M3, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::uint8_t> got =
      round_on_device({0.0f, -0.0f, inf, -inf, nan, -nan, std::numeric_limits<float>::denorm_min(), 1e-30f});
  EXPECT_EQ(hex(got[0]), "0x00");
  EXPECT_EQ(hex(got[1]), "0x80");  // -0 keeps its sign
  EXPECT_EQ(hex(got[2]), "0x7e");  // +Inf saturates to 448
  EXPECT_EQ(hex(got[3]), "0xfe");  // -Inf to -448
  EXPECT_EQ(hex(got[4]), "0x7f");  // NaN stays NaN
  EXPECT_EQ(hex(got[5]), "0xff");
  EXPECT_EQ(hex(got[6]), "0x00");  // far below half the smallest subnormal: zero
  EXPECT_EQ(hex(got[7]), "0x00");
}

}  // namespace
