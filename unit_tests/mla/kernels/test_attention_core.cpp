// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the tiled (flash-style) causal attention core against the reference core (CausalAttentionCore, one thread
// per row, checked against a naive S x S softmax and finite differences in test_mla_kernels.cpp): both paths (BLAS
// tiles, team scratch), tiles that do and do not divide S, query and key tiles of different sizes, scores large
// enough to overflow without the running max, the gradient flags, long sequences in float against double, and the
// tile options. Packed documents (DocumentLayout): every path and tiling against the reference core on random packings,
// packed documents against separate runs, the tiles across document boundaries skipped, and the layout's checks.
#include "kernel_test_support.hpp"
#include "scoped_environment.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/kernels/attention_core.hpp>
#include <mlacp/mla/kernels/detail/softmax_exp.hpp>
#include <mlacp/mla/kernels/flash_attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using mlacp::FlashAttentionPath;
using mlacp::test::kernels::invalid_argument_message;
using mlacp::test::kernels::rel_error;
using mlacp::test::kernels::to_vec;
using mlacp::test::kernels::Vec;
using mlacp::test::kernels::View3;
using mlacp::test::kernels::View4;

/// Exact up to rounding; float's bound allows the tiled core's different summation order over long key ranges.
template <class T>
double tol() {
  return std::is_same_v<T, double> ? 1e-12 : 2e-5;
}

template <class V>
void fill(const V& v, std::uint32_t seed, double magnitude, bool integers = false) {
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-magnitude, magnitude);
  for (std::size_t i = 0; i < h.span(); ++i) {
    const double x = dist(gen);
    h.data()[i] = static_cast<typename V::non_const_value_type>(integers ? std::round(x) : x);
  }
  Kokkos::deep_copy(v, h);
}

/// ||a - ref|| / max(||ref||, 1): relative where the reference is of order one or more, absolute where it vanishes
/// (the gradients of a one-token sequence are zero up to rounding).
double error(const Vec& a, const Vec& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1.0));
}

struct Shape {
  int b, s, h, dqk, dv;
};

/// Inputs, forward outputs and gradients of one attention problem.
template <class T>
struct Problem {
  View4<T> q, k, v, o, d_o, dq, dk, dv;
  View3<T> lse;
  Problem(const Shape& sh, double magnitude, bool integers)
      : q("q", sh.b, sh.s, sh.h, sh.dqk),
        k("k", sh.b, sh.s, sh.h, sh.dqk),
        v("v", sh.b, sh.s, sh.h, sh.dv),
        o("o", sh.b, sh.s, sh.h, sh.dv),
        d_o("d_o", sh.b, sh.s, sh.h, sh.dv),
        dq("dq", sh.b, sh.s, sh.h, sh.dqk),
        dk("dk", sh.b, sh.s, sh.h, sh.dqk),
        dv("dv", sh.b, sh.s, sh.h, sh.dv),
        lse("lse", sh.b, sh.h, sh.s) {
    fill(q, 1, magnitude, integers);
    fill(k, 2, magnitude, integers);
    fill(v, 3, 1.0);
    fill(d_o, 4, 1.0);
  }
  /// Runs forward and backward with `core`; the outputs and gradients start as garbage (they must be overwritten).
  template <class Core>
  void run(const Core& core, const mlacp::DocumentLayout& documents = mlacp::DocumentLayout()) {
    for (const auto& out : {o, dq, dk, dv}) Kokkos::deep_copy(out, T(42));
    Kokkos::deep_copy(lse, T(42));
    ExecSpace space;
    core.forward(space, mlacp::attention_problem(q, k, v, o, lse, documents));
    core.backward(space, mlacp::attention_problem(q, k, v, o, lse, d_o, dq, dk, dv, documents));
    space.fence();
  }
};

mlacp::FlashAttentionCore flash(FlashAttentionPath path, int tq, int tk) {
  mlacp::FlashAttentionOptions o;
  o.path = path;
  o.query_tile = tq;
  o.key_tile = tk;
  return mlacp::FlashAttentionCore(o);
}

template <class T>
class FlashAttention : public ::testing::Test {};
using ValueTypes = ::testing::Types<double, float>;
TYPED_TEST_SUITE(FlashAttention, ValueTypes);

