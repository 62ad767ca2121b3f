// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Records, per process (= per rank), the order and time of the events that make up a schedule: the launch and wait
// of each collective and the begin and end of each GEMM. Off by default; when off (and the watchdog is off), recording
// costs one relaxed atomic load: no lock, no clock, no copy of the name. The perf tests draw it as a timeline; the
// unit tests assert on the order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mlacp {

enum class EventKind {
  launch,         ///< a collective was handed to the transport
  wait_begin,     ///< wait() was called on it
  wait_end,       ///< its result is available
  compute_begin,  ///< a GEMM or other compute phase begins (host time of the call)
  compute_end,    ///< it ends (after its instance was fenced when recording)
};

const char* to_string(EventKind kind) noexcept;

struct Event {
  EventKind kind;
  std::string name;
  double time_s;  ///< seconds since the recorder was last cleared (steady clock)
};

namespace events {

/// Turns recording on or off (process-wide).
void enable(bool on) noexcept;
bool enabled() noexcept;
/// Forgets the events recorded so far (and the recent ones) and restarts the clock.
void clear();
/// The events recorded so far, in order.
std::vector<Event> snapshot();
/// Records one event when recording is on.
void record(EventKind kind, const std::string& name);

/// One of the last events of this process, kept whether or not recording is on (for the wait watchdog's report).
struct RecentEvent {
  EventKind kind;
  std::string name;
  std::chrono::steady_clock::time_point when;
};
/// The last (up to 64) events, oldest first, kept while the watchdog is armed (wait_timeout() > 0): launches and
/// waits, and compute phases too while recording is on (their end time needs a fence).
std::vector<RecentEvent> recent();

namespace detail {
/// Keeps the recent events for the watchdog's report, or stops (set_wait_timeout calls it).
void keep_recent(bool on) noexcept;
}  // namespace detail

/// Index of the first event of `kind` named `name` in `list`, or -1.
std::ptrdiff_t find(const std::vector<Event>& list, EventKind kind, const std::string& name);

}  // namespace events
}  // namespace mlacp
