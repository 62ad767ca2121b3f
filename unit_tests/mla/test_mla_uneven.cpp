// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sequence lengths and head counts that the group size does not divide: rank r holds Partition(S, P).count(r) tokens
// from Partition(S, P).offset(r) and Partition(H, P).count(r) heads (the first S mod P, H mod P ranks one more). The
// distributed layer's forward and every gradient against the same layer on one rank over the full sequence, for
// S in {P*k, P*k+1, P*k+P-1} and H in {P, P+1, 2P-1}, both strategies, float and double, with and without biases, one
// case with packed documents (a document spanning three shards), and the refusal of x of the wrong local extent on
// every rank. Fewer tokens or heads than ranks (empty shards): the block at the end.
#include "layer_reference_checks.hpp"
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/mla/mla_attention.hpp>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
template <class T>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

constexpr int kBlocks = 3;  // k in S = P*k + m

mlacp::MlaConfig uneven_config(mlacp::MlaStrategy strategy, bool bias, int seq, int heads) {
  return mlacp::test::make_config(2, seq, 24, heads, 4, 4, 6, 8, bias, strategy);
}

// A rank's rows of a full tensor by the partition, and a host vector summed over the ranks
// (layer_reference_checks.hpp).
using mlacp::test::shard;
using mlacp::test::sum_over_ranks;

// The distinct values of a list, in order (at P = 1 or 2 some of the S and H choices coincide).
std::vector<int> distinct(std::vector<int> v) {
  std::vector<int> out;
  for (int x : v)
    if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
  return out;
}

struct Case {
  mlacp::MlaStrategy strategy;
  bool bias;
  int q_lora = 0;  // MlaConfig::q_lora_rank (with a softmax scale of 0.3 when set)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(mlacp::to_string(info.param.strategy)) + (info.param.bias ? "_bias" : "_nobias") +
         (info.param.q_lora > 0 ? "_qlora" : "");
}

mlacp::MlaConfig case_config(const Case& c, int seq, int heads) {
  auto config = uneven_config(c.strategy, c.bias, seq, heads);
  config.q_lora_rank = c.q_lora;
  if (c.q_lora > 0) config.softmax_scale = 0.3;
  return config;
}

class MlaUneven : public ::testing::TestWithParam<Case> {};

// One configuration: the distributed layer (two iterations, the second on the buffers of the first) against the
// one-rank layer: y and dx gathered by the partition, every weight gradient summed over the ranks.
template <class T>
void check_configuration(const mlacp::MlaConfig& config, const std::string& what) {
  mlacp::test::expect_matches_single_rank_full_sequence<T>(config, {}, 2, what);
}

template <class T>
void check_splits(const Case& c) {
  const int P = mlacp::test::world_size();
  for (int S : distinct({P * kBlocks, P * kBlocks + 1, P * kBlocks + P - 1}))
    for (int H : distinct({P, P + 1, 2 * P - 1}))
      check_configuration<T>(case_config(c, S, H),
                             "S = " + std::to_string(S) + ", H = " + std::to_string(H) + ", P = " + std::to_string(P));
}

TEST_P(MlaUneven, DoubleMatchesSingleRankFullSequence) { check_splits<double>(GetParam()); }
TEST_P(MlaUneven, FloatMatchesSingleRankFullSequence) { check_splits<float>(GetParam()); }

// Packed documents on an uneven split: the RoPE positions restart per document from the rank's partition offset, and
// the document [3, S - 2) spans three shards or more at P >= 3.
TEST_P(MlaUneven, PackedDocumentsOnAnUnevenSplit) {
  const int P = mlacp::test::world_size();
  const int S = std::max(4 * P + 1, 7), H = P + 1;
  auto config = case_config(GetParam(), S, H);
  config.cu_seqlens = {0, 1, 3, S - 2, S};
  const std::string what = "S = " + std::to_string(S) + ", H = " + std::to_string(H) + ", cu_seqlens {0,1,3," +
                           std::to_string(S - 2) + "," + std::to_string(S) + "}";
  check_configuration<double>(config, what);
  check_configuration<float>(config, what);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
    for (bool bias : {false, true}) cases.push_back({strategy, bias});
  cases.push_back({mlacp::MlaStrategy::latent, true, 10});
  cases.push_back({mlacp::MlaStrategy::expanded, false, 10});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaUneven, ::testing::ValuesIn(all_cases()), case_name);