/// The default core on a shape that takes the large tiles on the BLAS path (S past flash_large_tile_min_seq, not a
/// multiple of the tile; dqk = 128): against the reference core, and bit for bit the core with those tiles set.
TYPED_TEST(FlashAttention, DefaultTilesByShapeMatchReferenceCore) {
  using T = TypeParam;
  const Shape sh{1, 1061, 2, 128, 8};
  const mlacp::FlashAttentionCore by_default;
  const auto tiles = by_default.tiles_for<ExecSpace>(sh.s, sh.dqk, false);
  if (mlacp::FlashAttentionCore::runs_blas<ExecSpace>(FlashAttentionPath::automatic)) {
    EXPECT_EQ(tiles, std::make_pair(mlacp::flash_large_tile_blas, mlacp::flash_large_tile_blas));
  }
  const int n_tiles = (sh.s + tiles.first - 1) / tiles.first;
  if (tiles.first == tiles.second) {
    EXPECT_EQ(by_default.tile_pairs<ExecSpace>(sh.s, mlacp::DocumentLayout(), sh.dqk).first,
              n_tiles * (n_tiles + 1) / 2);
  }
  Problem<T> ref(sh, 1.0, false), got(sh, 1.0, false), set(sh, 1.0, false);
  ref.run(mlacp::CausalAttentionCore{});
  got.run(by_default);
  set.run(flash(FlashAttentionPath::automatic, tiles.first, tiles.second));
  for (const auto& [a, r, s, name] :
       {std::make_tuple(got.o, ref.o, set.o, "o"), std::make_tuple(got.dq, ref.dq, set.dq, "dq"),
        std::make_tuple(got.dk, ref.dk, set.dk, "dk"), std::make_tuple(got.dv, ref.dv, set.dv, "dv")}) {
    EXPECT_LT(error(to_vec(a), to_vec(r)), tol<T>()) << name;
    EXPECT_EQ(to_vec(a), to_vec(s)) << name << ": the default is the large tiles set";
  }
  EXPECT_LT(error(to_vec(got.lse), to_vec(ref.lse)), tol<T>());
}

/// Every (path, tiles) against the reference core, forward (o, lse) and backward (dq, dk, dv).
TYPED_TEST(FlashAttention, MatchesReferenceCoreForEveryPathAndTiling) {
  using T = TypeParam;
  const std::vector<std::pair<int, int>> tilings = {{1, 1}, {3, 5}, {5, 3}, {4, 4}, {8, 16}, {16, 8}, {64, 64}, {0, 0}};
  const std::vector<Shape> shapes = {{2, 13, 3, 5, 3}, {1, 37, 2, 8, 6}, {1, 1, 1, 4, 4}};
  for (const Shape& sh : shapes) {
    // Magnitude 40 with integer entries gives scores of thousands: exp overflows without the running max.
    for (const double magnitude : {1.0, 40.0}) {
      Problem<T> ref(sh, magnitude, magnitude > 10.0);
      ref.run(mlacp::CausalAttentionCore{});
      for (const auto path : {FlashAttentionPath::blas, FlashAttentionPath::team}) {
        for (const auto& [tq, tk] : tilings) {
          Problem<T> got(sh, magnitude, magnitude > 10.0);
          got.run(flash(path, tq, tk));
          const std::string where = std::string(path == FlashAttentionPath::blas ? "blas" : "team") + " tiles " +
                                    std::to_string(tq) + "x" + std::to_string(tk) + " S=" + std::to_string(sh.s) +
                                    " magnitude " + std::to_string(magnitude);
          EXPECT_LT(error(to_vec(got.o), to_vec(ref.o)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.lse), to_vec(ref.lse)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.dq), to_vec(ref.dq)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.dk), to_vec(ref.dk)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.dv), to_vec(ref.dv)), tol<T>()) << where;
        }
      }
    }
  }
}

/// Random cu_seqlens over S tokens: `cuts` distinct cut points in (0, S).
std::vector<std::int64_t> random_packing(std::int64_t n_s, int cuts, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> dist(1, n_s - 1);
  std::vector<std::int64_t> cu = {0, n_s};
  while (static_cast<int>(cu.size()) < cuts + 2) {
    const std::int64_t c = dist(gen);
    if (std::find(cu.begin(), cu.end(), c) == cu.end()) cu.push_back(c);
  }
  std::sort(cu.begin(), cu.end());
  return cu;
}

// The kernels of the DocumentLayout tests are functions of their own: nvcc refuses a device lambda in a TEST body
// (gtest's TestBody is a private member function).

/// got(t, :) = doc_of, start_of and end_of of token t of the device offsets `docs`, answered in a kernel.
template <class Docs>
void document_queries_in_kernel(const Docs& docs, const Kokkos::View<std::int64_t* [3], MemSpace>& got) {
  Kokkos::parallel_for(
      "test_document_queries", Kokkos::RangePolicy<ExecSpace>(0, static_cast<int>(got.extent(0))),
      KOKKOS_LAMBDA(const int t) {
        got(t, 0) = docs.doc_of(t);
        got(t, 1) = docs.start_of(t);
        got(t, 2) = docs.end_of(t);
      });
}

/// got(t, :) = start_of and end_of of token t of the device offsets `docs`, answered in a kernel.
template <class Docs>
void document_bounds_in_kernel(const Docs& docs, const Kokkos::View<std::int64_t* [2], MemSpace>& got) {
  Kokkos::parallel_for(
      "test_assigned_layout", Kokkos::RangePolicy<ExecSpace>(0, static_cast<int>(got.extent(0))),
      KOKKOS_LAMBDA(const int t) {
        got(t, 0) = docs.start_of(t);
        got(t, 1) = docs.end_of(t);
      });
}

std::string packing_string(const std::vector<std::int64_t>& cu) {
  std::string s;
  for (const auto c : cu) s += (s.empty() ? "" : ",") + std::to_string(c);
  return s;
}

