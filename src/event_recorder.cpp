// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/event_recorder.hpp>
#include <mlacp/watchdog.hpp>

#include <mlacp/error.hpp>
#include <mlacp/settings.hpp>

#include <nlohmann/json.hpp>

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

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
// keeps the recent launches and waits for the watchdog's report (on while a wait timeout is set). MLACP_TRACE sets bit
// 0 from the start.
constexpr unsigned recording = 1u;
constexpr unsigned keeping_recent = 2u;

std::int64_t nanoseconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::string trace_file_from_environment() { return Settings::from_environment().trace(); }

struct Recorder {
  std::string trace_path = trace_file_from_environment();
  std::atomic<unsigned> mode{(wait_timeout() > 0 ? keeping_recent : 0u) | (trace_path.empty() ? 0u : recording)};
  std::atomic<int> rank{-1};  // set by the first Mesh; -1: not told
  std::mutex mutex;
  std::vector<Event> list;
  std::vector<RecentEvent> ring = std::vector<RecentEvent>(recent_capacity);
  std::size_t ring_next = 0;
  std::size_t ring_size = 0;
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
};

void write_trace_at_exit();

// Never destroyed, so that the MLACP_TRACE writer registered with std::atexit (after the recorder is complete) and
// anything recorded from other static destructors still find it.
Recorder& make_recorder() {
  auto* r = new Recorder();
  if (!r->trace_path.empty()) std::atexit(write_trace_at_exit);
  return *r;
}

Recorder& recorder() {
  static Recorder& instance = make_recorder();
  return instance;
}

