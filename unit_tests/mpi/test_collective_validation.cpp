// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Every invalid argument of the collectives is raised, with its message, on every rank, before anything is sent.
#include "mpi_test_harness.hpp"
#include "scoped_environment.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/partition.hpp>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

namespace {

using View4 = Kokkos::View<double****, Kokkos::LayoutRight>;

// Runs `launch` and expects mlacp::InvalidArgument whose message contains every part of `expected`.
void expect_invalid(const std::function<void()>& launch, const std::vector<std::string>& expected) {
  try {
    launch();
    ADD_FAILURE() << "no exception; expected InvalidArgument containing '" << expected.front() << "'";
  } catch (const mlacp::InvalidArgument& e) {
    for (const auto& part : expected) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  // Nothing was left in flight: the communicator still works for everybody.
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(CollectiveValidation, DimensionOutOfRange) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto p = static_cast<std::size_t>(mesh.size());
  View4 x("x", 2, 4 * p, 4 * p, 3);
  expect_invalid([&] { mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 4, 2, mesh); },
                 {"mlacp::launch_all_to_all: gather_dim = 4 is out of range for a rank-4 View",
                  "expected 0 <= "
                  "gather_dim < 4"});
  expect_invalid([&] { mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, -1, mesh); },
                 {"scatter_dim = -1 is out of range"});
  expect_invalid([&] { mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, 7, mesh); },
                 {"mlacp::launch_all_gather: dim = 7 is out of range"});
  expect_invalid([&] { mlacp::launch_reduce_scatter(Kokkos::DefaultExecutionSpace(), x, -2, mesh); },
                 {"mlacp::launch_reduce_scatter: dim = -2 is out of range"});
}

TEST(CollectiveValidation, GatherEqualsScatter) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  View4 x("x", 2, 4, 4, 3);
  expect_invalid([&] { mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 2, 2, mesh); },
                 {"gather_dim and scatter_dim are both 2; expected two different dimensions"});
}

TEST(CollectiveValidation, ScatteredSizeNotDivisibleNamesDimensionSizeAndP) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto p = static_cast<std::size_t>(mesh.size());
  if (p == 1) GTEST_SKIP() << "every size is divisible by P = 1";
  View4 x("x", 2, 4 * p, 4 * p + 1, 3);
  const std::string sizes = "scattered dimension 2 has size " + std::to_string(4 * p + 1) +
                            ", which is not divisible by the group size P = " + std::to_string(p);
  expect_invalid([&] { mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh); }, {sizes});
  expect_invalid([&] { mlacp::launch_reduce_scatter(Kokkos::DefaultExecutionSpace(), x, 2, mesh); },
                 {"mlacp::launch_reduce_scatter: " + sizes});
}

TEST(CollectiveValidation, UnallocatedView) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  View4 x;
  View4 y(static_cast<double*>(nullptr), 2, 4, 4, 3);
  expect_invalid([&] { mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), y, 1, mesh); },
                 {"the View of shape [2, 4, 4, 3] is not allocated"});
  // An empty View is valid: nothing to send.
  EXPECT_EQ(mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, 1, mesh).wait().size(), 0u);
}

TEST(CollectiveValidation, CheckedModeCatchesShapesThatDifferAcrossRanks) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks";
  ASSERT_TRUE(mesh.checked());
  const auto p = static_cast<std::size_t>(mesh.size());
  // The last rank has one token more: without the check MPI would read and write past the smaller buffers.
  View4 x("x", 2, 4 + (mesh.rank() == mesh.size() - 1 ? 1 : 0), 4 * p, 3);
  expect_invalid(
      [&] { mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh); },
      {"mlacp::launch_all_to_all 'all_to_all': the ranks of the mesh disagree on extent(1) (from 4 to 5 across ranks",
       "every rank must pass the same shape"});
  // Different operations on different ranks.
  View4 y("y", 2, 4 * p, 4 * p, 3);
  expect_invalid(
      [&] {
        if (mesh.rank() == 0)
          mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), y, 1, mesh);
        else
          mlacp::launch_reduce_scatter(Kokkos::DefaultExecutionSpace(), y, 1, mesh);
      },
      {"the ranks of the mesh disagree on the operation"});
}