/// Packed documents: every (path, tiles) against the reference core with the same layout, forward and backward. The
/// packings hold documents of length 1 (first, last, in between), documents shorter and longer than the tiles,
/// boundaries on tile edges (multiples of 4 and 8) and off them, and random ones.
TYPED_TEST(FlashAttention, PackedMatchesReferenceCoreForEveryPathAndTiling) {
  using T = TypeParam;
  const std::vector<std::pair<int, int>> tilings = {{1, 1},  {3, 5},  {5, 3},   {4, 4}, {8, 8},
                                                    {8, 16}, {16, 8}, {64, 64}, {0, 0}};
  const Shape sh{2, 37, 2, 6, 5};
  std::vector<std::vector<std::int64_t>> packings = {
      {0, 1, 37}, {0, 36, 37}, {0, 8, 16, 24, 32, 37}, {0, 4, 5, 20, 21, 37}, {0, 16, 17, 37}, {0, 33, 37}};
  for (std::uint32_t seed = 1; seed <= 4; ++seed) packings.push_back(random_packing(sh.s, 1 + 2 * seed, seed));
  for (const double magnitude : {1.0, 40.0}) {
    for (const auto& cu : packings) {
      const mlacp::DocumentLayout documents(cu, sh.s);
      Problem<T> ref(sh, magnitude, magnitude > 10.0);
      ref.run(mlacp::CausalAttentionCore{}, documents);
      for (const auto path : {FlashAttentionPath::blas, FlashAttentionPath::team}) {
        for (const auto& [tq, tk] : tilings) {
          Problem<T> got(sh, magnitude, magnitude > 10.0);
          got.run(flash(path, tq, tk), documents);
          const std::string where = std::string(path == FlashAttentionPath::blas ? "blas" : "team") + " tiles " +
                                    std::to_string(tq) + "x" + std::to_string(tk) + " cu_seqlens " +
                                    packing_string(cu) + " magnitude " + std::to_string(magnitude);
          EXPECT_LT(error(to_vec(got.o), to_vec(ref.o)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.lse), to_vec(ref.lse)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.dq), to_vec(ref.dq)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.dk), to_vec(ref.dk)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.dv), to_vec(ref.dv)), tol<T>()) << where;
        }
      }
    }
  }
}

/// The forward in blocks of query rows (attention_rows_problem: the rows [first, first + count) against their causal
/// prefix, on subviews; the layer's flat forward runs one per Ulysses rank so that each block of O leaves as it is
/// computed): computed block by block in a scrambled order over o and lse filled with garbage, every row is
/// overwritten and agrees with the square problem of the same core, with and without packed documents, B = 2 (strided
/// subviews) and blocks that do not align with the tiles. The reference core computes each row alone: bit for bit.
TYPED_TEST(FlashAttention, RowBlocksEqualTheSquareProblem) {
  using T = TypeParam;
  const Shape sh{2, 37, 3, 6, 5};
  const std::vector<std::pair<std::int64_t, std::int64_t>> blocks = {{19, 18}, {0, 10}, {10, 9}};
  const std::vector<std::vector<std::int64_t>> packings = {{0, 37}, {0, 8, 16, 24, 32, 37}, {0, 13, 37}};
  ExecSpace space;
  const auto check = [&](const auto& core, const std::string& name) {
    for (const auto& cu : packings) {
      const mlacp::DocumentLayout documents(cu, sh.s);
      Problem<T> whole(sh, 1.0, false), rows(sh, 1.0, false);
      whole.run(core, documents);
      Kokkos::deep_copy(rows.o, T(42));
      Kokkos::deep_copy(rows.lse, T(42));
      for (const auto& [first, count] : blocks)
        core.forward(space,
                     mlacp::attention_rows_problem(rows.q, rows.k, rows.v, rows.o, rows.lse, first, count, &documents));
      space.fence();
      const std::string where = name + " cu_seqlens " + packing_string(cu);
      EXPECT_LT(error(to_vec(rows.o), to_vec(whole.o)), tol<T>()) << where;
      EXPECT_LT(error(to_vec(rows.lse), to_vec(whole.lse)), tol<T>()) << where;
      if (name == "reference") {
        EXPECT_EQ(to_vec(rows.o), to_vec(whole.o)) << where;
        EXPECT_EQ(to_vec(rows.lse), to_vec(whole.lse)) << where;
      }
    }
  };
  check(mlacp::CausalAttentionCore{}, "reference");
  for (const auto path : {FlashAttentionPath::blas, FlashAttentionPath::team})
    for (const auto& [tq, tk] : std::vector<std::pair<int, int>>{{4, 4}, {8, 16}, {0, 0}})
      check(flash(path, tq, tk), std::string(path == FlashAttentionPath::blas ? "blas" : "team") + " tiles " +
                                     std::to_string(tq) + "x" + std::to_string(tk));
}

/// Copies tokens [t0, t0 + n) of every (b, head) of a [B, S, h, d] View into a [B, n, h, d] View, or back.
template <class T>
void copy_tokens(const View4<T>& from, std::int64_t from_t0, const View4<T>& to, std::int64_t to_t0, std::int64_t n) {
  Kokkos::deep_copy(
      Kokkos::subview(to, Kokkos::ALL(), std::make_pair(to_t0, to_t0 + n), Kokkos::ALL(), Kokkos::ALL()),
      Kokkos::subview(from, Kokkos::ALL(), std::make_pair(from_t0, from_t0 + n), Kokkos::ALL(), Kokkos::ALL()));
}

