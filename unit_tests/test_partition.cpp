// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Partition (include/mlacp/partition.hpp): the even rule and the accessors.
#include "collective_test_helpers.hpp"

namespace {

using namespace mlacp::test::collectives;

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
