// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The planner on a communicator (mesh_plan.hpp): cluster_of finds one node of P ranks here; plan_mesh returns the same
// choice on every rank, and every choice of its plan runs the layer (forward + backward on Mesh(comm, choice.ring)
// with apply(choice, config), against the one-rank layer); its refusals (no choice within the memory budget, ranks
// with different inputs, a machine file rank 0 cannot read) are the same InvalidArgument on every rank, naming the
// numbers; read_machine(comm, path) gives every rank rank 0's file.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>
#include <Kokkos_Core.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/model/mesh_plan.hpp>
#include <mlacp/token_map.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace model = mlacp::model;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Tensor = Kokkos::View<double***, Kokkos::LayoutRight, Mem>;

// A machine described by hand, as a user would for a cluster the model has not measured.
model::MachineParams test_machine() {
  model::MachineParams m;
  m.name = "test machine (hand-written)";
  m.source = "unit_tests/model/test_mesh_plan.cpp";
  m.ranks_per_node = mlacp::test::world_size();
  m.intra = {2e-6, 1e-10};
  m.inter = {1e-5, 1e-9};
  m.gemm["double"] = {{4, 5e8}, {64, 5e9}, {1024, 2e10}};
  m.gemm["float"] = {{4, 1e9}, {64, 1e10}, {1024, 4e10}};
  m.attention["double"] = {2e9, 1e9};
  m.attention["float"] = {4e9, 2e9};
  m.memory_bandwidth = 1e10;
  m.memory_per_rank_bytes = 0;
  m.overlap_efficiency = 1.0;
  return m;
}

mlacp::MlaConfig test_config() { return mlacp::test::make_config(2, 32, 48, 4, 8, 4, 6, 12, true); }

// Every rank's value of `v`, rank order.
std::vector<std::int64_t> gathered(std::int64_t v) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(mlacp::test::world_size()));
  MPI_Allgather(&v, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}

// This rank's rows of a full [B, S, D] tensor: mlacp::shard by the layer's token map.
Tensor rows_of(const Tensor& full, const mlacp::TokenMap& map, const mlacp::Mesh& mesh) {
  const int g = mesh.ring_rank(), u = mesh.ulysses_rank();
  Tensor local("planned shard", full.extent(0), static_cast<std::size_t>(map.count(g, u)), full.extent(2));
  const Kokkos::DefaultExecutionSpace space;
  mlacp::shard(space, map, g, u, full, local);
  space.fence();
  return local;
}

// As mesh_plan.cpp names a byte count.
std::string bytes_text(double bytes) {
  std::ostringstream out;
  out << std::setprecision(15) << bytes << " bytes";
  return out.str();
}

TEST(MeshPlan, ClusterOfThisRunIsOneNodeOfPRanks) {
  const model::Cluster here = model::cluster_of(MPI_COMM_WORLD);
  EXPECT_EQ(here.nodes, 1);
  EXPECT_EQ(here.ranks_per_node, mlacp::test::world_size());
  EXPECT_EQ(here.ranks(), mlacp::test::world_size());
  const model::Cluster self = model::cluster_of(MPI_COMM_SELF);
  EXPECT_EQ(self.nodes, 1);
  EXPECT_EQ(self.ranks_per_node, 1);
}

TEST(MeshPlan, SameChoiceOnEveryRankAndItIsThePlansFirst) {
  const int P = mlacp::test::world_size();
  for (const auto dtype : {model::Dtype::float64, model::Dtype::float32}) {
    const model::PlannedMesh pm = model::plan_mesh(MPI_COMM_WORLD, test_config(), dtype, test_machine());
    EXPECT_EQ(pm.cluster.nodes, 1);
    EXPECT_EQ(pm.cluster.ranks_per_node, P);
    EXPECT_EQ(pm.choice.ulysses * pm.choice.ring, P) << pm.choice.describe();
    ASSERT_NE(pm.plan.best(), nullptr);
    EXPECT_EQ(pm.plan.best()->prediction.choice.describe(), pm.choice.describe());
    EXPECT_GT(pm.plan.best()->prediction.total_s(), 0.0);
    for (const auto value : {static_cast<std::int64_t>(pm.choice.strategy), std::int64_t{pm.choice.ulysses},
                             std::int64_t{pm.choice.ring}, static_cast<std::int64_t>(pm.choice.layout)}) {
      const auto all = gathered(value);
      EXPECT_TRUE(std::all_of(all.begin(), all.end(), [&](std::int64_t v) { return v == all.front(); }))
          << "the ranks chose differently: " << pm.choice.describe() << " on rank " << mlacp::test::world_rank();
    }
    // apply: the choice's strategy and layout, nothing else.
    const mlacp::MlaConfig applied = model::apply(pm.choice, test_config());
    EXPECT_EQ(applied.strategy, pm.choice.strategy);
    EXPECT_EQ(applied.ring_layout, pm.choice.layout);
    EXPECT_EQ(applied.seq, test_config().seq);
    EXPECT_EQ(applied.bias, test_config().bias);
  }
}

