// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The overlap schedule of the MLA forward and backward, read from the event recorder, and the layer's misuse errors.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mla/names.hpp>

#include <sstream>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Tensor3 = Kokkos::View<double***, Kokkos::LayoutRight, Mem>;
using mlacp::EventKind;

mlacp::MlaConfig config_for(mlacp::MlaStrategy strategy, int P) {
  return mlacp::test::make_config(2, 8 * P, 16, 2 * P, 4, 2, 3, 6, true, strategy);
}

struct Recorded {
  std::vector<mlacp::Event> events;
  std::string dump() const {
    std::ostringstream out;
    for (const auto& e : events) out << "  " << mlacp::to_string(e.kind) << " " << e.name << "\n";
    return out.str();
  }
  std::ptrdiff_t at(EventKind kind, const std::string& name) const { return mlacp::events::find(events, kind, name); }
  bool has(EventKind kind, const std::string& name) const { return at(kind, name) >= 0; }
  // The positions of every event of `kind` named `name`, in recorded order.
  std::vector<std::ptrdiff_t> all(EventKind kind, const std::string& name) const {
    std::vector<std::ptrdiff_t> found;
    for (std::size_t i = 0; i < events.size(); ++i)
      if (events[i].kind == kind && events[i].name == name) found.push_back(static_cast<std::ptrdiff_t>(i));
    return found;
  }
  // `collective` is launched before compute `phase` begins and waited after it ends.
  void expect_overlap(const std::string& collective, const std::string& phase) const {
    const auto launch = at(EventKind::launch, collective), wait = at(EventKind::wait_begin, collective);
    const auto begin = at(EventKind::compute_begin, phase), end = at(EventKind::compute_end, phase);
    ASSERT_GE(launch, 0) << collective << " never launched\n" << dump();
    ASSERT_GE(wait, 0) << collective << " never waited\n" << dump();
    ASSERT_GE(begin, 0) << phase << " never ran\n" << dump();
    EXPECT_LT(launch, begin) << collective << " must be launched before " << phase << " begins\n" << dump();
    EXPECT_GT(wait, end) << collective << " must be waited after " << phase << " ends\n" << dump();
  }
};

// Runs one forward + backward with the recorder on and returns the backward's events.
Recorded record_backward(mlacp::MlaStrategy strategy, const mlacp::MlaRequiresGrad& flags, bool overlap = true) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  auto config = config_for(strategy, mesh.size());
  config.overlap = overlap;
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 7), mesh);
  Tensor3 x("x", config.batch, config.seq / mesh.size(), config.hidden);
  Tensor3 dy("dy", config.batch, config.seq / mesh.size(), config.hidden);
  mlacp::test::fill(x, 1 + mesh.rank(), 1.0);
  mlacp::test::fill(dy, 11 + mesh.rank(), 1.0);
  auto forward = layer.forward(Space(), x, flags);
  mlacp::events::clear();
  mlacp::events::enable(true);
  layer.backward(Space(), forward, dy);
  mlacp::events::enable(false);
  return Recorded{mlacp::events::snapshot()};
}

// Runs one forward with the recorder on and returns its events.
Recorded record_forward(mlacp::MlaStrategy strategy, bool overlap = true, int q_lora_rank = 0) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  auto config = config_for(strategy, mesh.size());
  config.overlap = overlap;
  config.q_lora_rank = q_lora_rank;
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 7), mesh);
  Tensor3 x("x", config.batch, config.seq / mesh.size(), config.hidden);
  mlacp::test::fill(x, 1 + mesh.rank(), 1.0);
  mlacp::events::clear();
  mlacp::events::enable(true);
  const auto forward = layer.forward(Space(), x);
  mlacp::events::enable(false);
  EXPECT_EQ(forward.output().extent(0), static_cast<std::size_t>(config.batch));
  return Recorded{mlacp::events::snapshot()};
}

