// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The communication core against references built by gathering full tensors to every rank.
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/partition.hpp>
#include <mlacp/progress.hpp>
#include <mlacp/watchdog.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {

using Extents = std::vector<std::int64_t>;

std::int64_t product(const Extents& e) {
  return std::accumulate(e.begin(), e.end(), std::int64_t{1}, std::multiplies<>());
}

Extents unravel(std::int64_t flat, const Extents& e) {
  Extents idx(e.size());
  for (std::size_t d = e.size(); d-- > 0;) {
    idx[d] = flat % e[d];
    flat /= e[d];
  }
  return idx;
}

std::int64_t ravel(const Extents& idx, const Extents& e) {
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < e.size(); ++d) flat = flat * e[d] + idx[d];
  return flat;
}

template <class T, int Rank>
struct ViewOf;
template <class T>
struct ViewOf<T, 3> {
  using type = Kokkos::View<T***, Kokkos::LayoutRight>;
};
template <class T>
struct ViewOf<T, 4> {
  using type = Kokkos::View<T****, Kokkos::LayoutRight>;
};
template <class T>
struct ViewOf<T, 5> {
  using type = Kokkos::View<T*****, Kokkos::LayoutRight>;
};

// A device View holding `values` with the given extents.
template <class T, int Rank>
typename ViewOf<T, Rank>::type make_view(const Extents& e, const std::vector<T>& values) {
  std::size_t n[5] = {1, 1, 1, 1, 1};
  for (int d = 0; d < Rank; ++d) n[d] = static_cast<std::size_t>(e[static_cast<std::size_t>(d)]);
  typename ViewOf<T, Rank>::type view;
  if constexpr (Rank == 3) view = decltype(view)("v", n[0], n[1], n[2]);
  if constexpr (Rank == 4) view = decltype(view)("v", n[0], n[1], n[2], n[3]);
  if constexpr (Rank == 5) view = decltype(view)("v", n[0], n[1], n[2], n[3], n[4]);
  Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(values.data(), values.size());
  Kokkos::View<T*, Kokkos::LayoutRight, typename decltype(view)::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      flat(view.data(), view.size());
  Kokkos::deep_copy(flat, host);
  return view;
}

template <class ViewType>
std::vector<typename ViewType::non_const_value_type> to_host(const ViewType& view) {
  using T = typename ViewType::non_const_value_type;
  Kokkos::fence();
  std::vector<T> out(view.size());
  Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(out.data(), out.size());
  Kokkos::View<const T*, Kokkos::LayoutRight, typename ViewType::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      flat(view.data(), view.size());
  Kokkos::deep_copy(host, flat);
  return out;
}

template <class ViewType>
Extents extents_of(const ViewType& v) {
  Extents e;
  for (int d = 0; d < static_cast<int>(ViewType::rank); ++d) e.push_back(static_cast<std::int64_t>(v.extent(d)));
  return e;
}

// Distinct values for every (rank, element), exact in float.
template <class T>
std::vector<T> local_values(const Extents& e, int rank) {
  std::vector<T> v(static_cast<std::size_t>(product(e)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(rank * 100000 + static_cast<int>(i) + 1);
  return v;
}

// Every rank's local tensor, gathered to every rank with plain MPI_Allgather.
template <class T>
std::vector<std::vector<T>> gather_all(const std::vector<T>& local) {
  const int size = mlacp::test::world_size();
  std::vector<T> all(local.size() * static_cast<std::size_t>(size));
  MPI_Allgather(local.data(), static_cast<int>(local.size() * sizeof(T)), MPI_BYTE, all.data(),
                static_cast<int>(local.size() * sizeof(T)), MPI_BYTE, MPI_COMM_WORLD);
  std::vector<std::vector<T>> per_rank;
  for (int r = 0; r < size; ++r)
    per_rank.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(local.size()) * r,
                          all.begin() + static_cast<std::ptrdiff_t>(local.size()) * (r + 1));
  return per_rank;
}

// What rank `me` must receive from all_to_all(gather, scatter): directly from the definition, element by element.
template <class T>
std::vector<T> reference_all_to_all(const std::vector<std::vector<T>>& all, const Extents& e, int gather, int scatter,
                                    int me) {
  const int parts = static_cast<int>(all.size());
  Extents out_e = e;
  out_e[static_cast<std::size_t>(gather)] *= parts;
  out_e[static_cast<std::size_t>(scatter)] /= parts;
  std::vector<T> out(static_cast<std::size_t>(product(out_e)));
  for (std::int64_t k = 0; k < product(out_e); ++k) {
    Extents idx = unravel(k, out_e);
    const auto g = static_cast<std::size_t>(gather), s = static_cast<std::size_t>(scatter);
    const auto source = static_cast<std::size_t>(idx[g] / e[g]);
    idx[g] %= e[g];
    idx[s] += me * out_e[s];
    out[static_cast<std::size_t>(k)] = all[source][static_cast<std::size_t>(ravel(idx, e))];
  }
  return out;
}

template <class T>
class Collectives : public ::testing::Test {};
using ValueTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Collectives, ValueTypes);