TEST(CollectiveValidation, CheckedModeRaisesOneRanksErrorOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks";
  const auto p = static_cast<std::size_t>(mesh.size());
  View4 x("x", 2, 4 * p, 4 * p, 3);
  const int bad = mesh.size() - 1;
  expect_invalid(
      [&] { mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, mesh.rank() == bad ? 9 : 2, mesh); },
      {"scatter_dim = 9 is out of range",
       "[raised on rank " + std::to_string(bad) + " of " + std::to_string(mesh.size()) + "; nothing was sent]"});
}

// A destination (`into`) receives the result where it has the result's shape; one of another shape, or the input's
// own memory, on one rank raises the same error on every rank before anything is sent.
TEST(CollectiveDestination, ResultGoesIntoTheCallersViewOrTheShapeIsRefusedOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto p = static_cast<std::size_t>(mesh.size());
  const Kokkos::DefaultExecutionSpace space;
  View4 x("x", 1, 2, 2 * p, 3);
  Kokkos::deep_copy(x, 1.0 + mesh.rank());
  if (p > 1) {
    View4 into("into", 1, 2 * p, 2, 3);
    auto result = mlacp::launch_all_to_all(space, x, 1, 2, mesh, "a2a into", into).wait();
    EXPECT_EQ(result.data(), into.data()) << "the result was not written into the destination";
    Kokkos::View<double***, Kokkos::LayoutRight> gathered("gathered", 1, 2 * p, 6 * p);
    Kokkos::View<double***, Kokkos::LayoutRight> x3("x3", 1, 2, 6 * p);
    Kokkos::deep_copy(x3, 1.0);
    EXPECT_EQ(mlacp::launch_all_gather(space, x3, 1, mesh, "gather into", gathered).wait().data(), gathered.data());
    Kokkos::View<double***, Kokkos::LayoutRight> reduced("reduced", 1, 2, 6 * p);
    Kokkos::View<double***, Kokkos::LayoutRight> x3p("x3p", 1, 2 * p, 6 * p);
    Kokkos::deep_copy(x3p, 1.0);
    const auto sum = mlacp::launch_reduce_scatter(space, x3p, 1, mesh, "reduce into", reduced).wait();
    EXPECT_EQ(sum.data(), reduced.data());
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reduced);
    EXPECT_EQ(host(0, 1, 5), static_cast<double>(p));
  }
  const int bad = mesh.size() - 1;
  View4 wrong("wrong", 1, 2 * p + (mesh.rank() == bad ? 1 : 0), 2, 3);
  // (At P == 1 the input itself is returned, but a destination of the wrong shape is still refused.)
  expect_invalid([&] { mlacp::launch_all_to_all(space, x, 1, 2, mesh, "a2a into", wrong); },
                 {"the destination View has shape [1, " + std::to_string(2 * p + 1) + ", 2, 3]",
                  "expected the result's shape [1, " + std::to_string(2 * p) + ", 2, 3]"});
}

TEST(CollectiveValidation, UncheckedModeStillValidatesLocally) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mesh.set_checked(false);
  View4 x("x", 2, 4, 4, 3);
  expect_invalid([&] { mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 3, 3, mesh); },
                 {"gather_dim and scatter_dim are both 3"});
}

TEST(Mesh, DuplicatesOrBorrowsTheCommunicator) {
  mlacp::Mesh owned(MPI_COMM_WORLD);
  int compare = MPI_UNEQUAL;
  MPI_Comm_compare(owned.comm(), MPI_COMM_WORLD, &compare);
  EXPECT_EQ(compare, MPI_CONGRUENT);
  EXPECT_TRUE(owned.owns_communicator());
  mlacp::Mesh borrowed(MPI_COMM_WORLD, mlacp::Mesh::Ownership::borrow);
  EXPECT_EQ(borrowed.comm(), MPI_COMM_WORLD);
  EXPECT_FALSE(borrowed.owns_communicator());
  EXPECT_EQ(owned.rank(), mlacp::test::world_rank());
  EXPECT_EQ(owned.size(), mlacp::test::world_size());
  mlacp::Mesh moved(std::move(owned));
  EXPECT_EQ(moved.size(), mlacp::test::world_size());
  EXPECT_EQ(owned.comm(), MPI_COMM_NULL);  // NOLINT(bugprone-use-after-move)
  EXPECT_THROW(mlacp::Mesh(MPI_COMM_NULL), mlacp::InvalidArgument);
}

