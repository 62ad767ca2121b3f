// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Steady state without churn: after the first iteration, forward + backward allocate no communication buffer and no
// View of the layer's own (counted through the Kokkos Tools allocate callback, diagnostics::count_view_allocations).
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/diagnostics.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/progress.hpp>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// The labels of the collectives' own results (a collective without a destination allocates its result under its
// name). The layer gives every collective a destination in its memory, so a steady iteration allocates none of these.
const std::set<std::string> collective_results = {mlacp::names::q_a2a,
                                                  mlacp::names::k_a2a,
                                                  mlacp::names::v_a2a,
                                                  mlacp::names::o_a2a,
                                                  mlacp::names::payload_all_gather,
                                                  mlacp::names::do_a2a,
                                                  mlacp::names::dq_a2a,
                                                  mlacp::names::dk_a2a,
                                                  mlacp::names::dv_a2a,
                                                  mlacp::names::latent_reduce_scatter};

struct Counted {
  std::uint64_t first = 0;  // View allocations of the warm-up iteration (the counter sees the layer's allocations)
  std::uint64_t buffers = 0, views = 0, collective_results = 0;
  std::vector<std::string> other_labels;  // labels of allocations that are neither collective results nor expected
};

std::string joined(const std::vector<std::string>& labels) {
  std::ostringstream out;
  for (const auto& l : labels) out << " '" << l << "'";
  return out.str();
}

// Runs `step` once (warm-up), then `iterations` more times, and counts what those allocated.
template <class Step>
Counted count_steady(Step step, int iterations, const std::set<std::string>& expected_labels) {
  Counted c;
  const auto before_first = mlacp::diagnostics::view_allocations();
  step();
  c.first = mlacp::diagnostics::view_allocations() - before_first;
  const auto buffers = mlacp::diagnostics::communication_buffer_allocations();
  for (int i = 0; i < iterations; ++i) {
    const auto views = mlacp::diagnostics::view_allocations();
    step();
    const auto n = mlacp::diagnostics::view_allocations() - views;
    c.views += n;
    const auto labels = mlacp::diagnostics::recent_view_allocations();
    // The last n labels are this iteration's (the log keeps 64; more than that is reported as unlabelled).
    for (std::uint64_t k = 0; k < n; ++k) {
      if (n > labels.size()) {
        c.other_labels.push_back("(more allocations than the label log keeps)");
        break;
      }
      const auto& label = labels[labels.size() - n + k];
      if (collective_results.count(label))
        ++c.collective_results;
      else if (!expected_labels.count(label))
        c.other_labels.push_back(label);
    }
  }
  c.buffers = mlacp::diagnostics::communication_buffer_allocations() - buffers;
  return c;
}

mlacp::MlaGradients<double, Mem> caller_gradients(const mlacp::MlaConfig& c, int local_seq) {
  mlacp::MlaGradients<double, Mem> g;
  static_cast<mlacp::MlaParameters<double, Mem>&>(g) = mlacp::MlaParameters<double, Mem>::allocate(c, "my ");
  g.dx = decltype(g.dx)("my dx", c.batch, local_seq, c.hidden);
  return g;
}

TEST(SteadyState, CommunicationBuffersAreReusedAfterTheFirstIteration) {
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    mlacp::Mesh mesh(MPI_COMM_WORLD);
    const auto c = mlacp::test::make_config(2, 8 * mesh.size(), 16, 2 * mesh.size(), 4, 2, 3, 6, true, strategy);
    mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh);
    Kokkos::View<double***, Kokkos::LayoutRight, Mem> x("x", c.batch, c.seq / mesh.size(), c.hidden);
    mlacp::test::fill(x, 4, 1.0);
    auto step = [&] {
      auto forward = layer.forward(Space(), x);
      layer.backward(Space(), forward, x);
    };
    const auto before = mlacp::diagnostics::communication_buffer_allocations();
    step();
    const auto after_first = mlacp::diagnostics::communication_buffer_allocations();
    if (mesh.size() > 1)
      EXPECT_GT(after_first, before) << "the first iteration communicates, so it allocates its buffers";
    else
      EXPECT_EQ(after_first, before) << "P = 1 sends nothing and needs no buffer";
    for (int i = 0; i < 4; ++i) step();
    EXPECT_EQ(mlacp::diagnostics::communication_buffer_allocations(), after_first)
        << mlacp::to_string(strategy) << ": iterations 2-5 allocated communication buffers";
    EXPECT_EQ(mlacp::pending_collectives(), 0u);
  }
}

