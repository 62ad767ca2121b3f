// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// launch_reduce_scatter (include/mlacp/reduce_scatter.hpp): the adjoint of the all-gather, even and uneven, its
// algorithms and their configuration.
#include "collective_test_helpers.hpp"
#include "scoped_environment.hpp"

#include <chrono>
#include <optional>
#include <thread>

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
  {
    const mlacp::test::ScopedEnvironment env("MLACP_REDUCE_SCATTER", "ring");
    mlacp::test::expect_error<mlacp::InvalidArgument>([] { mlacp::Mesh mesh(MPI_COMM_WORLD); },
                                                      "MLACP_REDUCE_SCATTER='ring'; expected 'pairwise' or 'mpi'");
  }
  {
    const mlacp::test::ScopedEnvironment env("MLACP_REDUCE_SCATTER", "mpi");
    EXPECT_EQ(mlacp::Mesh(MPI_COMM_WORLD).reduce_scatter_algorithm(), mlacp::ReduceScatterAlgorithm::mpi);
  }
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

// ---- bf16: summed in float (each block widened, added in rank order, rounded once), never by MPI. ----

// Rank r's value at flat index i of its input: rank 0 contributes +-2^k, every other rank 2^-8 or 1.5 * 2^-8 of it
// (all exact in bf16). In float the sum is rounded once; a bf16 accumulator would round 2^k (1 + 2^-8) back to 2^k (a
// tie, to even) at every step, losing the small contributions: from P = 3 on the two differ.
float bf16_contribution(int r, std::int64_t i) {
  const float scale = std::ldexp(1.0f, static_cast<int>(i % 16) - 8) * (i % 4 == 3 ? -1.0f : 1.0f);
  if (r == 0) return scale;
  return scale * (i % 2 == 0 ? std::ldexp(1.0f, -8) : 3 * std::ldexp(1.0f, -9));
}

// Reduce-scatters rank-`Rank` inputs of extents `e` along `dim` (evenly, or by `part`), optionally into a
// destination, and checks every value against the float sum rounded once; counts in `differs` the values where that
// sum differs from a bf16-accumulated one.
template <int Rank>
void check_bf16_sums(const mlacp::Mesh& mesh, const Extents& e, int dim, const mlacp::Partition* part, bool with_into,
                     std::int64_t& differs) {
  using mlacp::bf16;
  const int me = mesh.rank();
  const int p = mesh.size();
  const auto d = static_cast<std::size_t>(dim);
  std::vector<bf16> values(static_cast<std::size_t>(product(e)));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = bf16(bf16_contribution(me, static_cast<std::int64_t>(i)));
  auto x = make_view<bf16, Rank>(e, values);
  Extents re = e;
  re[d] = part != nullptr ? part->count(me) : e[d] / p;
  const std::int64_t offset = part != nullptr ? part->offset(me) : me * re[d];
  typename ViewOf<bf16, Rank>::type into;
  if (with_into) into = make_view<bf16, Rank>(re, std::vector<bf16>(static_cast<std::size_t>(product(re))));
  const auto space = Kokkos::DefaultExecutionSpace();
  auto result = part != nullptr ? mlacp::launch_reduce_scatter(space, x, dim, *part, mesh, "bf16 rs", into).wait()
                                : mlacp::launch_reduce_scatter(space, x, dim, mesh, "bf16 rs", into).wait();
  const std::string where = "dim " + std::to_string(dim) + (part != nullptr ? " partition " + part->str() : "") +
                            (with_into ? " into" : "") + (mesh.host_staging() ? " staged" : "");
  ASSERT_EQ(extents_of(result), re) << where;
  std::vector<bf16> expected(static_cast<std::size_t>(product(re)));
  for (std::int64_t k = 0; k < product(re); ++k) {
    Extents idx = unravel(k, re);
    idx[d] += offset;
    const std::int64_t i = ravel(idx, e);
    float sum = 0.0f;
    bf16 accumulated = bf16(bf16_contribution(0, i));
    for (int r = 0; r < p; ++r) {
      sum += bf16_contribution(r, i);
      if (r > 0) accumulated = bf16(float(accumulated) + bf16_contribution(r, i));
    }
    expected[static_cast<std::size_t>(k)] = bf16(sum);
    if (bits_of({bf16(sum)}) != bits_of({accumulated})) ++differs;
  }
  EXPECT_EQ(bits_of(to_host(result)), bits_of(expected)) << where;
}