std::string all_but_last(int size) {
  std::string ranks;
  for (int r = 0; r + 1 < size; ++r) ranks += (r ? ", " : "") + std::to_string(r);
  return ranks;
}

// The environment decides which collectives a mesh runs: a rank whose MLACP_REDUCE_SCATTER or MLACP_CHECKED differs
// would run MPI_Ialltoallv against MPI_Ireduce_scatter_block, or skip an agreement the others wait in. The mesh's
// construction agrees on them and names the setting and the ranks; nothing is left open.
TEST(MeshSettings, EnvironmentThatDiffersAcrossRanksIsRefusedOnEveryRank) {
  const int size = mlacp::test::world_size();
  if (size == 1) GTEST_SKIP() << "needs two ranks";
  const int last = size - 1;
  const bool on_last = mlacp::test::world_rank() == last;
  const auto communicators = mlacp::diagnostics::open_communicators();
  std::optional<mlacp::test::ScopedEnvironment> env;
  if (on_last) env.emplace("MLACP_REDUCE_SCATTER", "mpi");
  expect_invalid([] { mlacp::Mesh mesh(MPI_COMM_WORLD); },
                 {"mlacp::Mesh: the ranks of the mesh disagree on the reduce-scatter algorithm "
                  "(MLACP_REDUCE_SCATTER or set_reduce_scatter_algorithm): pairwise on rank(s) " +
                      all_but_last(size) + "; mpi on rank(s) " + std::to_string(last),
                  "[the mesh was not created]"});
  if (on_last) {
    env.reset();
    env.emplace("MLACP_REDUCE_SCATTER", "ring");
  }
  expect_invalid([] { mlacp::Mesh mesh(MPI_COMM_WORLD, mlacp::Mesh::Ownership::borrow); },
                 {on_last ? "MLACP_REDUCE_SCATTER='ring'; expected 'pairwise' or 'mpi'"
                          : "MLACP_REDUCE_SCATTER does not parse on rank(s) " + std::to_string(last) +
                                " (expected 'pairwise' or 'mpi')"});
  env.reset();
  if (on_last) env.emplace("MLACP_CHECKED", "0");
  expect_invalid([] { mlacp::Mesh mesh(MPI_COMM_WORLD); },
                 {"disagree on checked mode (MLACP_CHECKED or set_checked): off on rank(s) " + std::to_string(last) +
                  "; on on rank(s) " + all_but_last(size)});
  env.reset();
  EXPECT_EQ(mlacp::diagnostics::open_communicators(), communicators) << "a refused mesh freed its communicator";
}

// The setters are collective: different values on different ranks change nothing and raise on every rank.
TEST(MeshSettings, SettersAgreeAcrossRanks) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mesh.set_reduce_scatter_algorithm(mlacp::ReduceScatterAlgorithm::mpi);
  EXPECT_EQ(mesh.reduce_scatter_algorithm(), mlacp::ReduceScatterAlgorithm::mpi);
  mesh.set_checked(false);
  EXPECT_FALSE(mesh.checked());
  mesh.set_checked(true);
  if (mesh.size() == 1) return;
  const bool first = mesh.rank() == 0;
  expect_invalid(
      [&] {
        mesh.set_reduce_scatter_algorithm(first ? mlacp::ReduceScatterAlgorithm::pairwise
                                                : mlacp::ReduceScatterAlgorithm::mpi);
      },
      {"mlacp::Mesh::set_reduce_scatter_algorithm: the ranks of the mesh disagree on the reduce-scatter algorithm",
       "pairwise on rank(s) 0", "[the setting was not changed on any rank]"});
  EXPECT_EQ(mesh.reduce_scatter_algorithm(), mlacp::ReduceScatterAlgorithm::mpi);
  expect_invalid([&] { mesh.set_checked(first); },
                 {"mlacp::Mesh::set_checked: the ranks of the mesh disagree on checked mode", "on on rank(s) 0"});
  EXPECT_TRUE(mesh.checked());
}

