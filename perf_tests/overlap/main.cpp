// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap: one benchmark per overlap pair of the MLA backward, each run through the library piece that
// the layer (mla_attention.hpp) runs it with:
//   (1) the dO all-to-all with the w_o weight gradient: OutputProjection::backward;
//   (2) the dQ inverse all-to-all with the KV backward (latent strategy): the library's own latent schedule
//       (LatentSchedule over a ScheduleContext, with a synthetic O(n) attention core), its backward run as its named
//       steps (LatentSchedule::Backward): launch_dq(), kv() (disassemble_kv_grad, LatentKVLinear::launch_backward:
//       w_kvb dgrad, its own latent reduce-scatter launched, w_kvb wgrad), wait_dq(); forward and attention() run
//       untimed before, q_branch() and payload() (the reduce-scatter's wait, the payload backward) untimed after;
//   (3) the latent reduce-scatter with the w_kvb weight gradient: LatentKVLinear::backward.
// and one of the forward: the O exchange (per peer) with the w_o GEMMs that consume its blocks as they arrive:
// OutputProjection::forward (pair_o; even split only, beside the same bytes as a raw MPI_Ialltoall), and the same with
// the attention that produces O, each owner's block sent as soon as it is computed: OutputProjection::
// forward_as_computed with FlashAttentionCore (pair_o_attention; free dimension: the tokens per rank).
// For each, in one run: the compute alone (the piece without its collective), the collective alone (the library call
// the piece launches, same arguments), the piece overlapped (overlap on: launch, compute through the library's
// panelled GEMM, which calls mlacp::progress() between panels, wait) and the piece blocking (overlap off: the wait
// right after the launch). A piece's forward, which its backward needs, runs untimed before each timed backward.
// Pieces (1) and (3) produce their collective's input (a dgrad) before the launch, in both modes, so
//   E = (T_blocking - T_overlapped) / min(T_compute, T_comm)   (1 = all of the shorter one hidden)
//   pair/ideal = T_overlapped / (T_blocking - min(T_compute, T_comm))   (1 = the overlapped piece as fast as ideal)
// which are (T_compute + T_comm - T_pair) / min and T_pair / max when nothing runs before the launch. The compute's
// free dimension is calibrated so that T_compute matches T_comm on the link in use. Also sweeps OverlapPolicy::panels
// (1 = unpanelled: no polling during the GEMM) and, for the library pairs, the balance: E with the compute calibrated
// 1.5x longer and 1.5x shorter than the collective. Then the three library pieces once more with an uneven split
// (S = P*k + P-1 tokens and H = P*h + P-1 heads: the first P-1 ranks hold one token and one head more, so the
// collectives are the v-variants), calibrated and measured the same way: the E of each pair with uneven splits.
// Then (4) the ring step of ring attention (P >= 2; pair_ring below): FlashAttentionCore::forward or
// backward of a positioned problem on a chunk against launch_send_recv of the next chunk (and, backward, the previous
// step's gradient accumulator), forward and backward, its chunk length calibrated, each beside its raw-MPI ceiling (the
// same bytes as MPI_Isend/MPI_Irecv polled by the same compute): E of the library against E of raw MPI.
//
//   mpirun -n 2 mlacp-perf-overlap [--quick] [--json FILE] [--repeats N] [--transport-label STR] [--rate-label STR]
//                                  [--rows N] [--progress-thread] [--no-sweep] [--no-uneven] [--no-ring]
//                                  [--only-ring] [--ring-expanded] [--ring-heads N] [--ring-chunk N]
//
// The files: overlap/pair.hpp (what a pair is), one file per pair (pair_do.cpp, pair_o.cpp, pair_o_attention.cpp,
// pair_dq.cpp, pair_rs.cpp, pair_ring.cpp), overlap/harness.cpp (calibration, measurement, sweeps, JSON) and this one
// (the command line, the order of the pairs, the printed report).
#include <mpi.h>
#include <mlacp/mesh.hpp>

#include <iomanip>
#include <iostream>

#include "harness.hpp"