// The counter itself: it sees a View allocation, with its label, and nothing when nothing is allocated.
TEST(SteadyState, ViewAllocationCounterSeesEveryView) {
  ASSERT_TRUE(mlacp::diagnostics::count_view_allocations());
  const auto before = mlacp::diagnostics::view_allocations();
  const auto bytes = mlacp::diagnostics::view_allocation_bytes();
  Kokkos::View<double**, Mem> a("steady-state probe", 3, 5);
  EXPECT_EQ(mlacp::diagnostics::view_allocations(), before + 1);
  EXPECT_GE(mlacp::diagnostics::view_allocation_bytes(), bytes + 15 * sizeof(double));
  EXPECT_EQ(mlacp::diagnostics::recent_view_allocations().back(), "steady-state probe");
  auto copy = a;  // a copy is not an allocation
  EXPECT_EQ(mlacp::diagnostics::view_allocations(), before + 1);
  EXPECT_TRUE(mlacp::diagnostics::count_view_allocations()) << "idempotent";
  EXPECT_EQ(copy.use_count(), 2);
}

// Live bytes and their high-water mark: an allocation raises both, its release lowers the live bytes only, and a
// reset starts the mark at the live bytes.
TEST(SteadyState, ViewLiveAndPeakBytesFollowAllocationsAndReleases) {
  ASSERT_TRUE(mlacp::diagnostics::count_view_allocations());
  Kokkos::fence();
  const auto live = mlacp::diagnostics::view_live_bytes();
  mlacp::diagnostics::reset_view_peak_bytes();
  EXPECT_EQ(mlacp::diagnostics::view_peak_bytes(), live);
  {
    Kokkos::View<double*, Mem> a("peak probe a", 1000);
    EXPECT_GE(mlacp::diagnostics::view_live_bytes(), live + 1000 * sizeof(double));
    {
      Kokkos::View<double*, Mem> b("peak probe b", 3000);
      EXPECT_GE(mlacp::diagnostics::view_live_bytes(), live + 4000 * sizeof(double));
    }
    EXPECT_GE(mlacp::diagnostics::view_live_bytes(), live + 1000 * sizeof(double));
    EXPECT_LT(mlacp::diagnostics::view_live_bytes(), live + 4000 * sizeof(double)) << "b's release was not counted";
    auto copy = a;  // a copy neither allocates nor, when it goes, releases
    EXPECT_EQ(copy.use_count(), 2);
  }
  EXPECT_EQ(mlacp::diagnostics::view_live_bytes(), live) << "every probe released";
  EXPECT_GE(mlacp::diagnostics::view_peak_bytes(), live + 4000 * sizeof(double)) << "a and b were live together";
  mlacp::diagnostics::reset_view_peak_bytes();
  EXPECT_EQ(mlacp::diagnostics::view_peak_bytes(), live);
}

