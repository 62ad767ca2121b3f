// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The planner (include/mlacp/model/planner.hpp): every runnable choice and only those, ranked by predicted time, the
// memory budget, the restrictions, its errors, its table and JSON.
#include <mlacp/error.hpp>
#include <mlacp/model/planner.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>

namespace {

using mlacp::MlaStrategy;
using mlacp::RingLayout;
using namespace mlacp::model;

MachineParams machine() {
  MachineParams m;
  m.name = "test cluster";
  m.intra = {2e-6, 1.0 / 100e9};
  m.inter = {2e-5, 1.0 / 10e9};
  for (const char* d : {"double", "float", "bf16"}) {
    m.gemm[d] = {{32, 1e10}, {1024, 1e11}};
    m.attention[d] = {5e10, 3e10};
  }
  m.memory_bandwidth = 1e11;
  return m;
}

PlanRequest request() {
  PlanRequest r;
  mlacp::MlaConfig& c = r.config;
  c.batch = 1;
  c.seq = 4096;
  c.hidden = 512;
  c.heads = 8;
  c.nope = 32;
  c.rope = 16;
  c.vdim = 32;
  c.latent = 64;
  r.dtype = Dtype::float32;
  r.cluster = Cluster{2, 4};
  return r;
}

TEST(Planner, EveryRunnableChoiceRankedByTime) {
  const Plan p = plan(request(), machine());
  // 8 ranks on 2 x 4: C in {1, 2, 4, 8} (U = 8, 4, 2, 1 all divide or are divided by 4), two strategies, two layouts
  // on rings: 2 * (1 + 3 * 2) = 14 choices.
  ASSERT_EQ(p.rows.size(), 14U);
  std::set<std::string> seen;
  for (std::size_t i = 0; i < p.rows.size(); ++i) {
    EXPECT_TRUE(p.rows[i].fits);
    EXPECT_TRUE(seen.insert(p.rows[i].prediction.choice.describe()).second);
    if (i > 0) {
      EXPECT_LE(p.rows[i - 1].prediction.total_s(), p.rows[i].prediction.total_s());
    }
  }
  ASSERT_NE(p.best(), nullptr);
  EXPECT_EQ(p.best(), &p.rows.front());
  const std::string table = format_plan(p);
  EXPECT_NE(table.find("recommendation: " + p.rows.front().prediction.choice.describe()), std::string::npos) << table;
}

TEST(Planner, ZigzagBeatsContiguousOnACausalRing) {
  PlanRequest r = request();
  r.ring = 4;
  r.strategy = MlaStrategy::latent;
  const Plan p = plan(r, machine());
  ASSERT_EQ(p.rows.size(), 2U);
  EXPECT_EQ(p.rows[0].prediction.choice.layout, RingLayout::zigzag);
  EXPECT_LT(p.rows[0].prediction.total_s(), p.rows[1].prediction.total_s());
}

TEST(Planner, MemoryBudget) {
  PlanRequest r = request();
  const Plan all = plan(r, machine());
  double least = 1e300, most = 0;
  for (const PlanRow& row : all.rows) {
    least = std::min(least, row.prediction.memory.total());
    most = std::max(most, row.prediction.memory.total());
  }
  ASSERT_LT(least, most);
  r.memory_per_rank = (least + most) / 2;
  const Plan some = plan(r, machine());
  bool seen_misfit = false;
  for (const PlanRow& row : some.rows) {
    EXPECT_EQ(row.fits, row.prediction.memory.total() <= r.memory_per_rank);
    if (!row.fits) {
      seen_misfit = true;
      EXPECT_NE(row.why_not.find("per rank, budget"), std::string::npos) << row.why_not;
    } else {
      EXPECT_FALSE(seen_misfit) << "a fitting row after one that does not fit";
    }
  }
  EXPECT_TRUE(seen_misfit);
  r.memory_per_rank = least / 2;
  const Plan none = plan(r, machine());
  EXPECT_EQ(none.best(), nullptr);
  EXPECT_NE(format_plan(none).find("no choice fits"), std::string::npos);
  EXPECT_TRUE(nlohmann::ordered_json::parse(plan_to_json(none)).at("best").is_null());
}

TEST(Planner, ErrorsNameTheValue) {
  PlanRequest r = request();
  r.ring = 3;
  try {
    plan(r, machine());
    FAIL();
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ring 3: expected a divisor of the 8 ranks"), std::string::npos) << e.what();
  }
  r = request();
  r.cluster = Cluster{0, 4};
  EXPECT_THROW(plan(r, machine()), mlacp::InvalidArgument);
  r = request();
  r.config.rope = 3;  // odd
  EXPECT_THROW(plan(r, machine()), mlacp::InvalidArgument);
}

TEST(Planner, JsonHasEveryRow) {
  const Plan p = plan(request(), machine());
  // Parsed, as its readers do (python/mlacp/plan.py, the reports): the keys in the order written, every row with
  // its figures to the bit, and the best row's index.
  const auto doc = nlohmann::ordered_json::parse(plan_to_json(p));
  EXPECT_EQ(doc.begin().key(), "tool");
  EXPECT_EQ(doc.at("tool"), "mlacp-plan");
  ASSERT_EQ(doc.at("rows").size(), p.rows.size());
  for (std::size_t i = 0; i < p.rows.size(); ++i) {
    EXPECT_EQ(doc["rows"][i].at("total_s").get<double>(), p.rows[i].prediction.total_s());
    EXPECT_EQ(doc["rows"][i].at("fits").get<bool>(), p.rows[i].fits);
  }
  EXPECT_EQ(doc.at("best"), 0);
}

}  // namespace