namespace {

using namespace mlacp::perf;
using namespace mlacp::perf::overlap;

const char* usage =
    "usage: mlacp-perf-overlap [--quick] [--json FILE] [--repeats N] [--warmup N] [--transport-label STR]\n"
    "                          [--rate-label STR] [--rows N] [--progress-thread] [--no-sweep] [--no-transfer-only]\n"
    "                          [--no-uneven] [--no-ring] [--only-ring] [--ring-expanded] [--ring-heads N]\n"
    "                          [--ring-chunk N]\n"
    "  --rows N           sequence rows per pair (default 8192, --quick 1024): the collective's size\n"
    "  --no-uneven        skip the pairs with uneven splits (S and H not divisible by P)\n"
    "  --progress-thread  also run each pair unpanelled with a progress thread polling mlacp::progress()\n"
    "  --no-ring          skip the ring step pairs (P >= 2); --only-ring: run only them\n"
    "  --ring-expanded    also the ring step with the expanded strategy's K and V chunks travelling\n"
    "  --ring-heads N     heads of the ring step's attention (default 1; the chunk length is calibrated)\n"
    "  --ring-chunk N     the ring step's chunk length, uncalibrated (shared memory balances at a few dozen tokens,\n"
    "                     where the launch's fixed cost is the whole exchange)\n";

Settings read_settings(const Options& o, const mlacp::Mesh& mesh) {
  Settings st;
  const int P = mesh.size();
  st.rows = o.get_int("rows", o.quick ? 1024 : 8192);
  if (st.rows % (P * P) != 0) throw std::invalid_argument("--rows must be divisible by P*P");
  st.repeats = o.repeats_or(3, 11);
  st.warmup = o.warmup;
  st.quick = o.quick;
  st.panel_sweep = o.extra.count("no-sweep") == 0;
  st.balance_sweep = st.panel_sweep && !o.quick;
  st.progress_thread = o.extra.count("progress-thread") != 0;
  st.modes = o.extra.count("no-transfer-only") ? 1 : 2;
  st.uneven = o.extra.count("no-uneven") == 0;
  st.ring = o.extra.count("no-ring") == 0;
  st.ring_expanded = o.extra.count("ring-expanded") != 0;
  st.ring_heads = o.get_int("ring-heads", 1);
  st.only_ring = o.extra.count("only-ring") != 0;
  st.ring_chunk = o.get_int("ring-chunk", 0);
  if (st.ring_chunk < 0) throw std::invalid_argument("--ring-chunk must be positive (0: calibrated)");
  if (st.only_ring && !st.ring) throw std::invalid_argument("--only-ring and --no-ring exclude each other");
  if (st.ring_heads < 1) throw std::invalid_argument("--ring-heads must be at least 1");
  st.panel_counts = o.quick ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4, 8, 16, 32};
  st.default_policy = mlacp::overlap_policy();
  return st;
}

