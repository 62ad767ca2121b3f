// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// launch_reduce_scatter (include/mlacp/reduce_scatter.hpp): the adjoint of the all-gather, even and uneven, its
// algorithms and their configuration.
#include "collective_test_helpers.hpp"

namespace {

using namespace mlacp::test::collectives;

template <class T>
class Collectives : public ::testing::Test {};
TYPED_TEST_SUITE(Collectives, ValueTypes);

TYPED_TEST(Collectives, ReduceScatterIsTheAdjointOfAllGather) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  const int me = mlacp::test::world_rank();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const Extents xe{2, 3, 5}, ye{2, 3 * p, 5};
  std::vector<T> xv(static_cast<std::size_t>(product(xe))), yv(static_cast<std::size_t>(product(ye)));
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<T>(std::sin(1.0 + i + 31.0 * me));
  for (std::size_t i = 0; i < yv.size(); ++i) yv[i] = static_cast<T>(std::cos(2.0 + i + 17.0 * me));
  auto x = make_view<T, 3>(xe, xv);
  auto y = make_view<T, 3>(ye, yv);
  const auto ag = to_host(mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, 1, mesh).wait());
  const auto rs = to_host(mlacp::launch_reduce_scatter(Kokkos::DefaultExecutionSpace(), y, 1, mesh).wait());
  double local[2] = {0, 0}, global[2] = {0, 0};
  for (std::size_t i = 0; i < ag.size(); ++i) local[0] += double(ag[i]) * double(yv[i]);
  for (std::size_t i = 0; i < rs.size(); ++i) local[1] += double(xv[i]) * double(rs[i]);
  MPI_Allreduce(local, global, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const double tolerance = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  EXPECT_NEAR(global[0], global[1], tolerance * (std::abs(global[0]) + 1.0));
}

TYPED_TEST(Collectives, ReduceScatterAlgorithmsAgreeAlongEveryDimension) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  mlacp::Mesh pairwise(MPI_COMM_WORLD);
  mlacp::Mesh library(MPI_COMM_WORLD);
  ASSERT_EQ(pairwise.reduce_scatter_algorithm(), mlacp::ReduceScatterAlgorithm::pairwise);
  library.set_reduce_scatter_algorithm(mlacp::ReduceScatterAlgorithm::mpi);
  const Extents e{2 * p, 3 * p, 4 * p, 5};
  auto x = make_view<T, 4>(e, local_values<T>(e, pairwise.rank()));
  const auto space = Kokkos::DefaultExecutionSpace();
  // dim 0: the blocks are the input itself (sent without a pack); dims 1, 2: packed.
  for (int dim = 0; dim < 3; ++dim) {
    const auto a = to_host(mlacp::launch_reduce_scatter(space, x, dim, pairwise, "pairwise").wait());
    const auto b = to_host(mlacp::launch_reduce_scatter(space, x, dim, library, "mpi").wait());
    ASSERT_EQ(a.size(), b.size());
    const double tolerance = std::is_same_v<T, float> ? 1e-5 : 1e-13;
    for (std::size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(double(a[i]), double(b[i]), tolerance * (std::abs(double(b[i])) + 1.0))
          << "dim " << dim << " i " << i;
  }
}

TEST(CollectiveConfiguration, UnknownReduceScatterAlgorithmInTheEnvironmentIsRefused) {
  ASSERT_EQ(setenv("MLACP_REDUCE_SCATTER", "ring", 1), 0);
  mlacp::test::expect_error<mlacp::InvalidArgument>([] { mlacp::Mesh mesh(MPI_COMM_WORLD); },
                                                    "MLACP_REDUCE_SCATTER='ring'; expected 'pairwise' or 'mpi'");
  ASSERT_EQ(setenv("MLACP_REDUCE_SCATTER", "mpi", 1), 0);
  EXPECT_EQ(mlacp::Mesh(MPI_COMM_WORLD).reduce_scatter_algorithm(), mlacp::ReduceScatterAlgorithm::mpi);
  ASSERT_EQ(unsetenv("MLACP_REDUCE_SCATTER"), 0);
  EXPECT_EQ(mlacp::Mesh(MPI_COMM_WORLD).reduce_scatter_algorithm(), mlacp::ReduceScatterAlgorithm::pairwise);
}

TYPED_TEST(Collectives, UnevenReduceScatterIsTheAdjointOfUnevenAllGather) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  const int me = mlacp::test::world_rank();
  mlacp::Mesh pairwise(MPI_COMM_WORLD);
  mlacp::Mesh library(MPI_COMM_WORLD);
  library.set_reduce_scatter_algorithm(mlacp::ReduceScatterAlgorithm::mpi);
  for (const auto& part : uneven_partitions(p)) {
    for (const mlacp::Mesh* mesh : {&pairwise, &library}) {
      const Extents xe{2, part.count(me), 5}, ye{2, part.total(), 5};
      std::vector<T> xv(static_cast<std::size_t>(product(xe))), yv(static_cast<std::size_t>(product(ye)));
      for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<T>(std::sin(1.0 + i + 31.0 * me));
      for (std::size_t i = 0; i < yv.size(); ++i) yv[i] = static_cast<T>(std::cos(2.0 + i + 17.0 * me));
      const auto space = Kokkos::DefaultExecutionSpace();
      const auto ag = to_host(mlacp::launch_all_gather(space, make_view<T, 3>(xe, xv), 1, part, *mesh).wait());
      const auto rs = to_host(mlacp::launch_reduce_scatter(space, make_view<T, 3>(ye, yv), 1, part, *mesh).wait());
      ASSERT_EQ(ag.size(), yv.size());
      ASSERT_EQ(rs.size(), xv.size());
      double local[2] = {0, 0}, global[2] = {0, 0};
      for (std::size_t i = 0; i < ag.size(); ++i) local[0] += double(ag[i]) * double(yv[i]);
      for (std::size_t i = 0; i < rs.size(); ++i) local[1] += double(xv[i]) * double(rs[i]);
      MPI_Allreduce(local, global, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      const double tolerance = std::is_same_v<T, float> ? 1e-5 : 1e-12;
      EXPECT_NEAR(global[0], global[1], tolerance * (std::abs(global[0]) + 1.0)) << "partition " << part.str();
    }
  }
}

}  // namespace
