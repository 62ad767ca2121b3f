// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Packed variable-length sequences (MlaConfig::cu_seqlens) in the distributed MLA layer: forward and every gradient
// against the same layer on one rank over the full sequence, for both strategies, float and double, with and without
// biases, over fixed and random packings (a document of length 1, documents spanning several shards, boundaries on
// and off shard boundaries). The one-rank layer itself is checked against the plain-loop host reference with
// cu_seqlens (forward) and against finite differences (gradients), and a layout that differs across ranks raises on
// every rank.
#include "layer_reference_checks.hpp"
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/mla/mla_attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
template <class T>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

constexpr int kSeq = 32;

mlacp::MlaConfig packed_config(mlacp::MlaStrategy strategy, bool bias, std::vector<std::int64_t> cu_seqlens,
                               int batch = 2) {
  auto c = mlacp::test::make_config(batch, kSeq, 48, 4, 8, 4, 6, 12, bias, strategy);
  c.cu_seqlens = std::move(cu_seqlens);
  return c;
}

// A random packing of kSeq tokens into `documents` documents (the same on every rank: the seed decides).
std::vector<std::int64_t> random_packing(unsigned seed, int documents) {
  std::mt19937 gen(seed);
  std::set<std::int64_t> cuts;
  std::uniform_int_distribution<std::int64_t> pick(1, kSeq - 1);
  while (static_cast<int>(cuts.size()) < documents - 1) cuts.insert(pick(gen));
  std::vector<std::int64_t> c{0};
  c.insert(c.end(), cuts.begin(), cuts.end());
  c.push_back(kSeq);
  return c;
}

// The packings every case runs: a document of length 1 ([5, 6)), one spanning three shards at P = 4 ([6, 20) over
// shards 0, 1, 2 of 8 tokens), boundaries on shard boundaries, a single token at the end, and random ones.
std::vector<std::vector<std::int64_t>> packings() {
  std::vector<std::vector<std::int64_t>> p = {{0, 5, 6, 20, 32}, {0, 8, 16, 24, 32},   {0, 1, 31, 32},
                                              {0, 32},           random_packing(7, 4), random_packing(13, 9)};
  return p;
}

std::string describe(const std::vector<std::int64_t>& c) {
  std::string out = "cu_seqlens {";
  for (std::size_t i = 0; i < c.size(); ++i) out += (i ? "," : "") + std::to_string(c[i]);
  return out + "}";
}

struct Case {
  mlacp::MlaStrategy strategy;
  bool bias;
  int batch;
  int q_lora = 0;  // MlaConfig::q_lora_rank (with a softmax scale of 0.3 when set)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(mlacp::to_string(info.param.strategy)) + (info.param.bias ? "_bias" : "_nobias") + "_batch" +
         std::to_string(info.param.batch) + (info.param.q_lora > 0 ? "_qlora" : "");
}

class MlaPacked : public ::testing::TestWithParam<Case> {};

// The distributed layer with cu_seqlens against the one-rank layer with the same cu_seqlens (checked itself against
// independent references below): y, dx and every weight gradient (summed over the ranks), in two iterations (the
// second reuses the layer's RoPE positions and workspaces built by the first).
template <class T>
void check_against_single_rank(const Case& c) {
  for (const auto& cu : packings()) {
    auto config = packed_config(c.strategy, c.bias, cu, c.batch);
    config.q_lora_rank = c.q_lora;
    if (c.q_lora > 0) config.softmax_scale = 0.3;
    mlacp::test::expect_matches_single_rank_full_sequence<T>(config, {}, 2, describe(cu));
  }
}

TEST_P(MlaPacked, DoubleMatchesSingleRankFullSequence) { check_against_single_rank<double>(GetParam()); }
TEST_P(MlaPacked, FloatMatchesSingleRankFullSequence) { check_against_single_rank<float>(GetParam()); }

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
    for (bool bias : {false, true}) cases.push_back({strategy, bias, 2});
  cases.push_back({mlacp::MlaStrategy::latent, true, 1});
  cases.push_back({mlacp::MlaStrategy::expanded, false, 1});
  cases.push_back({mlacp::MlaStrategy::latent, true, 2, 20});
  cases.push_back({mlacp::MlaStrategy::expanded, false, 2, 20});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaPacked, ::testing::ValuesIn(all_cases()), case_name);

