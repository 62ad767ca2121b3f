// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the three collectives share (include/mlacp/collectives.hpp): host staging, P == 1, uniform partitions, pooled
// buffers.
#include "collective_test_helpers.hpp"

namespace {

using namespace mlacp::test::collectives;

template <class T>
class Collectives : public ::testing::Test {};
TYPED_TEST_SUITE(Collectives, ValueTypes);

TYPED_TEST(Collectives, HostStagingPathGivesTheSameResults) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  mlacp::Mesh direct(MPI_COMM_WORLD);
  mlacp::Mesh staged(MPI_COMM_WORLD);
  staged.set_host_staging(true);
  ASSERT_TRUE(staged.host_staging());
  const Extents e{2, 2 * p, 3 * p, 5};
  auto x = make_view<T, 4>(e, local_values<T>(e, direct.rank()));
  const auto space = Kokkos::DefaultExecutionSpace();
  EXPECT_EQ(to_host(mlacp::launch_all_to_all(space, x, 1, 2, staged).wait()),
            to_host(mlacp::launch_all_to_all(space, x, 1, 2, direct).wait()));
  EXPECT_EQ(to_host(mlacp::launch_all_gather(space, x, 1, staged).wait()),
            to_host(mlacp::launch_all_gather(space, x, 1, direct).wait()));
  EXPECT_EQ(to_host(mlacp::launch_reduce_scatter(space, x, 2, staged).wait()),
            to_host(mlacp::launch_reduce_scatter(space, x, 2, direct).wait()));
  // Gathering dim 0 receives in place (no unpack): staged too.
  EXPECT_EQ(to_host(mlacp::launch_all_to_all(space, x, 0, 2, staged).wait()),
            to_host(mlacp::launch_all_to_all(space, x, 0, 2, direct).wait()));
  EXPECT_EQ(to_host(mlacp::launch_all_gather(space, x, 0, staged).wait()),
            to_host(mlacp::launch_all_gather(space, x, 0, direct).wait()));
}

TYPED_TEST(Collectives, SingleRankGroupReturnsTheInputAllocation) {
  mlacp::Mesh self(MPI_COMM_SELF);
  Kokkos::View<TypeParam****, Kokkos::LayoutRight> x("x", 2, 3, 4, 5);
  auto a2a = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, self);
  EXPECT_TRUE(a2a.test());
  EXPECT_EQ(a2a.wait().data(), x.data());
  EXPECT_EQ(mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, 1, self).wait().data(), x.data());
  EXPECT_EQ(mlacp::launch_reduce_scatter(Kokkos::DefaultExecutionSpace(), x, 1, self).wait().data(), x.data());
}

TYPED_TEST(Collectives, UniformPartitionsGiveTheEvenCollectivesResults) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto space = Kokkos::DefaultExecutionSpace();
  const Extents e{2, 3, 2 * p, 4};
  const auto values = local_values<T>(e, mesh.rank());
  auto x = make_view<T, 4>(e, values);
  const mlacp::Partition tokens(3 * p, p), heads(2 * p, p);
  ASSERT_TRUE(tokens.uniform());
  EXPECT_EQ(to_host(mlacp::launch_all_to_all(space, x, 1, 2, tokens, heads, mesh).wait()),
            to_host(mlacp::launch_all_to_all(space, x, 1, 2, mesh).wait()));
  EXPECT_EQ(to_host(mlacp::launch_all_gather(space, x, 1, tokens, mesh).wait()),
            to_host(mlacp::launch_all_gather(space, x, 1, mesh).wait()));
  EXPECT_EQ(to_host(mlacp::launch_reduce_scatter(space, x, 2, heads, mesh).wait()),
            to_host(mlacp::launch_reduce_scatter(space, x, 2, mesh).wait()));
}

TEST(UnevenCollectives, SteadyStateAllocatesNoCommunicationBuffer) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto space = Kokkos::DefaultExecutionSpace();
  const mlacp::Partition seq(3 * p + 1, p), heads(2 * p - 1, p);
  Kokkos::View<double****, Kokkos::LayoutRight> x("x", 2, seq.count(mesh.rank()), heads.total(), 3);
  Kokkos::View<double****, Kokkos::LayoutRight> by_heads("h", 2, seq.total(), heads.count(mesh.rank()), 3);
  Kokkos::View<double****, Kokkos::LayoutRight> back("b", 2, seq.count(mesh.rank()), heads.total(), 3);
  auto step = [&] {
    mlacp::launch_all_to_all(space, x, 1, 2, seq, heads, mesh, "q", by_heads).wait();
    mlacp::launch_all_to_all(space, by_heads, 2, 1, heads, seq, mesh, "o", back).wait();
  };
  step();
  const auto before = mlacp::diagnostics::communication_buffer_allocations();
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(mlacp::diagnostics::communication_buffer_allocations(), before);
}

}  // namespace