// The O exchange is per peer: P - 1 receives (at P == 1 the all-to-all's local copy), and w_o runs once per source
// block, the own block's before the first wait and each received block's after its wait and before the next wait: the
// GEMMs of the blocks that arrived run while the others are in flight.
void expect_output_projection_per_source(const Recorded& r, int P, bool overlap) {
  const auto launches = r.all(EventKind::launch, mlacp::names::o_a2a);
  const auto waits = r.all(EventKind::wait_end, mlacp::names::o_a2a);
  const auto gemms = r.all(EventKind::compute_begin, mlacp::names::w_o_fprop);
  ASSERT_EQ(gemms.size(), static_cast<std::size_t>(P)) << "one w_o GEMM per source rank\n" << r.dump();
  if (P == 1) {
    // Nothing to exchange: the all-to-all's local copy, waited before the one GEMM.
    ASSERT_EQ(waits.size(), 1u) << r.dump();
    EXPECT_LT(waits.front(), gemms.front()) << r.dump();
    return;
  }
  ASSERT_EQ(launches.size(), static_cast<std::size_t>(P - 1)) << r.dump();
  ASSERT_EQ(waits.size(), static_cast<std::size_t>(P - 1)) << r.dump();
  EXPECT_LT(launches.back(), gemms.front()) << "every block is on its way before the first GEMM\n" << r.dump();
  // O leaves as it is computed: the attention runs per owner's query rows, peer (rank + k)'s block right before its
  // send leaves and the next block while it travels; the own rows last, before the first GEMM.
  const auto attention_begins = r.all(EventKind::compute_begin, mlacp::names::attention_fprop);
  const auto attention_ends = r.all(EventKind::compute_end, mlacp::names::attention_fprop);
  ASSERT_EQ(attention_begins.size(), static_cast<std::size_t>(P)) << "one attention block per owner\n" << r.dump();
  ASSERT_EQ(attention_ends.size(), static_cast<std::size_t>(P)) << r.dump();
  for (std::size_t k = 0; k + 1 < static_cast<std::size_t>(P); ++k) {
    EXPECT_LT(attention_ends[k], launches[k]) << "block " << k + 1 << " is sent once computed\n" << r.dump();
    EXPECT_LT(launches[k], attention_begins[k + 1]) << "block " << k + 1 << " travels while the next is computed\n"
                                                    << r.dump();
  }
  EXPECT_LT(attention_ends.back(), gemms.front()) << "the own rows are computed before their GEMM\n" << r.dump();
  if (!overlap) {
    EXPECT_LT(waits.back(), gemms.front()) << "blocking: every exchange waited before the GEMMs\n" << r.dump();
    return;
  }
  EXPECT_LT(gemms.front(), r.all(EventKind::wait_begin, mlacp::names::o_a2a).front())
      << "the own block's GEMM runs before any wait\n"
      << r.dump();
  for (std::size_t k = 0; k < waits.size(); ++k) {
    EXPECT_LT(waits[k], gemms[k + 1]) << "block " << k + 1 << "'s GEMM after its wait\n" << r.dump();
    if (k + 1 < waits.size()) {
      EXPECT_LT(gemms[k + 1], waits[k + 1]) << "block " << k + 1 << "'s GEMM before the next wait\n" << r.dump();
    }
  }
}

TEST(MlaSchedule, LatentForwardHidesTheGatherBehindQAndQBehindTheExpansion) {
  int P = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  for (const int q_lora_rank : {0, 4}) {
    const auto r = record_forward(mlacp::MlaStrategy::latent, true, q_lora_rank);
    // The payload is projected first and its all-gather leaves before the Q projection, which runs while it is in
    // flight; Q's all-to-all leaves next and the w_kvb expansion runs while it is in flight.
    EXPECT_LT(r.at(EventKind::compute_end, mlacp::names::w_kva_fprop),
              r.at(EventKind::launch, mlacp::names::payload_all_gather))
        << r.dump();
    r.expect_overlap(mlacp::names::payload_all_gather, mlacp::names::w_q_fprop);
    r.expect_overlap(mlacp::names::q_a2a, mlacp::names::w_kvb_fprop);
    EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::payload_all_gather),
              r.at(EventKind::compute_begin, mlacp::names::w_kvb_fprop))
        << r.dump();
    EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::q_a2a),
              r.at(EventKind::compute_begin, mlacp::names::attention_fprop))
        << r.dump();
    expect_output_projection_per_source(r, P, true);
  }
}