// The packing changes the numbers (the test above can fail): with documents, y differs from the one-document y.
TEST(MlaPackedMath, DocumentsChangeTheOutput) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto packed = packed_config(mlacp::MlaStrategy::latent, false, {0, 5, 6, 20, 32});
  auto plain = packed;
  plain.cu_seqlens.clear();
  const auto weights = mlacp::test::make_weights<double, Mem>(packed, 3);
  Tensor3<double> x("x", packed.batch, packed.seq / mesh.size(), packed.hidden);
  mlacp::test::fill(x, 4 + mesh.rank(), 1.0);
  mlacp::MlaAttention<double> a(packed, weights, mesh), b(plain, weights, mesh);
  const auto ya = mlacp::test::host_values(a.forward(Space(), x).output());
  const auto yb = mlacp::test::host_values(b.forward(Space(), x).output());
  double worst = 0;
  for (std::size_t i = 0; i < ya.size(); ++i) worst = std::max(worst, std::abs(ya[i] - yb[i]));
  EXPECT_GT(worst, 1e-3) << "a packed sequence gave the one-document output on rank " << mesh.rank();
}

// The one-rank layer with cu_seqlens equals the plain-loop host reference of docs/spec.md with the same cu_seqlens
// (positions restart per document, attention masked per document), both strategies, with and without bias.
TEST(MlaPackedMath, SingleRankForwardMatchesPlainLoopReference) {
  for (const auto& cu : packings())
    for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
      for (bool bias : {false, true})
        mlacp::test::expect_single_rank_forward_matches_plain_loop(packed_config(strategy, bias, cu), describe(cu));
}

// Every gradient of the one-rank packed layer equals central finite differences of L = sum(y * dy) along a random
// direction (the reference the distributed gradients are compared with is itself right).
TEST(MlaPackedMath, SingleRankGradientsMatchFiniteDifferences) {
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    auto config = packed_config(strategy, true, {0, 3, 4, 9, 12});
    config.seq = 12;
    mlacp::test::expect_single_rank_gradients_match_finite_differences(config, 2000);
  }
}

// A layout that differs on one rank (other offsets, or another number of documents) makes every rank raise the
// same error at construction, before any collective of the layer.
TEST(MlaPackedErrors, LayoutThatDiffersAcrossRanksRaisesOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto base = packed_config(mlacp::MlaStrategy::latent, false, {0, 5, 6, 20, 32});
  const auto weights = mlacp::test::make_weights<double, Mem>(base, 11);
  const bool odd_one = mesh.rank() == mesh.size() - 1 && mesh.size() > 1;
  const std::vector<std::pair<std::vector<std::int64_t>, std::string>> cases = {
      {{0, 5, 7, 20, 32}, "disagree on cu_seqlens (FNV-1a hash of the offsets)"},
      {{0, 5, 6, 32}, "disagree on cu_seqlens.size()"},
      {{}, "disagree on cu_seqlens.size()"}};
  for (const auto& [other, message] : cases) {
    auto config = base;
    if (odd_one) config.cu_seqlens = other;
    if (mesh.size() == 1) {
      EXPECT_NO_THROW(mlacp::MlaAttention<double>(config, weights, mesh));
      continue;
    }
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::MlaAttention<double>(config, weights, mesh); },
                                                      message);
  }
}

// An invalid cu_seqlens on one rank: every rank raises the error naming the bad entry.
TEST(MlaPackedErrors, InvalidLayoutOnOneRankRaisesOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto base = packed_config(mlacp::MlaStrategy::expanded, false, {0, 5, 6, 20, 32});
  const auto weights = mlacp::test::make_weights<double, Mem>(base, 11);
  const std::vector<std::pair<std::vector<std::int64_t>, std::string>> cases = {
      {{0, 6, 6, 32}, "mlacp::MlaConfig: cu_seqlens[2] = 6 <= cu_seqlens[1] = 6; expected strictly increasing"},
      {{0, 5, 31}, "mlacp::MlaConfig: cu_seqlens[2] = 31; expected the sequence length 32"},
      {{1, 32}, "mlacp::MlaConfig: cu_seqlens[0] = 1; expected 0"},
      {{0}, "mlacp::MlaConfig: cu_seqlens has 1 entries; expected at least 2"}};
  for (const auto& [bad, message] : cases) {
    auto config = base;
    if (mesh.rank() == mesh.size() - 1) config.cu_seqlens = bad;
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::MlaAttention<double>(config, weights, mesh); },
                                                      message);
  }
}