/// An independent check of the masking: documents d1 | d2 packed give what d1 and d2 give run separately (the
/// reference core bitwise, the tiled core to rounding in double), forward and gradients.
TEST(FlashAttentionPacked, PackedDocumentsEqualSeparateRuns) {
  const std::int64_t n1 = 23, n2 = 18, n_s = n1 + n2;
  const Shape sh{1, static_cast<int>(n_s), 2, 6, 4};
  const mlacp::DocumentLayout documents({0, n1, n_s}, n_s);
  auto separate = [&](const auto& core) {
    Problem<double> packed(sh, 2.0, false), joined(sh, 2.0, false);
    packed.run(core, documents);
    for (const auto& [t0, n] : {std::make_pair(std::int64_t(0), n1), std::make_pair(n1, n2)}) {
      Problem<double> part({sh.b, static_cast<int>(n), sh.h, sh.dqk, sh.dv}, 2.0, false);
      for (const auto& [all, one] : {std::make_pair(packed.q, part.q), std::make_pair(packed.k, part.k),
                                     std::make_pair(packed.v, part.v), std::make_pair(packed.d_o, part.d_o)})
        copy_tokens(all, t0, one, 0, n);
      part.run(core);
      for (const auto& [one, all] : {std::make_pair(part.o, joined.o), std::make_pair(part.dq, joined.dq),
                                     std::make_pair(part.dk, joined.dk), std::make_pair(part.dv, joined.dv)})
        copy_tokens(one, 0, all, t0, n);
      Kokkos::deep_copy(Kokkos::subview(joined.lse, Kokkos::ALL(), Kokkos::ALL(), std::make_pair(t0, t0 + n)),
                        part.lse);
    }
    return std::make_pair(std::move(packed), std::move(joined));
  };
  {
    const auto [packed, joined] = separate(mlacp::CausalAttentionCore{});
    EXPECT_EQ(to_vec(packed.o), to_vec(joined.o));
    EXPECT_EQ(to_vec(packed.lse), to_vec(joined.lse));
    EXPECT_EQ(to_vec(packed.dq), to_vec(joined.dq));
    EXPECT_EQ(to_vec(packed.dk), to_vec(joined.dk));
    EXPECT_EQ(to_vec(packed.dv), to_vec(joined.dv));
  }
  for (const auto path : {FlashAttentionPath::blas, FlashAttentionPath::team}) {
    for (const auto& [tq, tk] : std::vector<std::pair<int, int>>{{4, 4}, {8, 16}, {16, 8}, {0, 0}}) {
      const auto [packed, joined] = separate(flash(path, tq, tk));
      const std::string where = std::string(path == FlashAttentionPath::blas ? "blas " : "team ") + std::to_string(tq) +
                                "x" + std::to_string(tk);
      EXPECT_LT(rel_error(to_vec(packed.o), to_vec(joined.o)), 1e-12) << where;
      EXPECT_LT(rel_error(to_vec(packed.lse), to_vec(joined.lse)), 1e-12) << where;
      EXPECT_LT(rel_error(to_vec(packed.dq), to_vec(joined.dq)), 1e-12) << where;
      EXPECT_LT(rel_error(to_vec(packed.dk), to_vec(joined.dk)), 1e-12) << where;
      EXPECT_LT(rel_error(to_vec(packed.dv), to_vec(joined.dv)), 1e-12) << where;
    }
  }
}

/// A layout of one document, {0, S}, is plain causal attention: the same numbers, bitwise, on both paths.
TEST(FlashAttentionPacked, OneDocumentLayoutIsPlainCausalAttention) {
  const Shape sh{1, 45, 2, 6, 4};
  for (const auto path : {FlashAttentionPath::blas, FlashAttentionPath::team}) {
    Problem<double> plain(sh, 2.0, false), one(sh, 2.0, false);
    plain.run(flash(path, 8, 8));
    one.run(flash(path, 8, 8), mlacp::DocumentLayout({0, sh.s}, sh.s));
    EXPECT_EQ(to_vec(one.o), to_vec(plain.o));
    EXPECT_EQ(to_vec(one.dq), to_vec(plain.dq));
    EXPECT_EQ(to_vec(one.dk), to_vec(plain.dk));
    EXPECT_EQ(to_vec(one.dv), to_vec(plain.dv));
  }
}

/// Sets tokens [t0, t0 + n) of a [B, S, h, d] View to NaN.
template <class T>
void poison(const View4<T>& x, std::int64_t t0, std::int64_t n) {
  Kokkos::deep_copy(Kokkos::subview(x, Kokkos::ALL(), std::make_pair(t0, t0 + n), Kokkos::ALL(), Kokkos::ALL()),
                    std::numeric_limits<T>::quiet_NaN());
}