template <class T, int Rank>
void check_all_to_all_against_reference(const Extents& e) {
  const int me = mlacp::test::world_rank();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto values = local_values<T>(e, me);
  const auto all = gather_all(values);
  auto view = make_view<T, Rank>(e, values);
  for (int g = 0; g < Rank; ++g) {
    for (int s = 0; s < Rank; ++s) {
      if (g == s) continue;
      auto handle = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), view, g, s, mesh);
      auto result = handle.wait();
      Extents expected_e = e;
      expected_e[static_cast<std::size_t>(g)] *= mesh.size();
      expected_e[static_cast<std::size_t>(s)] /= mesh.size();
      EXPECT_EQ(extents_of(result), expected_e) << "gather " << g << " scatter " << s;
      EXPECT_EQ(to_host(result), reference_all_to_all(all, e, g, s, me)) << "gather " << g << " scatter " << s;
    }
  }
}

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

TYPED_TEST(Collectives, HandleKeepsAnInputItSendsWithoutPackAlive) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const Extents e{1, 4 * p, 2 * p, 3};  // batch 1: the token blocks of the input are contiguous, sent as they are
  const auto values = local_values<T>(e, mesh.rank());
  const auto space = Kokkos::DefaultExecutionSpace();
  auto x = make_view<T, 4>(e, values);
  auto expected_a2a = to_host(mlacp::launch_all_to_all(space, make_view<T, 4>(e, values), 2, 1, mesh).wait());
  auto expected_rs = to_host(mlacp::launch_reduce_scatter(space, make_view<T, 4>(e, values), 1, mesh).wait());
  auto a2a = mlacp::launch_all_to_all(space, x, 2, 1, mesh, "a2a of a dropped input");
  auto rs = mlacp::launch_reduce_scatter(space, x, 1, mesh, "reduce-scatter of a dropped input");
  x = decltype(x)();  // the caller's reference is gone; the handles hold the allocation until wait()
  EXPECT_EQ(to_host(a2a.wait()), expected_a2a);
  EXPECT_EQ(to_host(rs.wait()), expected_rs);
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

TEST(CollectiveHandle, SecondWaitThrowsAndEmptyHandleRefuses) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<double****, Kokkos::LayoutRight> x("x", 1, 2, 2 * p, 3);
  auto handle = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh, "dO a2a");
  EXPECT_TRUE(handle.pending());
  handle.wait();
  EXPECT_TRUE(handle.waited());
  try {
    handle.wait();
    ADD_FAILURE() << "a second wait() did not throw";
  } catch (const mlacp::UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "mlacp: collective 'dO a2a' cannot be waited twice");
  }
  auto moved = std::move(handle);
  EXPECT_FALSE(handle.launched());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_THROW(handle.wait(), mlacp::UsageError);
  mlacp::AsyncCollective<Kokkos::View<double****, Kokkos::LayoutRight>> empty;
  EXPECT_THROW(empty.test(), mlacp::UsageError);
}

TEST(CollectiveHandle, UnwaitedHandleIsCompletedAndReported) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<float****, Kokkos::LayoutRight> x("x", 1, 2, 2 * p, 3);
  const auto before = mlacp::diagnostics::unwaited_handles();
  ::testing::internal::CaptureStderr();
  { auto dropped = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh, "forgotten"); }
  // Assigning over a pending handle completes and reports it too.
  auto reused = mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, 1, mesh, "overwritten");
  reused = mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, 1, mesh, "second");
  reused.wait();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(mlacp::diagnostics::unwaited_handles(), before + 2);
  EXPECT_NE(err.find("collective 'forgotten' was launched but never waited"), std::string::npos) << err;
  EXPECT_NE(err.find("collective 'overwritten' was launched but never waited"), std::string::npos) << err;
  // The communicator is still usable: nothing is left in flight.
  auto after = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh).wait();
  EXPECT_EQ(after.extent(1), 2u * static_cast<unsigned>(p));
}

