// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the positioned problems of the attention cores (ring attention, issue 21; attention_problem.hpp): the S
// tokens split into C ring chunks (contiguous, or zigzag: chunk g = parts g and 2C-1-g of 2C), each query chunk's
// forward over every key chunk in ring order (its own first, first = true, then the others merged) and backward
// over every (query chunk, key chunk) pair (accumulated), against the square forward and backward of the whole
// sequence: with and without packed documents crossing chunk boundaries (and a document of one token), S not divisible
// by the chunk counts, an empty chunk, float, double and bf16 inputs (against double), for FlashAttentionCore's two
// paths (BLAS and team) and CausalAttentionCore. Also TokenSegments, the trait and the checks.
#include "kernel_test_support.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/detail/pending_transport.hpp>
#include <mlacp/mla/kernels/attention_core.hpp>
#include <mlacp/mla/kernels/flash_attention.hpp>
#include <mlacp/mla/kernels/token_segments.hpp>
#include <mlacp/progress.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using mlacp::TokenSegments;
using mlacp::test::kernels::from_vec;
using mlacp::test::kernels::invalid_argument_message;
using mlacp::test::kernels::random_vec;
using mlacp::test::kernels::to_vec;
using mlacp::test::kernels::Vec;
using mlacp::test::kernels::View3;
using mlacp::test::kernels::View4;

constexpr int n_b = 2, n_h = 2, d_qk = 12, d_v = 8;

/// The forward of the positioned problem: the queries at q_rows against the keys at k_rows.
template <class Core, class Q, class K, class V, class O, class L>
void forward_block(const Core& core, const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                   const L& lse, const TokenSegments& q_rows, const TokenSegments& k_rows,
                   const mlacp::DocumentLayout& docs, std::int64_t s, bool first) {
  core.forward(space, mlacp::attention_problem(q, k, v, o, lse, docs).positioned(q_rows, k_rows, s, first));
}
/// The backward of the positioned problem, accumulated into dq, dk, dv.
template <class Core, class Q, class K, class V, class O, class L, class DO, class DQ, class DK, class DV>
void backward_block(const Core& core, const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                    const L& lse, const DO& d_o, const DQ& dq, const DK& dk, const DV& dv, const TokenSegments& q_rows,
                    const TokenSegments& k_rows, const mlacp::DocumentLayout& docs, std::int64_t s) {
  core.backward(space,
                mlacp::attention_problem(q, k, v, o, lse, d_o, dq, dk, dv, docs).positioned(q_rows, k_rows, s, false));
}

/// ||a - ref|| / max(||ref||, 1).
double error(const Vec& a, const Vec& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1.0));
}

/// Sizes of n parts of S tokens, the first S % n one larger (as Partition splits).
std::vector<std::int64_t> split(std::int64_t s, std::int64_t n) {
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) sizes[static_cast<std::size_t>(i)] = s / n + (i < s % n ? 1 : 0);
  return sizes;
}

/// The ring chunks of S tokens in C chunks: contiguous, or zigzag (parts g and 2C-1-g of 2C).
std::vector<TokenSegments> chunks(std::int64_t s, std::int64_t c, bool zigzag) {
  std::vector<TokenSegments> out(static_cast<std::size_t>(c));
  const auto sizes = split(s, zigzag ? 2 * c : c);
  std::vector<std::int64_t> begin(sizes.size() + 1, 0);
  for (std::size_t i = 0; i < sizes.size(); ++i) begin[i + 1] = begin[i] + sizes[i];
  for (std::int64_t g = 0; g < c; ++g) {
    const auto a = static_cast<std::size_t>(g);
    out[a].add(begin[a], sizes[a]);
    if (zigzag) {
      const auto b = static_cast<std::size_t>(2 * c - 1 - g);
      out[a].add(begin[b], sizes[b]);
    }
  }
  return out;
}

/// The rows of `segs` of a flat [B, S, H, d] vector, as a flat [B, n, H, d] vector.
Vec gather(const Vec& full, std::int64_t s, std::int64_t d, const TokenSegments& segs) {
  const std::int64_t n = segs.rows();
  Vec out(static_cast<std::size_t>(n_b * n * n_h * d));
  for (std::int64_t b = 0; b < n_b; ++b)
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t x = 0; x < n_h * d; ++x)
        out[static_cast<std::size_t>((b * n + r) * n_h * d + x)] =
            full[static_cast<std::size_t>((b * s + segs.position(r)) * n_h * d + x)];
  return out;
}

