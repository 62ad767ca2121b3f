// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The fp8 E4M3 wire codec (include/mlacp/wire/fp8_e4m3_codec.hpp) and the collectives that take it:
// - the codec's rows against a host reference written from its definition (scale = amax / 448, code = the E4M3 nearest
//   to x / scale, value = code * scale; the 4 scale bytes after the codes), and the error bound it promises;
// - an all-to-all and an all-gather with the codec deliver exactly the plain float collective of the decoded input (the
//   codec is row-local and the collectives never cut a row), bit for bit, even and uneven, into `into` or not;
// - what it moves: (width + 4) bytes a row, counted by collective_bytes.hpp;
// - what it refuses, on every rank and before anything is launched: a reduce-scatter (sums), a collective over the
//   innermost dimension (rows), a double View.
#include "collective_test_helpers.hpp"

#include <mlacp/all_gather.hpp>
#include <mlacp/all_to_all.hpp>
#include <mlacp/collective_bytes.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/float8.hpp>
#include <mlacp/reduce_scatter.hpp>
#include <mlacp/wire/coded_collective.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace mlacp::test::collectives;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Codec = mlacp::detail::Fp8E4M3Codec;

// Rows of very different ranges (the scale is per row), signs, zeros and a row of zeros.
std::vector<float> test_values(std::int64_t rows, std::int64_t width, int seed) {
  std::vector<float> v(static_cast<std::size_t>(rows * width));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < width; ++k) {
      const double range = std::ldexp(1.0, static_cast<int>((r * 7 + seed) % 41) - 20);
      const double u = std::sin(0.37 * static_cast<double>(k + 1) * static_cast<double>(r + seed + 1));
      v[static_cast<std::size_t>(r * width + k)] = r % 5 == 3 ? 0.0f : static_cast<float>(range * u);
    }
  return v;
}

// The codec's definition, on the host.
std::vector<std::uint8_t> reference_encode(const std::vector<float>& x, std::int64_t rows, std::int64_t width) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(rows * (width + 4)));
  for (std::int64_t r = 0; r < rows; ++r) {
    float amax = 0;
    for (std::int64_t k = 0; k < width; ++k)
      amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(r * width + k)]));
    const float scale = amax > 0 ? amax / 448.0f : 1.0f;
    std::uint8_t* row = out.data() + r * (width + 4);
    for (std::int64_t k = 0; k < width; ++k)
      row[k] = mlacp::float8_e4m3(x[static_cast<std::size_t>(r * width + k)] / scale).bits();
    std::uint32_t bits = 0;
    std::memcpy(&bits, &scale, 4);
    for (int b = 0; b < 4; ++b) row[width + b] = static_cast<std::uint8_t>(bits >> (8 * b));
  }
  return out;
}

std::vector<float> reference_decode(const std::vector<std::uint8_t>& w, std::int64_t rows, std::int64_t width) {
  std::vector<float> out(static_cast<std::size_t>(rows * width));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint8_t* row = w.data() + r * (width + 4);
    std::uint32_t bits = 0;
    for (int b = 0; b < 4; ++b) bits |= static_cast<std::uint32_t>(row[width + b]) << (8 * b);
    float scale = 0;
    std::memcpy(&scale, &bits, 4);
    for (std::int64_t k = 0; k < width; ++k)
      out[static_cast<std::size_t>(r * width + k)] = static_cast<float>(mlacp::float8_e4m3::from_bits(row[k])) * scale;
  }
  return out;
}

// encode_rows / decode_rows on the device, through Views.
std::vector<std::uint8_t> encode(const std::vector<float>& x, std::int64_t rows, std::int64_t width) {
  Kokkos::View<float*, Mem> in("in", x.size());
  Kokkos::deep_copy(in, Kokkos::View<const float*, Kokkos::HostSpace>(x.data(), x.size()));
  Kokkos::View<std::uint8_t*, Mem> out("out", static_cast<std::size_t>(rows * (width + 4)));
  mlacp::detail::encode_rows<Codec, float>(Space(), "test encode", rows, width,
                                           mlacp::detail::ContiguousRows<const float>{in.data(), width}, out.data());
  std::vector<std::uint8_t> host(out.size());
  Kokkos::deep_copy(Kokkos::View<std::uint8_t*, Kokkos::HostSpace>(host.data(), host.size()), out);
  return host;
}

