// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The host-side parts of the NCCL backend (no GPU needed): datatypes, the grouped send/recv plan, argument checks.
#include <gtest/gtest.h>
#include <mlacp/error.hpp>
#include <mlacp/nccl/nccl_transport.hpp>

#include <set>

namespace {

TEST(NcclPlan, DatatypesMatchValueTypes) {
  EXPECT_EQ(mlacp::nccl::datatype<float>(), ncclFloat32);
  EXPECT_EQ(mlacp::nccl::datatype<double>(), ncclFloat64);
}

TEST(NcclPlan, NativeAllToAllFromNccl228) {
  EXPECT_EQ(mlacp::nccl::has_native_all_to_all(), NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0));
}

TEST(NcclPlan, EveryPeerExactlyOnceWithRankOrderedBlocks) {
  for (int nranks : {1, 2, 3, 4, 8}) {
    for (int rank = 0; rank < nranks; ++rank) {
      const auto plan = mlacp::nccl::all_to_all_plan(rank, nranks, 10);
      ASSERT_EQ(plan.size(), static_cast<std::size_t>(nranks));
      EXPECT_EQ(plan.front().peer, rank) << "the own block first";
      std::set<int> peers;
      for (const auto& t : plan) {
        peers.insert(t.peer);
        EXPECT_EQ(t.send_offset, static_cast<std::size_t>(t.peer) * 10);
        EXPECT_EQ(t.recv_offset, static_cast<std::size_t>(t.peer) * 10);
        EXPECT_EQ(t.count, 10u);
      }
      EXPECT_EQ(peers.size(), static_cast<std::size_t>(nranks));
    }
  }
}

TEST(NcclPlan, RejectsRankOutsideTheGroup) {
  try {
    mlacp::nccl::all_to_all_plan(4, 4, 1);
    ADD_FAILURE() << "no exception";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "mlacp::nccl::all_to_all_plan: rank 4 of 4 ranks; expected 0 <= rank < nranks");
  }
}

}  // namespace