TEST(MlaSchedule, ExpandedForwardConsumesTheOutputBlocksAsTheyArrive) {
  int P = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const auto r = record_forward(mlacp::MlaStrategy::expanded);
  expect_output_projection_per_source(r, P, true);
}

TEST(MlaSchedule, BlockingBaselineForwardWaitsEachCollectiveAtItsLaunch) {
  int P = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const auto r = record_forward(mlacp::MlaStrategy::latent, false);
  EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::payload_all_gather),
            r.at(EventKind::compute_begin, mlacp::names::w_q_fprop))
      << r.dump();
  EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::q_a2a), r.at(EventKind::compute_begin, mlacp::names::w_kvb_fprop))
      << r.dump();
  expect_output_projection_per_source(r, P, false);
}

TEST(MlaSchedule, LatentBackwardOverlapsEachCollectiveWithItsIndependentCompute) {
  const auto r = record_backward(mlacp::MlaStrategy::latent, {});
  r.expect_overlap(mlacp::names::do_a2a, mlacp::names::w_o_wgrad);
  r.expect_overlap(mlacp::names::dq_a2a, mlacp::names::kv_backward);
  r.expect_overlap(mlacp::names::latent_reduce_scatter, mlacp::names::w_kvb_wgrad);
  // dQ's wait comes before the Q projection's backward.
  EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::dq_a2a), r.at(EventKind::compute_begin, mlacp::names::q_backward))
      << r.dump();
  // The reduce-scatter, launched after dQ (and behind it on a shared link), stays in flight through the Q branch's
  // backward and is waited last, right before the payload's backward that needs it.
  r.expect_overlap(mlacp::names::latent_reduce_scatter, mlacp::names::q_backward);
  EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::latent_reduce_scatter),
            r.at(EventKind::compute_begin, mlacp::names::payload_backward))
      << r.dump();
}

TEST(MlaSchedule, ExpandedBackwardLaunchesAllInversesThenWaitsQFirst) {
  const auto r = record_backward(mlacp::MlaStrategy::expanded, {});
  r.expect_overlap(mlacp::names::do_a2a, mlacp::names::w_o_wgrad);
  for (const char* name : {mlacp::names::dq_a2a, mlacp::names::dk_a2a, mlacp::names::dv_a2a})
    EXPECT_LT(r.at(EventKind::launch, name), r.at(EventKind::compute_begin, mlacp::names::q_backward)) << name << "\n"
                                                                                                       << r.dump();
  r.expect_overlap(mlacp::names::dk_a2a, mlacp::names::q_backward);
  r.expect_overlap(mlacp::names::dv_a2a, mlacp::names::q_backward);
  EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::dk_a2a), r.at(EventKind::compute_begin, mlacp::names::k_backward))
      << r.dump();
  EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::dv_a2a), r.at(EventKind::compute_begin, mlacp::names::v_backward))
      << r.dump();
  EXPECT_LT(r.at(EventKind::compute_end, mlacp::names::k_backward), r.at(EventKind::wait_begin, mlacp::names::dv_a2a))
      << r.dump();
}

TEST(MlaSchedule, BlockingBaselineWaitsEachCollectiveBeforeTheCompute) {
  const auto r = record_backward(mlacp::MlaStrategy::latent, {}, false);
  EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::do_a2a), r.at(EventKind::compute_begin, mlacp::names::w_o_wgrad))
      << r.dump();
  EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::dq_a2a), r.at(EventKind::compute_begin, mlacp::names::kv_backward))
      << r.dump();
  EXPECT_LT(r.at(EventKind::wait_end, mlacp::names::latent_reduce_scatter),
            r.at(EventKind::compute_begin, mlacp::names::w_kvb_wgrad))
      << r.dump();
}

