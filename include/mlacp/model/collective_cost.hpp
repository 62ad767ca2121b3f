// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The alpha-beta cost of each collective the layer runs, per network level (MachineParams::intra, ::inter). A group
// of n ranks holds `per_node` of them on each node it spans; the node's other ranks run the same collective in their
// own groups at the same time, so a node's link carries the bytes of all G ranks of the node. With m the bytes a rank
// hands to the collective:
//
//   all-to-all (m = the rank's whole send buffer):
//     intra = (per_node - 1) alpha_i + m (per_node - 1)/n beta_i
//     inter = (n - per_node) alpha_e + G m (n - per_node)/n beta_e
//     time  = max(intra, inter)          (every peer's message is posted at once; the levels run side by side)
//   all-gather (m = the gathered result): as the all-to-all of m (each rank sends its m/n to every peer)
//   reduce-scatter (m = the rank's input): mlacp's pairwise reduce-scatter is the all-to-all of m, then the sum of
//     the n blocks of m/n at the wait (reduce_scatter_sum_bytes, at the memory bandwidth)
//   ring step (m = one chunk): alpha + m beta on the level the hop crosses; a hop that leaves the node shares its
//     link with the hops of the node's other rings (min(U, G) of them leave each node per step)
#pragma once

#include <mlacp/model/layer_model.hpp>
#include <mlacp/model/machine.hpp>

namespace mlacp::model {

/// Where a group's ranks sit: n ranks, per_node of them on each node it spans (n when it sits inside one node), on
/// nodes of G ranks; `leaving`: ring steps only, the hops that leave a node per step (0: none crosses).
struct Placement {
  int n = 1;
  int per_node = 1;
  int G = 1;
  int leaving = 0;
};

/// The seconds of one collective and the bytes one rank sends on each level.
struct CollectiveCost {
  double seconds = 0;
  double intra_bytes = 0;
  double inter_bytes = 0;
};

/// The Ulysses group of U consecutive ranks on `cluster`.
Placement ulysses_placement(const Cluster& cluster, int ulysses);
/// A ring of C ranks (one per Ulysses group, stride U) on `cluster`.
Placement ring_placement(const Cluster& cluster, int ulysses, int ring);

CollectiveCost all_to_all(const MachineParams& machine, const Placement& group, double bytes);
CollectiveCost all_gather(const MachineParams& machine, const Placement& group, double gathered_bytes);
CollectiveCost reduce_scatter(const MachineParams& machine, const Placement& group, double input_bytes);
/// Bytes the pairwise reduce-scatter's sum reads and writes at its wait.
double reduce_scatter_sum_bytes(const Placement& group, double input_bytes);
/// One ring step: this rank sends `bytes` to the next rank of the ring and receives as many from the previous.
CollectiveCost send_recv(const MachineParams& machine, const Placement& ring, double bytes);

}  // namespace mlacp::model
