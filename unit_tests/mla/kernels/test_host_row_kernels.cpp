// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the attention core's host row kernels (host_row_kernels.hpp): every instruction set's copy gives the generic
// function's results (the baseline copy its bits, the copies with FMA to within rounding), the choice is one the CPU
// runs, and an instruction set it does not run is refused by name. And of the BLAS path's row blocks
// (for_each_row_block): every visible (query, key) pair of a tile is computed exactly once, and the rows that see the
// whole key tile stay one block.
#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/bfloat16.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_blas.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_rows.hpp>
#include <mlacp/mla/kernels/detail/host_row_kernels.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

namespace {

using mlacp::detail::HostIsa;

template <class T>
class HostRowKernels : public ::testing::Test {};
using RowTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(HostRowKernels, RowTypes);

template <class T>
std::vector<T> random_row(std::int64_t n, unsigned seed, double spread) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-spread, spread);
  std::vector<T> row(static_cast<std::size_t>(n));
  for (auto& x : row) x = static_cast<T>(dist(gen));
  return row;
}

/// Whether a and b agree bit for bit (exact), or else to within a few units in the last place of Row, the row's value
/// type (a fused multiply-add's rounding against a multiply and an add, through the exp polynomial and the row sums).
/// T is Row for a row's values, double for its statistics. `argument` bounds |scale * s - m|, the exponent formed in
/// Row: a fused multiply-add rounds it once where a multiply and an add round twice, which moves exp(argument) by up
/// to a unit in the last place of the argument, relative.
template <class Row, class T>
bool close(T a, T b, bool exact, double argument = 0.0) {
  if (exact) return std::memcmp(&a, &b, sizeof a) == 0;
  const double eps = (std::is_same_v<Row, float> ? 1e-6 : 1e-14) * (1.0 + argument);
  return std::abs(static_cast<double>(a) - static_cast<double>(b)) <=
         eps * std::max({1.0, std::abs(static_cast<double>(a)), std::abs(static_cast<double>(b))});
}

template <class T>
bool close(const std::vector<T>& a, const std::vector<T>& b, bool exact, double argument = 0.0) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!close<T>(a[i], b[i], exact, argument)) return false;
  return true;
}

// Row lengths around the vector widths (4, 8, 16 lanes) and the eight partial sums, visible ranges masked at either
// end or empty, scores of small and large magnitude (large ones cancel against the row maximum).
struct RowCase {
  std::int64_t nk, first, last;
  double spread;
  bool start;
};
const RowCase row_cases[] = {{1, 0, 0, 1.0, true},       {7, 0, 6, 3.0, false},       {16, 0, 15, 1.0, true},
                             {17, 2, 16, 40.0, false},   {33, 5, 20, 1.0, true},      {128, 0, 127, 8.0, false},
                             {128, 0, 63, 1.0, true},    {131, 64, 130, 300.0, true}, {256, 10, 9, 1.0, false},
                             {255, 100, 254, 2.0, false}};

template <class T>
void expect_same_as_generic(HostIsa isa, bool exact) {
  const auto& kernels = mlacp::detail::host_row_kernels<T>(isa);
  const double scale = 0.0721687836;  // 1/sqrt(192)
  unsigned seed = 1;
  for (const RowCase& rc : row_cases) {
    SCOPED_TRACE(::testing::Message() << mlacp::detail::host_isa_name(isa) << (exact ? " (bits)" : " (rounding)")
                                      << " nk " << rc.nk << " visible [" << rc.first << ", " << rc.last << "]");
    const std::vector<T> s = random_row<T>(rc.nk, ++seed, rc.spread);
    const double argument = 2.0 * rc.spread * scale + 1.25;  // |scale * s - m| for m = 0.5, lse = 1.25 or a row max
    // The forward's online softmax, from a running state (m, l) or starting.
    std::vector<T> got = s, want = s;
    double m_got = 0.5, l_got = 3.0, m_want = 0.5, l_want = 3.0;
    const double f_got = kernels.online_softmax(got.data(), rc.nk, rc.first, rc.last, scale, rc.start, m_got, l_got);
    const double f_want =
        mlacp::detail::online_softmax_row(want.data(), rc.nk, rc.first, rc.last, scale, rc.start, m_want, l_want);
    EXPECT_TRUE(close(got, want, exact, argument));
    EXPECT_TRUE(close<T>(f_got, f_want, exact) && close<T>(m_got, m_want, exact) &&
                close<T>(l_got, l_want, exact, argument))
        << f_got << " " << f_want << " " << m_got << " " << m_want << " " << l_got << " " << l_want;
    // Outside the visible range a row is zero, whatever the copy.
    for (std::int64_t c = 0; c < rc.nk; ++c) {
      if (c < rc.first || c > rc.last) {
        EXPECT_EQ(got[static_cast<std::size_t>(c)], T(0)) << "column " << c;
      }
    }
    // The backward's probabilities and dS (dS from the same P on both sides).
    got = s;
    want = s;
    kernels.probabilities(got.data(), rc.nk, rc.first, rc.last, scale, 1.25);
    mlacp::detail::probabilities_row(want.data(), rc.nk, rc.first, rc.last, scale, 1.25);
    EXPECT_TRUE(close(got, want, exact, argument));
    std::vector<T> ds_got = random_row<T>(rc.nk, ++seed, 1.0), ds_want = ds_got;
    kernels.score_grad(ds_got.data(), want.data(), rc.nk, scale, -0.375);
    mlacp::detail::score_grad_row(ds_want.data(), want.data(), rc.nk, scale, -0.375);
    EXPECT_TRUE(close(ds_got, ds_want, exact));
  }
}

