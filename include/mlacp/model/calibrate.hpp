// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Calibration: measures the machine the ranks of a communicator run on and returns it as MachineParams (machine.hpp),
// as `mlacp-plan --calibrate` does.
//
// What is measured (every rate with all ranks of the communicator busy at once, after a barrier, since ranks that
// share cores run at the loaded rate, which is what the layer sees):
// - nodes: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); G ranks per node, the same on every node.
// - intra level (G >= 2): alpha from an 8-byte ping-pong between local ranks 0 and 1 of every node (half the round
//   trip), beta from MPI_Alltoall among each node's ranks of 1 MiB per rank: t = (n-1) alpha + (n-1)/n m beta, solved
//   for beta with the measured alpha. Medians over the repeats of the slowest rank of each repeat.
// - inter level (two nodes or more): alpha from a ping-pong between rank 0 of node 0 and rank 0 of node 1, beta from
//   an all-to-all among the ranks of each local rank (one per node; all G of them at once, so a node's link carries G
//   ranks' bytes): t = (n-1) alpha + G (n-1)/n m beta; and a plain cross-node ping-pong bandwidth for the report.
// - GEMM rate per dtype: squares and skinny shapes of the layer's kind (compat::gemm for double and float, the bf16
//   GEMM plan into a float C for bf16), the median of the repeats after a warm-up, averaged over the ranks; the curve
//   holds (harmonic-mean size, rate) points sorted by size.
// - attention core rate per dtype: FlashAttentionCore forward and backward on a causal problem, FLOPs as
//   mla/flop_count.hpp counts them.
// - memory bandwidth: a Kokkos copy, (read + written bytes) / time, averaged over the ranks.
// MPI is called in src/mpi/calibrate.cpp only; the compute measurements are in src/model/compute_rates.cpp.
#pragma once

#include <mlacp/model/machine.hpp>

#include <mpi.h>

#include <string>
#include <vector>

namespace mlacp::model {

struct CalibrationOptions {
  std::vector<Dtype> dtypes{Dtype::float64, Dtype::float32, Dtype::bfloat16};
  int repeats = 5;     ///< timed runs per measurement (the median is kept); at least 1
  bool quick = false;  ///< tiny sizes (tests): a fraction of a second instead of seconds
  /// 0: nodes are the ranks that share memory (MPI_COMM_TYPE_SHARED). Otherwise nodes of this many consecutive ranks,
  /// whatever the hardware (the last node holds the rest): a test on one machine exercises the inter-node level with
  /// it.
  int ranks_per_node = 0;
};

/// How well the GEMM curve predicts a shape it was not told about: the curve of every other measured shape (the
/// stored curve without this shape's point) read at this shape, against its measured time.
struct GemmFit {
  Dtype dtype = Dtype::float64;
  int m = 0, n = 0, k = 0;
  double measured_s = 0;   ///< median time, averaged over the ranks
  double predicted_s = 0;  ///< 2mnk at the rate of the curve without this point
  /// (predicted - measured) / measured.
  double relative_error() const { return measured_s > 0 ? (predicted_s - measured_s) / measured_s : 0.0; }
};

/// A calibration's parameters and what the command line prints beside them.
struct CalibrationReport {
  MachineParams machine;
  /// The skinny shapes (the layer's kind), one per dtype and shape.
  std::vector<GemmFit> gemm_fit;
  double inter_pingpong_bytes = 0;      ///< message size of the cross-node ping-pong (0: one node)
  double inter_pingpong_bandwidth = 0;  ///< its bytes per second (m / half round trip)
  /// The overlap measurement (MachineParams::overlap_efficiency): a GEMM loop alone, an all-to-all over all ranks
  /// alone, and the two together (the all-to-all polled between the GEMMs), seconds, max over ranks; 0 at one rank.
  double overlap_alone_s = 0, overlap_collective_s = 0, overlap_both_s = 0;
  int nodes = 1;
  double seconds = 0;  ///< wall time of the calibration
};

/// Collective over comm (every rank calls it; all return the same parameters): measures this machine. Throws
/// InvalidArgument on every rank when the nodes hold different numbers of ranks (naming the counts) or an option is
/// out of range.
MachineParams calibrate(MPI_Comm comm, const CalibrationOptions& options = {});
/// calibrate, with the GEMM fit and the cross-node bandwidth (every rank returns the same report).
CalibrationReport calibrate_report(MPI_Comm comm, const CalibrationOptions& options = {});

/// The report as text for a terminal: the machine's figures, the GEMM fit per skinny shape, the time taken.
std::string format_report(const CalibrationReport& report);

}  // namespace mlacp::model