TEST(CollectiveHandle, WaitTimeoutSetting) {
  const double before = mlacp::wait_timeout();
  mlacp::set_wait_timeout(2.5);
  EXPECT_EQ(mlacp::wait_timeout(), 2.5);
  // With the watchdog armed, a healthy wait completes as usual.
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<double****, Kokkos::LayoutRight> x("x", 1, 2, 2 * p, 3);
  EXPECT_EQ(mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh).wait().extent(1),
            2u * static_cast<unsigned>(p));
  mlacp::set_wait_timeout(-1);
  EXPECT_EQ(mlacp::wait_timeout(), 0.0);
  mlacp::set_wait_timeout(before);
}

TEST(CollectiveHandle, PendingCollectivesAreRegisteredForProgressUntilWaited) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<double****, Kokkos::LayoutRight> x("x", 2, 8, 2 * p, 4);
  ASSERT_EQ(mlacp::pending_collectives(), 0u);
  auto a = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh);
  auto b = mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, 1, mesh);
  // With P == 1 nothing is sent, so nothing is pending.
  EXPECT_EQ(mlacp::pending_collectives(), p == 1 ? 0u : 2u);
  const auto calls = mlacp::progress_calls();
  mlacp::progress();
  EXPECT_EQ(mlacp::progress_calls(), calls + (p == 1 ? 0u : 1u));
  a.wait();
  EXPECT_EQ(mlacp::pending_collectives(), p == 1 ? 0u : 1u);
  b.wait();
  EXPECT_EQ(mlacp::pending_collectives(), 0u);
}

TEST(CollectiveHandle, AllToAllCompletesWhileTheCallerOnlyComputesAndPollsTest) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<double****, Kokkos::LayoutRight> x("x", 2, 64, 4 * p, 16);
  Kokkos::deep_copy(x, 1.0);
  auto handle = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh, "polled");
  const auto start = std::chrono::steady_clock::now();
  volatile double work = 0;  // the compute's result is kept (volatile), not asserted on
  int polls = 0;
  bool done = false;
  while (!done && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    for (int i = 0; i < 1000; ++i) work = work + std::sqrt(static_cast<double>(i + polls));  // the caller's compute
    ++polls;
    done = handle.test();
  }
  EXPECT_TRUE(done) << "the all-to-all did not complete within 30 s of polling test() (" << polls << " polls)";
  EXPECT_FALSE(handle.waited());
  auto result = handle.wait();
  const auto values = to_host(result);
  EXPECT_EQ(std::accumulate(values.begin(), values.end(), 0.0), static_cast<double>(values.size()));
}

// ---- The uneven (v) collectives, against references computed directly from the definition on the host. ----

// Uneven partitions of a dimension for a group of p ranks: the even rule with a remainder, and counts with zeros
// (every other rank holds nothing, the last rank the most).
std::vector<mlacp::Partition> uneven_partitions(int p) {
  std::vector<mlacp::Partition> parts{mlacp::Partition(2 * p + 1, p), mlacp::Partition(3 * p - 1, p)};
  std::vector<std::int64_t> counts(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) counts[static_cast<std::size_t>(r)] = r % 2 == 0 ? 0 : r + 1;
  counts.back() += 2;
  parts.push_back(mlacp::Partition::from_counts(counts));
  return parts;
}

// Every rank's local tensor (of any size), gathered to every rank.
template <class T>
std::vector<std::vector<T>> gather_all_v(const std::vector<T>& local) {
  const int size = mlacp::test::world_size();
  const int bytes = static_cast<int>(local.size() * sizeof(T));
  std::vector<int> sizes(static_cast<std::size_t>(size)), displs(static_cast<std::size_t>(size));
  MPI_Allgather(&bytes, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 1; r < size; ++r)
    displs[static_cast<std::size_t>(r)] =
        displs[static_cast<std::size_t>(r - 1)] + sizes[static_cast<std::size_t>(r - 1)];
  std::vector<char> all(static_cast<std::size_t>(displs.back() + sizes.back()));
  MPI_Allgatherv(local.data(), bytes, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD);
  std::vector<std::vector<T>> per_rank;
  for (int r = 0; r < size; ++r) {
    std::vector<T> v(static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)]) / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), all.data() + displs[static_cast<std::size_t>(r)], v.size() * sizeof(T));
    per_rank.push_back(std::move(v));
  }
  return per_rank;
}

