// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// OverlapPolicy (panelled_gemm.hpp, src/overlap_policy.cpp): which pending collectives make mlacp's GEMMs panel and
// poll. A collective that moves through shared memory is not polled (the GEMM beside it is one call, as in a blocking
// schedule), any other is from min_poll_bytes on, and a machine file sets that threshold from the model.
//
// Under ctest every rank is on this machine's one node, through shared memory (test_overlap_policy_np*), or over TCP
// with Open MPI's shared-memory BTL left out (test_overlap_policy_tcp_np2: MLACP_TESTBED_SHARED_MEMORY=0). The
// simulated cluster runs the same binary on 2 nodes of 2 ranks (unit_tests/testbed/test_on_nodes.sh, ctest -L testbed)
// with MLACP_TESTBED_NODES=2. The checks below expect what those say.
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/all_to_all.hpp>
#include <mlacp/backend.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/model/machine.hpp>
#include <mlacp/mpi/communicator.hpp>
#include <mlacp/panelled_gemm.hpp>
#include <mlacp/progress.hpp>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Tensor = Kokkos::View<double****, Kokkos::LayoutRight, Space::memory_space>;
using Matrix = Kokkos::View<double**, Kokkos::LayoutRight, Space::memory_space>;

// The nodes the ranks run on, as the test's driver placed them (1 unless the testbed says otherwise).
int expected_nodes() {
  const char* nodes = std::getenv("MLACP_TESTBED_NODES");
  return nodes != nullptr && *nodes != '\0' ? std::atoi(nodes) : 1;
}

// Whether the driver left MPI's shared-memory transport on (unless MLACP_TESTBED_SHARED_MEMORY=0).
bool expected_shared_memory_transport() {
  const char* on = std::getenv("MLACP_TESTBED_SHARED_MEMORY");
  return on == nullptr || std::string(on) != "0";
}

// The policy is process-wide: each test changes a copy and restores the original.
class PolicyScope {
 public:
  PolicyScope() : saved_(mlacp::overlap_policy()) {}
  ~PolicyScope() { mlacp::overlap_policy() = saved_; }
  mlacp::OverlapPolicy& policy() { return mlacp::overlap_policy(); }

 private:
  mlacp::OverlapPolicy saved_;
};

// A pending all-to-all of which each rank sends `bytes_per_rank` bytes, then a host GEMM of 8 panels' rows: the
// progress() calls the GEMM made (one before and one after an unpanelled call, one before each panel and one after
// the last of a panelled one) and whether the collective counted as polled.
struct GemmBeside {
  std::size_t progress_calls = 0;
  std::size_t polled = 0;
};

GemmBeside gemm_beside_collective(const mlacp::Mesh& mesh, std::int64_t bytes_per_rank) {
  const int p = mesh.size();
  const std::int64_t per_block = bytes_per_rank / static_cast<std::int64_t>(sizeof(double)) / p;
  Tensor x("x", 1, per_block, p, 1);
  const std::size_t polled_before = mlacp::polled_collectives();
  auto handle = mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "pending beside the GEMM");
  GemmBeside seen;
  seen.polled = mlacp::polled_collectives() - polled_before;
  const std::int64_t rows = 8 * mlacp::overlap_policy().min_panel_rows;
  Matrix a("a", rows, 16), b("b", 16, 16), c("c", rows, 16);
  const auto before = mlacp::progress_calls();
  mlacp::detail::gemm_with_progress(Space(), "N", "N", 1.0, a, b, 0.0, c);
  seen.progress_calls = mlacp::progress_calls() - before;
  handle.wait();
  EXPECT_EQ(mlacp::polled_collectives(), polled_before) << "the wait unregisters the polled collective";
  return seen;
}

constexpr std::int64_t one_mib = 1 << 20;

TEST(OverlapPolicy, TheMeshKnowsWhetherItsBytesMoveThroughSharedMemory) {
  EXPECT_EQ(mlacp::mpi::shared_memory_transport_enabled(), expected_shared_memory_transport());
  const bool shared = expected_nodes() == 1 && expected_shared_memory_transport();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  EXPECT_EQ(mesh.shared_memory(), shared);
  // Moved meshes keep it.
  mlacp::Mesh moved(std::move(mesh));
  EXPECT_EQ(moved.shared_memory(), shared);
  // A mesh of one rank moves nothing over the network.
  MPI_Comm self = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_SELF, &self);
  {
    mlacp::Mesh alone(self, mlacp::Mesh::Ownership::borrow);
    EXPECT_EQ(alone.shared_memory(), expected_shared_memory_transport());
  }
  MPI_Comm_free(&self);
}