// The split is the documented one: the first S mod P ranks hold one token more (and heads likewise).
TEST(MlaUnevenSplit, FirstRanksHoldOneMore) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int P = mesh.size();
  const auto config = uneven_config(mlacp::MlaStrategy::latent, false, 3 * P + P - 1, 2 * P - 1);
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 1), mesh);
  const int r = mesh.rank();
  EXPECT_EQ(layer.local_seq(), 3 + (r < P - 1 ? 1 : 0));
  EXPECT_EQ(layer.local_heads(), 1 + (r < P - 1 ? 1 : 0));
  EXPECT_EQ(layer.seq_partition().offset(r), 4 * r - std::max(0, r - (P - 1)));
}

// x of another local extent than this rank's count raises on every rank before any collective: every rank wrong
// (the even share floor(S/P) + 1 everywhere), and only the last rank wrong.
TEST(MlaUnevenErrors, WrongLocalExtentRaisesOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int P = mesh.size();
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    const auto config = uneven_config(strategy, true, 3 * P + 1, P + 1);
    mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 1), mesh);
    const int s = layer.local_seq();
    // The call's S is the sum of the ranks' shards (issue 34): one token more on every rank is S + P, past the
    // configuration's seq (a maximum).
    Tensor3<double> wrong("x", config.batch, s + 1, config.hidden);
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { layer.forward(Space(), wrong); },
                                                      "x brings S = " + std::to_string(config.seq + P) + " tokens");
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { layer.forward(Space(), wrong); },
                                                      "bounds seq at " + std::to_string(config.seq));
    // The sum right but not the split: every rank raises the message naming the first rank whose shard is not the
    // token map's (rank 0's, with its count).
    if (P > 1) {
      const int mine = s - (mesh.rank() == 0 ? 1 : 0) + (mesh.rank() == P - 1 ? 1 : 0);
      Tensor3<double> x("x", config.batch, mine, config.hidden);
      mlacp::test::fill(x, 3, 1.0);
      mlacp::test::expect_error<mlacp::InvalidArgument>(
          [&] { layer.forward(Space(), x); }, "x of rank 0 holds " +
                                                  std::to_string(layer.seq_partition().count(0) - 1) +
                                                  " tokens, but the ranks bring S = " + std::to_string(config.seq) +
                                                  " and the token map of that S gives rank 0 (ring 0, Ulysses 0) " +
                                                  std::to_string(layer.seq_partition().count(0)));
    }
    // x of the wrong width is refused by the input check, on every rank.
    Tensor3<double> narrow("x", config.batch, s, config.hidden + 1);
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { layer.forward(Space(), narrow); }, "x has shape");
    // The layer still runs afterwards, and dy of the wrong extent raises likewise.
    Tensor3<double> good("x", config.batch, s, config.hidden);
    mlacp::test::fill(good, 4, 1.0);
    auto f = layer.forward(Space(), good);
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { layer.backward(Space(), f, wrong); }, "dy has shape");
  }
}

// ---- Empty shards: S < P and/or H < P leave some ranks with no token and/or no head ----
// Rank r then holds Partition(S, P).count(r) = 0 tokens (r >= S) or 0 heads (r >= H); it still takes part in every
// collective. y, dx and every weight gradient against the one-rank full-sequence layer, for S in {1, P-1} and H in
// {1, P-1}, each alone (with the other extent >= P) and together, both strategies, float and double, with and without
// biases; and packed documents over fewer tokens than ranks.

// The positive values of a list, distinct, in order (at P = 1, P - 1 = 0 is no size; at P = 2, 1 and P - 1 coincide).
std::vector<int> positive_sizes(std::vector<int> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](int x) { return x < 1; }), v.end());
  return distinct(std::move(v));
}

template <class T>
void check_empty_shards(const Case& c) {
  const int P = mlacp::test::world_size();
  const std::vector<int> few = positive_sizes({1, P - 1});
  const int many_seq = 3 * P + 1, many_heads = P + 1;
  std::vector<std::pair<int, int>> splits;  // (S, H)
  for (int S : few) splits.emplace_back(S, many_heads);
  for (int H : few) splits.emplace_back(many_seq, H);
  for (int S : few)
    for (int H : few) splits.emplace_back(S, H);
  for (const auto& [S, H] : splits)
    check_configuration<T>(case_config(c, S, H),
                           "S = " + std::to_string(S) + ", H = " + std::to_string(H) + ", P = " + std::to_string(P));
}