// ---- The uneven (v) collectives: partitions against the mesh, the View and the other ranks. ----

TEST(UnevenCollectiveValidation, ExtentThatDoesNotMatchThisRanksCountIsRefusedOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int p = mesh.size();
  const int me = mesh.rank();
  const int bad = p - 1;
  const Kokkos::DefaultExecutionSpace space;
  const mlacp::Partition seq(3 * p + 1, p), heads(p + 1, p);
  const auto s = static_cast<std::size_t>(seq.count(me));
  const auto h = static_cast<std::size_t>(heads.total());
  // The last rank's View has one token more than its count.
  View4 x("x", 2, s + (me == bad ? 1 : 0), h, 3);
  const std::string raised = p > 1 ? "[raised on rank " + std::to_string(bad) + " of " + std::to_string(p) : "";
  expect_invalid([&] { mlacp::launch_all_to_all(space, x, 1, 2, seq, heads, mesh, "q a2a"); },
                 {"mlacp::launch_all_to_all: gather_dim 1 has extent " + std::to_string(seq.count(bad) + 1) +
                      " on rank " + std::to_string(bad) + "; expected the gather partition (gather_dim 1)'s count(" +
                      std::to_string(bad) + ") = " + std::to_string(seq.count(bad)) + " (partition " + seq.str(),
                  raised});
  // The scattered dimension must be the scatter partition's total.
  View4 y("y", 2, s, h + (me == bad ? 1 : 0), 3);
  expect_invalid([&] { mlacp::launch_all_to_all(space, y, 1, 2, seq, heads, mesh); },
                 {"scatter_dim 2 has extent " + std::to_string(h + 1) + " on rank " + std::to_string(bad) +
                      "; expected the scatter partition (scatter_dim 2)'s total = " + std::to_string(h),
                  raised});
  expect_invalid([&] { mlacp::launch_all_gather(space, x, 1, seq, mesh); },
                 {"mlacp::launch_all_gather: dim 1 has extent " + std::to_string(seq.count(bad) + 1) + " on rank " +
                      std::to_string(bad) + "; expected the partition (dim 1)'s count(" + std::to_string(bad) + ")",
                  raised});
  View4 full("full", 2, static_cast<std::size_t>(seq.total()) + (me == bad ? 2 : 0), h, 3);
  expect_invalid([&] { mlacp::launch_reduce_scatter(space, full, 1, seq, mesh); },
                 {"mlacp::launch_reduce_scatter: dim 1 has extent " + std::to_string(seq.total() + 2) + " on rank " +
                      std::to_string(bad) + "; expected the partition (dim 1)'s total = " + std::to_string(seq.total()),
                  raised});
}

TEST(UnevenCollectiveValidation, PartitionOfAnotherNumberOfPartsIsRefused) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int p = mesh.size();
  const Kokkos::DefaultExecutionSpace space;
  const mlacp::Partition wrong(7, p + 1), heads(2 * p, p);
  View4 x("x", 2, static_cast<std::size_t>(wrong.count(mesh.rank())), static_cast<std::size_t>(2 * p), 3);
  expect_invalid([&] { mlacp::launch_all_to_all(space, x, 1, 2, wrong, heads, mesh); },
                 {"mlacp::launch_all_to_all: the gather partition (gather_dim 1) " + wrong.str() + " has " +
                  std::to_string(p + 1) + " parts; expected one part per rank of the mesh, P = " + std::to_string(p)});
  View4 y("y", 2, 7, static_cast<std::size_t>(2 * p), 3);
  expect_invalid([&] { mlacp::launch_reduce_scatter(space, y, 1, wrong, mesh); },
                 {"mlacp::launch_reduce_scatter: the partition (dim 1) " + wrong.str() + " has " +
                  std::to_string(p + 1) + " parts; expected one part per rank of the mesh, P = " + std::to_string(p)});
  // Different numbers of parts on different ranks: the same error everywhere, no hang.
  if (p == 1) return;
  const mlacp::Partition mine = mesh.rank() == 0 ? mlacp::Partition(3 * p, p) : mlacp::Partition(3 * p, p + 1);
  View4 z("z", 2, static_cast<std::size_t>(mine.count(mesh.rank())), 3, 3);
  expect_invalid([&] { mlacp::launch_all_gather(space, z, 1, mine, mesh); },
                 {"parts; expected one part per rank of the mesh, P = " + std::to_string(p), "[raised on rank 1 of "});
}