/// The tiles across document boundaries are skipped, not computed and masked: with documents on tile edges (block
/// diagonal), NaN in every input of the first document leaves the other documents' outputs and gradients exact (a
/// computed tile would carry it through 0 * NaN into them). And the visited tile pairs are those of the blocks.
TEST(FlashAttentionPacked, SkipsTilesAcrossDocumentBoundaries) {
  const std::int64_t n_s = 64, first_doc = 16;
  const std::vector<std::int64_t> cu = {0, first_doc, 48, n_s};
  const mlacp::DocumentLayout documents(cu, n_s);
  const Shape sh{1, static_cast<int>(n_s), 2, 6, 4};
  Problem<double> ref(sh, 2.0, false);
  ref.run(mlacp::CausalAttentionCore{}, documents);
  auto rest = [&](const View4<double>& x) {  // tokens [first_doc, S)
    View4<double> part("rest", x.extent(0), n_s - first_doc, x.extent(2), x.extent(3));
    copy_tokens(x, first_doc, part, 0, n_s - first_doc);
    return to_vec(part);
  };
  for (const auto path : {FlashAttentionPath::blas, FlashAttentionPath::team}) {
    for (const auto& [tq, tk] : std::vector<std::pair<int, int>>{{16, 16}, {16, 8}, {8, 16}}) {
      const auto core = flash(path, tq, tk);
      const std::string where = std::string(path == FlashAttentionPath::blas ? "blas " : "team ") + std::to_string(tq) +
                                "x" + std::to_string(tk);
      Problem<double> got(sh, 2.0, false);
      for (const auto& x : {got.q, got.k, got.v, got.d_o}) poison(x, 0, first_doc);
      got.run(core, documents);
      EXPECT_LT(rel_error(rest(got.o), rest(ref.o)), 1e-12) << where;
      EXPECT_LT(rel_error(rest(got.dq), rest(ref.dq)), 1e-12) << where;
      EXPECT_LT(rel_error(rest(got.dk), rest(ref.dk)), 1e-12) << where;
      EXPECT_LT(rel_error(rest(got.dv), rest(ref.dv)), 1e-12) << where;
      // Per query tile, the key tiles from the one holding its document start: documents 16 | 32 | 16 tokens.
      const auto [visited, causal] = core.tile_pairs<ExecSpace>(n_s, documents);
      const std::int64_t expected_causal = tq == tk ? 10 : 20, expected = tq == tk ? 5 : 10;
      EXPECT_EQ(causal, expected_causal) << where;
      EXPECT_EQ(visited, expected) << where;
    }
  }
  const auto [one_doc, causal] = mlacp::FlashAttentionCore{}.tile_pairs<ExecSpace>(n_s, mlacp::DocumentLayout());
  EXPECT_EQ(one_doc, causal);
}

/// cu_seqlens that do not describe a packing are refused with the entry and the rule; so is a layout over another S.
TEST(DocumentLayout, RejectsInvalidOffsetsNamingTheEntryAndTheRule) {
  auto message = [](std::vector<std::int64_t> cu, std::int64_t n_s) {
    return invalid_argument_message([&] { mlacp::DocumentLayout(std::move(cu), n_s); });
  };
  EXPECT_NE(message({1, 5, 9}, 9).find("cu_seqlens[0] = 1; expected 0"), std::string::npos);
  EXPECT_NE(message({0, 5, 8}, 9).find("cu_seqlens[2] = 8; expected the sequence length 9"), std::string::npos);
  EXPECT_NE(message({0, 5, 5, 9}, 9).find("cu_seqlens[2] = 5 <= cu_seqlens[1] = 5; expected strictly increasing"),
            std::string::npos);
  EXPECT_NE(message({0, 6, 4, 9}, 9).find("cu_seqlens[2] = 4 <= cu_seqlens[1] = 6"), std::string::npos);
  EXPECT_NE(message({0}, 9).find("has 1 entries; expected at least 2"), std::string::npos);
  EXPECT_NE(message({0, 0}, 0).find("expected a sequence of at least 1 token"), std::string::npos);
  EXPECT_EQ(message({0, 9}, 9), "");
  ExecSpace space;
  View4<double> q("q", 1, 8, 1, 3), v("v", 1, 8, 1, 3), o("o", 1, 8, 1, 3);
  View3<double> lse("lse", 1, 1, 8);
  const mlacp::DocumentLayout nine({0, 4, 9}, 9);
  const std::string msg = invalid_argument_message(
      [&] { mlacp::FlashAttentionCore{}.forward(space, mlacp::attention_problem(q, q, v, o, lse, nine)); });
  EXPECT_NE(msg.find("covers S = 9 tokens, the sequence has 8"), std::string::npos) << msg;
  EXPECT_NE(invalid_argument_message([&] {
              mlacp::CausalAttentionCore{}.forward(space, mlacp::attention_problem(q, q, v, o, lse, nine));
            }).find("covers S = 9 tokens"),
            std::string::npos);
}

