// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/model/collective_cost.hpp>

#include <algorithm>

namespace mlacp::model {

Placement ulysses_placement(const Cluster& cluster, int ulysses) {
  Placement p;
  p.n = ulysses;
  p.G = cluster.ranks_per_node;
  p.per_node = std::min(ulysses, cluster.ranks_per_node);
  return p;
}

Placement ring_placement(const Cluster& cluster, int ulysses, int ring) {
  Placement p;
  p.n = ring;
  p.G = cluster.ranks_per_node;
  // Ring members are U ranks apart: G / U of them share a node when U < G, one per node otherwise.
  p.per_node = ulysses < cluster.ranks_per_node ? std::min(ring, cluster.ranks_per_node / ulysses) : 1;
  // A ring that spans nodes leaves each node once per ring represented on it: min(U, G) hops per node and step.
  p.leaving = p.per_node < ring ? std::min(ulysses, cluster.ranks_per_node) : 0;
  return p;
}

CollectiveCost all_to_all(const MachineParams& machine, const Placement& g, double bytes) {
  CollectiveCost c;
  if (g.n <= 1 || bytes <= 0) return c;
  const double n = g.n, in = g.per_node;
  c.intra_bytes = bytes * (in - 1) / n;
  c.inter_bytes = bytes * (n - in) / n;
  const double intra = in > 1 ? machine.intra.time(c.intra_bytes, in - 1) : 0;
  const double inter = n > in ? machine.inter.time(g.G * c.inter_bytes, n - in) : 0;
  c.seconds = std::max(intra, inter);
  return c;
}

CollectiveCost all_gather(const MachineParams& machine, const Placement& group, double gathered_bytes) {
  return all_to_all(machine, group, gathered_bytes);
}

CollectiveCost reduce_scatter(const MachineParams& machine, const Placement& group, double input_bytes) {
  return all_to_all(machine, group, input_bytes);
}

double reduce_scatter_sum_bytes(const Placement& group, double input_bytes) {
  // n blocks of m/n read and one written.
  return group.n > 1 ? input_bytes + input_bytes / group.n : 0;
}

CollectiveCost send_recv(const MachineParams& machine, const Placement& ring, double bytes) {
  CollectiveCost c;
  if (ring.n <= 1 || bytes <= 0) return c;
  // Every rank waits for the slowest hop of the step: one that leaves the node when the ring spans nodes.
  if (ring.leaving > 0) {
    // Per rank: the fraction of its hops that leave the node (1 in per_node) on average, the step's time that of a
    // leaving hop.
    c.inter_bytes = bytes / ring.per_node;
    c.intra_bytes = bytes - c.inter_bytes;
    c.seconds = std::max(machine.inter.time(ring.leaving * bytes), ring.per_node > 1 ? machine.intra.time(bytes) : 0);
  } else {
    c.intra_bytes = bytes;
    c.seconds = machine.intra.time(bytes);
  }
  return c;
}

}  // namespace mlacp::model
