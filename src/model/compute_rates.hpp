// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Calibration's compute measurements (Kokkos, Kokkos Kernels, the bf16 GEMM plan, the attention core), no MPI: the
// MPI part (src/mpi/calibrate.cpp) calls them on every rank at once and reduces what they return. `sync` is called
// before every timed run (and warm-up), so that all ranks start each run together (a barrier there); a timed run
// repeats the measured call for at least `min_run_s` seconds, so that the ranks' runs overlap (the loaded rate).
#pragma once

#include <mlacp/model/machine.hpp>

#include <functional>
#include <string>
#include <vector>

namespace mlacp::model::detail {

struct GemmShape {
  int m = 0, n = 0, k = 0;
  /// 3 / (1/m + 1/n + 1/k), the curve's key.
  double effective_size() const;
};

/// Squares n = 32 ... 512 (quick: ... 128).
std::vector<GemmShape> calibration_squares(bool quick);
/// Skinny shapes of the layer's kind (quick: smaller ones).
std::vector<GemmShape> calibration_skinny(bool quick);

/// This rank's median seconds of an m x n x k GEMM (C = A B, row-major) in `dtype` over `repeats` runs after a warm-up.
double time_gemm(Dtype dtype, const GemmShape& shape, int repeats, double min_run_s, const std::function<void()>& sync);

/// The attention problem: B = 1, h = 2, S = 512 (quick: 64), dn = 64, dr = 32, dv = 64, causal.
struct AttentionProblem {
  int batch = 1, heads = 2, seq = 512, nope = 64, rope = 32, vdim = 64;
  /// flop_count.hpp's counts: 2E(dqk + dv) and 2E(3dqk + 2dv), E = B h S (S + 1) / 2.
  double forward_flops() const;
  double backward_flops() const;
};
AttentionProblem attention_problem(bool quick);
/// The problem at other head widths, for the rate per width (MachineParams::attention_by_width): dqk + dv = 64 (dn 16,
/// dr 16, dv 32: a small layer's heads), 160 (attention_problem's) and 320 (DeepSeek's dn 128, dr 64, dv 128), by
/// width.
std::vector<AttentionProblem> attention_width_problems(bool quick);

struct AttentionTimes {
  double forward_s = 0;
  double backward_s = 0;
};
/// This rank's median seconds of FlashAttentionCore's forward and backward on `problem` in `dtype`.
AttentionTimes time_attention(Dtype dtype, const AttentionProblem& problem, int repeats, double min_run_s,
                              const std::function<void()>& sync);

/// A float GEMM of `shape` run `calls` times back to back, `between()` called after each (the overlap measurement
/// polls a collective there); returns the seconds (fenced). The buffers live as long as the object.
class GemmLoop {
 public:
  explicit GemmLoop(const GemmShape& shape);
  ~GemmLoop();
  GemmLoop(const GemmLoop&) = delete;
  GemmLoop& operator=(const GemmLoop&) = delete;
  double run(int calls, const std::function<void()>& between) const;

 private:
  struct Buffers;
  Buffers* buffers_;
};

/// The element-wise measurement (MachineParams::elementwise_bandwidth): the layer's RMSNorm forward and backward over
/// [1, tokens, 512] values of `dtype` (tokens 1024; quick: 128). Returns the bytes the model counts for them (the
/// forward reads x and writes y, the backward reads x and dy and writes dx: 5 passes over the values) and this rank's
/// median seconds.
struct ElementwiseTime {
  double bytes = 0, seconds = 0;
};
ElementwiseTime time_elementwise(Dtype dtype, bool quick, int repeats, double min_run_s,
                                 const std::function<void()>& sync);

/// Bytes copied by the bandwidth measurement: 64 MiB (quick: 4 MiB).
double copy_bytes(bool quick);
/// This rank's median seconds of a Kokkos parallel_for copy of `bytes` (doubles) into another buffer.
double time_copy(double bytes, int repeats, double min_run_s, const std::function<void()>& sync);

/// The CPU's model name from /proc/cpuinfo ("unknown CPU" where there is none).
std::string cpu_model();

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values);

}  // namespace mlacp::model::detail