/// doc_of / start_of / end_of on the host and in a kernel, against a linear scan.
TEST(DocumentLayout, AnswersDocumentQueriesOnHostAndDevice) {
  const std::int64_t n_s = 50;
  const std::vector<std::int64_t> cu = random_packing(n_s, 9, 7);
  const mlacp::DocumentLayout documents(cu, n_s);
  EXPECT_EQ(documents.documents(), 10);
  EXPECT_FALSE(documents.single());
  Kokkos::View<std::int64_t* [3], MemSpace> got("got", n_s);
  document_queries_in_kernel(documents.offsets_for<ExecSpace>(n_s, "test"), got);
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got);
  for (std::int64_t t = 0; t < n_s; ++t) {
    std::int64_t d = 0;
    while (cu[d + 1] <= t) ++d;
    EXPECT_EQ(documents.doc_of(t), d) << t;
    EXPECT_EQ(documents.start_of(t), cu[d]) << t;
    EXPECT_EQ(documents.end_of(t), cu[d + 1]) << t;
    EXPECT_EQ(h(t, 0), d) << t;
    EXPECT_EQ(h(t, 1), cu[d]) << t;
    EXPECT_EQ(h(t, 2), cu[d + 1]) << t;
  }
  const mlacp::DocumentLayout none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.host(12).start_of(7), 0);
  EXPECT_EQ(none.host(12).end_of(7), 12);
  EXPECT_TRUE(mlacp::DocumentLayout({0, 5}, 5).single());
}

// assign() makes a layout another one in place: the same answers as a layout built from those offsets (host and
// device), the offset Views reused while they hold enough entries (the capacity), and back to one document.
TEST(DocumentLayout, AssignReusesItsOffsetsAndAnswersAsANewLayout) {
  const std::int64_t n_s = 40;
  mlacp::DocumentLayout layout;
  const std::size_t capacity = 12;
  const std::vector<std::vector<std::int64_t>> sequence = {
      random_packing(n_s, 5, 1), random_packing(n_s, 10, 2), {0, 40}, random_packing(n_s, 3, 3), {}};
  const std::int64_t* first_offsets = nullptr;
  for (const auto& cu : sequence) {
    EXPECT_TRUE(layout.assign(ExecSpace(), cu, n_s, capacity));
    EXPECT_FALSE(layout.assign(ExecSpace(), cu, n_s, capacity)) << "the same layout again changes nothing";
    const mlacp::DocumentLayout fresh = cu.empty() ? mlacp::DocumentLayout() : mlacp::DocumentLayout(cu, n_s);
    EXPECT_EQ(layout.empty(), fresh.empty());
    EXPECT_EQ(layout.single(), fresh.single());
    EXPECT_EQ(layout.documents(), fresh.documents());
    const auto docs = layout.offsets_for<ExecSpace>(n_s, "test");
    if (!layout.single()) {
      EXPECT_EQ(docs.offsets.extent(0), cu.size());
      if (first_offsets == nullptr) first_offsets = docs.offsets.data();
      EXPECT_EQ(docs.offsets.data(), first_offsets) << "the offsets were reallocated within the capacity";
    }
    Kokkos::View<std::int64_t* [2], MemSpace> got("got", n_s);
    document_bounds_in_kernel(docs, got);
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got);
    for (std::int64_t t = 0; t < n_s; ++t) {
      const std::int64_t start = cu.size() > 2 ? fresh.start_of(t) : 0, end = cu.size() > 2 ? fresh.end_of(t) : n_s;
      EXPECT_EQ(layout.host(n_s).start_of(t), start) << t;
      EXPECT_EQ(h(t, 0), start) << t;
      EXPECT_EQ(h(t, 1), end) << t;
    }
  }
  EXPECT_NE(invalid_argument_message([&] {
              layout.assign(ExecSpace(), {0, 7, 7, 40}, n_s, capacity);
            }).find("cu_seqlens[2] = 7"),
            std::string::npos);
}

/// An empty gradient View means "not needed": its work is skipped and the others are unchanged.
TYPED_TEST(FlashAttention, SkipsGradientsThatAreNotNeeded) {
  using T = TypeParam;
  const Shape sh{1, 21, 2, 6, 4};
  for (const auto path : {FlashAttentionPath::blas, FlashAttentionPath::team}) {
    const auto core = flash(path, 4, 8);
    Problem<T> all(sh, 1.0, false);
    all.run(core);
    for (int mask = 0; mask < 8; ++mask) {
      Problem<T> p(sh, 1.0, false);
      ExecSpace space;
      core.forward(space, mlacp::attention_problem(p.q, p.k, p.v, p.o, p.lse));
      View4<T> dq = mask & 1 ? p.dq : View4<T>(), dk = mask & 2 ? p.dk : View4<T>(), dv = mask & 4 ? p.dv : View4<T>();
      core.backward(space, mlacp::attention_problem(p.q, p.k, p.v, p.o, p.lse, p.d_o, dq, dk, dv));
      space.fence();
      if (mask & 1) {
        EXPECT_EQ(to_vec(dq), to_vec(all.dq)) << "mask " << mask;
      }
      if (mask & 2) {
        EXPECT_EQ(to_vec(dk), to_vec(all.dk)) << "mask " << mask;
      }
      if (mask & 4) {
        EXPECT_EQ(to_vec(dv), to_vec(all.dv)) << "mask " << mask;
      }
    }
  }
}

