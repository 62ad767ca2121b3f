// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/model/machine.hpp>
#include <mlacp/panelled_gemm.hpp>
#include <mlacp/settings.hpp>

#include <cmath>
#include <limits>

namespace mlacp {

OverlapPolicy& overlap_policy() {
  static OverlapPolicy policy = [] {
    OverlapPolicy p;
    // A malformed value keeps the default here (a GEMM must not throw halfway through a pass); every Mesh refuses
    // it at construction, naming it.
    try {
      if (const int panels = Settings::from_environment().wgrad_panels(); panels >= 1) p.panels = panels;
    } catch (const InvalidArgument&) {
    }
    return p;
  }();
  return policy;
}

OverlapPolicy overlap_policy_for(const model::MachineParams& machine, OverlapPolicy base) {
  constexpr auto never = std::numeric_limits<std::int64_t>::max();
  const double efficiency = machine.overlap_efficiency;
  // The link between nodes where the machine describes one; else its one link (a calibration on one node, e.g. over
  // scripts/netns-link.sh's TCP, holds its figures in `intra`).
  const auto& link = machine.inter.beta_s_per_byte > 0 ? machine.inter : machine.intra;
  if (!(efficiency > 0)) {
    base.min_poll_bytes = never;
    return base;
  }
  // The model hides efficiency * link.time(bytes) of a collective in flight beside compute.
  const double needed_s = base.min_hidden_s / efficiency - link.alpha_s;
  if (needed_s <= 0) {
    base.min_poll_bytes = 0;
  } else if (!(link.beta_s_per_byte > 0)) {
    base.min_poll_bytes = never;  // a link without a per-byte cost never takes longer than its latency
  } else {
    const double bytes = std::ceil(needed_s / link.beta_s_per_byte);
    base.min_poll_bytes = bytes >= static_cast<double>(never) ? never : static_cast<std::int64_t>(bytes);
  }
  return base;
}

namespace detail {

bool worth_polling(const Mesh& mesh, std::int64_t bytes) {
  const OverlapPolicy& policy = overlap_policy();
  if (mesh.shared_memory() && !policy.poll_shared_memory) return false;
  return bytes >= policy.min_poll_bytes;
}

}  // namespace detail
}  // namespace mlacp
