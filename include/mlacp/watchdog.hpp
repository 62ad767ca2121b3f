// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The wait watchdog: a wait that does not complete in time reports which collective it was and aborts the
// communicator, instead of hanging forever (a rank that never entered the collective, a rank that died half-way).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace mlacp {

/// Seconds a wait() (or the completion of an abandoned handle) may take before the watchdog fires; 0 = off (the
/// default). The environment variable MLACP_WAIT_TIMEOUT_S sets the initial value.
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
/// exception propagates) until it returns true, sleeping briefly between calls. Past `timeout_s` seconds it calls
/// `expire(waited_s)`, which must not return normally (the backends print watchdog_report and abort; tests throw).
void watch(const std::function<bool()>& poll, double timeout_s, const std::function<void(double waited_s)>& expire);
}  // namespace detail

}  // namespace mlacp