// Forward + backward into caller-provided gradient Views: iterations 2..N allocate no View at all (the layer's
// buffers and the collectives' results live in the layer's memory) and no communication buffer. Both strategies,
// with and without biases, one document and packed documents (cu_seqlens: the RoPE positions are built once), and S
// and H that P does not divide (the uneven collectives reuse their buffers too).
TEST(SteadyState, ForwardBackwardIntoCallerGradientsAllocatesNoView) {
  ASSERT_TRUE(mlacp::diagnostics::count_view_allocations());
  const int P = mlacp::test::world_size();
  // Flat, and ring attention on rings of P (issue 21): its chunk buffers and accumulators are the layer's too.
  for (const int ring : {1, P})
    for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
      mlacp::Mesh mesh(MPI_COMM_WORLD, ring);
      for (int variant = 0; variant < 4; ++variant) {
        const bool bias = variant == 1;
        auto c = mlacp::test::make_config(1, 8 * P, 16, 2 * P, 4, 2, 3, 6, bias, strategy);
        if (variant == 2) c.cu_seqlens = {0, 3, 4, 8 * P - 1, 8 * P};
        if (variant == 3) {
          c.seq = 9 * P - 1;
          c.heads = P + 1;
        }
        mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh);
        Kokkos::View<double***, Kokkos::LayoutRight, Mem> x("x", c.batch, layer.local_seq(), c.hidden);
        mlacp::test::fill(x, 4, 1.0);
        auto grads = caller_gradients(c, layer.local_seq());
        const auto counted = count_steady(
            [&] {
              auto forward = layer.forward(Space(), x);
              layer.backward(Space(), forward, x, grads);
            },
            4, {});
        const std::string what = "ring " + std::to_string(ring) + ", " + std::string(mlacp::to_string(strategy)) +
                                 (bias ? " with bias" : " without bias") +
                                 (c.cu_seqlens.empty() ? "" : ", packed documents") +
                                 (variant == 3 ? ", S and H not divisible by P" : "");
        EXPECT_GT(counted.first, 0u) << what << ": the first iteration allocates the workspaces";
        EXPECT_EQ(counted.buffers, 0u) << what << ": communication buffers allocated after the first iteration";
        EXPECT_TRUE(counted.other_labels.empty())
            << what << ": iterations 2-5 allocated Views:" << joined(counted.other_labels);
        EXPECT_EQ(counted.views, 0u) << what << ": iterations 2-5 allocated Views";
        EXPECT_EQ(counted.collective_results, 0u) << what << ": a collective allocated its result";
        EXPECT_EQ(layer.forward_workspaces(), 1u) << what << ": one forward at a time needs one workspace";
      }
    }
}

// Per-call packing that changes every call (forward's cu_seqlens, at most MlaConfig::max_documents documents):
// iterations 2..N allocate no View (the documents' offsets and the RoPE positions and table are rebuilt in place), also
// forward, forward, backward, backward with two packings pending at once, both strategies.
TEST(SteadyState, PackingThatChangesEveryCallAllocatesNoView) {
  ASSERT_TRUE(mlacp::diagnostics::count_view_allocations());
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int P = mesh.size();
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    auto c = mlacp::test::make_config(1, 8 * P, 16, 2 * P, 4, 2, 3, 6, true, strategy);
    c.max_documents = 8;
    const std::int64_t S = c.seq;
    const std::vector<std::vector<std::int64_t>> packings = {
        {0, 3, S}, {0, 1, 5, S - 1, S}, {0, S - 2, S}, {0, 1, 2, 3, 4, 5, 6, S}, {0, 7, S}};
    mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh);
    Kokkos::View<double***, Kokkos::LayoutRight, Mem> x("x", c.batch, layer.local_seq(), c.hidden);
    mlacp::test::fill(x, 4, 1.0);
    auto grads = caller_gradients(c, layer.local_seq());
    std::size_t call = 0;
    const auto one_at_a_time = count_steady(
        [&] {
          auto forward = layer.forward(Space(), x, {}, packings[call++ % packings.size()]);
          layer.backward(Space(), forward, x, grads);
        },
        6, {});
    const std::string what = mlacp::to_string(strategy);
    EXPECT_TRUE(one_at_a_time.other_labels.empty())
        << what << ": iterations 2-7 allocated Views:" << joined(one_at_a_time.other_labels);
    EXPECT_EQ(one_at_a_time.views, 0u) << what << ": iterations 2-7 allocated Views";
    EXPECT_EQ(one_at_a_time.buffers, 0u) << what;
    const auto two_pending = count_steady(
        [&] {
          auto first = layer.forward(Space(), x, {}, packings[call++ % packings.size()]);
          auto second = layer.forward(Space(), x, {}, packings[call++ % packings.size()]);
          layer.backward(Space(), first, x, grads);
          layer.backward(Space(), second, x, grads);
        },
        6, {});
    EXPECT_TRUE(two_pending.other_labels.empty())
        << what << ", two pending: iterations 2-7 allocated Views:" << joined(two_pending.other_labels);
    EXPECT_EQ(two_pending.views, 0u) << what << ", two pending: iterations 2-7 allocated Views";
    EXPECT_EQ(layer.forward_workspaces(), 2u);
  }
}

