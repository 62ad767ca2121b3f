// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The planner: every (strategy, U x C, layout) that can run a layer on a cluster, ranked by the model's predicted
// forward + backward time (layer_model.hpp), with its memory per rank, bytes per level and hidden fraction. The
// mlacp-plan tool prints it, mlacp.plan(...) returns it in Python, and Ring::plan (mesh_plan.hpp) runs its first
// choice.
#pragma once

#include <mlacp/model/layer_model.hpp>

#include <optional>
#include <string>
#include <vector>

namespace mlacp::model {

/// What to plan for: the layer (its strategy and ring_layout are ignored; the choices enumerate them; its q_lora_rank
/// is modelled), its dtype,
/// the cluster, and optional restrictions.
struct PlanRequest {
  MlaConfig config;
  Dtype dtype = Dtype::float32;
  Cluster cluster;
  /// Bytes per rank the layer may hold; 0: the machine's memory_per_rank_bytes (0 there too: no limit).
  double memory_per_rank = 0;
  std::optional<MlaStrategy> strategy;  ///< only this strategy
  int ring = 0;                         ///< only this C (0: every C that divides P)
  std::optional<RingLayout> layout;     ///< only this layout (rings only)
};

/// One row of a plan.
struct PlanRow {
  Prediction prediction;
  bool fits = true;     ///< memory.total() within the budget
  std::string why_not;  ///< "" when it fits; else the memory against the budget
};

/// Every choice, ranked: those that fit by predicted time, then those that do not (by memory).
struct Plan {
  PlanRequest request;
  std::string machine;  ///< MachineParams::name
  double budget = 0;    ///< the memory budget applied (0: none)
  std::vector<PlanRow> rows;
  /// The first row that fits; null when none does.
  const PlanRow* best() const;
};

/// Ranks every choice the request allows; throws InvalidArgument when the request itself is invalid (the layer for
/// P ranks, the cluster, the machine's parameters), naming the value.
Plan plan(const PlanRequest& request, const MachineParams& machine);

/// The table mlacp-plan prints: one line per row (choice, forward, backward, total, hidden fraction, bytes intra and
/// inter, memory, fits), then the recommendation.
std::string format_plan(const Plan& plan);
/// The same as JSON (mlacp-plan --json).
std::string plan_to_json(const Plan& plan);

}  // namespace mlacp::model
