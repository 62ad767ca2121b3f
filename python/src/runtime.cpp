// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Kokkos' lifetime in the interpreter, and the process-wide settings and records of mlacp: the wgrad overlap policy,
// the wait watchdog, the event recorder.
#include <pybind11/stl.h>

#include <Kokkos_Core.hpp>
#include <atomic>
#include <mlacp/error.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/panelled_gemm.hpp>
#include <mlacp/version.hpp>
#include <mlacp/watchdog.hpp>
#include <tuple>

#include "bindings.hpp"
#include "kokkos_lifetime.hpp"

namespace mlacp::python {
namespace py = pybind11;

namespace {
std::atomic<long> g_users{0};
std::atomic<bool> g_finalize_requested{false};
bool g_we_initialized = false;

void finalize_if_ours() {
  if (g_we_initialized && Kokkos::is_initialized()) {
    g_we_initialized = false;
    Kokkos::finalize();
  }
}
}  // namespace

void initialize_kokkos() {
  if (Kokkos::is_initialized()) return;
  Kokkos::initialize();
  g_we_initialized = true;
}

void request_kokkos_finalize() {
  g_finalize_requested = true;
  if (g_users.load() == 0) finalize_if_ours();
}

KokkosUser::KokkosUser() noexcept { ++g_users; }
KokkosUser::KokkosUser(const KokkosUser&) noexcept { ++g_users; }
KokkosUser::~KokkosUser() {
  if (--g_users == 0 && g_finalize_requested) finalize_if_ours();
}

void bind_runtime(py::module_& m) {
  initialize_kokkos();
  m.def("_finalize_kokkos", &request_kokkos_finalize,
        "Finalises Kokkos once no mlacp object holds memory (registered with atexit by the mlacp package).");
  m.def(
      "_kokkos_users", [] { return g_users.load(); }, "Objects alive that hold Kokkos memory (tests).");
  m.def("_kokkos_initialized", [] { return Kokkos::is_initialized(); });
  m.attr("__version__") = mlacp::version();

  m.def("wait_timeout", &mlacp::wait_timeout,
        "Seconds a collective's wait may take before the watchdog reports it and aborts (0 = off; "
        "MLACP_WAIT_TIMEOUT_S).");
  m.def("set_wait_timeout", &mlacp::set_wait_timeout, py::arg("seconds"));
  m.def(
      "overlap_policy", [] { return std::make_tuple(overlap_policy().panels, overlap_policy().min_panel_rows); },
      "(panels, min_panel_rows) of the wgrad GEMMs that run while a collective is pending (MLACP_WGRAD_PANELS).");
  m.def(
      "set_overlap_policy",
      [](int panels, std::int64_t min_panel_rows) {
        if (panels < 1 || min_panel_rows < 1)
          throw mlacp::InvalidArgument("mlacp.set_overlap_policy: panels = " + std::to_string(panels) +
                                       " and min_panel_rows = " + std::to_string(min_panel_rows) +
                                       "; expected both >= 1");
        overlap_policy() = OverlapPolicy{panels, min_panel_rows};
      },
      py::arg("panels"), py::arg("min_panel_rows") = OverlapPolicy{}.min_panel_rows);

  auto events = m.def_submodule("events", "mlacp's event recorder: collective launches and waits, compute phases.");
  events.def("enable", &mlacp::events::enable, py::arg("on") = true, "Records events (process-wide) or stops.");
  events.def("enabled", &mlacp::events::enabled);
  events.def("clear", &mlacp::events::clear, "Forgets the events so far and restarts the clock.");
  events.def(
      "snapshot",
      [] {
        std::vector<std::tuple<std::string, std::string, double>> out;
        for (const auto& e : mlacp::events::snapshot()) out.emplace_back(mlacp::to_string(e.kind), e.name, e.time_s);
        return out;
      },
      "The events recorded so far, in order, as (kind, name, seconds) with kind one of launch, wait_begin, wait_end, "
      "compute_begin, compute_end.");

  // The names the recorded events carry (mla/names.hpp), so that Python code looks for the same strings.
  auto names =
      m.def_submodule("names", "The collective and compute-phase names the MLA layer records (mla/names.hpp).");
  for (const auto& [attribute, value] : std::initializer_list<std::pair<const char*, const char*>>{
           {"q_a2a", mlacp::names::q_a2a},
           {"k_a2a", mlacp::names::k_a2a},
           {"v_a2a", mlacp::names::v_a2a},
           {"dq_a2a", mlacp::names::dq_a2a},
           {"dk_a2a", mlacp::names::dk_a2a},
           {"dv_a2a", mlacp::names::dv_a2a},
           {"o_a2a", mlacp::names::o_a2a},
           {"do_a2a", mlacp::names::do_a2a},
           {"payload_all_gather", mlacp::names::payload_all_gather},
           {"latent_reduce_scatter", mlacp::names::latent_reduce_scatter},
           {"call_shape", mlacp::names::call_shape},
           {"ring_payload", mlacp::names::ring_payload},
           {"ring_k", mlacp::names::ring_k},
           {"ring_v", mlacp::names::ring_v},
           {"ring_d_payload", mlacp::names::ring_d_payload},
           {"ring_dk", mlacp::names::ring_dk},
           {"ring_dv", mlacp::names::ring_dv},
           {"w_q_fprop", mlacp::names::w_q_fprop},
           {"w_kva_fprop", mlacp::names::w_kva_fprop},
           {"w_kvb_fprop", mlacp::names::w_kvb_fprop},
           {"attention_fprop", mlacp::names::attention_fprop},
           {"w_o_fprop", mlacp::names::w_o_fprop},
           {"w_o_dgrad", mlacp::names::w_o_dgrad},
           {"w_o_wgrad", mlacp::names::w_o_wgrad},
           {"b_o_grad", mlacp::names::b_o_grad},
           {"attention_bprop", mlacp::names::attention_bprop},
           {"kv_backward", mlacp::names::kv_backward},
           {"w_kvb_dgrad", mlacp::names::w_kvb_dgrad},
           {"w_kvb_wgrad", mlacp::names::w_kvb_wgrad},
           {"b_kvb_grad", mlacp::names::b_kvb_grad},
           {"q_backward", mlacp::names::q_backward},
           {"k_backward", mlacp::names::k_backward},
           {"v_backward", mlacp::names::v_backward},
           {"payload_backward", mlacp::names::payload_backward},
           {"ring_expand", mlacp::names::ring_expand},
           {"ring_kv_backward", mlacp::names::ring_kv_backward}})
    names.attr(attribute) = value;
}

}  // namespace mlacp::python