// The plan's first choice, and every other choice of the plan, runs: Mesh(comm, choice.ring) and the layer of
// apply(choice, config), forward + backward, against the one-rank layer.
TEST(MeshPlan, EveryChoiceOfThePlanRunsTheLayer) {
  const mlacp::MlaConfig config = test_config();
  const model::PlannedMesh pm = model::plan_mesh(MPI_COMM_WORLD, config, model::Dtype::float64, test_machine());
  const Space space;
  const auto weights = mlacp::test::make_weights<double, Mem>(config, 7);
  Tensor x("x", config.batch, config.seq, config.hidden), dy("dy", config.batch, config.seq, config.hidden);
  mlacp::test::fill(x, 100, 1.0);
  mlacp::test::fill(dy, 200, 1.0);
  mlacp::Mesh self(MPI_COMM_SELF);
  std::vector<model::Choice> choices = {pm.choice};
  for (const auto& row : pm.plan.rows)
    if (row.prediction.choice.describe() != pm.choice.describe()) choices.push_back(row.prediction.choice);
  if (mlacp::test::world_size() > 1) {
    EXPECT_TRUE(std::any_of(choices.begin(), choices.end(), [](const model::Choice& c) { return c.ring > 1; }))
        << "the plan holds no ring choice";
  }
  for (const model::Choice& choice : choices) {
    const mlacp::MlaConfig applied = model::apply(choice, config);
    mlacp::MlaAttention<double> reference(applied, weights, self);
    auto ref_forward = reference.forward(space, x);
    const auto ref = reference.backward(space, ref_forward, dy);

    mlacp::Mesh mesh(MPI_COMM_WORLD, choice.ring);
    ASSERT_EQ(mesh.ulysses_size(), choice.ulysses) << choice.describe();
    mlacp::MlaAttention<double> layer(applied, weights, mesh);
    const mlacp::TokenMap& map = layer.token_map();
    auto forward = layer.forward(space, rows_of(x, map, mesh));
    const auto grads = layer.backward(space, forward, rows_of(dy, map, mesh));
    EXPECT_LE(mlacp::test::relative_error(mlacp::test::host_values(forward.output()),
                                          mlacp::test::host_values(rows_of(ref_forward.output(), map, mesh))),
              1e-10)
        << "y, " << choice.describe();
    EXPECT_LE(mlacp::test::relative_error(mlacp::test::host_values(grads.dx),
                                          mlacp::test::host_values(rows_of(ref.dx, map, mesh))),
              1e-10)
        << "dx, " << choice.describe();
    std::vector<double> dw_o = mlacp::test::host_values(grads.w_o);
    MPI_Allreduce(MPI_IN_PLACE, dw_o.data(), static_cast<int>(dw_o.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_LE(mlacp::test::relative_error(dw_o, mlacp::test::host_values(ref.w_o)), 1e-10)
        << "dw_o, " << choice.describe();
  }
}

// No choice within the budget: the same InvalidArgument on every rank, naming the budget and the smallest need.
TEST(MeshPlan, MemoryBudgetErrorNamesTheNumbersOnEveryRank) {
  const mlacp::MlaConfig config = test_config();
  const model::PlannedMesh unlimited = model::plan_mesh(MPI_COMM_WORLD, config, model::Dtype::float32, test_machine());
  ASSERT_FALSE(unlimited.plan.rows.empty());
  double smallest = unlimited.plan.rows.front().prediction.memory.total();
  for (const auto& row : unlimited.plan.rows) smallest = std::min(smallest, row.prediction.memory.total());
  ASSERT_GT(smallest, 1000.0);

  // The budget given, then the machine's.
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { model::plan_mesh(MPI_COMM_WORLD, config, model::Dtype::float32, test_machine(), 1000.0); },
      "no choice fits the memory budget of 1000 bytes");
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { model::plan_mesh(MPI_COMM_WORLD, config, model::Dtype::float32, test_machine(), 1000.0); },
      "the smallest need is " + bytes_text(smallest));
  model::MachineParams small = test_machine();
  small.memory_per_rank_bytes = smallest / 2;
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { model::plan_mesh(MPI_COMM_WORLD, config, model::Dtype::float32, small); },
      "memory budget of " + bytes_text(smallest / 2));
  // Exactly the smallest need fits.
  const auto fits = model::plan_mesh(MPI_COMM_WORLD, config, model::Dtype::float32, test_machine(), smallest);
  EXPECT_LE(fits.plan.best()->prediction.memory.total(), smallest);
}

TEST(MeshPlan, RanksWithDifferentInputsAreRefusedOnEveryRank) {
  if (mlacp::test::world_size() < 2) GTEST_SKIP() << "needs two ranks";
  mlacp::MlaConfig config = test_config();
  if (mlacp::test::world_rank() == 1) config.seq = 40;
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { model::plan_mesh(MPI_COMM_WORLD, config, model::Dtype::float32, test_machine()); },
      "the ranks passed different inputs");
  // The strategy and the layout are the plan's to choose: ranks may differ in them.
  config = test_config();
  if (mlacp::test::world_rank() == 1) config.strategy = mlacp::MlaStrategy::expanded;
  EXPECT_NO_THROW(model::plan_mesh(MPI_COMM_WORLD, config, model::Dtype::float32, test_machine()));
}

TEST(MeshPlan, ReadMachineGivesEveryRankRankZerosFile) {
  // A path only rank 0 writes (its pid), known on every rank.
  std::int64_t pid = static_cast<std::int64_t>(getpid());
  MPI_Bcast(&pid, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  const std::string path = "mlacp_test_mesh_plan_" + std::to_string(pid) + ".json";
  const model::MachineParams machine = test_machine();
  if (mlacp::test::world_rank() == 0) model::write_machine(machine, path);
  const model::MachineParams read = model::read_machine(MPI_COMM_WORLD, path);
  EXPECT_EQ(model::machine_to_json(read), model::machine_to_json(machine));
  MPI_Barrier(MPI_COMM_WORLD);
  if (mlacp::test::world_rank() == 0) std::remove(path.c_str());

  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { model::read_machine(MPI_COMM_WORLD, "no/such/machine.json"); },
      "cannot read no/such/machine.json (on rank 0)");
}

}  // namespace
