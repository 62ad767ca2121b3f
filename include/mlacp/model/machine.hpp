// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// A machine as the performance model (layer_model.hpp) sees it: an alpha-beta cost per network level, the GEMM rate
// by size and dtype, the attention core's rate, the memory bandwidth and the memory per rank. `mlacp-plan
// --calibrate` measures them and writes them as JSON (machine_to_json); users may also write that file by hand for a
// cluster they describe (docs/model.md, "The machine file", points to a GPU cluster's file).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mlacp::model {

/// The element type the layer runs in (the planner's --dtype).
enum class Dtype { float64, float32, bfloat16 };
/// "double", "float" or "bf16".
const char* to_string(Dtype dtype) noexcept;
/// "double", "float" or "bf16"; throws InvalidArgument naming the value otherwise.
Dtype parse_dtype(const std::string& name);
/// 8, 4 or 2.
int bytes_of(Dtype dtype) noexcept;

/// One level of the network: a message of m bytes costs alpha + m * beta seconds.
struct LinkCost {
  double alpha_s = 0;          ///< latency per message, seconds
  double beta_s_per_byte = 0;  ///< inverse bandwidth, seconds per byte
  double time(double bytes, double messages = 1) const { return messages * alpha_s + bytes * beta_s_per_byte; }
};

/// The attention core's measured rate: its counted FLOPs (mla_flops' attention_forward / attention_backward over the
/// visible score elements) per second per rank.
struct AttentionRate {
  double forward_flops = 0;
  double backward_flops = 0;
};

/// The attention core's rate at one head width dqk + dv (MachineParams::attention_by_width).
struct AttentionWidthRate {
  double width = 0;
  double forward_flops = 0;
  double backward_flops = 0;
};

/// What the model knows of a machine. Rates are per rank, measured with every rank of a node busy at once (so a node
/// whose ranks share cores shows it).
struct MachineParams {
  std::string name;        ///< e.g. "calibrated: 2 x 2 ranks on AMD EPYC 9R14 (netns testbed, 2gbit)"
  std::string source;      ///< where the figures come from (a calibration run, a datasheet)
  int ranks_per_node = 1;  ///< G of the calibration (a plan's --ranks-per-node is what the plan uses)
  /// Between two ranks of one node (shared memory, NVLink), per rank.
  LinkCost intra;
  /// Between nodes: alpha per message, beta per byte through one node's link, which the node's ranks share (the
  /// model sums their bytes).
  LinkCost inter;
  /// GEMM rate per rank by dtype ("double", "float", "bf16"): points (n, FLOP/s), n increasing, where n is a GEMM's
  /// effective size, the harmonic mean 3 / (1/m + 1/n + 1/k) of its dimensions (a skinny product runs at the rate of
  /// its small side); a GEMM reads the curve at its effective size, log-linearly between points, clamped at the ends.
  std::map<std::string, std::vector<std::pair<double, double>>> gemm;
  /// The attention core's rate per rank by dtype.
  std::map<std::string, AttentionRate> attention;
  /// The same by head width (optional, per dtype; JSON: the attention entry's "by_width": [[width, forward,
  /// backward], ...]): a core's rate per FLOP falls with thin heads (its tile products are thin in dqk and dv), so a
  /// calibration measures it at several widths dqk + dv, increasing; a layer reads it at its own width, log-linearly
  /// between points, clamped at the ends. A dtype without points has `attention`'s rate at every width.
  std::map<std::string, std::vector<AttentionWidthRate>> attention_by_width;
  /// Memory bandwidth per rank, bytes per second (a plain copy); 0: not modelled.
  double memory_bandwidth = 0;
  /// The layer's element-wise kernels' rate per rank by dtype (RMSNorm, RoPE, packing: they convert and compute per
  /// element, so they run below the copy bandwidth, bf16 most): the bytes they read and write per second, calibrated
  /// on the layer's RMSNorm forward and backward. A dtype without an entry uses memory_bandwidth.
  std::map<std::string, double> elementwise_bandwidth;
  /// Memory per rank, bytes (the planner's default budget when --memory-per-rank is not given); 0: unknown.
  double memory_per_rank_bytes = 0;
  /// How much of a collective's time independent compute hides: a collective in flight during compute costs that
  /// compute (1 - overlap_efficiency) of the time they overlap (the CPU's share of moving the data: copies, polling,
  /// a network stack on the same cores). 1: free (a GPU's copy engines); 0: none hidden. Calibrated as
  /// 1 - (t_both - max(t_compute, t_collective)) / min(t_compute, t_collective).
  double overlap_efficiency = 1.0;
  /// The lag of a group's slowest rank at a synchronisation after equal work (max over ranks minus the mean, median
  /// of repeats), seconds: every collective the layer waits for carries it. Ranks that share cores (or noisy
  /// neighbours) make it large; 0: ranks in lockstep.
  double sync_s = 0;

  /// The GEMM rate (FLOP/s) of an m x n x k product in `dtype`; throws InvalidArgument when the machine has no
  /// curve for it.
  double gemm_rate(Dtype dtype, double m, double n, double k) const;
  /// Seconds of an m x n x k GEMM (2 m n k FLOPs at gemm_rate).
  double gemm_time(Dtype dtype, double m, double n, double k) const;
  /// The attention rates for `dtype`; throws InvalidArgument when absent.
  const AttentionRate& attention_rate(Dtype dtype) const;
  /// The attention core's forward (backward) FLOP rate in `dtype` for heads of width dqk + dv = `width`
  /// (attention_by_width where it has points, else attention_rate); throws InvalidArgument when absent.
  double attention_forward_rate(Dtype dtype, double width) const;
  double attention_backward_rate(Dtype dtype, double width) const;
  /// Bytes per second of the element-wise kernels in `dtype` (elementwise_bandwidth, else memory_bandwidth).
  double elementwise_rate(Dtype dtype) const;
  /// Why these parameters cannot be used ("" when they can): negative or missing figures, named.
  std::string error() const;
};

/// The JSON text of `m` (the file format; keys as the members).
std::string machine_to_json(const MachineParams& m);
/// Parses the JSON text; throws InvalidArgument naming `where` (a file name), the key and what was expected.
MachineParams machine_from_json(const std::string& text, const std::string& where = "machine parameters");
/// Reads and parses a file; throws InvalidArgument naming the path when it cannot be read.
MachineParams read_machine(const std::string& path);
/// Writes machine_to_json(m) to `path`; throws Error naming the path when it cannot be written.
void write_machine(const MachineParams& m, const std::string& path);

}  // namespace mlacp::model
