// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The two-level mesh of issue 21 (item 1): P = U x C ranks, C Ulysses groups of U consecutive ranks (or one group per
// node) and U rings of C ranks. The pure grouping logic without MPI; the sub-communicators it builds, checked by an
// allgather of world ranks over each; ring = 1 is the flat mesh; bad rings are one error on every rank; and the MLA
// layer refuses a two-level mesh until ring attention exists.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/mla_attention.hpp>

#include <string>
#include <utility>
#include <vector>

namespace {

using Mem = Kokkos::DefaultExecutionSpace::memory_space;
using mlacp::detail::group_by_node;
using mlacp::detail::group_by_ring;

// Every rank's world rank, over `comm`, in its rank order.
std::vector<int> world_ranks_of(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> all(static_cast<std::size_t>(size));
  const int me = mlacp::test::world_rank();
  MPI_Allgather(&me, 1, MPI_INT, all.data(), 1, MPI_INT, comm);
  return all;
}

TEST(MeshGrouping, ConsecutiveGroupsAndRings) {
  for (const auto& [p, c] : std::vector<std::pair<int, int>>{{1, 1}, {4, 1}, {4, 2}, {4, 4}, {6, 3}, {6, 2}, {8, 4}}) {
    const auto g = group_by_ring(p, c);
    ASSERT_TRUE(g.error.empty()) << g.error;
    EXPECT_EQ(g.ring_size, c);
    EXPECT_EQ(g.ulysses_size, p / c);
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(g.group_of[static_cast<std::size_t>(r)], r / (p / c)) << "P=" << p << " C=" << c << " r=" << r;
      EXPECT_EQ(g.position_of[static_cast<std::size_t>(r)], r % (p / c)) << "P=" << p << " C=" << c << " r=" << r;
    }
  }
  const auto two_by_two = group_by_ring(4, 2);
  EXPECT_EQ(two_by_two.group_of, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(two_by_two.position_of, (std::vector<int>{0, 1, 0, 1}));
}

TEST(MeshGrouping, BadRingSizesAreRefusedNamingTheValue) {
  auto e = group_by_ring(4, 3).error;
  EXPECT_NE(e.find("ring = 3 does not divide the 4 ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("(1, 2, 4)"), std::string::npos) << e;
  EXPECT_TRUE(group_by_ring(4, 3).group_of.empty());
  e = group_by_ring(4, 0).error;
  EXPECT_NE(e.find("ring = 0; expected a positive ring size"), std::string::npos) << e;
  e = group_by_ring(4, -2).error;
  EXPECT_NE(e.find("ring = -2; expected a positive ring size"), std::string::npos) << e;
  EXPECT_FALSE(group_by_ring(3, 2).error.empty());
}

TEST(MeshGrouping, OneGroupPerNodeWhateverThePlacement) {
  // Block placement: nodes {0,1} and {2,3} (ids are the node's lowest rank).
  auto g = group_by_node({0, 0, 2, 2});
  ASSERT_TRUE(g.error.empty()) << g.error;
  EXPECT_EQ(g.ring_size, 2);
  EXPECT_EQ(g.ulysses_size, 2);
  EXPECT_EQ(g.group_of, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(g.position_of, (std::vector<int>{0, 1, 0, 1}));
  // --map-by node (round robin over 2 nodes): node 0 holds ranks 0, 2, 4; node 1 holds 1, 3, 5.
  g = group_by_node({0, 1, 0, 1, 0, 1});
  ASSERT_TRUE(g.error.empty()) << g.error;
  EXPECT_EQ(g.ring_size, 2);
  EXPECT_EQ(g.ulysses_size, 3);
  EXPECT_EQ(g.group_of, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(g.position_of, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  // Arbitrary ids: groups are ordered by their first rank, not by the id.
  g = group_by_node({7, 3, 3, 7});
  ASSERT_TRUE(g.error.empty()) << g.error;
  EXPECT_EQ(g.group_of, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(g.position_of, (std::vector<int>{0, 0, 1, 1}));
  // One node: flat.
  g = group_by_node({0, 0, 0, 0});
  EXPECT_EQ(g.ring_size, 1);
  EXPECT_EQ(g.ulysses_size, 4);
  // Uneven nodes: refused, naming the sizes found.
  g = group_by_node({0, 0, 0, 3});
  EXPECT_TRUE(g.group_of.empty());
  EXPECT_NE(g.error.find("the nodes hold different numbers of ranks (the node of rank 0: 3 ranks, the node of rank 3: "
                         "1 rank)"),
            std::string::npos)
      << g.error;
}

TEST(MeshLayout, TwoLevelMeshBuildsTheGroupsAndTheRings) {
  const int p = mlacp::test::world_size();
  if (p % 2 != 0 || p < 2) GTEST_SKIP() << "needs an even number of ranks";
  const int u = p / 2;
  const int me = mlacp::test::world_rank();
  mlacp::Mesh mesh(MPI_COMM_WORLD, 2);
  EXPECT_EQ(mesh.size(), p);  // the whole mesh stays the whole communicator
  EXPECT_EQ(mesh.rank(), me);
  EXPECT_EQ(mesh.ring_size(), 2);
  EXPECT_EQ(mesh.ulysses_size(), u);
  EXPECT_EQ(mesh.ulysses_rank(), me % u);
  EXPECT_EQ(mesh.ring_rank(), me / u);
  EXPECT_EQ(mesh.ulysses_group().size(), u);
  EXPECT_EQ(mesh.ring_group().size(), 2);
  EXPECT_TRUE(mesh.ulysses_group().owns_communicator());
  std::vector<int> group;
  for (int r = 0; r < u; ++r) group.push_back((me / u) * u + r);
  EXPECT_EQ(world_ranks_of(mesh.ulysses_group().comm()), group);
  EXPECT_EQ(world_ranks_of(mesh.ring_group().comm()), (std::vector<int>{me % u, me % u + u}));
  if (p == 4) {  // the example: groups {0,1},{2,3}; rings {0,2},{1,3}
    EXPECT_EQ(world_ranks_of(mesh.ulysses_group().comm()),
              me < 2 ? (std::vector<int>{0, 1}) : (std::vector<int>{2, 3}));
    EXPECT_EQ(world_ranks_of(mesh.ring_group().comm()),
              me % 2 == 0 ? (std::vector<int>{0, 2}) : (std::vector<int>{1, 3}));
  }
  // Move-only: the sub-meshes travel with the mesh.
  mlacp::Mesh moved(std::move(mesh));
  EXPECT_EQ(moved.ring_size(), 2);
  EXPECT_EQ(world_ranks_of(moved.ring_group().comm()), (std::vector<int>{me % u, me % u + u}));
  // Collective setters reach the sub-meshes.
  moved.set_checked(false);
  EXPECT_FALSE(moved.ulysses_group().checked());
  EXPECT_FALSE(moved.ring_group().checked());
}

TEST(MeshLayout, RingOneIsTheFlatMesh) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh flat(MPI_COMM_WORLD);
  mlacp::Mesh one(MPI_COMM_WORLD, 1);
  for (const mlacp::Mesh* m : {&flat, &one}) {
    EXPECT_EQ(m->size(), p);
    EXPECT_EQ(m->ring_size(), 1);
    EXPECT_EQ(m->ulysses_size(), p);
    EXPECT_EQ(m->ulysses_rank(), m->rank());
    EXPECT_EQ(m->ring_rank(), 0);
    EXPECT_EQ(&m->ulysses_group(), m);  // no sub-mesh: the mesh itself
    mlacp::test::expect_error<mlacp::UsageError>([&] { (void)m->ring_group(); }, "flat (ring = 1)");
  }
}

TEST(MeshLayout, RingEqualToPIsOneRankPerGroup) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD, p);
  EXPECT_EQ(mesh.ring_size(), p);
  EXPECT_EQ(mesh.ulysses_size(), 1);
  EXPECT_EQ(mesh.ring_rank(), mesh.rank());
}

TEST(MeshLayout, BadRingsAreRefusedOnEveryRank) {
  const int p = mlacp::test::world_size();
  mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::Mesh mesh(MPI_COMM_WORLD, 0); },
                                                    "ring = 0; expected a positive ring size");
  mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::Mesh mesh(MPI_COMM_WORLD, p + 1); },
                                                    "does not divide the " + std::to_string(p) + " ranks");
  if (p == 4)
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::Mesh mesh(MPI_COMM_WORLD, 3); },
                                                      "ring = 3 does not divide the 4 ranks");
  if (p > 1) {  // ranks asking for different rings: one error naming them, on every rank, nothing split
    const int ring = mlacp::test::world_rank() == p - 1 ? p : 1;
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::Mesh mesh(MPI_COMM_WORLD, ring); },
                                                      "disagree on the ring of the two-level mesh");
  }
}

TEST(MeshLayout, RingNodeOnOneMachineIsFlat) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD, mlacp::Ring::node());
  EXPECT_EQ(mesh.ring_size(), 1);
  EXPECT_EQ(mesh.ulysses_size(), p);
  EXPECT_EQ(&mesh.ulysses_group(), &mesh);
}

}  // namespace
