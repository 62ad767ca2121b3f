// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MLA layer's life cycle (issue 19): the attention core's settings are read and agreed when the layer is built
// (a bad or differing MLACP_ATTENTION_TILES is one error on every rank at construction, also with ranks that hold no
// head), a moved-from Forward is refused like one never produced, and held outputs do not pin the per-forward
// workspaces (the pool's bytes stay bounded; it keeps a bounded number of free workspaces and releases them on
// request).
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"
#include "scoped_environment.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/mla/mla_attention.hpp>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Tensor3 = Kokkos::View<double***, Kokkos::LayoutRight, Mem>;

// H = 1 head: at P > 1 the ranks from 1 on hold no head (they never call the attention core).
mlacp::MlaConfig few_heads_config(mlacp::MlaStrategy strategy = mlacp::MlaStrategy::latent) {
  return mlacp::test::make_config(1, 12, 16, 1, 4, 2, 3, 6, false, strategy);
}

// Sets MLACP_ATTENTION_TILES for the scope (restored after).
struct TilesEnvironment : mlacp::test::ScopedEnvironment {
  explicit TilesEnvironment(const char* value) : ScopedEnvironment("MLACP_ATTENTION_TILES", value) {}
};

// The command: MLACP_ATTENTION_TILES=128X128 with heads < P. Before, the ranks with heads raised inside the
// forward and the others waited in the O all-to-all; now every rank raises at construction, before any forward.
TEST(MlaCoreSettings, BadTilesInTheEnvironmentRaiseOnEveryRankAtConstruction) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    const auto c = few_heads_config(strategy);
    const auto weights = mlacp::test::make_weights<double, Mem>(c, 3);
    TilesEnvironment env("128X128");
    mlacp::test::expect_error<mlacp::InvalidArgument>(
        [&] { mlacp::MlaAttention<double> layer(c, weights, mesh); },
        "MLACP_ATTENTION_TILES='128X128'; expected QxK with two positive integers");
  }
}

// Only the last rank has the bad setting: every rank raises its message (one agreed error).
TEST(MlaCoreSettings, BadTilesOnOneRankRaiseOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto c = few_heads_config();
  const auto weights = mlacp::test::make_weights<double, Mem>(c, 3);
  TilesEnvironment env(mesh.rank() == mesh.size() - 1 ? "0x8" : "16x16");
  mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::MlaAttention<double> layer(c, weights, mesh); },
                                                    "MLACP_ATTENTION_TILES='0x8'; expected QxK");
}

// Explicit options are settings too: a non-positive tile is refused at construction on every rank.
TEST(MlaCoreSettings, BadTileOptionsRaiseAtConstruction) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto c = few_heads_config();
  mlacp::FlashAttentionOptions options;
  options.key_tile = -3;
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] {
        mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh,
                                          mlacp::FlashAttentionCore(options));
      },
      "key_tile = -3; expected positive tile sizes");
}

// Valid settings that differ across ranks (other tiles on the last rank) are refused on every rank, naming the
// setting; equal settings build, and the layer then runs with them whatever the environment says later.
TEST(MlaCoreSettings, TilesThatDifferAcrossRanksAreRefusedOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto c = few_heads_config();
  const auto weights = mlacp::test::make_weights<double, Mem>(c, 3);
  if (mesh.size() > 1) {
    TilesEnvironment env(mesh.rank() == mesh.size() - 1 ? "8x8" : "16x16");
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::MlaAttention<double> layer(c, weights, mesh); },
                                                      "disagree on FlashAttentionCore query tile");
  }
  std::vector<double> y;
  {
    TilesEnvironment env("4x4");
    mlacp::MlaAttention<double> layer(c, weights, mesh);
    ::setenv("MLACP_ATTENTION_TILES", "bad", 1);  // read at construction only: the forward does not see it
    Tensor3 x("x", c.batch, layer.local_seq(), c.hidden);
    mlacp::test::fill(x, 4 + mesh.rank(), 1.0);
    auto f = layer.forward(Space(), x);
    layer.backward(Space(), f, x);
    EXPECT_EQ(f.output().extent(1), static_cast<std::size_t>(layer.local_seq()));
  }
}

// A moved-from Forward is empty: backward on it is refused on every rank as "backward before forward", whichever
// ranks misuse it, before any collective; the Forward it moved to still runs its backward. Move construction and
// move assignment alike.
TEST(MlaForwardMove, BackwardOnAMovedFromForwardIsRefusedOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    const auto c = mlacp::test::make_config(1, 4 * mesh.size(), 16, 2 * mesh.size(), 4, 2, 3, 6, true, strategy);
    mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh);
    Tensor3 x("x", c.batch, layer.local_seq(), c.hidden);
    mlacp::test::fill(x, 4 + mesh.rank(), 1.0);
    auto first = layer.forward(Space(), x);
    auto moved = std::move(first);  // move construction
    EXPECT_FALSE(first.holds_workspace());
    EXPECT_EQ(first.output().data(), nullptr);
    // Every rank misuses it.
    mlacp::test::expect_error<mlacp::UsageError>([&] { layer.backward(Space(), first, x); }, "backward before forward");
    // Only rank 0 misuses it; the others pass their valid Forward, and still every rank raises (nobody waits in the
    // dO all-to-all) and the valid ones are not consumed.
    mlacp::test::expect_error<mlacp::UsageError>([&] { layer.backward(Space(), mesh.rank() == 0 ? first : moved, x); },
                                                 "backward before forward");
    EXPECT_FALSE(moved.backward_done());
    decltype(moved) assigned;
    assigned = std::move(moved);  // move assignment
    EXPECT_FALSE(moved.holds_workspace());
    mlacp::test::expect_error<mlacp::UsageError>([&] { layer.backward(Space(), moved, x); }, "backward before forward");
    const auto grads = layer.backward(Space(), assigned, x);
    EXPECT_TRUE(assigned.backward_done());
    EXPECT_NE(grads.dx.data(), nullptr);
    EXPECT_EQ(layer.forward_workspaces_in_use(), 0u);
  }
}