// With one Ulysses group per node, the groups move through shared memory and the ring over the network.
TEST(OverlapPolicy, ATwoLevelMeshPollsItsRingOnly) {
  const int nodes = expected_nodes();
  if (nodes == 1) GTEST_SKIP() << "one node: Ring::node() is the flat mesh (the testbed runs this on 2 nodes)";
  mlacp::Mesh mesh(MPI_COMM_WORLD, mlacp::Ring::node());
  ASSERT_EQ(mesh.ring_size(), nodes);
  EXPECT_FALSE(mesh.shared_memory());
  EXPECT_EQ(mesh.ulysses_group().shared_memory(), expected_shared_memory_transport());
  EXPECT_FALSE(mesh.ring_group().shared_memory());
  EXPECT_EQ(mlacp::detail::worth_polling(mesh.ulysses_group(), one_mib), !expected_shared_memory_transport());
  EXPECT_TRUE(mlacp::detail::worth_polling(mesh.ring_group(), one_mib));
}

TEST(OverlapPolicy, TheDefaultPollsOnlyCollectivesOverTheNetwork) {
  PolicyScope scope;
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const bool across = !mesh.shared_memory();
  EXPECT_EQ(mlacp::detail::worth_polling(mesh, one_mib), across);
  EXPECT_FALSE(mlacp::detail::worth_polling(mesh, scope.policy().min_poll_bytes - 1)) << "below the threshold";
  if (mesh.size() == 1) return;  // nothing is pending at P = 1
  const GemmBeside seen = gemm_beside_collective(mesh, one_mib);
  if (!mlacp::Backend<Space>::polls_progress) {
    EXPECT_EQ(seen.progress_calls, 0u);
  } else if (across) {
    EXPECT_EQ(seen.polled, 1u);
    EXPECT_EQ(seen.progress_calls, 9u) << "8 panels: a progress() before each and one after the last";
  } else {
    EXPECT_EQ(seen.polled, 0u) << "shared memory: nothing for polling to hide";
    EXPECT_EQ(seen.progress_calls, 2u) << "one GEMM call, progress() before and after it";
  }
}

TEST(OverlapPolicy, PollSharedMemoryAndTheByteThresholdDecide) {
  PolicyScope scope;
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  scope.policy().poll_shared_memory = true;
  scope.policy().min_poll_bytes = one_mib;
  EXPECT_TRUE(mlacp::detail::worth_polling(mesh, one_mib));
  EXPECT_FALSE(mlacp::detail::worth_polling(mesh, one_mib - 1));
  if (mesh.size() == 1 || !mlacp::Backend<Space>::polls_progress) return;
  const GemmBeside polled = gemm_beside_collective(mesh, one_mib);
  EXPECT_EQ(polled.polled, 1u);
  EXPECT_EQ(polled.progress_calls, 9u);
  // A collective below the threshold is not polled, whatever its transport.
  scope.policy().min_poll_bytes = 4 * one_mib;
  const GemmBeside small = gemm_beside_collective(mesh, one_mib);
  EXPECT_EQ(small.polled, 0u);
  EXPECT_EQ(small.progress_calls, 2u);
}

TEST(OverlapPolicy, AMachineFileSetsTheThresholdFromTheModel) {
  const mlacp::OverlapPolicy base;  // min_hidden_s 200 us
  mlacp::model::MachineParams m;
  m.overlap_efficiency = 0.5;
  m.inter.alpha_s = 10e-6;
  m.inter.beta_s_per_byte = 1 / 250e6;  // 2 Gbit/s
  // 0.5 * (10 us + bytes / 250 MB/s) >= 200 us from (400 - 10) us * 250 MB/s = 97500 bytes on.
  const mlacp::OverlapPolicy policy = mlacp::overlap_policy_for(m, base);
  EXPECT_NEAR(static_cast<double>(policy.min_poll_bytes), 97500, 1);  // ceil of a rounded quotient
  EXPECT_EQ(policy.panels, base.panels);
  EXPECT_EQ(policy.min_panel_rows, base.min_panel_rows);
  EXPECT_EQ(policy.poll_shared_memory, base.poll_shared_memory);
  // A machine that hides nothing polls nothing; a latency the model hides enough of polls everything.
  m.overlap_efficiency = 0;
  EXPECT_EQ(mlacp::overlap_policy_for(m, base).min_poll_bytes, std::numeric_limits<std::int64_t>::max());
  m.overlap_efficiency = 1;
  m.inter.alpha_s = 1e-3;
  EXPECT_EQ(mlacp::overlap_policy_for(m, base).min_poll_bytes, 0);
  // A calibration on one node (no link between nodes): its one link, `intra`, decides.
  mlacp::model::MachineParams one_node;
  one_node.overlap_efficiency = 0.5;
  one_node.intra = {10e-6, 1 / 250e6};
  EXPECT_NEAR(static_cast<double>(mlacp::overlap_policy_for(one_node, base).min_poll_bytes), 97500, 1);
  // A faster link needs more bytes for the same hidden time: 100 Gbit/s, full overlap, no latency.
  m.inter.alpha_s = 0;
  m.inter.beta_s_per_byte = 1 / 12.5e9;
  EXPECT_NEAR(static_cast<double>(mlacp::overlap_policy_for(m, base).min_poll_bytes), 2500000, 1);
}

}  // namespace