/// Writes a flat [B, n, H, d] vector of the rows of `segs` into a flat [B, S, H, d] one.
void scatter(Vec& full, const Vec& part, std::int64_t s, std::int64_t d, const TokenSegments& segs) {
  const std::int64_t n = segs.rows();
  for (std::int64_t b = 0; b < n_b; ++b)
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t x = 0; x < n_h * d; ++x)
        full[static_cast<std::size_t>((b * s + segs.position(r)) * n_h * d + x)] =
            part[static_cast<std::size_t>((b * n + r) * n_h * d + x)];
}

/// lse [B, H, n] of the rows of `segs` into lse [B, H, S].
void scatter_lse(Vec& full, const Vec& part, std::int64_t s, const TokenSegments& segs) {
  const std::int64_t n = segs.rows();
  for (std::int64_t bh = 0; bh < n_b * n_h; ++bh)
    for (std::int64_t r = 0; r < n; ++r)
      full[static_cast<std::size_t>(bh * s + segs.position(r))] = part[static_cast<std::size_t>(bh * n + r)];
}

struct Inputs {
  std::int64_t s;
  Vec q, k, v, d_o;
  explicit Inputs(std::int64_t s_)
      : s(s_),
        q(random_vec(static_cast<std::size_t>(n_b * s * n_h * d_qk), 11, -2.0, 2.0)),
        k(random_vec(static_cast<std::size_t>(n_b * s * n_h * d_qk), 12, -2.0, 2.0)),
        v(random_vec(static_cast<std::size_t>(n_b * s * n_h * d_v), 13)),
        d_o(random_vec(static_cast<std::size_t>(n_b * s * n_h * d_v), 14)) {}
};

/// The square forward and backward of the whole sequence with `core` in R.
struct Square {
  Vec o, lse, dq, dk, dv;
};
template <class R, class Core>
Square square(const Core& core, const Inputs& in, const mlacp::DocumentLayout& docs) {
  const std::int64_t s = in.s;
  View4<R> q("q", n_b, s, n_h, d_qk), k("k", n_b, s, n_h, d_qk), v("v", n_b, s, n_h, d_v), o("o", n_b, s, n_h, d_v);
  View4<R> d_o("do", n_b, s, n_h, d_v), dq("dq", n_b, s, n_h, d_qk), dk("dk", n_b, s, n_h, d_qk);
  View4<R> dv("dv", n_b, s, n_h, d_v);
  View3<R> lse("lse", n_b, n_h, s);
  from_vec(q, in.q);
  from_vec(k, in.k);
  from_vec(v, in.v);
  from_vec(d_o, in.d_o);
  ExecSpace space;
  core.forward(space, mlacp::attention_problem(q, k, v, o, lse, docs));
  core.backward(space, mlacp::attention_problem(q, k, v, o, lse, d_o, dq, dk, dv, docs));
  space.fence();
  return {to_vec(o), to_vec(lse), to_vec(dq), to_vec(dk), to_vec(dv)};
}

