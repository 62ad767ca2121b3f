// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Entries of the error catalogue (docs/errors.md) not covered by the collective and layer suites:
// non-finite inputs, a mesh of another group size, calls after finalize, sizes that are not positive.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/mla/mla_attention.hpp>

#include <limits>
#include <string>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Tensor3 = Kokkos::View<double***, Kokkos::LayoutRight, Mem>;

mlacp::MlaConfig config_for(int P) { return mlacp::test::make_config(1, 4 * P, 8, P, 2, 2, 2, 4); }

using mlacp::test::expect_error;

TEST(ErrorCatalogue, NonFiniteInputsWhenTheFiniteCheckIsOn) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto config = config_for(mesh.size());
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 3), mesh);
  Tensor3 x("x", config.batch, config.seq / mesh.size(), config.hidden);
  auto host = Kokkos::create_mirror_view(x);
  // Only the last rank has a NaN and an Inf; every rank must raise.
  if (mesh.rank() == mesh.size() - 1) {
    host(0, 0, 1) = std::numeric_limits<double>::quiet_NaN();
    host(0, 1, 2) = std::numeric_limits<double>::infinity();
  }
  Kokkos::deep_copy(x, host);
  // Off (the default): the NaN goes through (and would poison y).
  EXPECT_NO_THROW(layer.forward(Space(), x, mlacp::MlaRequiresGrad::none()));
  mesh.set_check_finite(true);
  expect_error<mlacp::InvalidArgument>(
      [&] { layer.forward(Space(), x); },
      "x holds 2 non-finite value(s) (NaN or Inf) on rank " + std::to_string(mesh.size() - 1));
  Tensor3 clean("clean", config.batch, config.seq / mesh.size(), config.hidden);
  auto forward = layer.forward(Space(), clean);
  expect_error<mlacp::InvalidArgument>([&] { layer.backward(Space(), forward, x); }, "dy holds 2 non-finite value(s)");
}

// The call's S is the sum of the ranks' shards (issue 34): a layer on a mesh over MPI_COMM_SELF (P = 1) given this
// group's shard runs it as a sequence of its s tokens, and says so (token_map().seq()); more tokens than the
// configuration's seq (a maximum) are refused, naming the bound.
TEST(ErrorCatalogue, InputShardedForAnotherGroupSize) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks";
  const auto config = config_for(mesh.size());
  mlacp::Mesh self(MPI_COMM_SELF);
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 3), self);
  Tensor3 shard("x", config.batch, config.seq / mesh.size(), config.hidden);
  auto forward = layer.forward(Space(), shard);
  EXPECT_EQ(layer.token_map().seq(), config.seq / mesh.size());
  Tensor3 longer("x", config.batch, config.seq + 1, config.hidden);
  expect_error<mlacp::InvalidArgument>([&] { layer.forward(Space(), longer); },
                                       "x brings S = " + std::to_string(config.seq + 1) +
                                           " tokens but the configuration bounds seq at " + std::to_string(config.seq));
}

// Every size must be positive (batch and seq, the optional maxima of a call's shape: 0 or positive); fewer tokens
// or heads than ranks are no error (a rank may hold no token or no head: test_mla_uneven's empty-shard block checks
// the numbers).
TEST(ErrorCatalogue, NonPositiveSizeIsRefusedFewerThanPRuns) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int P = mesh.size();
  auto config = config_for(P);
  config.hidden = 0;
  expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::MlaAttention<double>(config, mlacp::test::make_weights<double, Mem>(config, 3), mesh); },
      "mlacp::MlaConfig: hidden = 0; expected a positive size");
  config = config_for(P);
  config.seq = -2;
  EXPECT_EQ(config.error(P), "mlacp::MlaConfig: seq = -2; expected 0 (unset: a call brings any) or a positive maximum");
  config = config_for(P);
  config.heads = -1;
  EXPECT_EQ(config.error(P), "mlacp::MlaConfig: heads = -1; expected a positive size");
  config = config_for(P);
  config.seq = 1;
  config.heads = 1;
  EXPECT_EQ(config.error(P), "");
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 3), mesh);
  EXPECT_EQ(layer.local_seq(), mesh.rank() == 0 ? 1 : 0);
  EXPECT_EQ(layer.local_heads(), mesh.rank() == 0 ? 1 : 0);
}

TEST(ErrorCatalogue, InterCommunicatorAndNullCommunicator) {
  expect_error<mlacp::InvalidArgument>([] { mlacp::Mesh m(MPI_COMM_NULL); }, "the communicator is MPI_COMM_NULL");
  if (mlacp::test::world_size() == 1) return;
  // Two halves of the world joined by an inter-communicator.
  const int rank = mlacp::test::world_rank();
  MPI_Comm half = MPI_COMM_NULL, inter = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 99, &inter);
  expect_error<mlacp::InvalidArgument>([&] { mlacp::Mesh m(inter); }, "an inter-communicator was given");
  MPI_Comm_free(&inter);
  MPI_Comm_free(&half);
}

}  // namespace
