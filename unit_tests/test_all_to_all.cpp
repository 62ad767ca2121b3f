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

// ---- bf16: moved as 2-byte elements, every bit kept (distinct bit patterns, of both signs, far apart in magnitude).

TEST(Bf16Collectives, AllToAllMovesBf16ExactlyForEveryDimensionPair) {
  const int p = mlacp::test::world_size();
  check_all_to_all_against_reference<mlacp::bf16, 3>({p, 2 * p, 3 * p});
  check_all_to_all_against_reference<mlacp::bf16, 4>({2 * p, p, 2 * p, 3 * p});
  check_all_to_all_against_reference<mlacp::bf16, 5>({p, p, p, p, 2 * p});
}

TEST(Bf16Collectives, UnevenAllToAllMovesBf16Exactly) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mlacp::Mesh staged(MPI_COMM_WORLD);
  staged.set_host_staging(true);
  const auto parts = uneven_partitions(p);
  const std::pair<int, int> pairs[] = {{1, 2}, {2, 1}, {2, 0}};
  for (const auto& [g, s] : pairs)
    for (std::size_t a = 0; a < parts.size(); ++a) {
      const auto& gather = parts[a];
      const auto& scatter = parts[(a + 1) % parts.size()];
      check_all_to_all_v<mlacp::bf16, 4>({2, 3, 4, 3}, g, s, gather, scatter, a == 1 ? staged : mesh, a == 0);
    }
  // Batch 1: sent and received in place.
  check_all_to_all_v<mlacp::bf16, 4>({1, 0, 0, 3}, 1, 2, parts[0], parts[1], mesh, false);
}

TEST(Bf16Collectives, SeqToHeadThenHeadToSeqIsTheIdentity) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const Extents e{2, 5, 3 * p, 7};
  const auto values = local_values<mlacp::bf16>(e, mesh.rank());
  auto x = make_view<mlacp::bf16, 4>(e, values);
  const auto space = Kokkos::DefaultExecutionSpace();
  auto heads = mlacp::launch_all_to_all(space, x, 1, 2, mesh, "seq_to_head").wait();
  auto back = mlacp::launch_all_to_all(space, heads, 2, 1, mesh, "head_to_seq").wait();
  EXPECT_EQ(bits_of(to_host(back)), bits_of(values));
}

// A float rank and a bf16 rank are told apart before anything moves: the value size is agreed on (checked mode).
TEST(Bf16Collectives, RanksPassingFloatAndBf16AreRefusedOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks";
  ASSERT_TRUE(mesh.checked());
  const auto p = static_cast<std::size_t>(mesh.size());
  const auto space = Kokkos::DefaultExecutionSpace();
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] {
        if (mesh.rank() == 0) {
          Kokkos::View<float****, Kokkos::LayoutRight> x("x", 2, 4, 4 * p, 3);
          mlacp::launch_all_to_all(space, x, 1, 2, mesh);
        } else {
          Kokkos::View<mlacp::bf16****, Kokkos::LayoutRight> x("x", 2, 4, 4 * p, 3);
          mlacp::launch_all_to_all(space, x, 1, 2, mesh);
        }
      },
      "the ranks of the mesh disagree on the value size in bytes (the value type: 4 float, 8 double, 2 bf16) (from 2 "
      "to 4 across ranks; this rank passed " +
          std::string(mesh.rank() == 0 ? "4" : "2") + ", shape [2, 4, " + std::to_string(4 * p) + ", 3] of " +
          (mesh.rank() == 0 ? "float" : "bf16"));
}

}  // namespace