// An eval loop under no_grad that keeps all its outputs: each output keeps only itself. The layer keeps one
// workspace whose bytes do not grow, every held output still holds its own values at the end, and once the outputs are
// dropped nothing grows either. (Before, every held output pinned a whole workspace: 20 of them.)
TEST(MlaWorkspacePool, HeldOutputsOfNoGradForwardsDoNotPinWorkspaces) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    const auto c = mlacp::test::make_config(2, 4 * mesh.size(), 16, 2 * mesh.size(), 4, 2, 3, 6, true, strategy);
    mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh);
    std::vector<Tensor3> outputs;
    std::vector<std::vector<double>> values;
    std::size_t bytes_after_first = 0;
    for (int i = 0; i < 20; ++i) {
      Tensor3 x("x", c.batch, layer.local_seq(), c.hidden);
      mlacp::test::fill(x, 100 + i + 7 * mesh.rank(), 1.0);
      auto f = layer.forward(Space(), x, mlacp::MlaRequiresGrad::none());
      EXPECT_FALSE(f.holds_workspace()) << "a forward that needs no backward gives its workspace back";
      outputs.push_back(f.output());
      values.push_back(mlacp::test::host_values(f.output()));
      if (i == 0) bytes_after_first = layer.forward_workspace_bytes();
      EXPECT_LE(layer.forward_workspaces(), 1u) << mlacp::to_string(strategy) << " iteration " << i;
      EXPECT_EQ(layer.forward_workspace_bytes(), bytes_after_first) << mlacp::to_string(strategy) << " iteration " << i;
    }
    EXPECT_GT(bytes_after_first, 0u);
    for (std::size_t i = 0; i < outputs.size(); ++i)
      EXPECT_EQ(mlacp::test::host_values(outputs[i]), values[i]) << "held output " << i << " was overwritten";
    outputs.clear();
    Tensor3 x("x", c.batch, layer.local_seq(), c.hidden);
    mlacp::test::fill(x, 1, 1.0);
    std::size_t bytes_with_gradients = 0;
    for (int i = 0; i < 3; ++i) {
      auto f = layer.forward(Space(), x);  // with gradients: the workspace is held until backward
      layer.backward(Space(), f, x);
      if (i == 0) bytes_with_gradients = layer.forward_workspace_bytes();
    }
    EXPECT_EQ(layer.forward_workspaces(), 1u);
    EXPECT_EQ(layer.forward_workspace_bytes(), bytes_with_gradients);
  }
}

// Outputs of forwards with gradients, held after their backward: the same (one workspace), and a burst of pending
// forwards (gradient accumulation) grows the pool only until they are consumed: the free workspaces beyond the bound
// are released at the next forward, and release_memory() drops every free one.
TEST(MlaWorkspacePool, FreeWorkspacesAreBoundedAndReleasedOnRequest) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto c = mlacp::test::make_config(1, 4 * mesh.size(), 16, 2 * mesh.size(), 4, 2, 3, 6, false);
  mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh);
  EXPECT_EQ(layer.max_free_forward_workspaces(), 2u);
  Tensor3 x("x", c.batch, layer.local_seq(), c.hidden);
  mlacp::test::fill(x, 5 + mesh.rank(), 1.0);
  std::vector<Tensor3> held;
  for (int i = 0; i < 10; ++i) {
    auto f = layer.forward(Space(), x);
    layer.backward(Space(), f, x);
    held.push_back(f.output());
  }
  EXPECT_EQ(layer.forward_workspaces(), 1u) << "held outputs after backward pinned workspaces";
  const std::size_t one = layer.forward_workspace_bytes();
  {
    std::vector<decltype(layer.forward(Space(), x))> pending;
    for (int i = 0; i < 5; ++i) pending.push_back(layer.forward(Space(), x));
    EXPECT_EQ(layer.forward_workspaces(), 5u);
    EXPECT_EQ(layer.forward_workspaces_in_use(), 5u);
    for (auto& f : pending) layer.backward(Space(), f, x);
    EXPECT_EQ(layer.forward_workspaces_in_use(), 0u);
  }
  auto f = layer.forward(Space(), x);
  EXPECT_EQ(layer.forward_workspaces(), 1u + layer.max_free_forward_workspaces())
      << "the one in use and at most max_free free ones";
  layer.backward(Space(), f, x);
  layer.release_memory();
  EXPECT_EQ(layer.forward_workspaces(), 0u);
  EXPECT_EQ(layer.forward_workspace_bytes(), 0u);
  layer.set_max_free_forward_workspaces(0);
  auto g = layer.forward(Space(), x);
  layer.backward(Space(), g, x);
  EXPECT_EQ(layer.forward_workspace_bytes(), one);
  auto h = layer.forward(Space(), x);  // the free one is taken; none is kept beside it
  EXPECT_EQ(layer.forward_workspaces(), 1u);
  layer.backward(Space(), h, x);
}

}  // namespace
