// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// launch_all_to_all (include/mlacp/all_to_all.hpp), even and uneven, against references built by gathering full tensors
// to every rank.
#include "collective_test_helpers.hpp"

namespace {

using namespace mlacp::test::collectives;

template <class T>
class Collectives : public ::testing::Test {};
TYPED_TEST_SUITE(Collectives, ValueTypes);

TYPED_TEST(Collectives, AllToAllMatchesGatheredReferenceForEveryDimensionPairRank4) {
  const int p = mlacp::test::world_size();
  check_all_to_all_against_reference<TypeParam, 4>({2 * p, 3 * p, 4 * p, 5 * p});
}

TYPED_TEST(Collectives, AllToAllMatchesGatheredReferenceRank3AndRank5) {
  const int p = mlacp::test::world_size();
  check_all_to_all_against_reference<TypeParam, 3>({p, 2 * p, 3 * p});
  check_all_to_all_against_reference<TypeParam, 5>({p, 2 * p, p, 3 * p, 2 * p});
}

TYPED_TEST(Collectives, SeqToHeadThenHeadToSeqIsTheIdentity) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const Extents e{2, 5, 3 * p, 7};  // [B, s, H, d]
  const auto values = local_values<TypeParam>(e, mesh.rank());
  auto x = make_view<TypeParam, 4>(e, values);
  auto heads = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh, "seq_to_head").wait();
  EXPECT_EQ(extents_of(heads), (Extents{2, 5 * p, 3, 7}));
  auto back = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), heads, 2, 1, mesh, "head_to_seq").wait();
  EXPECT_EQ(extents_of(back), e);
  EXPECT_EQ(to_host(back), values);
}

TYPED_TEST(Collectives, UnevenAllToAllMatchesReferenceForTheLayersDimensionPairs) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto parts = uneven_partitions(p);
  // [B, S, H, d] with tokens (dim 1) and heads (dim 2) split unevenly, and the pairs with the batch (0).
  const Extents base{2, 3, 4, 3};  // the extents of the partitioned pair are replaced
  const std::pair<int, int> pairs[] = {{1, 2}, {2, 1}, {2, 0}, {0, 2}};
  for (const auto& [g, s] : pairs)
    for (std::size_t a = 0; a < parts.size(); ++a) {
      const auto& gather = parts[a];
      const auto& scatter = parts[(a + 1) % parts.size()];
      check_all_to_all_v<TypeParam, 4>(base, g, s, gather, scatter, mesh, a == 0);
    }
}

TYPED_TEST(Collectives, UnevenAllToAllRank3AndRank5AndBatchOne) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto parts = uneven_partitions(p);
  for (std::size_t a = 0; a < parts.size(); ++a) {
    const auto& gather = parts[a];
    const auto& scatter = parts[(a + 2) % parts.size()];
    check_all_to_all_v<TypeParam, 3>({3, 0, 0}, 1, 2, gather, scatter, mesh, false);
    check_all_to_all_v<TypeParam, 3>({0, 0, 5}, 0, 1, gather, scatter, mesh, a == 1);  // sent and received in place
    check_all_to_all_v<TypeParam, 5>({2, 0, 0, 2, 3}, 1, 2, gather, scatter, mesh, a == 2);
    check_all_to_all_v<TypeParam, 5>({2, 2, 0, 3, 0}, 4, 2, gather, scatter, mesh, false);
    // Batch 1: the scattered blocks are contiguous (sent without a pack), the gathered ones land in place.
    check_all_to_all_v<TypeParam, 4>({1, 0, 0, 3}, 1, 2, gather, scatter, mesh, false);
  }
}

TYPED_TEST(Collectives, UnevenSeqToHeadThenHeadToSeqIsTheIdentity) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const mlacp::Partition seq(4 * p + 1, p), heads(p + 1, p);
  const Extents e{2, seq.count(mesh.rank()), heads.total(), 5};
  const auto values = local_values<TypeParam>(e, mesh.rank());
  auto x = make_view<TypeParam, 4>(e, values);
  const auto space = Kokkos::DefaultExecutionSpace();
  auto by_heads = mlacp::launch_all_to_all(space, x, 1, 2, seq, heads, mesh, "seq_to_head").wait();
  EXPECT_EQ(extents_of(by_heads), (Extents{2, seq.total(), heads.count(mesh.rank()), 5}));
  auto back = mlacp::launch_all_to_all(space, by_heads, 2, 1, heads, seq, mesh, "head_to_seq").wait();
  EXPECT_EQ(extents_of(back), e);
  EXPECT_EQ(to_host(back), values);
}

}  // namespace
