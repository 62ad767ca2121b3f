// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The performance model of one MLA layer's forward + backward on a cluster: the schedule's steps as the schedules run
// them (latent_schedule.hpp, expanded_schedule.hpp, ring_attention.hpp), each compute step costed from its GEMM
// shapes (MachineParams::gemm_time), the attention core's rate and the element-wise traffic, each collective from
// collective_cost.hpp, and the order of launches and waits simulated on one compute stream and one network queue per
// rank. It gives forward and backward time, the bytes per level, the hidden fraction and the memory per rank of one
// (strategy, U, C, layout) choice. docs/model.md ("The model") has the formulas.
#pragma once

#include <mlacp/mla/mla_config.hpp>
#include <mlacp/model/machine.hpp>

#include <string>
#include <vector>

namespace mlacp::model {

/// The cluster a plan is for: nodes x ranks_per_node ranks, ranks of one node consecutive.
struct Cluster {
  int nodes = 1;
  int ranks_per_node = 1;  ///< G
  int ranks() const { return nodes * ranks_per_node; }
};

/// One way to run the layer: the strategy and the mesh U x C (Mesh(comm, C); C = 1 is flat Ulysses over U = P ranks).
struct Choice {
  MlaStrategy strategy = MlaStrategy::latent;
  int ulysses = 1;                         ///< U
  int ring = 1;                            ///< C
  RingLayout layout = RingLayout::zigzag;  ///< ignored when ring == 1
  /// "latent U=4 C=1", "expanded U=2 C=2 zigzag".
  std::string describe() const;
};

/// Bytes one rank hands to the layer's collectives in one forward + backward, by the level they cross (the critical
/// rank's; a collective whose peers sit on both levels counts each peer's part where it goes).
struct LevelBytes {
  double intra = 0;
  double inter = 0;
  double total() const { return intra + inter; }
};

/// The memory one rank holds for the layer at its peak (the backward of one pending forward), bytes: every buffer the
/// layer allocates for the configuration (its workspaces, scratch and pooled buffers are kept and reused), as
/// unit_tests/model/test_memory_model.cpp checks against the peak Kokkos bytes of the real layer.
struct MemoryEstimate {
  double weights = 0;      ///< the parameters (every rank holds them all)
  double gradients = 0;    ///< their gradients (float for a bf16 layer)
  double activations = 0;  ///< the forward workspace backward reads (saved q, k, v, o, lse, latent, ...)
  double scratch = 0;      ///< per-call scratch, the ring's buffers, the attention core's tiles, bf16's GEMM workspace
  double inputs = 0;       ///< x, dy, y and dx of the rank's tokens
  /// The Ulysses collectives' buffers: the pool's packed send and receive buffers, the bf16 wire's copies and the
  /// output projection's exchange.
  double communication = 0;
  /// The previous step's y, dx and weight gradients, which a training loop that assigns each step's over the last
  /// (mlacp-mla-block's) still holds while the next step runs.
  double held = 0;
  double total() const { return weights + gradients + activations + scratch + inputs + communication + held; }
};

/// One simulated step of the critical rank's schedule.
struct ScheduleEvent {
  enum class Kind { compute, collective, wait };
  std::string name;  ///< the library's event names (mla/names.hpp) where they exist
  Kind kind = Kind::compute;
  bool backward = false;
  double start_s = 0, end_s = 0;  ///< from the start of the forward
};

/// What the model predicts for one choice.
struct Prediction {
  Choice choice;
  double forward_s = 0, backward_s = 0;
  double compute_s = 0;        ///< compute of the critical rank (forward + backward)
  double communication_s = 0;  ///< the collectives' modelled times, summed
  double exposed_s = 0;        ///< time the compute stream waited for a collective
  /// 1 - exposed / communication (1 with no communication).
  double hidden_fraction = 1;
  LevelBytes bytes;
  MemoryEstimate memory;
  std::vector<ScheduleEvent> events;
  double total_s() const { return forward_s + backward_s; }
};

/// Why `choice` cannot run `config` on `cluster` ("" when it can): U x C must be the cluster's ranks, and a group must
/// sit inside a node or span whole nodes (U divides G or G divides U) for the model's placement.
std::string choice_error(const MlaConfig& config, const Choice& choice, const Cluster& cluster);

/// The attention work of each ring step: per step t, the most visible (query, key) pairs of any rank's chunk g
/// against chunk (g - t) mod C (the ranks wait for each other at every exchange); on a flat mesh (C = 1) one entry,
/// the whole sequence's. Causal within each document of config.cu_seqlens.
std::vector<double> ring_step_pairs(const MlaConfig& config, const Choice& choice);

/// The memory of `choice` per rank (no machine needed). A bf16 layer is priced on the path it computes with
/// (MlaConfig::bf16_compute, or MLACP_BF16_COMPUTE where that says auto and is set): its bf16 schedule; the float
/// layer inside, the widened weights and the float edges (float); or both at once (auto: the first forward times both
/// paths and frees the slower one's memory only then).
MemoryEstimate predict_memory(const MlaConfig& config, Dtype dtype, const Choice& choice, const Cluster& cluster);

/// The model's prediction; throws InvalidArgument with choice_error's message when the choice cannot run.
/// config.q_lora_rank > 0 models the low-rank query projection (w_qa [Rq, D], RMSNorm, w_qb [H*dqk, Rq]) in place of
/// w_q, as the layer runs it.
Prediction predict(const MlaConfig& config, Dtype dtype, const Choice& choice, const Cluster& cluster,
                   const MachineParams& machine);

/// The collectives' launches and waits ("launch <name>", "wait <name>", names.hpp) of one rank's forward (or
/// backward) in the order the model walks the layer's timeline (mla/detail/timeline.hpp) for it: a rank of a Ulysses
/// group of `group` ranks on a ring of `ring` chunks whose position holds heads (or not), for a pass with `flags`
/// (config.strategy and config.overlap as they are). predict() costs this walk for the critical rank; the layer runs
/// it (unit_tests/mla/detail/test_timeline_drift.cpp compares the two, rank by rank).
std::vector<std::string> collective_order(const MlaConfig& config, int group, int ring, bool heads,
                                          const MlaRequiresGrad& flags, bool backward);

}  // namespace mlacp::model
