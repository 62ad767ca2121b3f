// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The views of a schedule that standard tools open: the event recorder's Chrome trace-event JSON (Perfetto,
// chrome://tracing), the MLACP_TRACE switch, and what a Kokkos Tools connector sees of a collective in flight.
//
// The JSON is parsed and checked by scripts/check_trace.py (ctest runs it after this binary): with
// MLACP_TRACE_TEST_DIR set, the layer-step test writes its trace and the recorded events there. The MLACP_TRACE test
// runs in its own ctest with MLACP_TRACE set (it is skipped otherwise).
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mla/names.hpp>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Tensor3 = Kokkos::View<double***, Kokkos::LayoutRight, Mem>;
using mlacp::EventKind;

// One forward + backward of the expanded strategy (three inverse all-to-alls in flight at once).
void run_layer_step(const mlacp::Mesh& mesh) {
  const auto config =
      mlacp::test::make_config(2, 8 * mesh.size(), 16, 2 * mesh.size(), 4, 2, 3, 6, true, mlacp::MlaStrategy::expanded);
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 7), mesh);
  Tensor3 x("x", config.batch, layer.local_seq(), config.hidden);
  Tensor3 dy("dy", config.batch, layer.local_seq(), config.hidden);
  mlacp::test::fill(x, 1 + mesh.rank(), 1.0);
  mlacp::test::fill(dy, 11 + mesh.rank(), 1.0);
  auto forward = layer.forward(Space(), x);
  layer.backward(Space(), forward, dy);
  Kokkos::fence();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Trace, RankPathInsertsTheRankBeforeTheExtension) {
  EXPECT_EQ(mlacp::events::rank_path("trace.json", 0), "trace.rank0.json");
  EXPECT_EQ(mlacp::events::rank_path("out/run.1/trace.json", 12), "out/run.1/trace.rank12.json");
  EXPECT_EQ(mlacp::events::rank_path("out.d/trace", 3), "out.d/trace.rank3");
  EXPECT_EQ(mlacp::events::rank_path("out/.trace", 1), "out/.trace.rank1");
}

TEST(Trace, EmptyRecordIsAValidTraceWithTheProcessAndComputeTrack) {
  const std::string json = mlacp::events::chrome_trace({}, 5);
  EXPECT_TRUE(contains(json, "\"traceEvents\"")) << json;
  EXPECT_TRUE(contains(json, "\"args\": {\"name\": \"rank 5\"}")) << json;
  EXPECT_TRUE(contains(json, "\"args\": {\"name\": \"compute\"}")) << json;
  EXPECT_FALSE(contains(json, "collective in flight")) << json;
}

TEST(Trace, UnmatchedEventsBecomeInstantsOrOpenSlices) {
  // A compute end whose begin was cleared, a launch never waited (a mesh agreement), a phase still open, a name that
  // needs escaping.
  const std::vector<mlacp::Event> list = {{EventKind::compute_end, "cleared", 0, 1000},
                                          {EventKind::launch, "agreement", 0, 2000},
                                          {EventKind::compute_begin, "open \"phase\"", 0, 3000}};
  const std::string json = mlacp::events::chrome_trace(list, 0);
  EXPECT_TRUE(contains(json,
                       "\"ph\": \"i\", \"pid\": 0, \"tid\": 0, \"cat\": \"compute_end\", \"name\": \"cleared\", "
                       "\"ts\": 1.000"))
      << json;
  EXPECT_TRUE(contains(json, "\"cat\": \"launch\", \"name\": \"agreement\", \"ts\": 2.000")) << json;
  EXPECT_TRUE(contains(json,
                       "\"ph\": \"B\", \"pid\": 0, \"tid\": 0, \"cat\": \"compute\", \"name\": "
                       "\"open \\\"phase\\\"\", \"ts\": 3.000"))
      << json;
}