// f(layer, c, what) for a layer whose configuration leaves batch and seq unset (any shape per call), flat and on a ring
// of P, both strategies; `what` names the mesh and the strategy.
template <class F>
void for_each_layer_of_any_shape(F&& f) {
  const int P = mlacp::test::world_size();
  for (const int ring : {1, P})
    for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
      mlacp::Mesh mesh(MPI_COMM_WORLD, ring);
      const auto c = mlacp::test::make_config(0, 0, 16, P + 1, 4, 2, 3, 6, true, strategy);
      mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh);
      f(layer, c, "ring " + std::to_string(ring) + ", " + std::string(mlacp::to_string(strategy)));
    }
}

// Any shape per call (issue 34): a layer whose configuration leaves batch and seq unset serves other shapes first,
// then one shape repeated allocates no View and no communication buffer after its first call, flat and on a ring of
// P, both strategies; so does a shape it served before others (its buffers follow the pass's extents).
TEST(SteadyState, RepeatedCallsOfOneShapeAllocateNoViewAfterOtherShapes) {
  ASSERT_TRUE(mlacp::diagnostics::count_view_allocations());
  const int P = mlacp::test::world_size();
  for_each_layer_of_any_shape(
      [&](mlacp::MlaAttention<double>& layer, const mlacp::MlaConfig& c, const std::string& layer_what) {
        // (B, S): the steady shape, then another that the layer serves in between.
        const std::pair<int, int> shapes[] = {{2, 7 * P + 1}, {1, 9 * P}};
        auto run = [&](int batch, int seq, mlacp::MlaGradients<double, Mem>& grads) {
          Kokkos::View<double***, Kokkos::LayoutRight, Mem> x("x", batch, layer.local_seq_for(seq), c.hidden);
          mlacp::test::fill(x, 4, 1.0);
          return [&layer, x, &grads] {
            auto forward = layer.forward(Space(), x);
            layer.backward(Space(), forward, x, grads);
          };
        };
        for (int round = 0; round < 2; ++round)
          for (const auto& [batch, seq] : shapes) {
            auto shaped = c;
            shaped.batch = batch;
            auto grads = caller_gradients(shaped, layer.local_seq_for(seq));
            const auto counted = count_steady(run(batch, seq, grads), 3, {});
            const std::string what = layer_what + ", B = " + std::to_string(batch) + ", S = " + std::to_string(seq) +
                                     ", round " + std::to_string(round);
            EXPECT_TRUE(counted.other_labels.empty())
                << what << ": repeated calls allocated Views:" << joined(counted.other_labels);
            EXPECT_EQ(counted.views, 0u) << what << ": repeated calls allocated Views";
            EXPECT_EQ(counted.buffers, 0u) << what << ": repeated calls allocated communication buffers";
          }
      });
}