void print_report(const Report& report, const Options& o, const Settings& settings, int P) {
  std::cout << "mlacp-perf-overlap: P=" << P << " transport=" << o.transport << " rate=" << o.rate
            << " repeats=" << settings.repeats
            << " (median of max over ranks), panels=" << settings.default_policy.panels
            << " min_panel_rows=" << settings.default_policy.min_panel_rows << "\n";
  std::cout << "(E = (blocking - pair) / min(compute, comm); pair/ideal = pair / (blocking - min(compute, comm)))\n";
  std::cout << std::left << std::setw(54) << "pair" << std::right << std::setw(10) << "compute" << std::setw(10)
            << "comm" << std::setw(10) << "pair" << std::setw(10) << "blocking" << std::setw(8) << "E" << std::setw(12)
            << "pair/ideal" << std::setw(11) << "comm/comp"
            << "\n";
  for (const Row& r : report.table)
    std::cout << std::left << std::setw(54) << r.label << std::right << std::setw(8) << ms(r.compute) << "ms"
              << std::setw(8) << ms(r.comm) << "ms" << std::setw(8) << ms(r.pair) << "ms" << std::setw(8)
              << ms(r.blocking) << "ms" << std::setw(8) << fixed(r.e, 2) << std::setw(12) << fixed(r.pair_over_ideal, 3)
              << std::setw(11) << fixed(r.comm / r.compute, 2) << "\n";
  std::cout << "Where the overlapped pair's time goes (per-rank medians, max over ranks):\n"
            << std::left << std::setw(54) << "pair" << std::right << std::setw(10) << "launch" << std::setw(12)
            << "compute" << std::setw(10) << "wait" << std::setw(18) << "compute/alone\n";
  for (const PhaseRow& p : report.phases)
    std::cout << std::left << std::setw(54) << p.label << std::right << std::setw(8) << ms(p.phases.launch) << "ms"
              << std::setw(10) << ms(p.phases.compute) << "ms" << std::setw(8) << ms(p.phases.wait) << "ms"
              << std::setw(17) << fixed(p.phases.compute / p.compute_alone, 3) << "\n";
  if (!report.sweep_lines.empty()) {
    std::cout << "E by OverlapPolicy::panels (1 = one GEMM call, no polling inside it):\n";
    for (const auto& l : report.sweep_lines) std::cout << l << "\n";
  }
  if (!report.balance_lines.empty()) {
    std::cout << "E by comm/compute (measured ratio:E; the band of the targets is 0.67..1.5):\n";
    for (const auto& l : report.balance_lines) std::cout << l << "\n";
  }
  if (!report.uneven_lines.empty()) {
    std::cout << "E with uneven splits (S = P*k + P-1, H = P*h + P-1; v-collectives), beside the even split's:\n";
    for (const auto& l : report.uneven_lines) std::cout << l << "\n";
  }
  if (!report.ring_lines.empty()) {
    std::cout << "Ring step (attention on a chunk vs the next chunk's exchange; n = calibrated chunk length, MB sent "
                 "per rank, times in ms, p/i = pair/ideal) against its raw-MPI ceiling (MPI_Isend/MPI_Irecv of the "
                 "same bytes, polled by the same "
                 "compute):\n"
              << "  " << std::left << std::setw(36) << "pair" << std::right << std::setw(7) << "n" << std::setw(9)
              << "MB" << std::setw(9) << "compute" << std::setw(9) << "comm" << std::setw(9) << "comm raw"
              << std::setw(8) << "E lib" << std::setw(8) << "E raw" << std::setw(10) << "E lib@raw" << std::setw(8)
              << "gap" << std::setw(10) << "p/i lib" << std::setw(10) << "p/i raw"
              << "\n"
              << "  (E lib@raw: the library's pair on the ceiling's comm and blocking; gap = E raw - E lib@raw = "
                 "(pair lib - pair raw) / min(compute, comm raw), target <= 0.05)\n";
    for (const auto& l : report.ring_lines) std::cout << l << "\n";
  }
}

int run(int argc, char** argv) {
  const Options o = parse_options(argc, argv, {"--rows", "--ring-heads", "--ring-chunk"},
                                  {"--progress-thread", "--no-sweep", "--no-transfer-only", "--no-uneven", "--no-ring",
                                   "--ring-expanded", "--only-ring"});
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mesh.set_checked(false);  // the benchmark measures the transport, not the argument agreement
  const Settings settings = read_settings(o, mesh);
  JsonObject doc = header("mlacp-perf-overlap", o, mesh.size(), settings.repeats);
  doc.obj("default_policy", JsonObject()
                                .num("panels", settings.default_policy.panels)
                                .num("min_panel_rows", static_cast<double>(settings.default_policy.min_panel_rows)));
  Report report;
  std::vector<double> even_e;  // the library pairs' E (mode 0)
  const int modes = settings.only_ring ? 0 : settings.modes;
  for (int mode = 0; mode < modes; ++mode)
    for (const PairSpec& spec :
         {pair_do(mesh, settings.rows, false), pair_dq(mesh, settings.rows, false), pair_rs(mesh, settings.rows, false),
          pair_o(mesh, settings.rows), pair_o_attention(mesh, settings.quick)}) {
      const double e = benchmark_pair(spec, mode == 1, settings, mesh.comm(), report);
      if (mode == 0) even_e.push_back(e);
    }
  if (settings.uneven && !settings.only_ring) benchmark_uneven(mesh, even_e, settings, report);
  if (settings.ring) benchmark_ring(mesh, settings, report);
  doc.set("pairs", report.pair_docs);
  if (settings.uneven && !settings.only_ring) doc.set("uneven_vs_even", report.uneven_docs);
  if (settings.ring) doc.set("ring_step_vs_raw_mpi", report.ring_docs);
  if (mesh.rank() == 0) {
    print_report(report, o, settings, mesh.size());
    write_json(o.json, doc.json());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool thread_multiple = false;
  for (int i = 1; i < argc; ++i) thread_multiple |= std::string(argv[i]) == "--progress-thread";
  return mlacp::perf::run_main(argc, argv, usage, run, thread_multiple);
}