TEST(UnevenCollectiveValidation, CheckedModeCatchesPartitionsThatDifferAcrossRanks) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int p = mesh.size();
  if (p == 1) GTEST_SKIP() << "needs two ranks";
  const int me = mesh.rank();
  const Kokkos::DefaultExecutionSpace space;
  // The same total, split differently on the last rank: each rank's View matches its own partition, so only the
  // agreement can see it (without it the ranks would send blocks of sizes their peers do not expect).
  const mlacp::Partition agreed(3 * p + 1, p);
  auto counts = agreed.counts();
  counts[0] += 1;
  counts[1] -= 1;
  const mlacp::Partition mine = me == p - 1 ? mlacp::Partition::from_counts(counts) : agreed;
  const mlacp::Partition heads(2 * p, p);
  View4 x("x", 2, static_cast<std::size_t>(mine.count(me)), static_cast<std::size_t>(2 * p), 3);
  expect_invalid([&] { mlacp::launch_all_to_all(space, x, 1, 2, mine, heads, mesh, "q a2a"); },
                 {"mlacp::launch_all_to_all 'q a2a': the ranks of the mesh disagree on count(0) of the gather "
                  "partition (gather_dim 1) (from " +
                      std::to_string(agreed.count(0)) + " to " + std::to_string(agreed.count(0) + 1) + " across ranks",
                  "the gather partition (gather_dim 1) " + mine.str(), "every rank must pass the same partitions",
                  "[nothing was sent]"});
  View4 g("g", 2, static_cast<std::size_t>(mine.count(me)), 3, 3);
  expect_invalid([&] { mlacp::launch_all_gather(space, g, 1, mine, mesh); },
                 {"mlacp::launch_all_gather 'all_gather': the ranks of the mesh disagree on count(0) of the partition "
                  "(dim 1)"});
  View4 r("r", 2, static_cast<std::size_t>(agreed.total()), 3, 3);
  expect_invalid([&] { mlacp::launch_reduce_scatter(space, r, 1, mine, mesh); },
                 {"mlacp::launch_reduce_scatter 'reduce_scatter': the ranks of the mesh disagree on count(0) of the "
                  "partition (dim 1)"});
  // An even call on some ranks and an uneven one on others.
  const mlacp::Partition even(3 * p, p);
  View4 e("e", 2, 3, 3, 3);
  expect_invalid(
      [&] {
        if (me == 0)
          mlacp::launch_all_gather(space, e, 1, mesh);
        else
          mlacp::launch_all_gather(space, e, 1, even, mesh);
      },
      {"the ranks of the mesh disagree on the split (0: even, 1: uneven, with Partitions)"});
}

TEST(UnevenCollectiveValidation, DestinationOfTheWrongShapeAndUncheckedLocalChecks) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int p = mesh.size();
  const int me = mesh.rank();
  const Kokkos::DefaultExecutionSpace space;
  const mlacp::Partition seq(2 * p + 1, p), heads(p + 1, p);
  View4 x("x", 1, static_cast<std::size_t>(seq.count(me)), static_cast<std::size_t>(heads.total()), 3);
  // The result is [1, S, heads.count(me), 3]; a destination one head too wide is refused, on every rank with the
  // message of rank 0 (the lowest failing rank).
  View4 wrong("wrong", 1, static_cast<std::size_t>(seq.total()), static_cast<std::size_t>(heads.count(me) + 1), 3);
  expect_invalid([&] { mlacp::launch_all_to_all(space, x, 1, 2, seq, heads, mesh, "a2a", wrong); },
                 {"the destination View has shape [1, " + std::to_string(seq.total()) + ", " +
                  std::to_string(heads.count(0) + 1) + ", 3]; expected the result's shape [1, " +
                  std::to_string(seq.total()) + ", " + std::to_string(heads.count(0)) + ", 3]"});
  mesh.set_checked(false);
  View4 y("y", 1, static_cast<std::size_t>(seq.count(me) + 1), static_cast<std::size_t>(heads.total()), 3);
  expect_invalid([&] { mlacp::launch_all_to_all(space, y, 1, 2, seq, heads, mesh); },
                 {"gather_dim 1 has extent " + std::to_string(seq.count(me) + 1) + " on rank " + std::to_string(me)});
}