// Per-call packing (forward's cu_seqlens): the layer's configuration has another packing (or none), each forward
// brings its own. Two forwards with different packings are pending at once and their backwards run after both
// (gradient accumulation into one set of gradients); y of each and the accumulated gradients equal the one-rank
// layers configured with those packings over the full sequence. Three rounds, so that the workspaces are reused with
// packings that change.
void expect_per_call_packing_matches_single_rank(mlacp::MlaStrategy strategy, bool bias,
                                                 const std::vector<std::int64_t>& configured) {
  const double tolerance = 1e-10;
  mlacp::Mesh mesh(MPI_COMM_WORLD), self(MPI_COMM_SELF);
  const Space space;
  const auto config = packed_config(strategy, bias, configured);
  const auto weights = mlacp::test::make_weights<double, Mem>(config, 42);
  Tensor3<double> x("x", config.batch, config.seq, config.hidden), dy("dy", config.batch, config.seq, config.hidden);
  mlacp::test::fill(x, 100, 1.0);
  mlacp::test::fill(dy, 200, 1.0);
  const std::vector<std::vector<std::int64_t>> rounds[] = {
      {{0, 5, 6, 20, 32}, {0, 1, 31, 32}}, {random_packing(3, 7), {}}, {{0, 8, 16, 24, 32}, random_packing(21, 5)}};
  mlacp::MlaAttention<double> layer(config, weights, mesh);
  const mlacp::Partition seq(config.seq, mesh.size());
  const auto x_local = mlacp::test::shard(x, seq, mesh.rank()), dy_local = mlacp::test::shard(dy, seq, mesh.rank());
  for (const auto& packings_of_round : rounds) {
    const auto& a = packings_of_round[0];
    const auto& b = packings_of_round[1];
    const std::string what = std::string(mlacp::to_string(strategy)) + (bias ? " bias" : "") + ", configured " +
                             describe(configured) + ", per call " + describe(a) + " and " + describe(b);
    // References: one-rank layers configured with each packing; their gradients summed.
    auto ref_config_a = config, ref_config_b = config;
    ref_config_a.cu_seqlens = a;
    ref_config_b.cu_seqlens = b;
    mlacp::MlaAttention<double> ref_a(ref_config_a, weights, self), ref_b(ref_config_b, weights, self);
    auto ref_fa = ref_a.forward(space, x);
    auto ref_fb = ref_b.forward(space, x);
    mlacp::MlaGradients<double, Mem> ref_grads;
    ref_a.backward(space, ref_fa, dy, ref_grads);
    ref_b.backward(space, ref_fb, dy, ref_grads);

    auto fa = layer.forward(space, x_local, {}, a);
    auto fb = layer.forward(space, x_local, {}, b);
    EXPECT_LE(
        mlacp::test::relative_error(mlacp::test::host_values(fa.output()),
                                    mlacp::test::host_values(mlacp::test::shard(ref_fa.output(), seq, mesh.rank()))),
        tolerance)
        << "y of the first packing, " << what;
    EXPECT_LE(
        mlacp::test::relative_error(mlacp::test::host_values(fb.output()),
                                    mlacp::test::host_values(mlacp::test::shard(ref_fb.output(), seq, mesh.rank()))),
        tolerance)
        << "y of the second packing, " << what;
    mlacp::MlaGradients<double, Mem> grads;
    layer.backward(space, fa, dy_local, grads);
    layer.backward(space, fb, dy_local, grads);
    EXPECT_LE(mlacp::test::relative_error(mlacp::test::host_values(grads.dx),
                                          mlacp::test::host_values(mlacp::test::shard(ref_grads.dx, seq, mesh.rank()))),
              tolerance)
        << "dx, " << what;
    auto expect_sum = [&](const char* name, const auto& got, const auto& want) {
      EXPECT_LE(mlacp::test::relative_error(mlacp::test::sum_over_ranks(mlacp::test::host_values(got)),
                                            mlacp::test::host_values(want)),
                tolerance)
          << name << ", " << what;
    };
    expect_sum("dw_q", grads.w_q, ref_grads.w_q);
    expect_sum("dw_kva", grads.w_kva, ref_grads.w_kva);
    expect_sum("dg_kv", grads.g_kv, ref_grads.g_kv);
    expect_sum("dw_kvb", grads.w_kvb, ref_grads.w_kvb);
    expect_sum("dw_o", grads.w_o, ref_grads.w_o);
    if (bias) {
      expect_sum("db_q", grads.b_q, ref_grads.b_q);
      expect_sum("db_kvb", grads.b_kvb, ref_grads.b_kvb);
      expect_sum("db_o", grads.b_o, ref_grads.b_o);
    }
  }
  // The configuration's packing is still the one forward(space, x, flags) uses.
  mlacp::MlaAttention<double> ref(config, weights, self);
  auto f = layer.forward(space, x_local);
  EXPECT_LE(mlacp::test::relative_error(
                mlacp::test::host_values(f.output()),
                mlacp::test::host_values(mlacp::test::shard(ref.forward(space, x).output(), seq, mesh.rank()))),
            tolerance)
      << "the configured packing after per-call ones";
}

TEST(MlaPackedPerCall, PendingForwardsWithDifferentPackingsMatchSingleRank) {
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    expect_per_call_packing_matches_single_rank(strategy, true, {});
    expect_per_call_packing_matches_single_rank(strategy, false, {0, 16, 32});
  }
}