/// Long sequences: float keeps float accuracy against double (softmax statistics and the row term in double, no
/// sum whose error grows with S beyond the GEMMs' own).
TEST(FlashAttentionLong, FloatAgreesWithDoubleAtS4096) {
  const Shape sh{1, 4096, 1, 32, 32};
  Problem<double> d(sh, 2.0, false);
  d.run(mlacp::FlashAttentionCore{});
  Problem<float> f(sh, 2.0, false);
  f.run(mlacp::FlashAttentionCore{});
  EXPECT_LT(rel_error(to_vec(f.o), to_vec(d.o)), 1e-5);
  EXPECT_LT(rel_error(to_vec(f.lse), to_vec(d.lse)), 1e-6);
  EXPECT_LT(rel_error(to_vec(f.dq), to_vec(d.dq)), 1e-4);
  EXPECT_LT(rel_error(to_vec(f.dk), to_vec(d.dk)), 1e-4);
  EXPECT_LT(rel_error(to_vec(f.dv), to_vec(d.dv)), 1e-5);
}

/// The portable team path agrees with the BLAS path on a longer sequence with several tiles per row.
TEST(FlashAttentionLong, TeamPathAgreesWithBlasPathAtS1024) {
  const Shape sh{1, 1024, 2, 24, 16};
  Problem<double> blas(sh, 2.0, false);
  blas.run(flash(FlashAttentionPath::blas, 0, 0));
  Problem<double> team(sh, 2.0, false);
  team.run(flash(FlashAttentionPath::team, 0, 0));
  EXPECT_LT(rel_error(to_vec(team.o), to_vec(blas.o)), 1e-12);
  EXPECT_LT(rel_error(to_vec(team.dq), to_vec(blas.dq)), 1e-12);
  EXPECT_LT(rel_error(to_vec(team.dk), to_vec(blas.dk)), 1e-12);
  EXPECT_LT(rel_error(to_vec(team.dv), to_vec(blas.dv)), 1e-12);
}

/// The softmax's exp against the C library's over the arguments it gets (<= 0), within a few ulp, and 0 where e^x is
/// below the smallest normal number.
TEST(SoftmaxExp, AgreesWithTheCLibrary) {
  double worst_d = 0, worst_f = 0;
  for (double x = -745.0; x <= 1e-3; x += 0.0173) {
    const double want = std::exp(x);
    const double got = mlacp::detail::softmax_exp(x);
    if (want >= 2.3e-308)
      worst_d = std::max(worst_d, std::abs(got - want) / want);
    else
      EXPECT_LE(got, 2.3e-308) << x;
    const auto xf = static_cast<float>(x);
    const double want_f = std::exp(static_cast<double>(xf));
    const double got_f = mlacp::detail::softmax_exp(xf);
    if (want_f >= 1.2e-38)
      worst_f = std::max(worst_f, std::abs(got_f - want_f) / want_f);
    else
      EXPECT_LE(got_f, 1.2e-38) << x;
  }
  EXPECT_LT(worst_d, 4 * 2.2e-16);
  EXPECT_LT(worst_f, 4 * 1.2e-7);
  EXPECT_EQ(mlacp::detail::softmax_exp(0.0), 1.0);
  EXPECT_EQ(mlacp::detail::softmax_exp(0.0f), 1.0f);
  EXPECT_EQ(mlacp::detail::softmax_exp(-1e6), 0.0);
  EXPECT_EQ(mlacp::detail::softmax_exp(-1e6f), 0.0f);
}

TEST(FlashAttentionOptions, TilesFromOptionsEnvironmentAndDefaults) {
  mlacp::FlashAttentionOptions o;
  EXPECT_EQ(mlacp::detail::flash_tiles(o, true),
            std::make_pair(mlacp::flash_default_query_tile_blas, mlacp::flash_default_key_tile_blas));
  EXPECT_EQ(mlacp::detail::flash_tiles(o, false),
            std::make_pair(mlacp::flash_default_query_tile_team, mlacp::flash_default_key_tile_team));
  {
    const mlacp::test::ScopedEnvironment tiles("MLACP_ATTENTION_TILES", "48x96");
    EXPECT_EQ(mlacp::detail::flash_tiles(o, true), std::make_pair(48, 96));
    o.key_tile = 7;  // explicit options win over the environment
    EXPECT_EQ(mlacp::detail::flash_tiles(o, true), std::make_pair(48, 7));
  }
  for (const char* bad : {"48", "0x8", "8x", "x8", "8x8x8", "-4x8", "abc"}) {
    const mlacp::test::ScopedEnvironment tiles("MLACP_ATTENTION_TILES", bad);
    EXPECT_NE(invalid_argument_message([&] {
                mlacp::detail::flash_tiles({}, true);
              }).find(std::string("MLACP_ATTENTION_TILES='") + bad + "'; expected QxK"),
              std::string::npos)
        << bad;
  }
  o = {};
  o.query_tile = -1;
  EXPECT_NE(invalid_argument_message([&] { mlacp::detail::flash_tiles(o, true); }).find("query_tile = -1"),
            std::string::npos);
}