void write_trace_at_exit() {
  try {
    write_chrome_trace(recorder().trace_path, snapshot(), trace_rank());
  } catch (const std::exception& e) {
    std::cerr << "mlacp: MLACP_TRACE: " << e.what() << "\n";
  }
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
  if (on) {
    timespec cpu{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
    r.list.push_back(Event{kind, name, std::chrono::duration<double>(now - r.origin).count(), nanoseconds(now),
                           static_cast<double>(cpu.tv_sec) + 1e-9 * static_cast<double>(cpu.tv_nsec)});
  }
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

// ---- Chrome trace-event JSON ---------------------------------------------------------------------------------------

namespace {

// A JSON string literal of `text`, escaped by nlohmann/json (bytes that are not UTF-8 become U+FFFD). The rest of
// the document is written here: one event per line, and times as exact decimal microseconds, which a double (what
// the library would write) cannot hold for a clock read in nanoseconds.
std::string quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Nanoseconds as microseconds with three decimals, exact: 1234567 -> "1234.567".
std::string microseconds(std::int64_t ns) {
  const std::uint64_t magnitude = ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  char text[32];
  std::snprintf(text, sizeof text, "%s%llu.%03llu", ns < 0 ? "-" : "",
                static_cast<unsigned long long>(magnitude / 1000), static_cast<unsigned long long>(magnitude % 1000));
  return text;
}

// One trace event before it is written: a complete slice ('X'), a slice still open at the end ('B') or an instant.
struct TraceSlice {
  char phase;
  const char* category;  // compute, collective, wait, launch (an instant), compute_end (an instant)
  std::string name;
  std::int64_t begin_ns;
  std::int64_t end_ns;  // == begin_ns unless phase 'X'
  int track;            // 0: compute; k >= 1: collective in flight #k
  std::string args;     // the body of the "args" object, or ""
};

// A collective from its launch (or, when the launch is not in the record, its wait) to the end of its wait.
struct Flight {
  std::string name;
  bool launched = false;
  std::int64_t launch_ns = 0;
  bool waiting = false;
  std::int64_t wait_begin_ns = 0;
  bool ended = false;
  std::int64_t end_ns = 0;
  std::int64_t start_ns() const { return launched ? launch_ns : wait_begin_ns; }
};

std::vector<TraceSlice> trace_slices(const std::vector<Event>& list) {
  std::vector<TraceSlice> slices;
  std::vector<std::size_t> open_phases;  // indices into `list` of compute phases begun and not ended (a stack)
  std::map<std::string, std::deque<Flight>> in_flight;  // by name, in launch order
  std::vector<Flight> flights;                          // ended or still open at the end, in order of their start
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Event& e = list[i];
    switch (e.kind) {
      case EventKind::compute_begin:
        open_phases.push_back(i);
        break;
      case EventKind::compute_end: {
        auto it = std::find_if(open_phases.rbegin(), open_phases.rend(),
                               [&](std::size_t begin) { return list[begin].name == e.name; });
        if (it == open_phases.rend()) {
          slices.push_back({'i', "compute_end", e.name, e.clock_ns, e.clock_ns, 0, ""});  // begun before the record
        } else {
          slices.push_back({'X', "compute", e.name, list[*it].clock_ns, e.clock_ns, 0, ""});
          open_phases.erase(std::next(it).base());
        }
        break;
      }
      case EventKind::launch: {
        Flight f;
        f.name = e.name;
        f.launched = true;
        f.launch_ns = e.clock_ns;
        in_flight[e.name].push_back(f);
        break;
      }
      case EventKind::wait_begin: {
        auto& queue = in_flight[e.name];
        auto it = std::find_if(queue.begin(), queue.end(), [](const Flight& f) { return !f.waiting; });
        if (it == queue.end()) {
          Flight f;  // launched before the record began
          f.name = e.name;
          it = queue.insert(queue.end(), f);
        }
        it->waiting = true;
        it->wait_begin_ns = e.clock_ns;
        break;
      }
      case EventKind::wait_end: {
        auto& queue = in_flight[e.name];
        auto it = std::find_if(queue.begin(), queue.end(), [](const Flight& f) { return f.waiting; });
        Flight f;
        if (it != queue.end()) {
          f = *it;
          queue.erase(it);
        } else {
          f.name = e.name;
          f.waiting = true;
          f.wait_begin_ns = e.clock_ns;
        }
        f.ended = true;
        f.end_ns = e.clock_ns;
        flights.push_back(f);
        break;
      }
    }
  }
  for (const std::size_t begin : open_phases)
    slices.push_back({'B', "compute", list[begin].name, list[begin].clock_ns, list[begin].clock_ns, 0, ""});
  for (const auto& [name, queue] : in_flight)
    for (const Flight& f : queue) {
      if (f.waiting)
        flights.push_back(f);  // waited, not yet complete: an open slice
      else
        slices.push_back({'i', "launch", name, f.launch_ns, f.launch_ns, 0, ""});  // launched and never waited here
    }
  // Tracks: each collective on the lowest-numbered track free at its start, so that slices on one track never overlap.
  std::stable_sort(flights.begin(), flights.end(),
                   [](const Flight& a, const Flight& b) { return a.start_ns() < b.start_ns(); });
  std::vector<std::int64_t> track_free_at;  // per collective track: when its last slice ends (open: never)
  for (const Flight& f : flights) {
    std::size_t slot = 0;
    while (slot < track_free_at.size() && track_free_at[slot] > f.start_ns()) ++slot;
    if (slot == track_free_at.size()) track_free_at.push_back(0);
    track_free_at[slot] = f.ended ? f.end_ns : std::numeric_limits<std::int64_t>::max();
    const int track = static_cast<int>(slot) + 1;
    const char phase = f.ended ? 'X' : 'B';
    const std::int64_t end = f.ended ? f.end_ns : f.start_ns();
    std::string args = std::string("\"launched\": ") + (f.launched ? "true" : "false");
    if (f.ended) args += ", \"blocked_in_wait_us\": " + microseconds(f.end_ns - f.wait_begin_ns);
    slices.push_back({phase, "collective", f.name, f.start_ns(), end, track, args});
    if (f.waiting)
      slices.push_back(
          {phase, "wait", "wait " + f.name, f.wait_begin_ns, f.ended ? f.end_ns : f.wait_begin_ns, track, ""});
  }
  std::stable_sort(slices.begin(), slices.end(),
                   [](const TraceSlice& a, const TraceSlice& b) { return a.begin_ns < b.begin_ns; });
  return slices;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

}  // namespace

std::string chrome_trace(const std::vector<Event>& list, int rank) {
  const std::vector<TraceSlice> slices = trace_slices(list);
  int tracks = 1;
  for (const TraceSlice& s : slices) tracks = std::max(tracks, s.track + 1);
  const std::string pid = std::to_string(rank);
  std::ostringstream out;
  out << "{\"traceEvents\": [\n";
  out << "{\"ph\": \"M\", \"pid\": " << pid << ", \"name\": \"process_name\", \"args\": {\"name\": \"rank " << pid
      << "\"}},\n";
  out << "{\"ph\": \"M\", \"pid\": " << pid << ", \"name\": \"process_sort_index\", \"args\": {\"sort_index\": " << pid
      << "}}";
  for (int track = 0; track < tracks; ++track) {
    const std::string name = track == 0 ? "compute" : "collective in flight #" + std::to_string(track);
    out << ",\n{\"ph\": \"M\", \"pid\": " << pid << ", \"tid\": " << track
        << ", \"name\": \"thread_name\", \"args\": {\"name\": " << quoted(name) << "}}";
    out << ",\n{\"ph\": \"M\", \"pid\": " << pid << ", \"tid\": " << track
        << ", \"name\": \"thread_sort_index\", \"args\": {\"sort_index\": " << track << "}}";
  }
  for (const TraceSlice& s : slices) {
    out << ",\n{\"ph\": \"" << s.phase << "\", \"pid\": " << pid << ", \"tid\": " << s.track
        << ", \"cat\": " << quoted(s.category) << ", \"name\": " << quoted(s.name)
        << ", \"ts\": " << microseconds(s.begin_ns);
    if (s.phase == 'X') out << ", \"dur\": " << microseconds(s.end_ns - s.begin_ns);
    if (s.phase == 'i') out << ", \"s\": \"t\"";
    if (!s.args.empty()) out << ", \"args\": {" << s.args << "}";
    out << "}";
  }
  const auto steady = std::chrono::steady_clock::now();
  const auto unix_now = std::chrono::system_clock::now();
  const std::int64_t unix_minus_steady_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(unix_now.time_since_epoch()).count() - nanoseconds(steady);
  out << "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"producer\": \"mlacp\", \"rank\": " << pid
      << ", \"host\": " << quoted(host_name())
      << ", \"clock\": \"steady_clock microseconds since its epoch\", \"unix_minus_steady_us\": "
      << microseconds(unix_minus_steady_ns) << "}}\n";
  return out.str();
}

std::string rank_path(const std::string& path, int rank) {
  const std::string tag = ".rank" + std::to_string(rank);
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  const bool has_extension = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  return has_extension ? path.substr(0, dot) + tag + path.substr(dot) : path + tag;
}

void write_chrome_trace(const std::string& path, const std::vector<Event>& list, int rank) {
  if (path.empty()) throw InvalidArgument("mlacp::events::write_chrome_trace: the path is empty; expected a file name");
  const std::string file = rank_path(path, rank);
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (out) out << chrome_trace(list, rank);
  if (out) out.close();
  if (!out)
    throw Error("mlacp::events::write_chrome_trace: cannot write '" + file + "' (" + std::strerror(errno) +
                "); expected a writable file in an existing directory");
}

int trace_rank() noexcept {
  const int told = recorder().rank.load(std::memory_order_relaxed);
  if (told >= 0) return told;
  for (const char* variable : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* value = std::getenv(variable)) {
      char* end = nullptr;
      const long rank = std::strtol(value, &end, 10);
      if (end != value && *end == '\0' && rank >= 0 && rank <= std::numeric_limits<int>::max())
        return static_cast<int>(rank);
    }
  return 0;
}

std::string trace_file() { return recorder().trace_path; }

namespace detail {
void set_trace_rank(int world_rank) noexcept {
  int unset = -1;
  recorder().rank.compare_exchange_strong(unset, world_rank, std::memory_order_relaxed);
}
}  // namespace detail

}  // namespace events
}  // namespace mlacp
