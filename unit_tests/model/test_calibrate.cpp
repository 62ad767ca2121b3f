// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// calibrate (include/mlacp/model/calibrate.hpp) with quick sizes: every rank returns the same parameters (the same
// JSON), the rates are positive, the intra-node level is measured wherever a node holds two ranks or more, the
// inter-node level is 0 and said to be unmeasured on one node, and measured when the ranks are split into nodes by
// hand (options.ranks_per_node); nodes of different sizes and bad options are refused on every rank.
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/error.hpp>
#include <mlacp/model/calibrate.hpp>
#include <mlacp/model/machine.hpp>

#include <mpi.h>

#include <iostream>
#include <string>
#include <vector>

namespace {

using mlacp::model::CalibrationOptions;
using mlacp::model::Dtype;
using mlacp::model::MachineParams;

/// Expects the same text on every rank of MPI_COMM_WORLD.
void expect_same_on_every_rank(const std::string& text) {
  std::string root = text;
  int n = static_cast<int>(root.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  root.resize(static_cast<std::size_t>(n));
  MPI_Bcast(root.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(text, root) << "rank " << mlacp::test::world_rank() << " differs from rank 0";
}

void expect_rates_positive(const MachineParams& m, const std::vector<Dtype>& dtypes) {
  EXPECT_EQ(m.gemm.size(), dtypes.size());
  for (const Dtype d : dtypes) {
    const std::string name = mlacp::model::to_string(d);
    ASSERT_TRUE(m.gemm.count(name)) << name;
    const auto& points = m.gemm.at(name);
    EXPECT_GE(points.size(), 4u) << name;
    for (std::size_t i = 0; i < points.size(); ++i) {
      EXPECT_GT(points[i].first, 0) << name;
      EXPECT_GT(points[i].second, 0) << name;
      if (i > 0) {
        EXPECT_GT(points[i].first, points[i - 1].first) << name;
      }
    }
    EXPECT_GT(m.attention_rate(d).forward_flops, 0) << name;
    EXPECT_GT(m.attention_rate(d).backward_flops, 0) << name;
    EXPECT_GT(m.gemm_time(d, 100, 200, 300), 0) << name;
  }
  EXPECT_GT(m.memory_bandwidth, 0);
}

TEST(Calibrate, QuickRunIsTheSameOnEveryRankAndUsable) {
  const int size = mlacp::test::world_size();
  CalibrationOptions options;
  options.quick = true;
  options.repeats = 3;
  const auto report = mlacp::model::calibrate_report(MPI_COMM_WORLD, options);
  const MachineParams& m = report.machine;
  expect_same_on_every_rank(mlacp::model::machine_to_json(m));
  EXPECT_EQ(m.error(), "");
  expect_rates_positive(m, options.dtypes);
  // The test's ranks run on one machine: one node of all of them.
  EXPECT_EQ(report.nodes, 1);
  EXPECT_EQ(m.ranks_per_node, size);
  EXPECT_EQ(m.name.rfind(std::to_string(size) + " x 1 ranks on ", 0), 0u) << m.name;
  EXPECT_EQ(m.source.rfind("mlacp-plan --calibrate, ", 0), 0u) << m.source;
  if (size >= 2) {
    EXPECT_GT(m.intra.alpha_s, 0);
    EXPECT_GT(m.intra.beta_s_per_byte, 0);
  } else {
    EXPECT_EQ(m.intra.alpha_s, 0);
    EXPECT_EQ(m.intra.beta_s_per_byte, 0);
    EXPECT_NE(m.source.find("intra-node level not measured (one rank per node)"), std::string::npos) << m.source;
  }
  EXPECT_EQ(m.inter.alpha_s, 0);
  EXPECT_EQ(m.inter.beta_s_per_byte, 0);
  EXPECT_NE(m.source.find("inter-node level not measured (one node)"), std::string::npos) << m.source;
  EXPECT_EQ(report.inter_pingpong_bandwidth, 0);
  // The fit: two skinny shapes per dtype, measured and predicted.
  ASSERT_EQ(report.gemm_fit.size(), 2 * options.dtypes.size());
  for (const auto& f : report.gemm_fit) {
    EXPECT_GT(f.measured_s, 0);
    EXPECT_GT(f.predicted_s, 0);
  }
  const std::string text = mlacp::model::format_report(report);
  expect_same_on_every_rank(text.substr(0, text.find("calibration took")));
  EXPECT_NE(text.find("GEMM fit"), std::string::npos) << text;
  // The JSON reads back to the same parameters.
  EXPECT_EQ(mlacp::model::machine_to_json(mlacp::model::machine_from_json(mlacp::model::machine_to_json(m))),
            mlacp::model::machine_to_json(m));
}

TEST(Calibrate, NodesSplitByHandMeasureTheInterNodeLevel) {
  const int size = mlacp::test::world_size();
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  CalibrationOptions options;
  options.quick = true;
  options.repeats = 3;
  options.dtypes = {Dtype::float32};
  options.ranks_per_node = size / 2;  // two nodes
  const auto report = mlacp::model::calibrate_report(MPI_COMM_WORLD, options);
  const MachineParams& m = report.machine;
  expect_same_on_every_rank(mlacp::model::machine_to_json(m));
  EXPECT_EQ(m.error(), "");
  expect_rates_positive(m, options.dtypes);
  EXPECT_EQ(report.nodes, 2);
  EXPECT_EQ(m.ranks_per_node, size / 2);
  EXPECT_EQ(m.name.rfind(std::to_string(size / 2) + " x 2 ranks on ", 0), 0u) << m.name;
  EXPECT_GT(m.inter.alpha_s, 0);
  EXPECT_GT(m.inter.beta_s_per_byte, 0);
  EXPECT_GT(report.inter_pingpong_bandwidth, 0);
  EXPECT_EQ(m.source.find("inter-node level not measured"), std::string::npos) << m.source;
  if (size / 2 >= 2) {
    EXPECT_GT(m.intra.beta_s_per_byte, 0);
  } else {
    EXPECT_EQ(m.intra.beta_s_per_byte, 0);
    EXPECT_NE(m.source.find("intra-node level not measured"), std::string::npos) << m.source;
  }
}

TEST(Calibrate, NodesOfDifferentSizesAreRefusedOnEveryRank) {
  const int size = mlacp::test::world_size();
  if (size < 3) GTEST_SKIP() << "needs three ranks";
  // Three ranks in nodes of two: 2 and 1.
  MPI_Comm three = MPI_COMM_NULL;
  const int rank = mlacp::test::world_rank();
  MPI_Comm_split(MPI_COMM_WORLD, rank < 3 ? 0 : MPI_UNDEFINED, rank, &three);
  if (three == MPI_COMM_NULL) {
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  CalibrationOptions options;
  options.quick = true;
  options.ranks_per_node = 2;
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { (void)mlacp::model::calibrate(three, options); },
      "calibrate: the nodes hold different numbers of ranks (2, 1 on nodes 0 to 1), expected the same number of "
      "ranks on every node");
  MPI_Comm_free(&three);
}

TEST(Calibrate, BadOptionsAreRefused) {
  CalibrationOptions options;
  options.repeats = 0;
  mlacp::test::expect_error<mlacp::InvalidArgument>([&] { (void)mlacp::model::calibrate(MPI_COMM_WORLD, options); },
                                                    "calibrate: repeats = 0, expected at least 1");
  options = {};
  options.dtypes.clear();
  mlacp::test::expect_error<mlacp::InvalidArgument>([&] { (void)mlacp::model::calibrate(MPI_COMM_WORLD, options); },
                                                    "calibrate: no dtype given");
}

/// The full-size calibration, printed by rank 0 (run by hand: --gtest_also_run_disabled_tests
/// --gtest_filter=*FullCalibration*); what mlacp-plan --calibrate measures.
TEST(Calibrate, DISABLED_FullCalibrationPrintsItsReport) {
  const auto report = mlacp::model::calibrate_report(MPI_COMM_WORLD);
  EXPECT_EQ(report.machine.error(), "");
  if (mlacp::test::world_rank() == 0) {
    std::cout << mlacp::model::format_report(report) << mlacp::model::machine_to_json(report.machine) << std::flush;
  }
}

}  // namespace