// Workspaces sized by the largest shape seen (issue 34): once the largest shape and each other one have run, calls
// that keep changing B, S and the packing allocate no buffer of the layer's and no communication buffer; each
// allocates its output y alone (the caller's, exactly its shape), and the workspaces' bytes stay those of the largest
// shape. Flat and on a ring of P, both strategies.
TEST(SteadyState, AlternatingShapesReuseWorkspacesSizedByTheLargest) {
  ASSERT_TRUE(mlacp::diagnostics::count_view_allocations());
  const int P = mlacp::test::world_size();
  for_each_layer_of_any_shape(
      [&](mlacp::MlaAttention<double>& layer, const mlacp::MlaConfig& c, const std::string& layer_what) {
        struct Shape {
          int batch, seq;
          std::vector<std::int64_t> cu_seqlens;
        };
        // The largest first, then smaller ones with another B, an S that P does not divide, and packed documents.
        const std::vector<Shape> shapes = {
            {3, 9 * P + 2, {}}, {1, 5 * P, {}}, {2, 7 * P + 1, {0, 3, 7 * P + 1}}, {3, 4 * P + 1, {}}};
        auto call = [&](const Shape& shape) {
          auto shaped = c;
          shaped.batch = shape.batch;
          const int s = layer.local_seq_for(shape.seq);
          auto grads = caller_gradients(shaped, s);
          Kokkos::View<double***, Kokkos::LayoutRight, Mem> x("x", shape.batch, s, c.hidden);
          mlacp::test::fill(x, 4, 1.0);
          const auto views = mlacp::diagnostics::view_allocations();
          const auto buffers = mlacp::diagnostics::communication_buffer_allocations();
          {
            auto forward = layer.forward(Space(), x, {}, shape.cu_seqlens);
            layer.backward(Space(), forward, x, grads);
          }
          const auto n = mlacp::diagnostics::view_allocations() - views;
          const auto labels = mlacp::diagnostics::recent_view_allocations();
          std::vector<std::string> allocated;
          for (std::uint64_t k = 0; k < n && k < labels.size(); ++k) allocated.push_back(labels[labels.size() - n + k]);
          return std::make_pair(allocated, mlacp::diagnostics::communication_buffer_allocations() - buffers);
        };
        for (const Shape& shape : shapes) call(shape);  // every shape once: the largest sizes the workspaces
        call(shapes.front());
        const std::size_t largest_bytes = layer.forward_workspace_bytes();
        for (int round = 0; round < 2; ++round)
          for (std::size_t i = 0; i < shapes.size(); ++i) {
            const auto [allocated, buffers] = call(shapes[(i + 1) % shapes.size()]);  // the shape changes every call
            const std::string what =
                layer_what + ", round " + std::to_string(round) + ", shape " + std::to_string((i + 1) % shapes.size());
            EXPECT_EQ(allocated, std::vector<std::string>{"mlacp::y"})
                << what << ": a call of a shape seen before allocated" << joined(allocated);
            EXPECT_EQ(buffers, 0u) << what << ": communication buffers allocated";
            if ((i + 1) % shapes.size() == 0) {
              EXPECT_EQ(layer.forward_workspace_bytes(), largest_bytes) << what << ": the workspaces grew";
            }
          }
        EXPECT_EQ(layer.forward_workspaces(), 1u);
      });
}

// Fresh gradients: backward returns new Views, so it necessarily allocates exactly those (zeroed) and nothing else.
TEST(SteadyState, FreshGradientsAllocateOnlyTheReturnedViews) {
  ASSERT_TRUE(mlacp::diagnostics::count_view_allocations());
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int P = mesh.size();
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    const auto c = mlacp::test::make_config(2, 8 * P, 16, 2 * P, 4, 2, 3, 6, true, strategy);
    mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh);
    Kokkos::View<double***, Kokkos::LayoutRight, Mem> x("x", c.batch, c.seq / P, c.hidden);
    mlacp::test::fill(x, 4, 1.0);
    const std::set<std::string> returned = {"mlacp::grad w_q",   "mlacp::grad w_kva", "mlacp::grad g_kv",
                                            "mlacp::grad w_kvb", "mlacp::grad w_o",   "mlacp::grad b_q",
                                            "mlacp::grad b_kvb", "mlacp::grad b_o",   "mlacp::dx"};
    const int iterations = 3;
    const auto counted = count_steady(
        [&] {
          auto forward = layer.forward(Space(), x);
          const auto grads = layer.backward(Space(), forward, x);
        },
        iterations, returned);
    EXPECT_TRUE(counted.other_labels.empty())
        << mlacp::to_string(strategy) << ": allocated beyond the returned gradients:" << joined(counted.other_labels);
    EXPECT_EQ(counted.collective_results, 0u) << mlacp::to_string(strategy) << ": a collective allocated its result";
    EXPECT_EQ(counted.views, static_cast<std::uint64_t>(iterations * returned.size()))
        << mlacp::to_string(strategy) << ": one allocation per returned gradient View (no weight-sized temporaries)";
    EXPECT_EQ(counted.buffers, 0u);
  }
}

}  // namespace