// In float the exponent scale * s - m is formed in float (flash_attention_rows.hpp): each probability stays within a
// few units in the last place of exp's exact value plus the argument's rounding, 6e-8 of |scale * s - m| per rounding,
// relative. Checked against exp in double, in every copy the CPU runs, for scores up to |scale * s| = 22.
TEST(HostRowKernelsFloat, ProbabilitiesWithinTheArgumentsRounding) {
  const double scale = 0.0721687836;  // 1/sqrt(192)
  for (const HostIsa isa : {HostIsa::baseline, HostIsa::avx2, HostIsa::avx512}) {
    if (!mlacp::detail::host_isa_supported(isa)) continue;
    const auto& kernels = mlacp::detail::host_row_kernels<float>(isa);
    for (const double spread : {1.0, 40.0, 300.0}) {
      SCOPED_TRACE(::testing::Message() << mlacp::detail::host_isa_name(isa) << " spread " << spread);
      const std::vector<float> s = random_row<float>(256, 7, spread);
      std::vector<float> p = s;
      double m = 0.0, l = 0.0;
      kernels.online_softmax(p.data(), 256, 0, 255, scale, true, m, l);
      EXPECT_EQ(m, static_cast<double>(static_cast<float>(m))) << "the running maximum is kept in float";
      double sum = 0.0;
      for (std::size_t c = 0; c < s.size(); ++c) {
        const double argument = static_cast<double>(s[c]) * scale - m;
        const double exact = std::exp(argument);
        sum += static_cast<double>(p[c]);
        if (exact < 1e-30) continue;  // below float's normal range the core may flush to zero
        EXPECT_LE(std::abs(static_cast<double>(p[c]) - exact), (1e-6 + 2e-7 * std::abs(argument)) * exact)
            << "column " << c << " argument " << argument;
      }
      EXPECT_NEAR(l, sum, 1e-12 * sum) << "l is the row's sum of its probabilities";
      // The backward's probabilities of the same row against its log-sum-exp.
      const double lse = m + std::log(l);
      std::vector<float> q = s;
      kernels.probabilities(q.data(), 256, 0, 255, scale, lse);
      for (std::size_t c = 0; c < s.size(); ++c) {
        const double argument = static_cast<double>(s[c]) * scale - lse;
        const double exact = std::exp(argument);
        if (exact < 1e-30) continue;
        EXPECT_LE(std::abs(static_cast<double>(q[c]) - exact), (1e-6 + 2e-7 * std::abs(argument)) * exact)
            << "column " << c << " argument " << argument;
      }
    }
  }
}

// Every copy the CPU runs against the generic functions compiled here. The baseline copy, built without FMA, gives
// their bits where this test is built without FMA too (no -march with FMA); the others agree to within rounding.
TYPED_TEST(HostRowKernels, EveryInstructionSetGivesTheGenericResults) {
  using T = TypeParam;
#if defined(__FMA__)
  const bool baseline_exact = false;
#else
  const bool baseline_exact = true;
#endif
  for (const HostIsa isa : {HostIsa::baseline, HostIsa::avx2, HostIsa::avx512})
    if (mlacp::detail::host_isa_supported(isa))
      expect_same_as_generic<T>(isa, isa == HostIsa::baseline && baseline_exact);
}

