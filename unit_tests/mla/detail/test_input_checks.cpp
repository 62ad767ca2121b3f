// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The layer's input checks (mla/detail/input_checks.hpp), tested directly rather than through the layer: the input
// check and its agreement, the gradient Views' shapes, the allocation of missing gradients and the offsets' hash.
#include "context_setup.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/detail/input_checks.hpp>
#include <mlacp/mla/detail/schedule_context.hpp>

#include <string>
#include <vector>

namespace {

using Space = mlacp::test::ScheduleSpace;
using Tensor3 = mlacp::test::Context::tensor3;
using Grads = mlacp::test::Context::gradients_type;
using PiecesSetup = mlacp::test::ContextSetup;
using mlacp::test::message_of;

Tensor3 x_of(int tokens) { return Tensor3("x", 2, static_cast<std::size_t>(tokens), 8); }

TEST(InputChecks, CheckInputPassesAGoodInputOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  EXPECT_EQ(s.ctx.local_seq(), s.ctx.seq_partition().count(mesh.rank()));
  EXPECT_NO_THROW(mlacp::detail::check_input(s.ctx, Space(), "forward", "x", x_of(s.ctx.local_seq()), {}, "", ""));
}

TEST(InputChecks, CheckInputRaisesOneRanksBadShapeOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  const bool last = mesh.rank() == mesh.size() - 1;
  const Tensor3 x = x_of(s.ctx.local_seq() + (last ? 1 : 0));
  const std::string m = message_of<mlacp::InvalidArgument>(
      [&] { mlacp::detail::check_input(s.ctx, Space(), "forward", "x", x, {}, "", ""); });
  EXPECT_NE(m.find("x has shape"), std::string::npos) << m;
  EXPECT_NE(m.find("expected [B, s, D]"), std::string::npos) << m;
}

TEST(InputChecks, CheckInputRaisesUsageFirstAndOtherErrorsAfterTheShape) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  const Tensor3 x = x_of(s.ctx.local_seq());
  const std::string usage = mesh.rank() == 0 ? "misused on rank 0" : "";
  std::string m = message_of<mlacp::UsageError>([&] {
    mlacp::detail::check_input(s.ctx, Space(), "backward", "dy", x, {}, usage, "never raised: usage comes first");
  });
  EXPECT_NE(m.find("misused on rank 0"), std::string::npos) << m;
  const std::string other = mesh.rank() == mesh.size() - 1 ? "a gradient is wrong" : "";
  m = message_of<mlacp::InvalidArgument>(
      [&] { mlacp::detail::check_input(s.ctx, Space(), "backward", "dy", x, {}, "", other); });
  EXPECT_NE(m.find("a gradient is wrong"), std::string::npos) << m;
}

TEST(InputChecks, CheckInputAgreesOnTheFlagsAndTheExtraFields) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  PiecesSetup s(mesh);
  const Tensor3 x = x_of(s.ctx.local_seq());
  mlacp::MlaRequiresGrad flags;
  flags.w_kvb = mesh.rank() != 0;
  std::string m = message_of<mlacp::InvalidArgument>(
      [&] { mlacp::detail::check_input(s.ctx, Space(), "forward", "x", x, flags, "", ""); });
  EXPECT_NE(m.find("disagree on the gradient flags"), std::string::npos) << m;
  m = message_of<mlacp::InvalidArgument>([&] {
    mlacp::detail::check_input(s.ctx, Space(), "forward", "x", x, {}, "", "",
                               {{"cu_seqlens.size()", mesh.rank() == 0 ? 3 : 4}});
  });
  EXPECT_NE(m.find("cu_seqlens.size()"), std::string::npos) << m;
}

TEST(InputChecks, GradientsErrorNamesTheFirstViewOfTheWrongShape) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  Grads g;
  EXPECT_EQ(mlacp::detail::gradients_error(s.ctx, g), "");  // empty Views are allocated later
  const auto& c = s.config;
  const auto rows = static_cast<std::size_t>(c.heads * (c.nope + c.vdim));
  g.w_kvb = decltype(g.w_kvb)("w_kvb", rows, static_cast<std::size_t>(c.latent));
  EXPECT_EQ(mlacp::detail::gradients_error(s.ctx, g), "");
  g.w_kvb = decltype(g.w_kvb)("w_kvb", rows + 1, static_cast<std::size_t>(c.latent));
  std::string m = mlacp::detail::gradients_error(s.ctx, g);
  EXPECT_NE(m.find("gradient w_kvb has shape [" + std::to_string(rows + 1)), std::string::npos) << m;
  EXPECT_NE(m.find("on rank " + std::to_string(mesh.rank())), std::string::npos) << m;
  g.w_kvb = decltype(g.w_kvb)();
  g.dx = Tensor3("dx", 2, static_cast<std::size_t>(s.ctx.local_seq() + 1), 8);
  m = mlacp::detail::gradients_error(s.ctx, g);
  EXPECT_NE(m.find("gradient dx has shape"), std::string::npos) << m;
}

TEST(InputChecks, AllocateMissingAllocatesWhatTheFlagsNeedWithTheTableShapes) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  Grads g;
  mlacp::MlaRequiresGrad flags = mlacp::MlaRequiresGrad::none();
  flags.w_kva = flags.b_o = flags.x = true;
  mlacp::detail::allocate_missing(s.ctx, g, flags);
  EXPECT_EQ(g.w_kva.extent(0), static_cast<std::size_t>(s.config.latent + s.config.rope));
  EXPECT_EQ(g.w_kva.extent(1), static_cast<std::size_t>(s.config.hidden));
  EXPECT_EQ(g.b_o.extent(0), static_cast<std::size_t>(s.config.hidden));
  EXPECT_EQ(g.dx.extent(1), static_cast<std::size_t>(s.ctx.local_seq()));
  EXPECT_EQ(g.w_q.data(), nullptr);
  EXPECT_EQ(g.w_kvb.data(), nullptr);
  EXPECT_EQ(mlacp::detail::gradients_error(s.ctx, g), "");
  // A provided View is kept as it is; an absent bias is never allocated.
  const auto provided = g.w_kva;
  auto unbiased_config = s.config;
  unbiased_config.bias = false;
  PiecesSetup unbiased(mesh, unbiased_config);
  Grads h;
  h.w_kva = provided;
  flags.b_q = true;
  mlacp::detail::allocate_missing(unbiased.ctx, h, flags);
  EXPECT_EQ(h.w_kva.data(), provided.data());
  EXPECT_EQ(h.b_q.data(), nullptr);
  EXPECT_EQ(h.b_o.data(), nullptr);
}

TEST(InputChecks, HashOffsetsSeparatesLayouts) {
  EXPECT_EQ(mlacp::detail::hash_offsets({0, 5, 16}), mlacp::detail::hash_offsets({0, 5, 16}));
  EXPECT_NE(mlacp::detail::hash_offsets({0, 5, 16}), mlacp::detail::hash_offsets({0, 6, 16}));
  EXPECT_NE(mlacp::detail::hash_offsets({0, 5, 16}), mlacp::detail::hash_offsets({0, 16}));
  EXPECT_NE(mlacp::detail::hash_offsets({}), mlacp::detail::hash_offsets({0}));
}

}  // namespace