// The rank holding index x of a partition.
int owner_of(const mlacp::Partition& part, std::int64_t x) {
  for (int r = 0; r < part.parts(); ++r)
    if (x < part.offset(r + 1)) return r;
  return part.parts();
}

// Rank r's input of an uneven all-to-all: `base` with extent(g) = gather.count(r), extent(s) = scatter.total().
Extents a2a_input_extents(Extents base, int g, int s, const mlacp::Partition& gather, const mlacp::Partition& scatter,
                          int r) {
  base[static_cast<std::size_t>(g)] = gather.count(r);
  base[static_cast<std::size_t>(s)] = scatter.total();
  return base;
}

// What rank `me` must receive from the uneven all-to-all, element by element from the definition.
template <class T>
std::vector<T> reference_all_to_all_v(const std::vector<std::vector<T>>& all, const Extents& base, int g, int s,
                                      const mlacp::Partition& gather, const mlacp::Partition& scatter, int me) {
  Extents out_e = base;
  out_e[static_cast<std::size_t>(g)] = gather.total();
  out_e[static_cast<std::size_t>(s)] = scatter.count(me);
  std::vector<T> out(static_cast<std::size_t>(product(out_e)));
  for (std::int64_t k = 0; k < product(out_e); ++k) {
    Extents idx = unravel(k, out_e);
    const int source = owner_of(gather, idx[static_cast<std::size_t>(g)]);
    idx[static_cast<std::size_t>(g)] -= gather.offset(source);
    idx[static_cast<std::size_t>(s)] += scatter.offset(me);
    out[static_cast<std::size_t>(k)] =
        all[static_cast<std::size_t>(source)]
           [static_cast<std::size_t>(ravel(idx, a2a_input_extents(base, g, s, gather, scatter, source)))];
  }
  return out;
}

template <class T, int Rank>
void check_all_to_all_v(const Extents& base, int g, int s, const mlacp::Partition& gather,
                        const mlacp::Partition& scatter, const mlacp::Mesh& mesh, bool with_into) {
  const int me = mesh.rank();
  const Extents e = a2a_input_extents(base, g, s, gather, scatter, me);
  const auto values = local_values<T>(e, me);
  const auto all = gather_all_v(values);
  auto view = make_view<T, Rank>(e, values);
  Extents expected_e = base;
  expected_e[static_cast<std::size_t>(g)] = gather.total();
  expected_e[static_cast<std::size_t>(s)] = scatter.count(me);
  typename ViewOf<T, Rank>::type into;
  if (with_into) into = make_view<T, Rank>(expected_e, std::vector<T>(static_cast<std::size_t>(product(expected_e))));
  auto result =
      mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), view, g, s, gather, scatter, mesh, "a2a v", into)
          .wait();
  const std::string where = "gather " + std::to_string(g) + " " + gather.str() + " scatter " + std::to_string(s) + " " +
                            scatter.str() + (with_into ? " into" : "");
  ASSERT_EQ(extents_of(result), expected_e) << where;
  if (with_into && mesh.size() > 1 && product(expected_e) > 0) {
    EXPECT_EQ(result.data(), into.data()) << where;
  }
  EXPECT_EQ(to_host(result), reference_all_to_all_v(all, base, g, s, gather, scatter, me)) << where;
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

