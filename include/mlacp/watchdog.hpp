// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The wait watchdog: a wait that does not complete in time reports which collective it was and aborts the
// communicator, instead of hanging forever (a rank that never entered the collective, a rank that died half-way).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace mlacp {

/// The watchdog's default: 1800 s, PyTorch's documented default timeout of its process groups (30 minutes). It is the
/// backstop for what the failure channel (Mesh::report_failure) cannot see: a rank that died, hangs, or never entered
/// a collective. Generous, so that no healthy wait (a slow first iteration, a straggler behind a checkpoint write, a
/// large model's long compute between a launch and its wait) ever trips it, and short enough that a lost job ends
/// within the hour instead of holding its nodes until the scheduler's limit.
inline constexpr double default_wait_timeout_s = 1800.0;

/// Seconds a wait() (or the completion of an abandoned handle) may take before the watchdog fires; 0 = off. On by
/// default (default_wait_timeout_s); the environment variable MLACP_WAIT_TIMEOUT_S sets the initial value
/// (MLACP_WAIT_TIMEOUT_S=0 turns it off), set_wait_timeout overrides it. With it on or off, MPI waits poll, and every
/// poll also looks at the mesh's failure channel.
double wait_timeout();
void set_wait_timeout(double seconds);

/// What the watchdog reports about a collective.
struct CollectiveInfo {
  std::string name;        ///< e.g. "dQ a2a"
  std::string operation;   ///< e.g. "mlacp::launch_all_to_all(gather_dim=2, scatter_dim=1)"
  std::string shape;       ///< the input View's shape, e.g. "[2, 64, 4, 12]"
  std::int64_t bytes = 0;  ///< bytes this rank sends
  std::chrono::steady_clock::time_point launched = std::chrono::steady_clock::now();
};

namespace detail {
/// The report printed when the watchdog fires: the collective, how long ago it was launched, and the last things
/// this rank did (mlacp's recent events).
std::string watchdog_report(const CollectiveInfo& info, int rank, int size, double waited_s);

/// The watched wait of every backend: calls `poll` (true once the operation completed; it may throw, and the
/// exception propagates) until it returns true, sleeping briefly between calls. Past `timeout_s` seconds (never when
/// it is 0) it calls `expire(waited_s)`, which must not return normally (the backends print watchdog_report and abort;
/// tests throw).
void watch(const std::function<bool()>& poll, double timeout_s, const std::function<void(double waited_s)>& expire);
}  // namespace detail

}  // namespace mlacp