// row_max (compared as integers, so that it vectorises) gives the largest value as comparisons do: rows of mixed signs,
// all negative, with -Inf, with -0 and +0 (+0 wins, and -0 alone stays -0), at lengths around the vector widths, and
// through every instruction set's softmax row, whose maximum m is scale times it.
TYPED_TEST(HostRowKernels, RowMaxIsTheLargestValue) {
  using T = TypeParam;
  std::mt19937 gen(11);
  std::normal_distribution<double> dist(0.0, 40.0);
  const T inf = std::numeric_limits<T>::infinity();
  for (std::int64_t n = 1; n <= 70; ++n) {
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<T> row(static_cast<std::size_t>(n));
      for (auto& x : row) {
        x = static_cast<T>(dist(gen));
        if (kind >= 1) x = -std::abs(x);                // all negative
        if (kind == 2 && gen() % 5 == 0) x = -inf;      // with -Inf
        if (kind == 3) x = gen() % 2 ? T(-0.0) : -inf;  // -0 and -Inf only
      }
      const T want = *std::max_element(row.begin(), row.end());
      const T got = mlacp::detail::row_max(row.data(), n);
      EXPECT_EQ(got, want) << "n " << n << " kind " << kind;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << "n " << n << " kind " << kind;
    }
  }
  const T zeros[] = {T(-0.0), T(0.0), T(-0.0)};
  EXPECT_FALSE(std::signbit(mlacp::detail::row_max(zeros, 3))) << "+0 is larger than -0";
  EXPECT_TRUE(std::signbit(mlacp::detail::row_max(zeros, 1))) << "-0 alone";
  const T ramp[] = {T(-3), T(-2.5), T(7), T(-100), T(6.75)};
  for (const HostIsa isa : {HostIsa::baseline, HostIsa::avx2, HostIsa::avx512}) {
    if (!mlacp::detail::host_isa_supported(isa)) continue;
    std::vector<T> s(std::begin(ramp), std::end(ramp));
    double m = 0.0, l = 0.0;
    mlacp::detail::host_row_kernels<T>(isa).online_softmax(s.data(), 5, 0, 4, 0.5, true, m, l);
    EXPECT_EQ(m, 3.5) << mlacp::detail::host_isa_name(isa);
  }
}

// The bf16 rounding of every copy gives mlacp::bfloat16's bits exactly (it feeds GEMMs whose results the tests pin):
// ties both ways, values that round up into the next binade and past the largest bf16 to Inf, subnormals, +-0,
// +-Inf, NaNs with payloads (quieted, sign kept), and random values, at lengths that leave vector remainders.
TYPED_TEST(HostRowKernels, Bf16RoundingIsTheConversionsBitForBit) {
  using T = TypeParam;
  std::vector<T> src;
  auto from_bits = [](std::uint32_t u) {
    float f = 0;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  for (const std::uint32_t u :
       {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f7fffffu, 0x7f7fffffu, 0x7f7f8000u, 0xff7fffffu,
        0x00000001u, 0x00008000u, 0x00018000u, 0x807fffffu, 0x00000000u, 0x80000000u, 0x7f800000u,
        0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0xff810000u, 0x7fbfffffu})
    src.push_back(static_cast<T>(from_bits(u)));
  if constexpr (std::is_same_v<T, double>) {
    src.push_back(1.0 + 0x1.01p-8);    // above a bf16 tie that float rounding would land on
    src.push_back(-(1.0 + 0x1.8p-8));  // a tie in double itself
    src.push_back(1e300);
  }
  const std::vector<T> random = random_row<T>(1000, 7, 1e3);
  src.insert(src.end(), random.begin(), random.end());
  for (const HostIsa isa : {HostIsa::baseline, HostIsa::avx2, HostIsa::avx512}) {
    if (!mlacp::detail::host_isa_supported(isa)) continue;
    for (const std::size_t n : {src.size(), std::size_t(1), std::size_t(17), std::size_t(33)}) {
      std::vector<mlacp::bfloat16> got(n, mlacp::bfloat16::from_bits(0x1234));
      mlacp::detail::host_row_kernels<T>(isa).round_bf16(src.data(), got.data(), static_cast<std::int64_t>(n));
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(got[i].bits(), mlacp::bfloat16(src[i]).bits())
            << mlacp::detail::host_isa_name(isa) << " value " << i << " of " << n << ": " << src[i];
    }
  }
}

TEST(HostIsa, TheChoiceIsOneTheCpuRunsAndOthersAreRefusedByName) {
  const HostIsa best = mlacp::detail::host_isa_best();
  EXPECT_TRUE(mlacp::detail::host_isa_supported(best));
  EXPECT_TRUE(mlacp::detail::host_isa_supported(HostIsa::baseline));
  EXPECT_EQ(&mlacp::detail::host_row_kernels<float>(), &mlacp::detail::host_row_kernels<float>(best));
  bool refused_any = false;
  for (const HostIsa isa : {HostIsa::avx2, HostIsa::avx512}) {
    if (mlacp::detail::host_isa_supported(isa)) continue;
    refused_any = true;
    try {
      mlacp::detail::host_row_kernels<double>(isa);
      ADD_FAILURE() << "expected InvalidArgument for " << mlacp::detail::host_isa_name(isa);
    } catch (const mlacp::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("instruction set ") + mlacp::detail::host_isa_name(isa)),
                std::string::npos)
          << e.what();
    }
  }
  std::cout << "host row kernels: " << mlacp::detail::host_isa_name(best)
            << (refused_any ? " (a wider set was refused by name)" : " (every set runs here)") << "\n";
}

