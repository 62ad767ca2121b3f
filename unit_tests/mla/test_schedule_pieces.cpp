// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The schedule pieces' checks (schedule_pieces.hpp), tested directly rather than through the layer: the input check
// and its agreement, the gradient Views' shapes, the allocation of missing gradients, the offsets' hash and the rank's
// rows of w_kvb.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/mla_attention.hpp>

#include <functional>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Pieces = mlacp::detail::SchedulePieces<double, Space, mlacp::FlashAttentionCore>;
using Tensor3 = Pieces::tensor3;
using Grads = Pieces::gradients_type;

// S = 2P + 1 (uneven) and H = P + 1 heads, with biases.
mlacp::MlaConfig sample(int P) { return mlacp::test::make_config(2, 2 * P + 1, 8, P + 1, 4, 2, 3, 5, true); }

// The pieces over a configuration and its weights, with what they refer to kept alive.
struct PiecesSetup {
  explicit PiecesSetup(const mlacp::Mesh& m)
      : config(sample(m.size())),
        weights(mlacp::test::make_weights<double, Mem>(config, 3)),
        pieces(config, weights, m, core, documents, scratch) {}
  mlacp::MlaConfig config;
  mlacp::MlaWeights<double, Mem> weights;
  mlacp::FlashAttentionCore core;
  mlacp::DocumentLayout documents;
  mlacp::detail::LayerScratch<double, Space> scratch;
  Pieces pieces;
};

// The message of the exception `f` throws as E ("" when it throws none; other exceptions propagate).
template <class E>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

Tensor3 x_of(int tokens) { return Tensor3("x", 2, static_cast<std::size_t>(tokens), 8); }

TEST(SchedulePieces, CheckInputPassesAGoodInputOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  EXPECT_EQ(s.pieces.local_seq(), s.pieces.seq_partition().count(mesh.rank()));
  EXPECT_NO_THROW(s.pieces.check_input(Space(), "forward", "x", x_of(s.pieces.local_seq()), {}, "", ""));
}

TEST(SchedulePieces, CheckInputRaisesOneRanksBadShapeOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  const bool last = mesh.rank() == mesh.size() - 1;
  const Tensor3 x = x_of(s.pieces.local_seq() + (last ? 1 : 0));
  const std::string m =
      message_of<mlacp::InvalidArgument>([&] { s.pieces.check_input(Space(), "forward", "x", x, {}, "", ""); });
  EXPECT_NE(m.find("x has shape"), std::string::npos) << m;
  EXPECT_NE(m.find("expected [B, s, D]"), std::string::npos) << m;
}

TEST(SchedulePieces, CheckInputRaisesUsageFirstAndOtherErrorsAfterTheShape) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  const Tensor3 x = x_of(s.pieces.local_seq());
  const std::string usage = mesh.rank() == 0 ? "misused on rank 0" : "";
  std::string m = message_of<mlacp::UsageError>(
      [&] { s.pieces.check_input(Space(), "backward", "dy", x, {}, usage, "never raised: usage comes first"); });
  EXPECT_NE(m.find("misused on rank 0"), std::string::npos) << m;
  const std::string other = mesh.rank() == mesh.size() - 1 ? "a gradient is wrong" : "";
  m = message_of<mlacp::InvalidArgument>([&] { s.pieces.check_input(Space(), "backward", "dy", x, {}, "", other); });
  EXPECT_NE(m.find("a gradient is wrong"), std::string::npos) << m;
}

TEST(SchedulePieces, CheckInputAgreesOnTheFlagsAndTheExtraFields) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  PiecesSetup s(mesh);
  const Tensor3 x = x_of(s.pieces.local_seq());
  mlacp::MlaRequiresGrad flags;
  flags.w_kvb = mesh.rank() != 0;
  std::string m =
      message_of<mlacp::InvalidArgument>([&] { s.pieces.check_input(Space(), "forward", "x", x, flags, "", ""); });
  EXPECT_NE(m.find("disagree on the gradient flags"), std::string::npos) << m;
  m = message_of<mlacp::InvalidArgument>([&] {
    s.pieces.check_input(Space(), "forward", "x", x, {}, "", "", {{"cu_seqlens.size()", mesh.rank() == 0 ? 3 : 4}});
  });
  EXPECT_NE(m.find("cu_seqlens.size()"), std::string::npos) << m;
}

