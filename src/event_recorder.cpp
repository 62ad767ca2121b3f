// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/event_recorder.hpp>
#include <mlacp/watchdog.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>

namespace mlacp {

const char* to_string(EventKind kind) noexcept {
  switch (kind) {
    case EventKind::launch:
      return "launch";
    case EventKind::wait_begin:
      return "wait_begin";
    case EventKind::wait_end:
      return "wait_end";
    case EventKind::compute_begin:
      return "compute_begin";
    case EventKind::compute_end:
      return "compute_end";
  }
  return "unknown";
}

namespace events {
namespace {

constexpr std::size_t recent_capacity = 64;

// What record() does, in one word so that "nothing" costs one relaxed load: bit 0 records the list (enable), bit 1
// keeps the recent launches and waits for the watchdog's report (on while a wait timeout is set).
constexpr unsigned recording = 1u;
constexpr unsigned keeping_recent = 2u;

struct Recorder {
  std::atomic<unsigned> mode{wait_timeout() > 0 ? keeping_recent : 0u};
  std::mutex mutex;
  std::vector<Event> list;
  std::vector<RecentEvent> ring = std::vector<RecentEvent>(recent_capacity);
  std::size_t ring_next = 0;
  std::size_t ring_size = 0;
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
};

Recorder& recorder() {
  static Recorder instance;
  return instance;
}

}  // namespace

void enable(bool on) noexcept {
  if (on)
    recorder().mode.fetch_or(recording, std::memory_order_relaxed);
  else
    recorder().mode.fetch_and(~recording, std::memory_order_relaxed);
}

bool enabled() noexcept { return (recorder().mode.load(std::memory_order_relaxed) & recording) != 0; }

namespace detail {
void keep_recent(bool on) noexcept {
  if (on)
    recorder().mode.fetch_or(keeping_recent, std::memory_order_relaxed);
  else
    recorder().mode.fetch_and(~keeping_recent, std::memory_order_relaxed);
}
}  // namespace detail

void clear() {
  auto& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.list.clear();
  r.ring_next = 0;
  r.ring_size = 0;
  r.origin = std::chrono::steady_clock::now();
}

std::vector<Event> snapshot() {
  auto& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.list;
}

void record(EventKind kind, const std::string& name) {
  auto& r = recorder();
  const unsigned mode = r.mode.load(std::memory_order_relaxed);
  if (mode == 0) return;
  const bool on = (mode & recording) != 0;
  const bool collective = kind == EventKind::launch || kind == EventKind::wait_begin || kind == EventKind::wait_end;
  const bool keep = (mode & keeping_recent) != 0 && (collective || on);
  if (!on && !keep) return;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (keep) {
    r.ring[r.ring_next] = RecentEvent{kind, name, now};
    r.ring_next = (r.ring_next + 1) % recent_capacity;
    r.ring_size = std::min(r.ring_size + 1, recent_capacity);
  }
  if (on) r.list.push_back(Event{kind, name, std::chrono::duration<double>(now - r.origin).count()});
}

std::vector<RecentEvent> recent() {
  auto& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<RecentEvent> out;
  for (std::size_t i = 0; i < r.ring_size; ++i)
    out.push_back(r.ring[(r.ring_next + recent_capacity - r.ring_size + i) % recent_capacity]);
  return out;
}

std::ptrdiff_t find(const std::vector<Event>& list, EventKind kind, const std::string& name) {
  for (std::size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == kind && list[i].name == name) return static_cast<std::ptrdiff_t>(i);
  return -1;
}

}  // namespace events
}  // namespace mlacp