// The uneven all-gather and reduce-scatter along every dimension of a rank-3 and a rank-4 View, with and without a
// destination, and the reduce-scatter by both MPI algorithms and through host staging.
template <class T, int Rank>
void check_all_gather_and_reduce_scatter_v(const Extents& base, int dim, const mlacp::Partition& part,
                                           mlacp::Mesh& mesh, bool with_into) {
  const int me = mesh.rank();
  const int p = mesh.size();
  const auto d = static_cast<std::size_t>(dim);
  const auto space = Kokkos::DefaultExecutionSpace();
  const std::string where = "dim " + std::to_string(dim) + " partition " + part.str() + (with_into ? " into" : "") +
                            (mesh.host_staging() ? " staged" : "") +
                            (mesh.reduce_scatter_algorithm() == mlacp::ReduceScatterAlgorithm::mpi ? " mpi" : "");
  // All-gather: rank r contributes count(r) rows.
  Extents e = base;
  e[d] = part.count(me);
  const auto values = local_values<T>(e, me);
  const auto all = gather_all_v(values);
  Extents ge = base;
  ge[d] = part.total();
  typename ViewOf<T, Rank>::type into;
  if (with_into) into = make_view<T, Rank>(ge, std::vector<T>(static_cast<std::size_t>(product(ge))));
  auto gathered = mlacp::launch_all_gather(space, make_view<T, Rank>(e, values), dim, part, mesh, "ag v", into).wait();
  ASSERT_EQ(extents_of(gathered), ge) << where;
  std::vector<T> expected(static_cast<std::size_t>(product(ge)));
  for (std::int64_t k = 0; k < product(ge); ++k) {
    Extents idx = unravel(k, ge);
    const int r = owner_of(part, idx[d]);
    idx[d] -= part.offset(r);
    Extents re = base;
    re[d] = part.count(r);
    expected[static_cast<std::size_t>(k)] = all[static_cast<std::size_t>(r)][static_cast<std::size_t>(ravel(idx, re))];
  }
  EXPECT_EQ(to_host(gathered), expected) << "all_gather " << where;

  // Reduce-scatter: every rank passes total() rows and keeps its count(me) rows of the sum.
  const auto full_values = local_values<T>(ge, me);
  const auto full_all = gather_all(full_values);
  Extents se = base;
  se[d] = part.count(me);
  typename ViewOf<T, Rank>::type into_rs;
  if (with_into) into_rs = make_view<T, Rank>(se, std::vector<T>(static_cast<std::size_t>(product(se))));
  auto reduced =
      mlacp::launch_reduce_scatter(space, make_view<T, Rank>(ge, full_values), dim, part, mesh, "rs v", into_rs).wait();
  ASSERT_EQ(extents_of(reduced), se) << where;
  std::vector<T> sum(static_cast<std::size_t>(product(se)), T(0));
  for (std::int64_t k = 0; k < product(se); ++k) {
    Extents idx = unravel(k, se);
    idx[d] += part.offset(me);
    for (int r = 0; r < p; ++r)
      sum[static_cast<std::size_t>(k)] +=
          full_all[static_cast<std::size_t>(r)][static_cast<std::size_t>(ravel(idx, ge))];
  }
  EXPECT_EQ(to_host(reduced), sum) << "reduce_scatter " << where;
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

TEST(Partition, EvenRuleAndAccessors) {
  const mlacp::Partition even(10, 4);
  EXPECT_EQ(even.counts(), (std::vector<std::int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(even.parts(), 4);
  EXPECT_EQ(even.total(), 10);
  EXPECT_EQ(even.offset(2), 6);
  EXPECT_EQ(even.offset(4), 10);
  EXPECT_FALSE(even.uniform());
  EXPECT_TRUE(mlacp::Partition(8, 4).uniform());
  EXPECT_EQ(mlacp::Partition(2, 4).counts(), (std::vector<std::int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(mlacp::Partition::from_counts({3, 3, 2, 2}), even);
  EXPECT_NE(mlacp::Partition::from_counts({2, 3, 3, 2}), even);
  EXPECT_EQ(mlacp::Partition::from_counts({0, 0}).total(), 0);
  EXPECT_TRUE(mlacp::Partition::from_counts({0, 0}).uniform());
  mlacp::test::expect_error<mlacp::InvalidArgument>([] { mlacp::Partition(4, 0); },
                                                    "mlacp::Partition: parts = 0; expected parts >= 1");
  mlacp::test::expect_error<mlacp::InvalidArgument>([] { mlacp::Partition(-1, 2); },
                                                    "mlacp::Partition: total = -1; expected total >= 0");
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [] {
        mlacp::Partition::from_counts({2, -1});
      },
      "mlacp::Partition::from_counts: count(1) = -1 in {2, -1}; expected counts >= 0");
  mlacp::test::expect_error<mlacp::InvalidArgument>([] { mlacp::Partition::from_counts({}); },
                                                    "expected one count per rank (parts >= 1)");
}

}  // namespace