class MlaEmptyShards : public ::testing::TestWithParam<Case> {};

TEST_P(MlaEmptyShards, DoubleMatchesSingleRankFullSequence) { check_empty_shards<double>(GetParam()); }
TEST_P(MlaEmptyShards, FloatMatchesSingleRankFullSequence) { check_empty_shards<float>(GetParam()); }

// Packed documents {0, 1, S} over S = max(P - 1, 3) tokens (fewer than the ranks from P = 4 on; the second document
// has two tokens or more, else every query attends to itself only and dq is exactly 0), and H = P - 1 heads.
TEST_P(MlaEmptyShards, PackedDocumentsOverFewerTokensThanRanks) {
  const int P = mlacp::test::world_size();
  const int S = std::max(P - 1, 3), H = std::max(P - 1, 1);
  auto config = case_config(GetParam(), S, H);
  config.cu_seqlens = {0, 1, S};
  const std::string what = "S = " + std::to_string(S) + ", H = " + std::to_string(H) + ", P = " + std::to_string(P) +
                           ", cu_seqlens {0,1," + std::to_string(S) + "}";
  check_configuration<double>(config, what);
  check_configuration<float>(config, what);
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaEmptyShards, ::testing::ValuesIn(all_cases()), case_name);

// Empty shards under the blocking schedule (overlap = false) and with some gradients only (the collectives a flag
// set skips are skipped on every rank alike), in double, both strategies, with biases.
TEST(MlaEmptyShardsVariants, BlockingScheduleAndPartialGradients) {
  const int P = mlacp::test::world_size();
  auto flags_with = [](std::initializer_list<bool mlacp::MlaRequiresGrad::*> members) {
    auto r = mlacp::MlaRequiresGrad::none();
    for (auto m : members) r.*m = true;
    return r;
  };
  using R = mlacp::MlaRequiresGrad;
  const std::vector<std::pair<std::string, R>> flag_sets = {{"no input gradient",
                                                             [] {
                                                               R r;
                                                               r.x = false;
                                                               return r;
                                                             }()},
                                                            {"output projection only", flags_with({&R::w_o, &R::b_o})},
                                                            {"kv only", flags_with({&R::w_kvb, &R::b_kvb, &R::w_kva})},
                                                            {"q only", flags_with({&R::w_q, &R::b_q})}};
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
    for (const auto& [S, H] : {std::pair<int, int>{std::max(P - 1, 1), 1}, {1, std::max(P - 1, 1)}}) {
      auto config = uneven_config(strategy, true, S, H);
      const std::string what = std::string(mlacp::to_string(strategy)) + " S = " + std::to_string(S) +
                               ", H = " + std::to_string(H) + ", P = " + std::to_string(P);
      config.overlap = false;
      mlacp::test::expect_matches_single_rank_full_sequence<double>(config, {}, 2, what + ", blocking");
      config.overlap = true;
      for (const auto& [name, flags] : flag_sets)
        mlacp::test::expect_matches_single_rank_full_sequence<double>(config, flags, 1, what + ", " + name);
    }
}

// The ranks past S hold no token and those past H no head; H below 1 and S below 0 are still refused.
TEST(MlaEmptyShardsSplit, RanksPastTheExtentHoldNothing) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int P = mesh.size(), r = mesh.rank();
  const auto config = uneven_config(mlacp::MlaStrategy::expanded, false, 1, 1);
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 1), mesh);
  EXPECT_EQ(layer.local_seq(), r == 0 ? 1 : 0);
  EXPECT_EQ(layer.local_heads(), r == 0 ? 1 : 0);
  EXPECT_EQ(layer.seq_partition().offset(r), r == 0 ? 0 : 1);
  EXPECT_EQ(layer.head_partition().count(P - 1), P == 1 ? 1 : 0);
  // seq is a maximum (issue 34): 0 is unset, a negative one is refused.
  auto bad = uneven_config(mlacp::MlaStrategy::latent, false, -1, 1);
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::MlaAttention<double>(bad, mlacp::test::make_weights<double, Mem>(bad, 1), mesh); },
      "seq = -1; expected 0 (unset: a call brings any) or a positive maximum");
  bad = uneven_config(mlacp::MlaStrategy::latent, false, 1, 0);
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::MlaAttention<double>(bad, mlacp::test::make_weights<double, Mem>(bad, 1), mesh); },
      "heads = 0; expected a positive size");
}

}  // namespace
