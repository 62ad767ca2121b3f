// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Any batch and sequence length per call (issue 34). One layer, built once with the configuration's batch and seq
// unset (or set, as maxima), serves a sequence of calls of different B, S and packing, on flat meshes and on rings, and
// every call equals a fresh layer built for that call's shape bit for bit: y, dx and every weight gradient. Forwards
// of different shapes may be pending at once; each backward runs with its forward's shape. The call's S is derived from
// the ranks' shards, so a shard that is not the token map's, a B that differs across ranks, no token at all or a
// shape past the maxima is one clear error on every rank, checked mode or not, before anything is sent; the layer
// runs on afterwards.
#include "layer_reference_checks.hpp"
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/error.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/model/planner.hpp>
#include <mlacp/token_map.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using mlacp::test::host_values;
using mlacp::test::LayerMem;
using mlacp::test::LayerSpace;
using mlacp::test::LayerTensor;
using mlacp::test::rows_of;

// One call: its B, S and packing (empty: one document).
struct Call {
  int batch;
  int seq;
  std::vector<std::int64_t> cu_seqlens;
};

std::string str(const Call& call) {
  std::string s = "B = " + std::to_string(call.batch) + ", S = " + std::to_string(call.seq);
  if (!call.cu_seqlens.empty()) s += ", " + std::to_string(call.cu_seqlens.size() - 1) + " documents";
  return s;
}

// S that P divides and S that it does not, B from 1 to 3, packed and not (two unpacked S in a row: the RoPE positions
// of a zigzag ring's two ranges follow S, not only the packing), and the first shape again after the others (its
// workspaces were reallocated in between).
std::vector<Call> calls(int P) {
  return {{2, 4 * P + 1, {}},
          {3, 2 * P, {}},
          {1, 6 * P, {0, 3, 6 * P}},
          {1, 5 * P + 3, {0, 1, 4, 5 * P + 3}},
          {2, 4 * P + 1, {}}};
}

int largest_seq(const std::vector<Call>& cs) {
  int S = 0;
  for (const auto& c : cs) S = std::max(S, c.seq);
  return S;
}

// What one call of a layer produced, on the host.
struct Outputs {
  std::vector<double> y, dx;
  std::vector<std::vector<double>> weight_grads;  // in the parameter table's order
};

template <class T>
Outputs outputs_of(const mlacp::MlaConfig& c, const LayerTensor<T>& y, const mlacp::MlaGradients<T, LayerMem>& grads) {
  Outputs out{host_values(y), host_values(grads.dx), {}};
  mlacp::for_each_parameter(
      [&](const mlacp::ParameterInfo& info, const auto& g) {
        if (info.present(c)) out.weight_grads.push_back(host_values(g));
      },
      static_cast<const mlacp::MlaParameters<mlacp::gradient_value_t<T>, LayerMem>&>(grads));
  return out;
}

void expect_bitwise_equal(const Outputs& got, const Outputs& fresh, const std::string& what) {
  EXPECT_EQ(got.y, fresh.y) << what << ": y";
  EXPECT_EQ(got.dx, fresh.dx) << what << ": dx";
  ASSERT_EQ(got.weight_grads.size(), fresh.weight_grads.size()) << what;
  for (std::size_t i = 0; i < got.weight_grads.size(); ++i)
    EXPECT_EQ(got.weight_grads[i], fresh.weight_grads[i]) << what << ": weight gradient " << i << " of the table";
}

// The global x and dy of call `index` (the same on every rank), and this rank's shards of them for `layer`.
template <class T>
struct CallData {
  LayerTensor<T> x, dy;
  CallData(const mlacp::MlaConfig& c, const Call& call, std::size_t index, const mlacp::Mesh& mesh,
           const mlacp::TokenMap& map) {
    LayerTensor<T> full_x("x", call.batch, call.seq, c.hidden), full_dy("dy", call.batch, call.seq, c.hidden);
    mlacp::test::fill(full_x, 100 + index, 1.0);
    mlacp::test::fill(full_dy, 200 + index, 1.0);
    const auto& ranges = map.ranges(mesh.ring_rank(), mesh.ulysses_rank());
    x = rows_of(full_x, ranges);
    dy = rows_of(full_dy, ranges);
  }
};

// The call on a fresh layer of exactly that shape (the configuration's batch and seq are the call's, as before
// issue 34), on the same weights and mesh.
template <class T>
Outputs fresh_layer_call(mlacp::MlaConfig c, const mlacp::MlaWeights<T, LayerMem>& weights, const mlacp::Mesh& mesh,
                         const Call& call, const CallData<T>& data) {
  c.batch = call.batch;
  c.seq = call.seq;
  mlacp::MlaAttention<T> fresh(c, weights, mesh);
  EXPECT_EQ(fresh.local_seq(), static_cast<int>(data.x.extent(1)));
  auto f = fresh.forward(LayerSpace(), data.x, {}, call.cu_seqlens);
  const auto grads = fresh.backward(LayerSpace(), f, data.dy);
  return outputs_of(c, f.output(), grads);
}