/// Every query chunk's positioned forward over the key chunks in ring order (its own first; `empty_first`: empty chunks
/// before it, so that first = true meets a block that sees nothing), then the backward over every pair.
template <class T, class Core>
Square ring(const Core& core, const Inputs& in, const mlacp::DocumentLayout& docs,
            const std::vector<TokenSegments>& parts, bool empty_first = false) {
  using A = mlacp::compat::accumulation_t<T>;
  const std::int64_t s = in.s;
  const auto c = static_cast<std::int64_t>(parts.size());
  Square out{Vec(in.d_o.size()), Vec(static_cast<std::size_t>(n_b * n_h * s)), Vec(in.q.size()), Vec(in.k.size()),
             Vec(in.v.size())};
  struct Chunk {
    View4<T> q, k, v, o, d_o;
    View4<A> o_acc, dq, dk, dv;
    View3<A> lse;
  };
  std::vector<Chunk> ch;
  for (const auto& p : parts) {
    const std::int64_t n = p.rows();
    Chunk x{View4<T>("q", n_b, n, n_h, d_qk),  View4<T>("k", n_b, n, n_h, d_qk),  View4<T>("v", n_b, n, n_h, d_v),
            View4<T>("o", n_b, n, n_h, d_v),   View4<T>("do", n_b, n, n_h, d_v),  View4<A>("oa", n_b, n, n_h, d_v),
            View4<A>("dq", n_b, n, n_h, d_qk), View4<A>("dk", n_b, n, n_h, d_qk), View4<A>("dv", n_b, n, n_h, d_v),
            View3<A>("lse", n_b, n_h, n)};
    from_vec(x.q, gather(in.q, s, d_qk, p));
    from_vec(x.k, gather(in.k, s, d_qk, p));
    from_vec(x.v, gather(in.v, s, d_v, p));
    from_vec(x.d_o, gather(in.d_o, s, d_v, p));
    ch.push_back(x);
  }
  ExecSpace space;
  for (std::int64_t g = 0; g < c; ++g) {
    std::vector<std::int64_t> order;
    if (empty_first)
      for (std::int64_t h = 0; h < c; ++h)
        if (parts[static_cast<std::size_t>(h)].rows() == 0) order.push_back(h);
    for (std::int64_t step = 0; step < c; ++step) {
      const std::int64_t h = (g - step + c) % c;  // ring order: own chunk, then the one before, ...
      if (std::find(order.begin(), order.end(), h) == order.end()) order.push_back(h);
    }
    const auto& x = ch[static_cast<std::size_t>(g)];
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto& y = ch[static_cast<std::size_t>(order[i])];
      forward_block(core, space, x.q, y.k, y.v, x.o_acc, x.lse, parts[static_cast<std::size_t>(g)],
                    parts[static_cast<std::size_t>(order[i])], docs, s, i == 0);
    }
    space.fence();
    from_vec(x.o, to_vec(x.o_acc));  // the stored type, as the ring driver keeps it
    scatter(out.o, to_vec(x.o_acc), s, d_v, parts[static_cast<std::size_t>(g)]);
    scatter_lse(out.lse, to_vec(x.lse), s, parts[static_cast<std::size_t>(g)]);
  }
  for (std::int64_t g = 0; g < c; ++g)
    for (std::int64_t h = 0; h < c; ++h) {
      const auto& x = ch[static_cast<std::size_t>(g)];
      const auto& y = ch[static_cast<std::size_t>(h)];
      backward_block(core, space, x.q, y.k, y.v, x.o, x.lse, x.d_o, x.dq, y.dk, y.dv,
                     parts[static_cast<std::size_t>(g)], parts[static_cast<std::size_t>(h)], docs, s);
    }
  space.fence();
  for (std::int64_t g = 0; g < c; ++g) {
    const auto& x = ch[static_cast<std::size_t>(g)];
    const auto& p = parts[static_cast<std::size_t>(g)];
    scatter(out.dq, to_vec(x.dq), s, d_qk, p);
    scatter(out.dk, to_vec(x.dk), s, d_qk, p);
    scatter(out.dv, to_vec(x.dv), s, d_v, p);
  }
  return out;
}

template <class T>
double block_tol() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  return 2e-2;
}

/// Packings whose boundaries cross the chunk boundaries, with a document of one token.
std::vector<std::int64_t> packing(std::int64_t s) { return {0, 1, 7, 8, s / 2 + 3, s}; }