// MPI's counts are ints: an uneven collective whose partition or message does not fit is refused, on every rank,
// before anything is read (the Views here are unmanaged around one double: nothing of them is ever touched).
TEST(UnevenCollectiveValidation, CountsBeyondMpisIntAreRefused) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int p = mesh.size();
  const Kokkos::DefaultExecutionSpace space;
  double one = 0;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(p), 0);
  counts[0] = std::int64_t{1} << 31;
  const auto huge = mlacp::Partition::from_counts(counts);
  View4 x(&one, 1, static_cast<std::size_t>(huge.total()), 1, 1);
  expect_invalid([&] { mlacp::launch_reduce_scatter(space, x, 1, huge, mesh); },
                 {"mlacp::launch_reduce_scatter: the partition (dim 1) " + huge.str() +
                  " has the total 2147483648; "
                  "expected at most INT_MAX (2147483647) for MPI's int counts"});
  const mlacp::Partition rows(4 * p, p);
  View4 y(&one, 1, static_cast<std::size_t>(rows.total()), std::size_t{1} << 20, 1024);
  expect_invalid([&] { mlacp::launch_reduce_scatter(space, y, 1, rows, mesh); },
                 {"4294967296 elements per rank and message exceed MPI's int count limit (2147483647)"});
}

// The collectives pull in the NCCL backend (cuda_runtime.h, nccl.h) only in CUDA builds with NCCL: a host build that
// found NCCL at configure time compiles this file without them (issue 19: including the layer pulled both backends
// into every translation unit).
TEST(BackendIncludes, TheNcclBackendOnlyInCudaBuilds) {
#if !defined(KOKKOS_ENABLE_CUDA) && (defined(NCCL_MAJOR) || defined(CUDART_VERSION))
  ADD_FAILURE() << "<mlacp/collectives.hpp> included nccl.h or cuda_runtime.h in a build without Kokkos' CUDA backend";
#else
  SUCCEED();
#endif
}