// One layer over `calls`, one call at a time, then two calls of different shapes pending at once, each against a
// fresh layer of its shape.
template <class T>
void expect_calls_match_fresh_layers(mlacp::MlaConfig c, int ring, const std::string& what) {
  mlacp::Mesh mesh(MPI_COMM_WORLD, ring);
  const auto cs = calls(mesh.size());
  const auto weights = mlacp::test::make_weights<T, LayerMem>(c, 42);
  mlacp::MlaAttention<T> layer(c, weights, mesh);
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const Call& call = cs[i];
    const std::string name = what + ", call " + std::to_string(i) + " (" + str(call) + ")";
    const CallData<T> data(c, call, i, mesh, layer.token_map_for(call.seq));
    EXPECT_EQ(layer.local_seq_for(call.seq), static_cast<int>(data.x.extent(1))) << name;
    auto f = layer.forward(LayerSpace(), data.x, {}, call.cu_seqlens);
    const auto grads = layer.backward(LayerSpace(), f, data.dy);
    // The layer's shape accessors describe the pass that ran.
    EXPECT_EQ(layer.token_map().seq(), call.seq) << name;
    EXPECT_EQ(layer.local_seq(), static_cast<int>(data.x.extent(1))) << name;
    expect_bitwise_equal(outputs_of(c, f.output(), grads), fresh_layer_call(c, weights, mesh, call, data), name);
  }
  // Two shapes pending at once (gradient accumulation over micro-batches of different lengths): each backward runs
  // with its own forward's shape, in either order.
  const CallData<T> a(c, cs[0], 10, mesh, layer.token_map_for(cs[0].seq));
  const CallData<T> b(c, cs[3], 11, mesh, layer.token_map_for(cs[3].seq));
  auto fa = layer.forward(LayerSpace(), a.x, {}, cs[0].cu_seqlens);
  auto fb = layer.forward(LayerSpace(), b.x, {}, cs[3].cu_seqlens);
  const auto gb = layer.backward(LayerSpace(), fb, b.dy);
  const auto ga = layer.backward(LayerSpace(), fa, a.dy);
  expect_bitwise_equal(outputs_of(c, fa.output(), ga), fresh_layer_call(c, weights, mesh, cs[0], a),
                       what + ", pending " + str(cs[0]));
  expect_bitwise_equal(outputs_of(c, fb.output(), gb), fresh_layer_call(c, weights, mesh, cs[3], b),
                       what + ", pending " + str(cs[3]));
}

// The flat mesh and the rings C > 1 that divide P.
std::vector<int> rings(int P) {
  std::vector<int> out{1};
  for (const int C : mlacp::test::ring_sizes(P)) out.push_back(C);
  return out;
}

mlacp::MlaConfig base_config(mlacp::MlaStrategy strategy, bool q_lora) {
  // batch and seq unset: any shape per call. H = 5 is uneven over 2, 3 and 4 ranks.
  auto c = mlacp::test::make_config(0, 0, 16, 5, 4, 2, 3, 6, true, strategy);
  if (q_lora) c.q_lora_rank = 5;
  c.max_documents = 4;
  return c;
}

TEST(MlaCallShapes, OneLayerServesEveryShapeAsAFreshLayerWould) {
  const int P = mlacp::test::world_size();
  for (const int ring : rings(P))
    for (const auto layout : {mlacp::RingLayout::contiguous, mlacp::RingLayout::zigzag})
      for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
        if (ring == 1 && layout == mlacp::RingLayout::zigzag) continue;  // the same flat split
        auto c = base_config(strategy, /*q_lora=*/ring == 1);
        c.ring_layout = layout;
        const std::string what =
            std::string(mlacp::to_string(strategy)) + ", ring " + std::to_string(ring) + " " + mlacp::to_string(layout);
        expect_calls_match_fresh_layers<double>(c, ring, what + ", double");
        expect_calls_match_fresh_layers<float>(c, ring, what + ", float");
      }
}

TEST(MlaCallShapes, MaximaBoundTheCallsAndServeEveryShapeWithin) {
  const int P = mlacp::test::world_size();
  for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    auto c = base_config(strategy, true);
    c.batch = 3;
    c.seq = largest_seq(calls(P));
    expect_calls_match_fresh_layers<double>(c, 1, std::string(mlacp::to_string(strategy)) + ", maxima set");
  }
}

// A call whose shape cannot run raises `expected` (a part of the message) on every rank, before anything is sent.
template <class F>
void expect_refused_on_every_rank(F call, const std::string& expected, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": no error";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << what << ": " << e.what();
  }
}