TEST(MlaSchedule, SkippedGradientsLaunchNothing) {
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    // Only the output projection trains: no collective of the schedule at all in backward (the checked-mode
    // agreement on dy's shape is the only communication), and no attention backward.
    auto only_o = mlacp::MlaRequiresGrad::none();
    only_o.w_o = only_o.b_o = true;
    auto r = record_backward(strategy, only_o);
    for (const auto& e : r.events) {
      if (e.name.find("(checked-mode agreement)") == std::string::npos) {
        EXPECT_NE(e.kind, EventKind::launch) << e.name << "\n" << r.dump();
      }
    }
    EXPECT_FALSE(r.has(EventKind::compute_begin, mlacp::names::attention_bprop)) << r.dump();
    EXPECT_TRUE(r.has(EventKind::compute_begin, mlacp::names::w_o_wgrad)) << r.dump();

    // No gradient for x, w_q, b_q: the dQ inverse is never launched (nor waited).
    auto no_q = mlacp::MlaRequiresGrad{};
    no_q.x = no_q.w_q = no_q.b_q = false;
    r = record_backward(strategy, no_q);
    EXPECT_FALSE(r.has(EventKind::launch, mlacp::names::dq_a2a)) << r.dump();
    EXPECT_FALSE(r.has(EventKind::wait_begin, mlacp::names::dq_a2a)) << r.dump();
    EXPECT_TRUE(r.has(EventKind::launch, mlacp::names::do_a2a)) << r.dump();

    // Frozen w_o/b_o: no w_o wgrad.
    auto frozen_o = mlacp::MlaRequiresGrad{};
    frozen_o.w_o = frozen_o.b_o = false;
    r = record_backward(strategy, frozen_o);
    EXPECT_FALSE(r.has(EventKind::compute_begin, mlacp::names::w_o_wgrad)) << r.dump();
  }
  // Latent: no gradient for x, w_kva, g_kv: the reduce-scatter is skipped, the w_kvb wgrad still runs.
  auto no_payload = mlacp::MlaRequiresGrad{};
  no_payload.x = no_payload.w_kva = no_payload.g_kv = false;
  const auto r = record_backward(mlacp::MlaStrategy::latent, no_payload);
  EXPECT_FALSE(r.has(EventKind::launch, mlacp::names::latent_reduce_scatter)) << r.dump();
  EXPECT_TRUE(r.has(EventKind::compute_begin, mlacp::names::w_kvb_wgrad)) << r.dump();
}

// ---- misuse -------------------------------------------------------------------------------------------------------

using mlacp::test::expect_error;

TEST(MlaMisuse, BackwardBeforeForwardAndSecondBackward) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto config = config_for(mlacp::MlaStrategy::latent, mesh.size());
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 7), mesh);
  Tensor3 x("x", config.batch, config.seq / mesh.size(), config.hidden), dy = x;
  mlacp::MlaAttention<double>::Forward empty;
  expect_error<mlacp::UsageError>([&] { layer.backward(Space(), empty, dy); }, "backward before forward");
  auto forward = layer.forward(Space(), x);
  layer.backward(Space(), forward, dy);
  expect_error<mlacp::UsageError>([&] { layer.backward(Space(), forward, dy); },
                                  "a second backward of the same forward");
  // A Forward of another layer.
  mlacp::MlaAttention<double> other(config, mlacp::test::make_weights<double, Mem>(config, 8), mesh);
  auto foreign = other.forward(Space(), x);
  expect_error<mlacp::UsageError>([&] { layer.backward(Space(), foreign, dy); }, "produced by another MlaAttention");
  other.backward(Space(), foreign, dy);
}

TEST(MlaMisuse, OnlyOneRankMisusesButEveryRankRaises) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks";
  const auto config = config_for(mlacp::MlaStrategy::latent, mesh.size());
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 7), mesh);
  Tensor3 x("x", config.batch, config.seq / mesh.size(), config.hidden), dy = x;
  auto forward = layer.forward(Space(), x);
  mlacp::MlaAttention<double>::Forward empty;
  const bool bad = mesh.rank() == mesh.size() - 1;
  expect_error<mlacp::UsageError>([&] { layer.backward(Space(), bad ? empty : forward, dy); },
                                  "backward before forward");
  // The healthy ranks' forward was not consumed: it can still be used.
  EXPECT_FALSE(forward.backward_done());
  layer.backward(Space(), forward, dy);
}