std::vector<float> decode(const std::vector<std::uint8_t>& w, std::int64_t rows, std::int64_t width) {
  Kokkos::View<std::uint8_t*, Mem> in("in", w.size());
  Kokkos::deep_copy(in, Kokkos::View<const std::uint8_t*, Kokkos::HostSpace>(w.data(), w.size()));
  Kokkos::View<float*, Mem> out("out", static_cast<std::size_t>(rows * width));
  mlacp::detail::decode_rows<Codec, float>(Space(), "test decode", rows, width, in.data(),
                                           mlacp::detail::ContiguousRows<float>{out.data(), width});
  std::vector<float> host(out.size());
  Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace>(host.data(), host.size()), out);
  return host;
}

TEST(Fp8E4M3Codec, RowsAreTheDefinitionAndWithinItsBound) {
  for (const std::int64_t width : {1, 7, 64, 192, 576}) {
    const std::int64_t rows = 23;
    const auto x = test_values(rows, width, static_cast<int>(width));
    const auto wire = encode(x, rows, width);
    ASSERT_EQ(wire, reference_encode(x, rows, width)) << "width " << width;
    const auto back = decode(wire, rows, width);
    ASSERT_EQ(back, reference_decode(wire, rows, width)) << "width " << width;
    for (std::int64_t r = 0; r < rows; ++r) {
      float amax = 0;
      for (std::int64_t k = 0; k < width; ++k)
        amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(r * width + k)]));
      for (std::int64_t k = 0; k < width; ++k) {
        const auto i = static_cast<std::size_t>(r * width + k);
        // Half a unit in the last place of E4M3 (3 mantissa bits) relative to the value, or its subnormal step
        // (2^-9 of the scale, amax / 448) near zero; the largest magnitude of a row is exact up to float rounding.
        const double bound = std::max(std::fabs(x[i]) / 16.0, amax / 448.0 * std::ldexp(1.0, -10)) * (1 + 1e-6);
        EXPECT_LE(std::fabs(back[i] - x[i]), bound) << "row " << r << " value " << x[i] << " decoded " << back[i];
      }
    }
  }
}

TEST(Fp8E4M3Codec, AllToAllDeliversTheDecodedInputBitForBit) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int p = mesh.size(), me = mesh.rank();
  const std::int64_t B = 2, s = 3, H = 2 * p, d = 40;  // [B, s, H, d]: tokens gathered, heads scattered
  const auto x = test_values(B * s * H, d, me + 1);
  const auto decoded = reference_decode(reference_encode(x, B * s * H, d), B * s * H, d);
  auto view = make_view<float, 4>({B, s, H, d}, x);
  auto plain_input = make_view<float, 4>({B, s, H, d}, decoded);
  const auto expected = to_host(mlacp::launch_all_to_all(Space(), plain_input, 1, 2, mesh, "plain").wait());
  mlacp::reset_collective_bytes();
  auto got = mlacp::launch_all_to_all(Space(), view, 1, 2, mesh, "fp8", {}, mlacp::WireCodec::fp8_e4m3).wait();
  EXPECT_EQ(to_host(got), p == 1 ? x : expected);  // P == 1: nothing moves, nothing is encoded
  EXPECT_EQ(mlacp::collective_bytes().all_to_all, p == 1 ? 0u : static_cast<std::uint64_t>(B * s * H * (d + 4)));
  // Into a caller's destination, and uneven (tokens 0, 1, ... per rank; heads 1, 2, ...).
  std::vector<std::int64_t> t(static_cast<std::size_t>(p)), hh(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    t[static_cast<std::size_t>(r)] = r;
    hh[static_cast<std::size_t>(r)] = r + 1;
  }
  const auto tokens = mlacp::Partition::from_counts(t), heads = mlacp::Partition::from_counts(hh);
  const std::int64_t st = tokens.count(me), Ht = heads.total();
  const auto xu = test_values(B * st * Ht, d, 5 * me + 2);
  const auto du = reference_decode(reference_encode(xu, B * st * Ht, d), B * st * Ht, d);
  auto vu = make_view<float, 4>({B, st, Ht, d}, xu);
  auto pu = make_view<float, 4>({B, st, Ht, d}, du);
  const auto eu = to_host(mlacp::launch_all_to_all(Space(), pu, 1, 2, tokens, heads, mesh, "plain").wait());
  Kokkos::View<float****, Kokkos::LayoutRight, Mem> into("into", B, tokens.total(), heads.count(me), d);
  auto gu =
      mlacp::launch_all_to_all(Space(), vu, 1, 2, tokens, heads, mesh, "fp8", into, mlacp::WireCodec::fp8_e4m3).wait();
  if (p > 1) {
    EXPECT_EQ(gu.data(), into.data()) << "decoded into the caller's destination";
  }
  EXPECT_EQ(to_host(gu), p == 1 ? xu : eu);
}