// The bound on MPI's int counts, tested on the check itself (pure host code: a described call, no View, nothing
// allocated), exactly at INT_MAX and INT_MAX + 1 values per message, for every collective, even and uneven, on a group
// of 2 ranks whatever the mesh. The count is the one the transport passes: the even path's P equal blocks, the uneven
// path's blocks of the partitions (on the receive side, blocks of the result, not of the input).
namespace boundary {

using mlacp::detail::CollectiveCall;
using mlacp::detail::CollectiveKind;
constexpr std::int64_t fits = INT_MAX;
constexpr std::int64_t beyond = std::int64_t{INT_MAX} + 1;

CollectiveCall call(CollectiveKind kind, std::vector<std::int64_t> extents, int dim_a, int dim_b,
                    std::vector<std::int64_t> counts_a = {}, std::vector<std::int64_t> counts_b = {}) {
  CollectiveCall c{kind, static_cast<int>(extents.size()), {}, dim_a, dim_b, 4, true};
  for (std::size_t d = 0; d < extents.size(); ++d) c.extents[d] = extents[d];
  c.uneven = !counts_a.empty();
  c.counts_a = std::move(counts_a);
  c.counts_b = std::move(counts_b);
  return c;
}

void expect_fits(const CollectiveCall& c, int me) {
  EXPECT_EQ(mlacp::detail::collective_call_error(c, 2, me), "") << "rank " << me << " of 2";
}

void expect_beyond(const CollectiveCall& c, int me) {
  const std::string error = mlacp::detail::collective_call_error(c, 2, me);
  EXPECT_NE(error.find("2147483648 elements per rank and message exceed MPI's int count limit (2147483647)"),
            std::string::npos)
      << "rank " << me << " of 2: '" << error << "'";
}

TEST(CollectiveCountBound, EvenAllToAllAtTheBoundary) {
  // [1, 2, n] gathered on 0, scattered on 1: each of the 2 blocks holds n values.
  expect_fits(call(CollectiveKind::all_to_all, {1, 2, fits}, 0, 1), 0);
  expect_beyond(call(CollectiveKind::all_to_all, {1, 2, beyond}, 0, 1), 0);
}

TEST(CollectiveCountBound, EvenAllGatherAtTheBoundary) {
  // Every message is the whole input.
  expect_fits(call(CollectiveKind::all_gather, {1, 1, fits}, 0, -1), 0);
  expect_beyond(call(CollectiveKind::all_gather, {1, 1, beyond}, 0, -1), 0);
}

TEST(CollectiveCountBound, EvenReduceScatterAtTheBoundary) {
  expect_fits(call(CollectiveKind::reduce_scatter, {2, 1, fits}, 0, -1), 0);
  expect_beyond(call(CollectiveKind::reduce_scatter, {2, 1, beyond}, 0, -1), 0);
}

TEST(CollectiveCountBound, UnevenAllToAllAtTheBoundary) {
  // Gather partition {1, 1} of dim 0, scatter partition {1, 0} of dim 1: rank 0 sends one block of n values and
  // receives two; rank 1 sends one and receives none.
  for (int me = 0; me < 2; ++me) {
    expect_fits(call(CollectiveKind::all_to_all, {1, 1, fits}, 0, 1, {1, 1}, {1, 0}), me);
    expect_beyond(call(CollectiveKind::all_to_all, {1, 1, beyond}, 0, 1, {1, 1}, {1, 0}), me);
  }
}

TEST(CollectiveCountBound, UnevenAllGatherAtTheBoundary) {
  // Partition {1, 0} of dim 0: rank 0 holds one row of n values, rank 1 none; both receive rank 0's row.
  expect_fits(call(CollectiveKind::all_gather, {1, 1, fits}, 0, -1, {1, 0}), 0);
  expect_fits(call(CollectiveKind::all_gather, {0, 1, fits}, 0, -1, {1, 0}), 1);
  expect_beyond(call(CollectiveKind::all_gather, {1, 1, beyond}, 0, -1, {1, 0}), 0);
  expect_beyond(call(CollectiveKind::all_gather, {0, 1, beyond}, 0, -1, {1, 0}), 1);
}

TEST(CollectiveCountBound, UnevenReduceScatterAtTheBoundary) {
  for (int me = 0; me < 2; ++me) {
    expect_fits(call(CollectiveKind::reduce_scatter, {1, 1, fits}, 0, -1, {1, 0}), me);
    expect_beyond(call(CollectiveKind::reduce_scatter, {1, 1, beyond}, 0, -1, {1, 0}), me);
  }
}

// The dQ all-to-all: [1, B, S, h, d] gathered on dim 0 (one part per rank) and scattered on S. Each message holds
// B * S/P * h * d values; the input's B * S * h * d (what one index of dim 0 holds before the exchange) is no count
// MPI is ever passed. Refusing it was the spurious error at the first backward (issue 19, defect 4).
TEST(CollectiveCountBound, DqAllToAllGatheredOnDimZeroCountsTheResultsBlocks) {
  for (int me = 0; me < 2; ++me) {
    // Exactly INT_MAX per message: S = 2 split {1, 1}, d = INT_MAX (the input's row holds 2 * INT_MAX).
    expect_fits(call(CollectiveKind::all_to_all, {1, 1, 2, 1, fits}, 0, 2, {1, 1}, {1, 1}), me);
    expect_beyond(call(CollectiveKind::all_to_all, {1, 1, 2, 1, beyond}, 0, 2, {1, 1}, {1, 1}), me);
    // The shape: float, B = 2, S = 131072, H = 128 (h = 64 per rank), dqk = 192, P = 2: 1.6e9 values per
    // message, 3.2e9 in the input's row.
    expect_fits(call(CollectiveKind::all_to_all, {1, 2, 131072, 64, 192}, 0, 2, {1, 1}, {65536, 65536}), me);
    expect_fits(call(CollectiveKind::all_to_all, {1, 2, 131072, 64, 192}, 0, 2), me);
  }
}

}  // namespace boundary

}  // namespace