TEST(MlaMisuse, WeightsAndInputsThatDisagreeWithTheConfiguration) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto config = config_for(mlacp::MlaStrategy::latent, mesh.size());
  auto weights = mlacp::test::make_weights<double, Mem>(config, 1);
  weights.w_kvb = decltype(weights.w_kvb)("w_kvb", weights.w_kvb.extent(0) + 1, weights.w_kvb.extent(1));
  expect_error<mlacp::InvalidArgument>([&] { mlacp::MlaAttention<double>(config, weights, mesh); },
                                       "weight w_kvb has shape [" + std::to_string(weights.w_kvb.extent(0)) + ", 6]");
  auto no_bias = config;
  no_bias.bias = false;
  expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::MlaAttention<double>(no_bias, mlacp::test::make_weights<double, Mem>(config, 1), mesh); },
      "weight b_q has extent");
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 1), mesh);
  const auto s = std::to_string(layer.local_seq());
  Tensor3 wrong("x", config.batch, layer.local_seq(), config.hidden + 1);
  expect_error<mlacp::InvalidArgument>([&] { layer.forward(Space(), wrong); },
                                       "x has shape [2, " + s + ", 17]; expected [B, s, D] = [2, " + s + ", 16]");
}

TEST(MlaMisuse, InputsThatDifferAcrossRanks) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks";
  const auto config = config_for(mlacp::MlaStrategy::latent, mesh.size());
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 1), mesh);
  Tensor3 x("x", config.batch, config.seq / mesh.size(), config.hidden);
  auto flags = mlacp::MlaRequiresGrad{};
  flags.x = mesh.rank() != 0;  // rank 0 would skip the dQ inverse that the others launch: a hang without the check
  expect_error<mlacp::InvalidArgument>([&] { layer.forward(Space(), x, flags); },
                                       "the ranks of the mesh disagree on the gradient flags");
}

TEST(MlaMisuse, PairedConsumerThatNeverLaunchedItsInverse) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mlacp::InputA2APair<double, Space> pair(mesh, "Q");
  Kokkos::View<double****, Kokkos::LayoutRight, Mem> q("q", 1, 2, 2 * mesh.size(), 3);
  pair.launch_forward(Space(), q, true);
  auto heads = pair.wait_forward();
  expect_error<mlacp::UsageError>([&] { pair.wait_backward(Space()); },
                                  "MLA input consumer did not submit its inverse A2A");
  pair.launch_backward(Space(), heads);
  EXPECT_EQ(pair.wait_backward(Space()).extent(1), 2u);
  // A pair whose input needs no gradient launches nothing and returns an empty View.
  mlacp::InputA2APair<double, Space> frozen(mesh, "K");
  frozen.launch_forward(Space(), q, false);
  frozen.launch_backward(Space(), frozen.wait_forward());
  EXPECT_EQ(frozen.wait_backward(Space()).data(), nullptr);
}

TEST(MlaMisuse, AbandonedBackwardLeaksNoRequest) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto before = mlacp::diagnostics::unwaited_handles();
  ::testing::internal::CaptureStderr();
  {
    mlacp::InputA2APair<double, Space> pair(mesh, "Q");
    Kokkos::View<double****, Kokkos::LayoutRight, Mem> q("q", 1, 2, 2 * mesh.size(), 3);
    pair.launch_forward(Space(), q, true);
    pair.launch_backward(Space(), pair.wait_forward());
    // Abandoned here (as by an exception half-way through a backward): the destructor completes the inverse.
  }
  const auto err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(mlacp::diagnostics::unwaited_handles(), before + 1);
  EXPECT_NE(err.find("collective 'dQ a2a' was launched but never waited"), std::string::npos) << err;
}

}  // namespace