/// Every split (C = 2, 3, 4, contiguous and zigzag, with and without documents) of `core`'s blocks in T against the
/// square core in R (T itself, or double for bf16 inputs).
template <class T, class R, class Core>
void check_every_split(const Core& core, const Core& ref_core, const std::string& what) {
  for (const std::int64_t s : {37, 64}) {
    Inputs in(s);
    if constexpr (!std::is_same_v<T, double>) {  // the same inputs for every type
      in.q = mlacp::test::kernels::rounded<T>(in.q);
      in.k = mlacp::test::kernels::rounded<T>(in.k);
      in.v = mlacp::test::kernels::rounded<T>(in.v);
      in.d_o = mlacp::test::kernels::rounded<T>(in.d_o);
    }
    for (const bool packed : {false, true}) {
      const auto docs = packed ? mlacp::DocumentLayout(packing(s), s) : mlacp::DocumentLayout();
      const Square ref = square<R>(ref_core, in, docs);
      for (const std::int64_t c : {2, 3, 4})
        for (const bool zigzag : {false, true}) {
          const Square got = ring<T>(core, in, docs, chunks(s, c, zigzag));
          const std::string where = what + " S " + std::to_string(s) + " C " + std::to_string(c) +
                                    (zigzag ? " zigzag" : " contiguous") + (packed ? " packed" : "");
          const double tol = block_tol<T>();
          EXPECT_LT(error(got.o, ref.o), tol) << where << " o";
          EXPECT_LT(error(got.lse, ref.lse), tol) << where << " lse";
          EXPECT_LT(error(got.dq, ref.dq), tol) << where << " dq";
          EXPECT_LT(error(got.dk, ref.dk), tol) << where << " dk";
          EXPECT_LT(error(got.dv, ref.dv), tol) << where << " dv";
        }
    }
  }
}

mlacp::FlashAttentionCore flash(int tq, int tk, mlacp::FlashAttentionPath path = mlacp::FlashAttentionPath::blas) {
  mlacp::FlashAttentionOptions o;
  o.query_tile = tq;
  o.key_tile = tk;
  o.path = path;
  return mlacp::FlashAttentionCore(o);
}

mlacp::FlashAttentionCore team(int tq, int tk) { return flash(tq, tk, mlacp::FlashAttentionPath::team); }