TEST(Bf16Collectives, ReduceScatterSumsBf16InFloatAndRoundsOnce) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mlacp::Mesh staged(MPI_COMM_WORLD);
  staged.set_host_staging(true);
  std::int64_t differs = 0;
  // Even: dim 0 (the blocks are the input itself, sent in place) and packed dims; with and without a destination.
  for (int dim = 0; dim < 4; ++dim)
    check_bf16_sums<4>(mesh, {2 * p, 3 * p, 2 * p, 5 * p}, dim, nullptr, dim == 1, differs);
  check_bf16_sums<3>(staged, {2, 3 * p, 5}, 1, nullptr, false, differs);
  // Uneven (and a uniform partition, which takes the even path).
  auto parts = uneven_partitions(p);
  parts.push_back(mlacp::Partition(2 * p, p));
  for (std::size_t a = 0; a < parts.size(); ++a) {
    const auto total = parts[a].total();
    check_bf16_sums<3>(mesh, {2, total, 5}, 1, &parts[a], a == 0, differs);
    check_bf16_sums<3>(a == 1 ? staged : mesh, {total, 3, 2}, 0, &parts[a], false, differs);
    check_bf16_sums<5>(mesh, {1, total, 2, 3, 2}, 1, &parts[a], a == 2, differs);
  }
  // The values tell the two apart (else this test could not see a bf16 accumulator).
  if (p >= 3) {
    EXPECT_GT(differs, 0);
  }
}

// MPI has no bf16 sum: the mpi algorithm (set on the mesh or by MLACP_REDUCE_SCATTER=mpi) is refused for bf16 on every
// rank, checked or not, before anything is sent; the mesh still serves float reduce-scatters and bf16 moves.
TEST(Bf16Collectives, MpiReduceScatterAlgorithmIsRefusedForBf16OnEveryRank) {
  const int p = mlacp::test::world_size();
  const auto space = Kokkos::DefaultExecutionSpace();
  mlacp::Mesh library(MPI_COMM_WORLD);
  library.set_reduce_scatter_algorithm(mlacp::ReduceScatterAlgorithm::mpi);
  Kokkos::View<mlacp::bf16***, Kokkos::LayoutRight> x("x", 2, static_cast<std::size_t>(3 * p), 4);
  const std::string refusal =
      "holds bf16, which the mpi reduce-scatter algorithm (MLACP_REDUCE_SCATTER=mpi or ReduceScatterAlgorithm::mpi) "
      "cannot sum (MPI has no bf16 sum); expected pairwise (the default), which sums bf16 in float";
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::launch_reduce_scatter(space, x, 1, library); },
      "mlacp::launch_reduce_scatter: the View of shape [2, " + std::to_string(3 * p) + ", 4] " + refusal);
  const auto part = uneven_partitions(p)[0];
  Kokkos::View<mlacp::bf16***, Kokkos::LayoutRight> y("y", 2, static_cast<std::size_t>(part.total()), 4);
  mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::launch_reduce_scatter(space, y, 1, part, library); },
                                                    refusal);
  library.set_checked(false);
  mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::launch_reduce_scatter(space, x, 1, library); },
                                                    refusal);
  library.set_checked(true);
  {
    const mlacp::test::ScopedEnvironment env("MLACP_REDUCE_SCATTER", "mpi");
    mlacp::Mesh from_environment(MPI_COMM_WORLD);
    mlacp::test::expect_error<mlacp::InvalidArgument>(
        [&] { mlacp::launch_reduce_scatter(space, x, 1, from_environment); }, refusal);
  }
  // The same mesh still sums float (by MPI) and moves bf16; the pairwise mesh sums bf16.
  Kokkos::View<float***, Kokkos::LayoutRight> f("f", 2, static_cast<std::size_t>(3 * p), 4);
  Kokkos::deep_copy(f, 1.0f);
  EXPECT_EQ(to_host(mlacp::launch_reduce_scatter(space, f, 1, library).wait()),
            std::vector<float>(static_cast<std::size_t>(2 * 3 * 4), static_cast<float>(p)));
  Kokkos::deep_copy(x, mlacp::bf16(1.0f));
  EXPECT_EQ(bits_of(to_host(mlacp::launch_all_gather(space, x, 1, library).wait())),
            std::vector<std::uint16_t>(x.size() * static_cast<std::size_t>(p), 0x3f80));
  mlacp::Mesh pairwise(MPI_COMM_WORLD);
  EXPECT_EQ(bits_of(to_host(mlacp::launch_reduce_scatter(space, x, 1, pairwise).wait())),
            std::vector<std::uint16_t>(x.size() / static_cast<std::size_t>(p), bits_of({mlacp::bf16(float(p))})[0]));
}

}  // namespace