// Bad per-call offsets on one rank (the last): every rank raises the same error, worded as the configuration's, before
// any collective; valid ones that differ across ranks are refused naming the count or the hash; and packed documents
// for a core that takes no DocumentLayout are refused per call as at construction. The layer still works after.
TEST(MlaPackedPerCall, BadOrDifferingPackingRaisesOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto config = packed_config(mlacp::MlaStrategy::latent, false, {});
  const auto weights = mlacp::test::make_weights<double, Mem>(config, 11);
  mlacp::MlaAttention<double> layer(config, weights, mesh);
  Tensor3<double> x("x", config.batch, layer.local_seq(), config.hidden);
  mlacp::test::fill(x, 4 + mesh.rank(), 1.0);
  const bool last = mesh.rank() == mesh.size() - 1;
  const std::vector<std::pair<std::vector<std::int64_t>, std::string>> bad = {
      {{0, 6, 6, 32}, "mlacp::MlaAttention::forward: cu_seqlens[2] = 6 <= cu_seqlens[1] = 6; expected strictly"},
      {{0, 5, 31}, "mlacp::MlaAttention::forward: cu_seqlens[2] = 31; expected the sequence length 32"},
      {{1, 32}, "mlacp::MlaAttention::forward: cu_seqlens[0] = 1; expected 0"},
      {{0}, "mlacp::MlaAttention::forward: cu_seqlens has 1 entries; expected at least 2"}};
  const std::vector<std::int64_t> good = {0, 5, 6, 20, 32};
  for (const auto& entry : bad) {
    const std::vector<std::int64_t>& offsets = entry.first;  // not a structured binding: the lambda captures it
    mlacp::test::expect_error<mlacp::InvalidArgument>(
        [&] { auto f = layer.forward(Space(), x, {}, last ? offsets : good); }, entry.second);
  }
  if (mesh.size() > 1) {
    mlacp::test::expect_error<mlacp::InvalidArgument>(
        [&] {
          auto f = layer.forward(Space(), x, {}, last ? std::vector<std::int64_t>{0, 5, 7, 20, 32} : good);
        },
        "disagree on cu_seqlens (FNV-1a hash of the offsets)");
    mlacp::test::expect_error<mlacp::InvalidArgument>(
        [&] { auto f = layer.forward(Space(), x, {}, last ? std::vector<std::int64_t>{} : good); },
        "disagree on cu_seqlens.size()");
  }
  auto f = layer.forward(Space(), x, {}, good);
  layer.backward(Space(), f, x);
  EXPECT_EQ(layer.forward_workspaces_in_use(), 0u);
  // The bound on documents without allocation is a count: not positive (on one rank) is refused on every rank.
  auto bad_bound = config;
  if (last) bad_bound.max_documents = 0;
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::MlaAttention<double> other(bad_bound, weights, mesh); },
      "mlacp::MlaConfig: max_documents = 0; expected a positive count of documents");
}

// A core without the documents capability (no capabilities member: the defaults): it runs one document, and the layer
// refuses more than one at construction, on every rank, instead of silently attending across documents.
struct CoreWithoutDocuments {
  mlacp::CausalAttentionCore inner;
  template <class Problem>
  void forward(const Space& space, const Problem& problem) const {
    inner.forward(space, problem);
  }
  template <class Problem>
  void backward(const Space& space, const Problem& problem) const {
    inner.backward(space, problem);
  }
};

TEST(MlaPackedErrors, CoreWithoutDocumentLayoutIsRefusedForSeveralDocuments) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto config = packed_config(mlacp::MlaStrategy::latent, false, {0, 5, 6, 20, 32});
  const auto weights = mlacp::test::make_weights<double, Mem>(config, 11);
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::MlaAttention<double, Space, CoreWithoutDocuments>(config, weights, mesh); },
      "cu_seqlens has 4 documents but the attention core takes no DocumentLayout");
  auto one = config;
  one.cu_seqlens = {0, 32};
  mlacp::MlaAttention<double, Space, CoreWithoutDocuments> layer(one, weights, mesh);
  Tensor3<double> x("x", one.batch, one.seq / mesh.size(), one.hidden);
  mlacp::test::fill(x, 4 + mesh.rank(), 1.0);
  auto f = layer.forward(Space(), x);
  layer.backward(Space(), f, x);
  // Per call: several documents are refused with the constructor's message, one document runs.
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] {
        auto g = layer.forward(Space(), x, {}, {0, 5, 6, 20, 32});
      },
      "cu_seqlens has 4 documents but the attention core takes no DocumentLayout");
  auto g = layer.forward(Space(), x, {}, {0, 32});
  layer.backward(Space(), g, x);
}

}  // namespace
