// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// launch_all_gather (include/mlacp/all_gather.hpp), even and uneven, against references (with the reduce-scatter of the
// same tensors).
#include "collective_test_helpers.hpp"

namespace {

using namespace mlacp::test::collectives;

template <class T>
class Collectives : public ::testing::Test {};
TYPED_TEST_SUITE(Collectives, ValueTypes);

TYPED_TEST(Collectives, AllGatherAndReduceScatterMatchReferences) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  const int me = mlacp::test::world_rank();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const Extents e{2, 3 * p, 4};
  const auto values = local_values<T>(e, me);
  const auto all = gather_all(values);
  auto x = make_view<T, 3>(e, values);
  for (int dim = 0; dim < 3; ++dim) {
    auto gathered = mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, dim, mesh).wait();
    Extents ge = e;
    ge[static_cast<std::size_t>(dim)] *= p;
    ASSERT_EQ(extents_of(gathered), ge);
    std::vector<T> expected(static_cast<std::size_t>(product(ge)));
    for (std::int64_t k = 0; k < product(ge); ++k) {
      Extents idx = unravel(k, ge);
      const auto r = static_cast<std::size_t>(idx[static_cast<std::size_t>(dim)] / e[static_cast<std::size_t>(dim)]);
      idx[static_cast<std::size_t>(dim)] %= e[static_cast<std::size_t>(dim)];
      expected[static_cast<std::size_t>(k)] = all[r][static_cast<std::size_t>(ravel(idx, e))];
    }
    EXPECT_EQ(to_host(gathered), expected) << "all_gather dim " << dim;

    if (e[static_cast<std::size_t>(dim)] % p != 0) continue;
    auto reduced = mlacp::launch_reduce_scatter(Kokkos::DefaultExecutionSpace(), x, dim, mesh).wait();
    Extents re = e;
    re[static_cast<std::size_t>(dim)] /= p;
    ASSERT_EQ(extents_of(reduced), re);
    std::vector<T> sum(static_cast<std::size_t>(product(re)), T(0));
    for (std::int64_t k = 0; k < product(re); ++k) {
      Extents idx = unravel(k, re);
      idx[static_cast<std::size_t>(dim)] += me * re[static_cast<std::size_t>(dim)];
      for (int r = 0; r < p; ++r)
        sum[static_cast<std::size_t>(k)] += all[static_cast<std::size_t>(r)][static_cast<std::size_t>(ravel(idx, e))];
    }
    EXPECT_EQ(to_host(reduced), sum) << "reduce_scatter dim " << dim;
  }
}

TYPED_TEST(Collectives, UnevenAllGatherAndReduceScatterMatchReferences) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mlacp::Mesh library(MPI_COMM_WORLD);
  library.set_reduce_scatter_algorithm(mlacp::ReduceScatterAlgorithm::mpi);
  mlacp::Mesh staged(MPI_COMM_WORLD);
  staged.set_host_staging(true);
  const auto parts = uneven_partitions(p);
  for (std::size_t a = 0; a < parts.size(); ++a) {
    for (int dim = 0; dim < 3; ++dim) {
      check_all_gather_and_reduce_scatter_v<TypeParam, 3>({2, 3, 4}, dim, parts[a], mesh, a == 0);
      check_all_gather_and_reduce_scatter_v<TypeParam, 3>({2, 3, 4}, dim, parts[a], library, a == 1);
    }
    // The layer's case: the latent [B, S, r] gathered and reduce-scattered along the tokens (dim 1).
    check_all_gather_and_reduce_scatter_v<TypeParam, 4>({2, 0, 3, 2}, 1, parts[a], staged, false);
    check_all_gather_and_reduce_scatter_v<TypeParam, 5>({1, 0, 2, 3, 2}, 1, parts[a], mesh, true);
  }
}

// bf16: the all-gather moves 2-byte elements exactly (distinct bit patterns), even (a uniform partition takes the even
// path) and uneven, in place and packed, staged through the host; the reduce-scatter of the same helper sums in float
// and rounds once (its own test: test_reduce_scatter).
TEST(Bf16Collectives, AllGatherMovesBf16Exactly) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mlacp::Mesh staged(MPI_COMM_WORLD);
  staged.set_host_staging(true);
  auto parts = uneven_partitions(p);
  parts.insert(parts.begin(), mlacp::Partition(2 * p, p));  // uniform: the even all-gather
  for (std::size_t a = 0; a < parts.size(); ++a) {
    for (int dim = 0; dim < 3; ++dim)
      check_all_gather_and_reduce_scatter_v<mlacp::bf16, 3>({2, 3, 4}, dim, parts[a], a == 2 ? staged : mesh, a == 1);
    check_all_gather_and_reduce_scatter_v<mlacp::bf16, 4>({2, 0, 3, 2}, 1, parts[a], staged, false);
    check_all_gather_and_reduce_scatter_v<mlacp::bf16, 5>({1, 0, 2, 3, 2}, 1, parts[a], mesh, true);
  }
}

}  // namespace