namespace {

// ---- The pairwise sum as the blocks arrive (RunningBlockSum): in rank order, bit for bit, whatever the order. ----

// Rank r's input value at flat index i: magnitudes that differ by rank, so that another order of the sum would round
// differently.
template <class T>
T running_sum_input(int r, std::int64_t i) {
  const double v = std::sin(1.0 + 0.37 * static_cast<double>(i) + 31.0 * r) * std::pow(10.0, r % 3);
  if constexpr (std::is_same_v<T, mlacp::bf16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// Every rank but `late` launches a reduce-scatter of `e` along dim 1 (evenly, or by `part`), polls mlacp::progress()
// (which sums nothing) and waits, while rank `late` launches a while after them: in its wait, a rank sums the blocks of
// ranks 0 .. late - 1 while the late block travels, when they are a run of at least two (block 0 alone is not copied
// ahead), so at P = 2 nothing is summed ahead. Rank `late`'s receives are in when it waits: it sums in one pass. The
// result is the sum in rank order, bit for bit.
template <class T>
void check_running_sum(const mlacp::Mesh& mesh, const Extents& e, const mlacp::Partition* part, int late) {
  using Acc = std::conditional_t<std::is_same_v<T, mlacp::bf16>, float, T>;
  const int me = mesh.rank();
  const int p = mesh.size();
  std::vector<T> values(static_cast<std::size_t>(product(e)));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = running_sum_input<T>(me, static_cast<std::int64_t>(i));
  auto x = make_view<T, 3>(e, values);
  const auto space = Kokkos::DefaultExecutionSpace();
  const auto launch = [&] {
    return part != nullptr ? mlacp::launch_reduce_scatter(space, x, 1, *part, mesh, "running rs")
                           : mlacp::launch_reduce_scatter(space, x, 1, mesh, "running rs");
  };
  const std::string where = std::string(part != nullptr ? "partition " + part->str() : "even") + ", late rank " +
                            std::to_string(late) + ", rank " + std::to_string(me);
  const std::size_t before = mlacp::detail::blocks_summed_on_arrival();
  std::optional<decltype(launch())> handle;
  if (me != late) {
    handle.emplace(launch());
    for (int i = 0; i < 100; ++i) mlacp::progress();
    EXPECT_EQ(mlacp::detail::blocks_summed_on_arrival() - before, 0U) << where << ": summed in progress()";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == late) {
    // Long enough for the others to reach their waits and see the early blocks in (an oversubscribed rank may sleep a
    // time slice or a few), when there is a run of them to sum.
    if (late >= 2) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    handle.emplace(launch());
  }
  const auto result = to_host(handle->wait());
  if (me != late) {
    const auto expected = static_cast<std::size_t>(late >= 2 ? late : 0);
    EXPECT_EQ(mlacp::detail::blocks_summed_on_arrival() - before, expected) << where << ": summed ahead in wait()";
  }
  Extents re = e;
  re[1] = part != nullptr ? part->count(me) : e[1] / p;
  const std::int64_t offset = part != nullptr ? part->offset(me) : me * re[1];
  std::vector<T> expected(static_cast<std::size_t>(product(re)));
  for (std::int64_t k = 0; k < product(re); ++k) {
    Extents idx = unravel(k, re);
    idx[1] += offset;
    const std::int64_t i = ravel(idx, e);
    Acc sum = static_cast<Acc>(running_sum_input<T>(0, i));
    for (int r = 1; r < p; ++r) sum += static_cast<Acc>(running_sum_input<T>(r, i));
    expected[static_cast<std::size_t>(k)] = static_cast<T>(sum);
  }
  EXPECT_EQ(exact(result), exact(expected)) << where;
}

template <class T>
class RunningSum : public ::testing::Test {};
using SummedTypes = ::testing::Types<float, double, mlacp::bf16>;
TYPED_TEST_SUITE(RunningSum, SummedTypes);

// Unchecked: a checked launch agrees with every rank first, which the late rank has not reached.
TYPED_TEST(RunningSum, BlocksAreSummedAsTheyArriveInRankOrderBitForBit) {
  const int p = mlacp::test::world_size();
  if (p < 2) GTEST_SKIP() << "one rank: nothing is exchanged";
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mesh.set_checked(false);
  const auto part = uneven_partitions(p)[2];
  for (const int late : {0, p / 2, p - 1}) {
    check_running_sum<TypeParam>(mesh, {2, 3 * p, 5}, nullptr, late);
    check_running_sum<TypeParam>(mesh, {1, 4 * p, 3}, nullptr, late);  // sent in place
    check_running_sum<TypeParam>(mesh, {2, part.total(), 3}, &part, late);
  }
}

}  // namespace
