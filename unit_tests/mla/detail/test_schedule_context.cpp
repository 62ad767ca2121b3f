// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The schedule context (mla/detail/schedule_context.hpp): the rank's rows of w_kvb, where collectives write, the
// one-document RoPE table.
#include "context_setup.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/detail/schedule_context.hpp>

#include <string>
#include <vector>

namespace {

using Space = mlacp::test::ScheduleSpace;
using Tensor3 = mlacp::test::Context::tensor3;
using Grads = mlacp::test::Context::gradients_type;
using PiecesSetup = mlacp::test::ContextSetup;

TEST(ScheduleContext, RowsOfAreTheRanksHeadRows) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  const auto width = static_cast<std::size_t>(s.config.nope + s.config.vdim);
  const auto first = static_cast<std::size_t>(s.ctx.head_partition().offset(mesh.rank()));
  const auto rows = s.ctx.rows_of(s.weights.w_kvb);
  EXPECT_EQ(rows.extent(0), static_cast<std::size_t>(s.ctx.local_heads()) * width);
  EXPECT_EQ(rows.data(), s.weights.w_kvb.data() + first * width * s.weights.w_kvb.extent(1));
  const auto part = s.ctx.part_of(s.weights.b_kvb);
  EXPECT_EQ(part.data(), s.weights.b_kvb.data() + first * width);
  EXPECT_EQ(s.ctx.rows_of(decltype(s.weights.w_kvb)()).data(), nullptr);
}

TEST(ScheduleContext, CollectivesWriteIntoTheLayersMemoryOnlyWhenThereArePeers) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  mlacp::detail::Buffer<mlacp::test::Context::tensor4> slot;
  const auto into = s.ctx.into(slot, "slot", 1, 2, 3, 4);
  if (mesh.size() == 1) {
    // A collective on one rank returns its input: nothing is allocated for its result.
    EXPECT_EQ(into.data(), nullptr);
    EXPECT_EQ(slot.capacity(), 0u);
  } else {
    EXPECT_EQ(into.data(), slot.view().data());
    EXPECT_EQ(into.extent(3), 4u);
    // The second call reuses the allocation.
    EXPECT_EQ(s.ctx.into(slot, "slot", 1, 2, 3, 4).data(), into.data());
  }
}

TEST(ScheduleContext, HeadBlocksFollowTheHeadSplit) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);  // H = P + 1: uneven for P > 1
  mlacp::detail::Buffer<mlacp::test::Context::tensor5> slot;
  const auto blocks = s.ctx.blocks(slot, "blocks", 7);
  const auto s_local = static_cast<std::size_t>(s.ctx.local_seq());
  if (s.ctx.head_partition().uniform()) {
    EXPECT_EQ(blocks.extent(0), static_cast<std::size_t>(mesh.size()));
    EXPECT_EQ(blocks.extent(3), static_cast<std::size_t>(s.ctx.local_heads()));
  } else {
    // One block of all heads: the all-to-all scatters them unevenly.
    EXPECT_EQ(blocks.extent(0), 1u);
    EXPECT_EQ(blocks.extent(3), static_cast<std::size_t>(s.config.heads));
  }
  EXPECT_EQ(blocks.extent(1), static_cast<std::size_t>(s.config.batch));
  EXPECT_EQ(blocks.extent(2), s_local);
  EXPECT_EQ(blocks.extent(4), 7u);
}

TEST(ScheduleContext, OneDocumentRopeTableIsBuiltOnceForTheRanksPositions) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  PiecesSetup s(mesh);
  mlacp::detail::ForwardDocuments<Space::memory_space> documents;  // one document
  const auto& first = s.ctx.rope_table(Space(), documents);
  const auto* data = first.cos.data();
  EXPECT_TRUE(
      first.matches(s.ctx.local_seq(), s.ctx.seq_partition().offset(mesh.rank()), s.config.rope, s.config.rope_base));
  EXPECT_EQ(s.ctx.rope_table(Space(), documents).cos.data(), data);  // cached, not rebuilt
}

}  // namespace