// The row blocks of every (query tile, key tile) pair of a packed sequence, at both block heights (float and double's,
// bf16's): each visible pair exactly once, each masked one at most once, and in one document the rows at or after the
// key tile's last key are one block.
TEST(FlashRowBlocks, EachVisiblePairOnceAndFullRowsInOneBlock) {
  const std::int64_t n_s = 300;
  for (const std::int64_t height :
       {mlacp::detail::flash_diagonal_block_rows, mlacp::detail::flash_diagonal_block_rows_bf16})
    for (const std::vector<std::int64_t>& cu :
         {std::vector<std::int64_t>{0, n_s}, std::vector<std::int64_t>{0, 7, 40, 41, 150, 230, n_s}}) {
      const mlacp::DocumentLayout layout(cu, n_s);
      const auto docs = layout.host(n_s);
      for (const auto& [tq, tk] : {std::pair<std::int64_t, std::int64_t>{64, 64}, {256, 64}, {48, 200}, {300, 300}}) {
        for (std::int64_t i0 = 0; i0 < n_s; i0 += tq) {
          const std::int64_t nq = std::min(tq, n_s - i0);
          for (std::int64_t j0 = 0; j0 < n_s; j0 += tk) {
            const std::int64_t nk = std::min(tk, n_s - j0);
            std::vector<int> covered(static_cast<std::size_t>(nq * nk), 0);
            std::int64_t full_blocks = 0, rows_done = 0;
            mlacp::detail::for_each_row_block(docs, i0, nq, j0, nk, height,
                                              [&](std::int64_t a, std::int64_t na, std::int64_t ka, std::int64_t nka) {
                                                EXPECT_GE(a, rows_done) << "row blocks in order, disjoint";
                                                rows_done = a + na;
                                                if (ka == 0 && nka == nk && na > height) ++full_blocks;
                                                for (std::int64_t r = a; r < a + na; ++r)
                                                  for (std::int64_t c = ka; c < ka + nka; ++c)
                                                    ++covered[static_cast<std::size_t>(r * nk + c)];
                                              });
            for (std::int64_t r = 0; r < nq; ++r)
              for (std::int64_t c = 0; c < nk; ++c) {
                const std::int64_t query = i0 + r, key = j0 + c;
                const bool visible = key <= query && key >= docs.start_of(query);
                const int n = covered[static_cast<std::size_t>(r * nk + c)];
                // Once where visible; a masked entry inside a block's key range at most once.
                ASSERT_TRUE(visible ? n == 1 : n <= 1)
                    << "query " << query << " key " << key << " tiles " << tq << "x" << tk << ": computed " << n;
              }
            // One document, a tall tile crossing the diagonal: its rows after the key tile form one block.
            if (cu.size() == 2 && j0 >= i0 && i0 + nq - (j0 + nk - 1) > height) {
              EXPECT_EQ(full_blocks, 1) << "tile " << i0 << "+" << nq << " x " << j0 << "+" << nk;
            }
            // A square tile on the diagonal: blocks of the height only, as the core always cut it.
            if (cu.size() == 2 && j0 == i0 && nq == nk) {
              EXPECT_EQ(full_blocks, 0) << "tile " << i0 << "+" << nq;
            }
          }
        }
      }
    }
}

}  // namespace