TEST(Fp8E4M3Codec, AllGatherDeliversTheDecodedInputBitForBit) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int p = mesh.size(), me = mesh.rank();
  const std::int64_t B = 2, s = 5, w = 36;  // the latent payload [B, s, R + dr]
  const auto x = test_values(B * s, w, 3 * me + 1);
  const auto decoded = reference_decode(reference_encode(x, B * s, w), B * s, w);
  auto view = make_view<float, 3>({B, s, w}, x);
  auto plain_input = make_view<float, 3>({B, s, w}, decoded);
  const auto expected = to_host(mlacp::launch_all_gather(Space(), plain_input, 1, mesh, "plain").wait());
  const auto got =
      to_host(mlacp::launch_all_gather(Space(), view, 1, mesh, "fp8", {}, mlacp::WireCodec::fp8_e4m3).wait());
  EXPECT_EQ(got, p == 1 ? x : expected);
}

TEST(Fp8E4M3Codec, RefusedWhereItCannotHoldOnEveryRankBeforeALaunch) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int p = mesh.size();
  const auto unwaited = mlacp::diagnostics::unwaited_handles();
  mlacp::reset_collective_bytes();
  auto view = make_view<float, 3>({2, 2 * p, 8}, test_values(4 * p, 8, 1));
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::launch_reduce_scatter(Space(), view, 1, mesh, "rs", {}, mlacp::WireCodec::fp8_e4m3); },
      "mlacp: collective 'rs': the wire codec fp8_e4m3 cannot carry a reduce-scatter's partial sums");
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::launch_all_gather(Space(), view, 2, mesh, "ag", {}, mlacp::WireCodec::fp8_e4m3); },
      "the wire codec fp8_e4m3 scales each row of the innermost dimension (2), which this collective splits or "
      "concatenates");
  auto doubles = make_view<double, 3>({2, 2 * p, 8}, std::vector<double>(static_cast<std::size_t>(32 * p), 1.0));
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::launch_all_to_all(Space(), doubles, 1, 0, mesh, "a2a", {}, mlacp::WireCodec::fp8_e4m3); },
      "the wire codec fp8_e4m3 carries float Views only");
  EXPECT_EQ(mlacp::collective_bytes().total(), 0u) << "nothing was handed to the transport";
  EXPECT_EQ(mlacp::diagnostics::unwaited_handles(), unwaited) << "no handle was left behind";
  // The mesh is usable afterwards: bf16 sums (in float), and the codec moves what it can.
  const auto sum = mlacp::launch_reduce_scatter(Space(), view, 1, mesh, "rs", {}, mlacp::WireCodec::bfloat16).wait();
  EXPECT_EQ(sum.extent(1), 2u);
}

}  // namespace