TEST(Trace, CollectivesInFlightTogetherGetTracksOfTheirOwn) {
  // a: launched at 1 us, waited 4..5; b: launched at 2 us (a still in flight), waited 6..8; c: launched at 5.5 us,
  // after a ended: it takes a's track again.
  const std::vector<mlacp::Event> list = {
      {EventKind::launch, "a", 0, 1000},   {EventKind::launch, "b", 0, 2000},     {EventKind::wait_begin, "a", 0, 4000},
      {EventKind::wait_end, "a", 0, 5000}, {EventKind::launch, "c", 0, 5500},     {EventKind::wait_begin, "b", 0, 6000},
      {EventKind::wait_end, "b", 0, 8000}, {EventKind::wait_begin, "c", 0, 9000}, {EventKind::wait_end, "c", 0, 9250}};
  const std::string json = mlacp::events::chrome_trace(list, 1);
  EXPECT_TRUE(contains(json,
                       "\"tid\": 1, \"cat\": \"collective\", \"name\": \"a\", \"ts\": 1.000, \"dur\": 4.000, "
                       "\"args\": {\"launched\": true, \"blocked_in_wait_us\": 1.000}"))
      << json;
  EXPECT_TRUE(contains(json, "\"tid\": 1, \"cat\": \"wait\", \"name\": \"wait a\", \"ts\": 4.000, \"dur\": 1.000"))
      << json;
  EXPECT_TRUE(contains(json, "\"tid\": 2, \"cat\": \"collective\", \"name\": \"b\", \"ts\": 2.000, \"dur\": 6.000"))
      << json;
  EXPECT_TRUE(contains(json, "\"tid\": 1, \"cat\": \"collective\", \"name\": \"c\", \"ts\": 5.500, \"dur\": 3.750"))
      << json;
  EXPECT_TRUE(contains(json, "\"args\": {\"name\": \"collective in flight #2\"}")) << json;
  EXPECT_FALSE(contains(json, "collective in flight #3")) << json;
}

// One layer step: the trace has this rank's process, the compute track and three collective tracks (the expanded
// backward's dQ, dK and dV all-to-alls are in flight together). With MLACP_TRACE_TEST_DIR set, the trace and the
// recorded events (kind TAB name per line) are written there for scripts/check_trace.py.
TEST(Trace, LayerStepHasOneProcessPerRankAComputeTrackAndATrackPerCollectiveInFlight) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const bool was_enabled = mlacp::events::enabled();
  mlacp::events::enable(true);
  mlacp::events::clear();
  run_layer_step(mesh);
  const auto list = mlacp::events::snapshot();
  mlacp::events::enable(was_enabled);
  ASSERT_GE(mlacp::events::find(list, EventKind::launch, mlacp::names::dq_a2a), 0);
  for (std::size_t i = 1; i < list.size(); ++i) ASSERT_LE(list[i - 1].clock_ns, list[i].clock_ns) << i;

  const std::string json = mlacp::events::chrome_trace(list, mesh.rank());
  EXPECT_TRUE(contains(json, "\"args\": {\"name\": \"rank " + std::to_string(mesh.rank()) + "\"}"));
  EXPECT_TRUE(contains(json, "\"cat\": \"compute\", \"name\": \"w_o wgrad\""));
  for (const char* name : {mlacp::names::do_a2a, mlacp::names::dq_a2a, mlacp::names::dk_a2a, mlacp::names::dv_a2a})
    EXPECT_TRUE(contains(json, std::string("\"cat\": \"collective\", \"name\": \"") + name + "\"")) << name;
  EXPECT_TRUE(contains(json, "collective in flight #3")) << json;

  if (const char* dir = std::getenv("MLACP_TRACE_TEST_DIR")) {
    const std::string base = std::string(dir) + "/layer_step.json";
    mlacp::events::write_chrome_trace(base, list, mesh.rank());
    std::ofstream recorded(mlacp::events::rank_path(std::string(dir) + "/layer_step.events.tsv", mesh.rank()));
    for (const auto& e : list) recorded << mlacp::to_string(e.kind) << '\t' << e.name << '\n';
    ASSERT_TRUE(recorded.good());
  }
}

TEST(Trace, WriteToAMissingDirectoryNamesTheFile) {
  try {
    mlacp::events::write_chrome_trace("/nonexistent-mlacp-dir/trace.json", {}, 2);
    FAIL() << "no error";
  } catch (const mlacp::Error& e) {
    EXPECT_TRUE(contains(e.what(), "'/nonexistent-mlacp-dir/trace.rank2.json'")) << e.what();
  }
}

// Run by its own ctest with MLACP_TRACE=FILE: recording is on from the start without any call, and the process writes
// FILE.rankN.json at exit (checked by scripts/check_trace.py afterwards).
TEST(TraceEnvironment, MlacpTraceRecordsFromTheStart) {
  if (std::getenv("MLACP_TRACE") == nullptr) GTEST_SKIP() << "MLACP_TRACE is not set";
  EXPECT_EQ(mlacp::events::trace_file(), std::getenv("MLACP_TRACE"));
  EXPECT_TRUE(mlacp::events::enabled());
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  EXPECT_EQ(mlacp::events::trace_rank(), mlacp::test::world_rank());
  run_layer_step(mesh);
  EXPECT_GE(mlacp::events::find(mlacp::events::snapshot(), EventKind::wait_end, mlacp::names::do_a2a), 0);
}