TEST(SchedulePieces, GradientsErrorNamesTheFirstViewOfTheWrongShape) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  Grads g;
  EXPECT_EQ(s.pieces.gradients_error(g), "");  // empty Views are allocated later
  const auto& c = s.config;
  const auto rows = static_cast<std::size_t>(c.heads * (c.nope + c.vdim));
  g.w_kvb = decltype(g.w_kvb)("w_kvb", rows, static_cast<std::size_t>(c.latent));
  EXPECT_EQ(s.pieces.gradients_error(g), "");
  g.w_kvb = decltype(g.w_kvb)("w_kvb", rows + 1, static_cast<std::size_t>(c.latent));
  std::string m = s.pieces.gradients_error(g);
  EXPECT_NE(m.find("gradient w_kvb has shape [" + std::to_string(rows + 1)), std::string::npos) << m;
  EXPECT_NE(m.find("on rank " + std::to_string(mesh.rank())), std::string::npos) << m;
  g.w_kvb = decltype(g.w_kvb)();
  g.dx = Tensor3("dx", 2, static_cast<std::size_t>(s.pieces.local_seq() + 1), 8);
  m = s.pieces.gradients_error(g);
  EXPECT_NE(m.find("gradient dx has shape"), std::string::npos) << m;
}

TEST(SchedulePieces, AllocateMissingAllocatesWhatTheFlagsNeedWithTheTableShapes) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  Grads g;
  mlacp::MlaRequiresGrad flags = mlacp::MlaRequiresGrad::none();
  flags.w_kva = flags.b_o = flags.x = true;
  s.pieces.allocate_missing(g, flags);
  EXPECT_EQ(g.w_kva.extent(0), static_cast<std::size_t>(s.config.latent + s.config.rope));
  EXPECT_EQ(g.w_kva.extent(1), static_cast<std::size_t>(s.config.hidden));
  EXPECT_EQ(g.b_o.extent(0), static_cast<std::size_t>(s.config.hidden));
  EXPECT_EQ(g.dx.extent(1), static_cast<std::size_t>(s.pieces.local_seq()));
  EXPECT_EQ(g.w_q.data(), nullptr);
  EXPECT_EQ(g.w_kvb.data(), nullptr);
  EXPECT_EQ(s.pieces.gradients_error(g), "");
  // A provided View is kept as it is; an absent bias is never allocated.
  const auto provided = g.w_kva;
  s.config.bias = false;
  Grads h;
  h.w_kva = provided;
  flags.b_q = true;
  s.pieces.allocate_missing(h, flags);
  EXPECT_EQ(h.w_kva.data(), provided.data());
  EXPECT_EQ(h.b_q.data(), nullptr);
  EXPECT_EQ(h.b_o.data(), nullptr);
}

TEST(SchedulePieces, HashOffsetsSeparatesLayouts) {
  using P = Pieces;
  EXPECT_EQ(P::hash_offsets({0, 5, 16}), P::hash_offsets({0, 5, 16}));
  EXPECT_NE(P::hash_offsets({0, 5, 16}), P::hash_offsets({0, 6, 16}));
  EXPECT_NE(P::hash_offsets({0, 5, 16}), P::hash_offsets({0, 16}));
  EXPECT_NE(P::hash_offsets({}), P::hash_offsets({0}));
}

TEST(SchedulePieces, RowsOfAreTheRanksHeadRows) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  const auto width = static_cast<std::size_t>(s.config.nope + s.config.vdim);
  const auto first = static_cast<std::size_t>(s.pieces.head_partition().offset(mesh.rank()));
  const auto rows = s.pieces.rows_of(s.weights.w_kvb);
  EXPECT_EQ(rows.extent(0), static_cast<std::size_t>(s.pieces.local_heads()) * width);
  EXPECT_EQ(rows.data(), s.weights.w_kvb.data() + first * width * s.weights.w_kvb.extent(1));
  const auto part = s.pieces.part_of(s.weights.b_kvb);
  EXPECT_EQ(part.data(), s.weights.b_kvb.data() + first * width);
  EXPECT_EQ(s.pieces.rows_of(decltype(s.weights.w_kvb)()).data(), nullptr);
}

}  // namespace
