// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Records, per process (= per rank), the order and time of the events that make up a schedule: the launch and wait
// of each collective and the begin and end of each GEMM. Off by default; when off (and the watchdog is off), recording
// costs one relaxed atomic load: no lock, no clock, no copy of the name. The perf tests draw it as a timeline; the
// unit tests assert on the order.
//
// The events can also be written as a Chrome trace-event JSON file (chrome_trace / write_chrome_trace), which
// Perfetto (ui.perfetto.dev) and chrome://tracing open: one process per rank, one track ("thread") for compute and
// one per collective in flight. MLACP_TRACE=FILE turns recording on in any program that uses mlacp and writes each
// process's events to FILE with its rank inserted (trace.json -> trace.rank0.json, trace.rank1.json, ...) when the
// process exits; scripts/merge_traces.py joins the ranks' files into one.
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
  /// The same instant as steady-clock nanoseconds since the clock's epoch: not reset by clear(), and on Linux the
  /// same clock in every process of one machine (the time axis of the Chrome trace).
  std::int64_t clock_ns;
  /// The recording thread's CPU time at that instant, in seconds (CLOCK_THREAD_CPUTIME_ID): the CPU a phase used,
  /// which an oversubscribed or shared machine does not inflate as it does wall time (the ring's balance report).
  double thread_cpu_s = 0;
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

// ---- Chrome trace-event JSON ----------------------------------------------------------------------------------------

/// `list` (one process's events, in recorded order) as a Chrome trace-event JSON document ({"traceEvents": [...]}):
/// process `rank` ("rank N"), thread 0 "compute" with one complete ("X") slice per compute phase (nested phases nest),
/// threads 1, 2, ... "collective in flight #k" with one slice per collective from its launch to the end of its wait
/// and inside it a "wait <name>" slice for the time blocked in wait(); a collective never waited in `list` (mesh
/// agreements, which record only their launch) is an instant ("i") on the compute track, a phase or collective still
/// open at the end a "B" event without its "E". Times are microseconds of the steady clock (Event::clock_ns), so
/// the files of ranks on one machine line up; "otherData" holds the host and the offset to Unix time for others.
std::string chrome_trace(const std::vector<Event>& list, int rank);

/// `path` with ".rank<rank>" inserted before its extension: "out/trace.json" -> "out/trace.rank3.json",
/// "trace" -> "trace.rank3".
std::string rank_path(const std::string& path, int rank);

/// Writes chrome_trace(list, rank) to rank_path(path, rank). Throws mlacp::Error naming the file when it cannot be
/// written.
void write_chrome_trace(const std::string& path, const std::vector<Event>& list, int rank);

/// The rank this process writes its MLACP_TRACE file as: its rank in MPI_COMM_WORLD, told by the first Mesh
/// constructed; before that the launcher's rank variable (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID)
/// or 0.
int trace_rank() noexcept;

/// The file MLACP_TRACE names ("" when unset). When set (read at the recorder's first use, at the latest when the
/// first Mesh is constructed), recording is on from the start, and at process exit (std::atexit: after main returns
/// or exit() is called, when neither Kokkos nor MPI needs to be alive) the events recorded since the last clear()
/// are written to rank_path(trace_file(), trace_rank()). A process that aborts (MPI_Abort, the watchdog) writes
/// nothing. A program that turns recording off or clears the recorder keeps that control.
std::string trace_file();

namespace detail {
/// The process's rank in MPI_COMM_WORLD (Mesh's constructor calls it; the first call wins).
void set_trace_rank(int world_rank) noexcept;
}  // namespace detail

}  // namespace events
}  // namespace mlacp