TEST(TokenSegments, RowsPositionsAndChecks) {
  TokenSegments s;
  EXPECT_EQ(s.rows(), 0);
  EXPECT_EQ(s.segments(), 0);
  s.add(3, 0).add(4, 5).add(9, 0).add(20, 2);
  EXPECT_EQ(s.segments(), 2);
  EXPECT_EQ(s.rows(), 7);
  EXPECT_EQ(s.begin(1), 20);
  EXPECT_EQ(s.count(1), 2);
  EXPECT_EQ(s.row_of_segment(1), 5);
  EXPECT_EQ(s.position(0), 4);
  EXPECT_EQ(s.position(4), 8);
  EXPECT_EQ(s.position(5), 20);
  EXPECT_EQ(s.position(6), 21);
  EXPECT_NE(invalid_argument_message([&] { s.add(30, 1); }).find("add(30, 1): a third non-empty segment"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([&] { TokenSegments::contiguous(5, 3).add(7, 1); }).find("starts before"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([&] { TokenSegments().add(0, -1); }).find("count >= 0"), std::string::npos);
  static_assert(std::is_trivially_copyable_v<TokenSegments>);
}

TEST(BlockAttention, FlashBlasDoubleMatchesSquare) {
  for (const auto& t : {std::pair{8, 16}, std::pair{5, 7}, std::pair{128, 128}})
    check_every_split<double, double>(flash(t.first, t.second), flash(t.first, t.second),
                                      "flash " + std::to_string(t.first) + "x" + std::to_string(t.second));
}

TEST(BlockAttention, FlashBlasFloatMatchesSquare) {
  for (const auto& t : {std::pair{8, 16}, std::pair{128, 128}})
    check_every_split<float, float>(flash(t.first, t.second), flash(t.first, t.second), "flash float");
}

TEST(BlockAttention, FlashBlasBf16MatchesDouble) {
  check_every_split<mlacp::compat::bf16, double>(flash(8, 16), flash(8, 16), "flash bf16");
}

TEST(BlockAttention, FlashTeamMatchesSquare) {
  for (const auto& t : {std::pair{8, 16}, std::pair{5, 7}, std::pair{32, 32}})
    check_every_split<double, double>(team(t.first, t.second), team(t.first, t.second),
                                      "team " + std::to_string(t.first) + "x" + std::to_string(t.second));
  check_every_split<float, float>(team(8, 16), team(8, 16), "team float");
}

TEST(BlockAttention, CausalCoreMatchesSquare) {
  check_every_split<double, double>(mlacp::CausalAttentionCore{}, mlacp::CausalAttentionCore{}, "causal");
  check_every_split<float, float>(mlacp::CausalAttentionCore{}, mlacp::CausalAttentionCore{}, "causal float");
}

/// A chunk of no rows, as a query chunk (nothing to do) and as a key chunk, also the first of a query chunk's ring
/// (first = true against a block that sees nothing: o 0, lse -inf, then merged).
TEST(BlockAttention, EmptyChunk) {
  const std::int64_t s = 23;
  Inputs in(s);
  const std::vector<TokenSegments> parts = {TokenSegments::contiguous(0, 10), TokenSegments(),
                                            TokenSegments::contiguous(10, 13)};
  for (const bool packed : {false, true}) {
    const auto docs = packed ? mlacp::DocumentLayout({0, 1, 12, 23}, s) : mlacp::DocumentLayout();
    for (const bool empty_first : {false, true}) {
      const Square ref = square<double>(flash(8, 8), in, docs);
      for (const auto& [got, what] :
           {std::pair{ring<double>(flash(8, 8), in, docs, parts, empty_first), "flash"},
            std::pair{ring<double>(mlacp::CausalAttentionCore{}, in, docs, parts, empty_first), "causal"}}) {
        EXPECT_LT(error(got.o, ref.o), 1e-12) << what;
        EXPECT_LT(error(got.lse, ref.lse), 1e-12) << what;
        EXPECT_LT(error(got.dq, ref.dq), 1e-12) << what;
        EXPECT_LT(error(got.dk, ref.dk), 1e-12) << what;
        EXPECT_LT(error(got.dv, ref.dv), 1e-12) << what;
      }
    }
  }
}

/// first = true against keys that no query sees (all after the queries): o 0, lse -inf; then merged with nothing new.
template <class Core>
void check_no_visible_key(const Core& core) {
  const std::int64_t s = 20;
  View4<double> q("q", n_b, 8, n_h, d_qk), k("k", n_b, 12, n_h, d_qk), v("v", n_b, 12, n_h, d_v);
  View4<double> o("o", n_b, 8, n_h, d_v);
  View3<double> lse("lse", n_b, n_h, 8);
  from_vec(q, random_vec(q.span(), 1));
  from_vec(k, random_vec(k.span(), 2));
  from_vec(v, random_vec(v.span(), 3));
  from_vec(o, Vec(o.span(), 5.0));
  ExecSpace space;
  forward_block(core, space, q, k, v, o, lse, TokenSegments::contiguous(0, 8), TokenSegments::contiguous(8, 12),
                mlacp::DocumentLayout(), s, true);
  space.fence();
  for (const double x : to_vec(o)) EXPECT_EQ(x, 0.0);
  for (const double x : to_vec(lse)) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
  forward_block(core, space, q, k, v, o, lse, TokenSegments::contiguous(0, 8), TokenSegments::contiguous(8, 12),
                mlacp::DocumentLayout(), s, false);
  space.fence();
  for (const double x : to_vec(o)) EXPECT_EQ(x, 0.0);
  for (const double x : to_vec(lse)) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
}

TEST(BlockAttention, RowsThatSeeNoKey) {
  check_no_visible_key(flash(4, 4));
  check_no_visible_key(team(4, 4));
  check_no_visible_key(mlacp::CausalAttentionCore{});
}

TEST(BlockAttention, ComputesBlocksTraitAndChecks) {
  EXPECT_TRUE((mlacp::detail::core_computes_blocks<mlacp::CausalAttentionCore, ExecSpace>({})));
  EXPECT_TRUE((mlacp::detail::core_computes_blocks<mlacp::FlashAttentionCore, ExecSpace>(flash(8, 8))));
  EXPECT_TRUE((mlacp::detail::core_computes_blocks<mlacp::FlashAttentionCore, ExecSpace>(team(8, 8))));
  struct NoBlocks {};
  EXPECT_FALSE((mlacp::detail::core_computes_blocks<NoBlocks, ExecSpace>({})));
  View4<double> q("q", 1, 4, 1, 4), v("v", 1, 4, 1, 4);
  View3<double> lse("lse", 1, 1, 4);
  const auto rows = TokenSegments::contiguous(0, 4);
  // The team path takes float and double only, as its square forward.
  View4<mlacp::compat::bf16> qb("qb", 1, 4, 1, 4);
  View4<float> of("of", 1, 4, 1, 4);
  View3<float> lf("lf", 1, 1, 4);
  EXPECT_NE(invalid_argument_message([&] {
              forward_block(team(4, 4), ExecSpace(), qb, qb, qb, of, lf, rows, rows, mlacp::DocumentLayout(), 4, true);
            }).find("team path takes float and double"),
            std::string::npos);
  // Positions past the sequence and mismatched rows are refused, naming them.
  EXPECT_NE(invalid_argument_message([&] {
              forward_block(flash(4, 4), ExecSpace(), q, q, v, v, lse, rows, TokenSegments::contiguous(2, 4),
                            mlacp::DocumentLayout(), 4, true);
            }).find("seq = 4"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([&] {
              forward_block(flash(4, 4), ExecSpace(), q, q, v, v, lse, rows, TokenSegments::contiguous(0, 3),
                            mlacp::DocumentLayout(), 4, true);
            }).find("k (rows: k_rows.rows())"),
            std::string::npos);
}

/// A collective in flight that only counts how often mlacp::progress() advanced it.
struct CountingTransport final : mlacp::detail::PendingTransport {
  int progressed = 0;
  bool test() override { return true; }
  void wait() override {}
  void complete_noexcept() noexcept override {}
  void progress() noexcept override { ++progressed; }
};

/// While a collective is pending, the BLAS path calls mlacp::progress() once per (query tile, key tile) pair it
/// computes, forward and backward, and not at all when none is; a block with no visible pair runs no tile.
TEST(BlockAttention, ProgressesPendingCollectivesPerTile) {
  const std::int64_t s = 40;
  const auto q_rows = TokenSegments::contiguous(20, 20), k_rows = TokenSegments::contiguous(0, 20);
  View4<double> q("q", n_b, 20, n_h, d_qk), k("k", n_b, 20, n_h, d_qk), v("v", n_b, 20, n_h, d_v);
  View4<double> o("o", n_b, 20, n_h, d_v), dq("dq", n_b, 20, n_h, d_qk), dk("dk", n_b, 20, n_h, d_qk);
  View4<double> dv("dv", n_b, 20, n_h, d_v);
  View3<double> lse("lse", n_b, n_h, 20);
  from_vec(q, random_vec(q.span(), 1));
  from_vec(k, random_vec(k.span(), 2));
  from_vec(v, random_vec(v.span(), 3));
  const auto core = flash(8, 8);  // 3 query tiles and 3 key tiles of 20 rows: 9 pairs, all visible
  ExecSpace space;
  CountingTransport pending;
  mlacp::detail::register_pending(&pending);
  forward_block(core, space, q, k, v, o, lse, q_rows, k_rows, mlacp::DocumentLayout(), s, true);
  space.fence();
  EXPECT_EQ(pending.progressed, n_b * n_h * 9);
  backward_block(core, space, q, k, v, o, lse, o, dq, dk, dv, q_rows, k_rows, mlacp::DocumentLayout(), s);
  space.fence();
  EXPECT_EQ(pending.progressed, 2 * n_b * n_h * 9);
  // A block whose keys all follow its queries is skipped without any tile work: no tile loop, so no progress call.
  forward_block(core, space, q, k, v, o, lse, k_rows, q_rows, mlacp::DocumentLayout(), s, true);
  backward_block(core, space, q, k, v, o, lse, o, dq, dk, dv, k_rows, q_rows, mlacp::DocumentLayout(), s);
  space.fence();
  EXPECT_EQ(pending.progressed, 2 * n_b * n_h * 9);
  for (const double x : to_vec(lse)) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
  mlacp::detail::unregister_pending(&pending);
  forward_block(core, space, q, k, v, o, lse, q_rows, k_rows, mlacp::DocumentLayout(), s, true);
  space.fence();
  EXPECT_EQ(pending.progressed, 2 * n_b * n_h * 9);
}

}  // namespace