// ---- Kokkos Tools ---------------------------------------------------------------------------------------------------

// What an in-process Kokkos Tools connector saw: "mark <name>", "push <name>", "pop".
std::vector<std::string>& tool_log() {
  static std::vector<std::string> log;
  return log;
}
void on_mark(const char* name) { tool_log().push_back(std::string("mark ") + name); }
void on_push(const char* name) { tool_log().push_back(std::string("push ") + name); }
void on_pop() { tool_log().push_back("pop"); }

// Installs the three callbacks for its lifetime and restores whatever was installed before.
class ToolConnector {
 public:
  ToolConnector() : before_(mlacp::compat::tools::current_callbacks()) {
    tool_log().clear();
    mlacp::compat::tools::set_profile_event_callback(on_mark);
    mlacp::compat::tools::set_push_region_callback(on_push);
    mlacp::compat::tools::set_pop_region_callback(on_pop);
  }
  ~ToolConnector() { mlacp::compat::tools::set_callbacks(before_); }
  ToolConnector(const ToolConnector&) = delete;
  ToolConnector& operator=(const ToolConnector&) = delete;

 private:
  mlacp::compat::tools::callbacks before_;
};

std::ptrdiff_t position(const std::vector<std::string>& log, const std::string& entry) {
  for (std::size_t i = 0; i < log.size(); ++i)
    if (log[i] == entry) return static_cast<std::ptrdiff_t>(i);
  return -1;
}

std::string joined(const std::vector<std::string>& log) {
  std::string out;
  for (const auto& entry : log) out += "  " + entry + "\n";
  return out;
}

TEST(KokkosTools, ACollectiveIsMarkedAtLaunchAndCompletionAndItsWaitIsARegion) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<double****, Kokkos::LayoutRight, Mem> x("x", 1, 2, 2 * mesh.size(), 3);
  std::vector<std::string> log;
  {
    ToolConnector connector;
    ASSERT_TRUE(mlacp::compat::tools::active()) << "an in-process callback does not count as a tool";
    auto handle = mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "traced a2a");
    tool_log().push_back("(launch returned)");
    handle.wait();
    log = tool_log();
  }
  const auto launch = position(log, "mark mlacp::launch traced a2a");
  const auto returned = position(log, "(launch returned)");
  const auto push = position(log, "push mlacp::wait traced a2a");
  const auto complete = position(log, "mark mlacp::complete traced a2a");
  ASSERT_GE(launch, 0) << joined(log);
  ASSERT_GE(push, 0) << joined(log);
  ASSERT_GE(complete, 0) << joined(log);
  EXPECT_LT(launch, returned) << joined(log);
  EXPECT_LT(returned, push) << joined(log);
  // The wait's region closes (the last pop before the completion mark) before the completion is marked.
  ASSERT_GE(complete, 1);
  EXPECT_EQ(log[static_cast<std::size_t>(complete - 1)], "pop") << joined(log);
  int depth = 0;
  for (std::ptrdiff_t i = push; i < complete; ++i)
    depth += log[static_cast<std::size_t>(i)] == "pop" ? -1 : (log[static_cast<std::size_t>(i)].rfind("push", 0) == 0);
  EXPECT_EQ(depth, 0) << "regions opened inside the wait are closed by its end\n" << joined(log);
}

TEST(KokkosTools, EveryCollectiveOfALayerStepIsVisible) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  std::vector<std::string> log;
  {
    ToolConnector connector;
    run_layer_step(mesh);
    log = tool_log();
  }
  for (const char* name : {mlacp::names::q_a2a, mlacp::names::k_a2a, mlacp::names::v_a2a, mlacp::names::o_a2a,
                           mlacp::names::do_a2a, mlacp::names::dq_a2a, mlacp::names::dk_a2a, mlacp::names::dv_a2a}) {
    const std::string n(name);
    const auto launch = position(log, "mark mlacp::launch " + n);
    const auto push = position(log, "push mlacp::wait " + n);
    const auto complete = position(log, "mark mlacp::complete " + n);
    EXPECT_GE(launch, 0) << n << "\n" << joined(log);
    EXPECT_LT(launch, push) << n << "\n" << joined(log);
    EXPECT_LT(push, complete) << n << "\n" << joined(log);
  }
}

}  // namespace