TEST(MlaCallShapes, ShapesThatCannotRunRaiseOnEveryRankCheckedOrNot) {
  const int P = mlacp::test::world_size();
  const int rank = mlacp::test::world_rank();
  for (const bool checked : {true, false}) {
    mlacp::Mesh mesh(MPI_COMM_WORLD);
    mesh.set_checked(checked);
    auto c = base_config(mlacp::MlaStrategy::latent, false);
    c.batch = 2;
    c.seq = 8 * P;
    const auto weights = mlacp::test::make_weights<double, LayerMem>(c, 42);
    mlacp::MlaAttention<double> layer(c, weights, mesh);
    const std::string mode = checked ? "checked" : "unchecked";
    const auto x_of = [&](int batch, int tokens) { return LayerTensor<double>("x", batch, tokens, c.hidden); };
    const int s = layer.local_seq_for(4 * P);
    expect_refused_on_every_rank([&] { layer.forward(LayerSpace(), x_of(3, s)); }, "bounds batch at 2",
                                 mode + ": B past the maximum");
    expect_refused_on_every_rank([&] { layer.forward(LayerSpace(), x_of(1, layer.local_seq_for(8 * P + 2))); },
                                 "bounds seq at " + std::to_string(8 * P), mode + ": S past the maximum");
    expect_refused_on_every_rank([&] { layer.forward(LayerSpace(), x_of(1, 0)); }, "at least one batch row",
                                 mode + ": no token");
    if (P > 1) {
      expect_refused_on_every_rank([&] { layer.forward(LayerSpace(), x_of(rank == 0 ? 1 : 2, s)); },
                                   "differs across ranks", mode + ": B differs");
      // Rank 0 holds one token more, the last rank one fewer: the sum is S = 4P, but not its token map's split.
      const int mine = s + (rank == 0 ? 1 : 0) - (rank == P - 1 ? 1 : 0);
      expect_refused_on_every_rank([&] { layer.forward(LayerSpace(), x_of(1, mine)); },
                                   "of rank 0 holds " + std::to_string(s + 1) + " tokens",
                                   mode + ": a shard that is not the token map's");
    }
    // A packing of the configuration (none here) or of the call must end at the call's S.
    expect_refused_on_every_rank(
        [&] {
          layer.forward(LayerSpace(), x_of(1, s), {}, {0, 3, 8 * P});
        },
        "cu_seqlens", mode + ": a packing of another S");
    // The layer runs on, and equals a fresh one.
    const Call call{2, 4 * P, {}};
    const CallData<double> data(c, call, 0, mesh, layer.token_map_for(call.seq));
    auto f = layer.forward(LayerSpace(), data.x);
    const auto grads = layer.backward(LayerSpace(), f, data.dy);
    expect_bitwise_equal(outputs_of(c, f.output(), grads), fresh_layer_call(c, weights, mesh, call, data),
                         mode + ": after the refusals");
  }
}

// With no maxima, a call whose B * S (the layer's token rows, an int) would overflow is refused on every rank before
// x is read: x here is a View of those extents over one value, which a read would overrun.
TEST(MlaCallShapes, ACallWhoseTokenRowsOverflowAnIntIsRefusedBeforeXIsRead) {
  const int P = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto c = base_config(mlacp::MlaStrategy::latent, false);
  const auto weights = mlacp::test::make_weights<double, LayerMem>(c, 42);
  mlacp::MlaAttention<double> layer(c, weights, mesh);
  const int B = 1 << 16, S = 1 << 16;  // B * S = 2^32
  const LayerTensor<double> one("one value", 1, 1, 1);
  const LayerTensor<double> x(one.data(), B, layer.local_seq_for(S), c.hidden);
  expect_refused_on_every_rank(
      [&] { layer.forward(LayerSpace(), x); },
      "brings B = 65536 and S = 65536: mlacp::MlaConfig: batch * seq (token rows) = 4294967296",
      "B * S past INT_MAX on " + std::to_string(P) + " ranks");
  EXPECT_EQ(c.int_products_error(B, S / 2 - 1), "");
  EXPECT_NE(c.int_products_error(B, S / 2).find("batch * seq (token rows) = 2147483648 (B=65536 S=32768"),
            std::string::npos)
      << c.int_products_error(B, S / 2);
}

TEST(MlaCallShapes, TheConfigurationsMaximaAreCheckedAndThePlannerNeedsAShape) {
  auto c = base_config(mlacp::MlaStrategy::latent, false);
  EXPECT_EQ(c.error(2), "") << "batch and seq unset: any shape per call";
  c.batch = -1;
  EXPECT_NE(c.error(2).find("batch = -1; expected 0 (unset: a call brings any) or a positive maximum"),
            std::string::npos)
      << c.error(2);
  c.batch = 0;
  c.cu_seqlens = {0, 4, 9};
  EXPECT_NE(c.error(2).find("but seq is unset; expected seq = 9"), std::string::npos) << c.error(2);
  c.seq = 9;
  EXPECT_EQ(c.error(2), "");
  EXPECT_NE(c.shape_error().find("batch = 0, seq = 9; expected both set"), std::string::npos) << c.shape_error();
  // The planner prices one shape: it refuses a configuration without one.
  mlacp::model::PlanRequest request;
  request.config = c;
  request.cluster.nodes = 1;
  request.cluster.ranks_per_node = 2;
  try {
    (void)mlacp::model::plan(request, mlacp::model::MachineParams{});
    ADD_FAILURE() << "the planner priced a configuration without batch";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("expected both set"), std::string::npos) << e.what();
  }
  c.batch = 2;
  EXPECT_EQ(c.shape_error(), "");
}

}  // namespace