// resolve() reads the tiles once (options, then MLACP_ATTENTION_TILES, then defaults): the core then runs with them
// whatever the environment says later, and a bad setting is returned as a message instead of thrown from a kernel.
TEST(FlashAttentionOptions, ResolveFixesTheTilesOnceAndReportsABadSetting) {
  constexpr bool blas = mlacp::FlashAttentionCore::runs_blas<ExecSpace>(FlashAttentionPath::automatic);
  mlacp::FlashAttentionCore core;
  std::optional<mlacp::test::ScopedEnvironment> tiles;
  tiles.emplace("MLACP_ATTENTION_TILES", "8x16");
  EXPECT_EQ(core.resolve<ExecSpace>(), "");
  const auto settings = core.settings();
  ASSERT_EQ(settings.size(), 4u);
  EXPECT_EQ(settings[0].second, 8);
  EXPECT_EQ(settings[1].second, 16);
  EXPECT_EQ(settings[2].second, 0) << "tiles set: no choice by shape";
  EXPECT_EQ(settings[3].second, blas ? 1 : 0);
  // A bad value set after resolve() is not read: the tile walk is still that of 8 x 16 (S = 40: query tiles ending
  // at 8, 16, 24, 32, 40 see 1, 1, 2, 2, 3 key tiles of 16).
  tiles.reset();
  tiles.emplace("MLACP_ATTENTION_TILES", "128X128");
  EXPECT_EQ(core.tile_pairs<ExecSpace>(40, mlacp::DocumentLayout()).second, 9)
      << "(query tile, key tile) pairs visited at 8 x 16";
  mlacp::FlashAttentionCore copy = core;  // a copy keeps what was resolved
  EXPECT_EQ(copy.settings(), settings);
  // Resolving now reports the bad value, naming it, and forgets the old tiles.
  mlacp::FlashAttentionCore fresh;
  EXPECT_NE(fresh.resolve<ExecSpace>().find("MLACP_ATTENTION_TILES='128X128'; expected QxK"), std::string::npos);
  EXPECT_EQ(fresh.settings()[0].second, 0);
  tiles.reset();
  // None set: the BLAS path chooses by shape, and says so.
  mlacp::FlashAttentionCore by_shape;
  EXPECT_EQ(by_shape.resolve<ExecSpace>(), "");
  EXPECT_EQ(by_shape.settings()[2].second, blas ? 1 : 0);
}

// Where no tile is set, the BLAS path's tiles follow the problem: the large tiles for sequences of at least
// flash_large_tile_min_seq tokens with wide query/key heads or bf16 inputs, the defaults otherwise; the team path and
// any tile set (options, either side, or MLACP_ATTENTION_TILES) keep their tiles at every shape.
TEST(FlashAttentionOptions, DefaultTilesFollowTheShapeOnTheBlasPath) {
  using Tiles = std::pair<int, int>;
  const Tiles small{mlacp::flash_default_query_tile_blas, mlacp::flash_default_key_tile_blas};
  const Tiles large{mlacp::flash_large_tile_blas, mlacp::flash_large_tile_blas};
  const auto blas = mlacp::detail::flash_tile_choice({}, true);
  EXPECT_TRUE(blas.by_shape);
  EXPECT_EQ(blas.for_problem(1024, 128, false), large);
  EXPECT_EQ(blas.for_problem(4096, 192, false), large);
  EXPECT_EQ(blas.for_problem(1023, 192, false), small);
  EXPECT_EQ(blas.for_problem(4096, 127, false), small);
  EXPECT_EQ(blas.for_problem(1024, 32, true), large);
  EXPECT_EQ(blas.for_problem(512, 32, true), small);
  const auto team = mlacp::detail::flash_tile_choice({}, false);
  EXPECT_FALSE(team.by_shape);
  EXPECT_EQ(team.for_problem(4096, 192, true),
            Tiles(mlacp::flash_default_query_tile_team, mlacp::flash_default_key_tile_team));
  mlacp::FlashAttentionOptions o;
  o.key_tile = 64;
  EXPECT_EQ(mlacp::detail::flash_tile_choice(o, true).for_problem(4096, 192, false), Tiles(128, 64));
  const mlacp::test::ScopedEnvironment tiles("MLACP_ATTENTION_TILES", "48x96");
  EXPECT_EQ(mlacp::detail::flash_tile_choice({}, true).for_problem(4096, 192, true), Tiles(48, 96));
}

TEST(FlashAttentionOptions, RejectsMismatchedShapes) {
  ExecSpace space;
  View4<double> q("q", 1, 4, 2, 3), k("k", 1, 4, 2, 3), v("v", 1, 4, 2, 5), o("o", 1, 4, 2, 4);
  View3<double> lse("lse", 1, 2, 4);
  const std::string msg = invalid_argument_message(
      [&] { mlacp::FlashAttentionCore{}.forward(space, mlacp::attention_problem(q, k, v, o, lse)); });
  EXPECT_NE(msg.find("o is [1, 4, 2, 4], expected [1, 4, 2, 5]"), std::string::npos) << msg;
}

}  // namespace
