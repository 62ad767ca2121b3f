// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap: one benchmark per overlap pair of the MLA backward,
//   (1) the dO all-to-all with the w_o weight gradient,
//   (2) the dQ inverse all-to-all with the KV backward (latent strategy),
//   (3) the latent reduce-scatter with the w_kvb weight gradient.
// For each, in one run: the compute alone, the collective alone, the library's overlapped pair (launch, the compute
// through the library's GEMM path, which calls mlacp::progress() between panels, wait) and the blocking sequence
// (launch, wait, compute). E = (T_compute + T_comm - T_pair) / min(T_compute, T_comm) (1 = all of the shorter one
// hidden) and T_pair / max(T_compute, T_comm). The compute's free dimension is calibrated so that T_compute matches
// T_comm on the link in use. Also sweeps OverlapPolicy::panels (1 = unpanelled: no polling during the GEMM) and, for
// the library pairs, the balance: E with the compute calibrated 1.5x longer and 1.5x shorter than the collective.
//
//   mpirun -n 2 mlacp-perf-overlap [--quick] [--json FILE] [--repeats N] [--transport-label STR] [--rate-label STR]
//                                  [--rows N] [--progress-thread] [--no-sweep]
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/mla/kv_layout.hpp>
#include <mlacp/mla/linear.hpp>
#include <mlacp/mla/rms_norm.hpp>
#include <mlacp/mla/rope.hpp>
#include <mlacp/mla/view_utils.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <atomic>
#include <memory>
#include <thread>

#include "perf_common.hpp"

namespace {

using namespace mlacp::perf;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using T = double;
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
using Tensor4 = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;
using Tensor5 = Kokkos::View<T*****, Kokkos::LayoutRight, Mem>;
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
using Vector = Kokkos::View<T*, Kokkos::LayoutRight, Mem>;
using Waiter = std::function<void()>;

const char* usage =
    "usage: mlacp-perf-overlap [--quick] [--json FILE] [--repeats N] [--warmup N] [--transport-label STR]\n"
    "                          [--rate-label STR] [--rows N] [--progress-thread] [--no-sweep] [--no-transfer-only]\n"
    "  --rows N           sequence rows per pair (default 8192, --quick 1024): the collective's size\n"
    "  --progress-thread  also run each pair unpanelled with a progress thread polling mlacp::progress()\n";

// A handle as a copyable closure that waits it.
template <class Handle>
Waiter waiter(Handle handle) {
  auto held = std::make_shared<Handle>(std::move(handle));
  return [held]() { held->wait(); };
}

// The transfer alone, as mlacp's GEMMs see it: a raw MPI request on pre-packed contiguous buffers, registered in
// mlacp's progress registry (so the panelled GEMM polls it), without mlacp's buffer allocation, pack and unpack.
class RawRequest final : public mlacp::detail::PendingTransport {
 public:
  explicit RawRequest(MPI_Request request) : request_(request) { mlacp::detail::register_pending(this); }
  ~RawRequest() override { complete_noexcept(); }
  RawRequest(const RawRequest&) = delete;
  RawRequest& operator=(const RawRequest&) = delete;
  bool test() override {
    int done = 0;
    MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
    return done != 0;
  }
  void wait() override {
    mlacp::detail::unregister_pending(this);
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void complete_noexcept() noexcept override {
    mlacp::detail::unregister_pending(this);
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void progress() noexcept override {
    int done = 0;
    if (request_ != MPI_REQUEST_NULL) MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
  }

 private:
  MPI_Request request_;
};

// Pre-packed buffers of `elements` doubles per rank and a launcher of a raw MPI_Ialltoall on them (every pair's
// collective moves its bytes as an all-to-all; the reduce-scatter's is the pairwise exchange).
std::function<Waiter()> raw_launcher(std::size_t elements, MPI_Comm comm, int P) {
  auto send = std::make_shared<std::vector<T>>(elements, 1.0);
  auto recv = std::make_shared<std::vector<T>>(elements, 0.0);
  return [=]() -> Waiter {
    MPI_Request request = MPI_REQUEST_NULL;
    const int count = static_cast<int>(elements / static_cast<std::size_t>(P));
    MPI_Ialltoall(send->data(), count, MPI_DOUBLE, recv->data(), count, MPI_DOUBLE, comm, &request);
    auto held = std::make_shared<RawRequest>(request);
    return [held, send, recv]() { held->wait(); };
  };
}

// One overlap pair at one size of its compute.
struct Pair {
  std::string compute_name, comm_name;
  std::int64_t panel_rows = 0;  // rows of the panelled GEMM (what OverlapPolicy splits)
  std::function<void()> compute;
  std::function<Waiter()> launch;
  std::function<Waiter()> launch_raw;  // the same bytes, raw MPI on pre-packed buffers (RawRequest)
  std::function<JsonObject()> sizes;
  std::function<JsonObject()> breakdown;  // optional: per-kernel times of the compute alone
  // optional: the compute with mlacp::progress() also called between its non-GEMM kernels (a proposed library change)
  std::function<void()> compute_polled;
};

struct PairSpec {
  std::string name;
  int initial_dim;
  std::function<Pair(int dim)> make;  // dim: the compute's free dimension (calibrated)
};

int effective_panels(std::int64_t rows, const mlacp::OverlapPolicy& p) {
  if (p.panels <= 1) return 1;
  return static_cast<int>(std::clamp<std::int64_t>(rows / std::max<std::int64_t>(1, p.min_panel_rows), 1, p.panels));
}

double overlap_e(double compute, double comm, double pair) { return (compute + comm - pair) / std::min(compute, comm); }

// Runs `fn` while a thread calls mlacp::progress() every `interval_us` (the opt-in progress-thread experiment; needs
// MPI_THREAD_MULTIPLE).
void with_progress_thread(int interval_us, const std::function<void()>& fn) {
  std::atomic<bool> stop{false};
  std::thread poller([&]() {
    while (!stop.load(std::memory_order_relaxed)) {
      mlacp::progress();
      std::this_thread::sleep_for(std::chrono::microseconds(interval_us));
    }
  });
  fn();
  stop = true;
  poller.join();
}

// ---- the three pairs --------------------------------------------------------------------------------------------

// (1) dO all-to-all (token-local -> head-local) with dw_o [D, H*dv] += dy[s, D]^T o[s, H*dv]. As the layer launches
// it: dO [1, s, H, dv] written by its dgrad in per-rank head blocks [P, 1, s, h, dv], block j sent to rank j.
PairSpec pair_do(const mlacp::Mesh& mesh, int rows) {
  const int P = mesh.size();
  const int H = 8 * P, dv = 128 / H > 0 ? std::max(1, 128 / H) : 1;
  return {"dO a2a + w_o wgrad", 128, [&mesh, rows, H, dv, P](int D) {
            const Space space;
            Tensor5 grad_local("dO blocks", P, 1, rows, H / P, dv);
            Matrix dy("dy", rows, D), o("o", rows, H * dv), dw("dw_o", D, H * dv);
            mlacp::testing::synthetic::fill(grad_local, 11, 1.0);
            mlacp::testing::synthetic::fill(dy, 12, 1.0);
            mlacp::testing::synthetic::fill(o, 13, 1.0);
            Pair p;
            p.compute_name = "w_o wgrad";
            p.comm_name = "dO a2a";
            p.panel_rows = rows;
            p.compute = [space, dy, o, dw]() {
              mlacp::detail::ComputePhase<Space> phase(space, "w_o wgrad");
              mlacp::detail::linear_wgrad(space, dy, o, dw);
            };
            p.launch = [space, grad_local, &mesh]() {
              return waiter(mlacp::launch_all_to_all(space, grad_local, 2, 0, mesh, "dO a2a"));
            };
            p.launch_raw = raw_launcher(grad_local.size(), mesh.comm(), P);
            p.sizes = [=]() {
              return JsonObject()
                  .num("s", rows)
                  .num("H", H)
                  .num("dv", dv)
                  .num("D", D)
                  .num("comm_bytes_per_rank", 8.0 * rows * H * dv)
                  .num("comm_bytes_leaving_rank", 8.0 * rows * H * dv * (P - 1) / P)
                  .num("gemm_flops", 2.0 * rows * D * H * dv)
                  .str("gemm", "dw_o[D, H*dv] += dy[s, D]^T o[s, H*dv]");
            };
            return p;
          }};
}

// (2) dQ inverse all-to-all [1, S, h, dqk] (head-local -> token-local, received as the layer does: the P head blocks
// [P, 1, s, h, dqk] that the Q branch consumes without an unpack) with the KV backward of the latent strategy:
// disassemble dK/dV, w_kvb dgrad, the payload gradient's columns, w_kvb wgrad, then the payload backward of the local
// rows (RoPE and RMSNorm backward, w_kva wgrad and dgrad). The latent reduce-scatter, which the layer launches inside
// the KV backward, is pair (3) and is left out here (the local rows of the payload gradient stand for its result).
PairSpec pair_dq(const mlacp::Mesh& mesh, int rows) {
  const int P = mesh.size();
  const int h = 8, dn = 8, dr = 8, dv = 16, dqk = dn + dr;
  return {"dQ a2a + kv backward", 64, [&mesh, rows, P, h, dn, dr, dv, dqk](int R) {
            const Space space;
            const int S = rows, s = S / P, D = R, width = h * (dn + dv);
            const std::int64_t offset = static_cast<std::int64_t>(mesh.rank()) * s;
            Tensor5 dq("dq", 1, 1, S, h, dqk);
            Tensor4 dk("dk", 1, S, h, dqk), dvv("dv", 1, S, h, dv);
            Tensor3 latent("latent", 1, S, R), kv_a("kv_a", 1, s, R + dr), x("x", 1, s, D);
            Matrix w_sel("w_sel", width, R), w_kva("w_kva", R + dr, D);
            Matrix dw_sel("dw_sel", width, R), dw_kva("dw_kva", R + dr, D);
            Vector g_kv("g_kv", R), dg_kv("dg_kv", R), rstd("rstd", s);
            Tensor3 dx("dx", 1, s, D);
            mlacp::testing::synthetic::fill(dq, 21, 1.0);
            mlacp::testing::synthetic::fill(dk, 22, 1.0);
            mlacp::testing::synthetic::fill(dvv, 23, 1.0);
            mlacp::testing::synthetic::fill(latent, 24, 1.0);
            mlacp::testing::synthetic::fill(kv_a, 25, 1.0);
            mlacp::testing::synthetic::fill(x, 26, 1.0);
            mlacp::testing::synthetic::fill(w_sel, 27, 0.1);
            mlacp::testing::synthetic::fill(w_kva, 28, 0.1);
            mlacp::testing::synthetic::fill(g_kv, 29, 0.2, 1.0);
            mlacp::testing::synthetic::fill(rstd, 30, 0.1, 1.0);
            // Scratch, allocated once (the layer allocates them per call; allocation is not what is measured here).
            Tensor3 dkv("d kv", 1, S, width), dkpe("d k_pe", 1, S, dr), grad_latent("d latent", 1, S, R);
            Tensor3 grad_payload("d payload", 1, S, R + dr), d_kv_a("d kv_a", 1, s, R + dr);
            // The local rows of the payload gradient (B = 1: the first s rows are contiguous).
            Tensor3 local_payload("d payload local", 1, s, R + dr);
            auto compute_steps = [=](const std::function<void(const char*)>& mark) {
              mlacp::detail::disassemble_kv_grad(space, dk, dvv, Tensor4(dkv.data(), 1, S, h, dn + dv), dkpe, dn);
              mark("disassemble_kv_grad (no poll)");
              const auto dkv2 = mlacp::detail::as_matrix(dkv, S, width);
              mlacp::detail::linear_dgrad(space, dkv2, w_sel, T(0), mlacp::detail::as_matrix(grad_latent, S, R));
              mark("w_kvb dgrad (panelled)");
              mlacp::detail::copy_columns(space, grad_latent, 0, grad_payload, 0, R);
              mlacp::detail::copy_columns(space, dkpe, 0, grad_payload, R, dr);
              mark("payload columns (no poll)");
              mlacp::detail::linear_wgrad(space, dkv2, mlacp::detail::as_matrix(latent, S, R), dw_sel);
              mark("w_kvb wgrad (panelled)");
              Kokkos::deep_copy(space, local_payload,
                                Kokkos::subview(grad_payload, Kokkos::ALL(), std::make_pair(0, s), Kokkos::ALL()));
              mlacp::rope_backward(space, mlacp::as_rank4(local_payload), R, dr, offset);
              mlacp::rms_norm_backward(space, kv_a, g_kv, rstd, local_payload, d_kv_a, dg_kv);
              mlacp::detail::copy_columns(space, local_payload, R, d_kv_a, R, dr);
              mark("rope + rms_norm backward (no poll)");
              const auto da2 = mlacp::detail::as_matrix(d_kv_a, s, R + dr);
              mlacp::detail::linear_wgrad(space, da2, mlacp::detail::as_matrix(x, s, D), dw_kva);
              mark("w_kva wgrad (panelled)");
              mlacp::detail::linear_dgrad(space, da2, w_kva, T(1), mlacp::detail::as_matrix(dx, s, D));
              mark("w_kva dgrad (panelled)");
            };
            Pair p;
            p.compute_name = "kv backward";
            p.comm_name = "dQ a2a";
            p.panel_rows = S;
            p.compute = [space, compute_steps]() {
              mlacp::detail::ComputePhase<Space> phase(space, "kv backward");
              compute_steps([](const char*) {});
            };
            p.compute_polled = [space, compute_steps]() {
              mlacp::detail::ComputePhase<Space> phase(space, "kv backward");
              compute_steps([](const char*) { mlacp::progress(); });
            };
            p.launch = [space, dq, &mesh]() {
              return waiter(mlacp::launch_all_to_all(space, dq, 0, 2, mesh, "dQ a2a"));
            };
            p.breakdown = [space, compute_steps, &mesh]() {
              // One pass with a fence after each step, max over ranks: how long each stretch runs, and which of
              // them never call mlacp::progress().
              JsonObject o;
              std::vector<std::pair<std::string, double>> steps;
              Kokkos::fence();
              double last = now();
              compute_steps([&](const char* name) {
                space.fence();
                const double t = now();
                steps.emplace_back(name, t - last);
                last = t;
              });
              for (auto& [name, t] : steps) {
                MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, mesh.comm());
                o.num(name, t);
              }
              return o;
            };
            p.launch_raw = raw_launcher(dq.size(), mesh.comm(), P);
            p.sizes = [=]() {
              return JsonObject()
                  .num("S", S)
                  .num("s", s)
                  .num("h", h)
                  .num("H", h * P)
                  .num("dn", dn)
                  .num("dr", dr)
                  .num("dv", dv)
                  .num("R", R)
                  .num("D", D)
                  .num("comm_bytes_per_rank", 8.0 * S * h * dqk)
                  .num("comm_bytes_leaving_rank", 8.0 * S * h * dqk * (P - 1) / P)
                  .num("gemm_flops", 4.0 * S * width * R + 4.0 * s * (R + dr) * D);
            };
            return p;
          }};
}

// (3) latent reduce-scatter of the payload gradient [1, S, R+dr] (SUM, along the sequence) with
// dw_sel[W, R] += grad_kv[S, W]^T latent[S, R], W = h*(dn+dv) (calibrated).
PairSpec pair_rs(const mlacp::Mesh& mesh, int rows) {
  const int P = mesh.size();
  const int R = 120, dr = 8;
  return {"latent reduce-scatter + w_kvb wgrad", 192, [&mesh, rows, P, R, dr](int W) {
            const Space space;
            const int S = rows;
            Tensor3 grad_payload("d payload", 1, S, R + dr);
            Matrix grad_kv("d kv", S, W), latent("latent", S, R), dw("dw_kvb", W, R);
            mlacp::testing::synthetic::fill(grad_payload, 31, 1.0);
            mlacp::testing::synthetic::fill(grad_kv, 32, 1.0);
            mlacp::testing::synthetic::fill(latent, 33, 1.0);
            Pair p;
            p.compute_name = "w_kvb wgrad";
            p.comm_name = "latent reduce-scatter";
            p.panel_rows = S;
            p.compute = [space, grad_kv, latent, dw]() {
              mlacp::detail::ComputePhase<Space> phase(space, "w_kvb wgrad");
              mlacp::detail::linear_wgrad(space, grad_kv, latent, dw);
            };
            p.launch = [space, grad_payload, &mesh]() {
              return waiter(mlacp::launch_reduce_scatter(space, grad_payload, 1, mesh, "latent reduce-scatter"));
            };
            p.launch_raw = raw_launcher(grad_payload.size(), mesh.comm(), P);
            p.sizes = [=]() {
              return JsonObject()
                  .num("S", S)
                  .num("R", R)
                  .num("dr", dr)
                  .num("W_h_dn_dv", W)
                  .num("comm_bytes_per_rank", 8.0 * S * (R + dr))
                  .num("comm_bytes_leaving_rank", 8.0 * S * (R + dr) * (P - 1) / P)
                  .num("gemm_flops", 2.0 * S * W * R)
                  .str("gemm", "dw_sel[W, R] += grad_kv[S, W]^T latent[S, R]");
            };
            return p;
          }};
}

// ---- the run ----------------------------------------------------------------------------------------------------

struct Row {
  std::string label;
  double compute, comm, pair, blocking, e, pair_over_max, blocking_over_max;
};

// Per-rank median of the recorded rounds after the warm-up, then the maximum over the ranks.
double phase_median(std::vector<double> times, int warmup, MPI_Comm comm) {
  times.erase(times.begin(),
              times.begin() + std::min<std::ptrdiff_t>(warmup, static_cast<std::ptrdiff_t>(times.size())));
  double m = median(times);
  MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, comm);
  return m;
}

struct Phases {
  std::string label;
  double launch, compute, wait, compute_alone;
};

int run(int argc, char** argv) {
  const Options o = parse_options(argc, argv, {"--rows"}, {"--progress-thread", "--no-sweep", "--no-transfer-only"});
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mesh.set_checked(false);  // the benchmark measures the transport, not the argument agreement
  const int P = mesh.size(), rank = mesh.rank();
  const int rows = o.get_int("rows", o.quick ? 1024 : 8192);
  if (rows % (P * P) != 0) throw std::invalid_argument("--rows must be divisible by P*P");
  const int repeats = o.repeats_or(3, 11), warmup = o.warmup;
  const bool sweep = o.extra.count("no-sweep") == 0;
  const bool ratio_sweep = sweep && !o.quick;
  const bool thread_experiment = o.extra.count("progress-thread") != 0;
  const MPI_Comm comm = mesh.comm();
  auto& policy = mlacp::overlap_policy();
  const mlacp::OverlapPolicy default_policy = policy;
  const std::vector<int> panel_sweep = o.quick ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4, 8, 16, 32};

  JsonObject doc = header("mlacp-perf-overlap", o, P, repeats);
  doc.obj("default_policy", JsonObject()
                                .num("panels", default_policy.panels)
                                .num("min_panel_rows", static_cast<double>(default_policy.min_panel_rows)));
  std::vector<std::string> pair_docs;
  std::vector<Row> table;
  std::vector<Phases> phases;
  std::vector<std::string> sweep_lines;
  std::vector<std::string> balance_lines;

  // Mode 0: the library's collectives (the figures of record). Mode 1 (unless --no-transfer-only): the same bytes as
  // raw MPI requests on pre-packed buffers in mlacp's progress registry, calibrated again: how well the panelled
  // GEMM's polling hides the transfer itself, without the pack and unpack kernels (CPU work that cannot overlap).
  const int modes = o.extra.count("no-transfer-only") ? 1 : 2;
  for (int mode = 0; mode < modes; ++mode)
    for (const PairSpec& spec : {pair_do(mesh, rows), pair_dq(mesh, rows), pair_rs(mesh, rows)}) {
      const bool raw = mode == 1;
      const std::string label = spec.name + (raw ? " [transfer only]" : "");
      Region region(label);
      // Calibration: the collective alone, then the compute's free dimension scaled until T_comm / T_compute is
      // within 10% of `target` (1 for the figures of record).
      Pair pair;
      auto go = [&]() { return raw ? pair.launch_raw() : pair.launch(); };
      double t_comm = 0, t_compute = 0;
      auto calibrate = [&](double target, int dim) {
        Region r("calibrate");
        pair = spec.make(dim);
        for (int step = 0; step < (o.quick ? 2 : 4); ++step) {
          const auto cal =
              measure_interleaved(comm, 1, o.quick ? 1 : 3, {[&]() { go()(); }, [&]() { pair.compute(); }});
          t_comm = cal[0].median();
          t_compute = cal[1].median();
          const double off = t_comm / t_compute / target;
          if (step > 0 && off > 0.9 && off < 1.1) break;
          const int next = std::clamp(static_cast<int>(std::lround(dim * std::pow(off, 0.9) / 8.0)) * 8, 8, 4096);
          if (next == dim) break;
          dim = next;
          pair = spec.make(dim);
        }
        return dim;
      };
      const int dim = calibrate(1.0, spec.initial_dim);
      // Everything measured together, interleaved round by round (see measure_interleaved): the compute alone, the
      // collective alone, the pair, the blocking sequence, and the pair at each panel count of the sweep.
      // The overlapped pair, also timed per phase on each rank: the launch (pack, MPI start), the compute with the
      // collective in flight (on host spaces a fence ends it), and the wait (what was left of the transfer, unpack).
      std::vector<double> phase_launch, phase_compute, phase_wait;
      auto overlapped_body = [&](bool record) {
        const double t0 = now();
        Waiter wait = go();
        const double t1 = now();
        pair.compute();
        Kokkos::fence();
        const double t2 = now();
        wait();
        if (!record) return;
        phase_launch.push_back(t1 - t0);
        phase_compute.push_back(t2 - t1);
        phase_wait.push_back(now() - t2);
      };
      std::vector<std::function<void()>> bodies = {pair.compute, [&]() { go()(); }, [&]() { overlapped_body(true); },
                                                   [&]() {
                                                     go()();
                                                     pair.compute();
                                                   }};
      const std::vector<int> sweep_panels = sweep ? panel_sweep : std::vector<int>{};
      const bool polled = static_cast<bool>(pair.compute_polled);
      if (polled)
        bodies.push_back([&]() {
          Waiter wait = go();
          pair.compute_polled();
          wait();
        });
      for (const int panels : sweep_panels)
        bodies.push_back([&, panels]() {
          policy.panels = panels;
          overlapped_body(false);
          policy = default_policy;
        });
      std::vector<Samples> samples;
      const std::size_t calls_before = mlacp::progress_calls();
      {
        Region r("measure");
        samples = measure_interleaved(comm, warmup, repeats, bodies);
      }
      const std::size_t polls = (mlacp::progress_calls() - calls_before) / static_cast<std::size_t>(warmup + repeats);
      const std::size_t sweep_first = polled ? 5 : 4;
      const Samples &compute = samples[0], &collective = samples[1], &overlapped = samples[2], &blocking = samples[3];
      const double tc = compute.median(), tm = collective.median(), tp = overlapped.median(), tb = blocking.median();
      Row row{label, tc, tm, tp, tb, overlap_e(tc, tm, tp), tp / std::max(tc, tm), tb / std::max(tc, tm)};
      table.push_back(row);
      const Phases ph{label, phase_median(phase_launch, warmup, comm), phase_median(phase_compute, warmup, comm),
                      phase_median(phase_wait, warmup, comm), tc};
      phases.push_back(ph);

      JsonObject pd;
      pd.str("pair", label)
          .str("mode", raw ? "transfer only (raw MPI on pre-packed buffers, polled by the library GEMM)" : "library")
          .str("compute", pair.compute_name)
          .str("collective", pair.comm_name)
          .obj("sizes", pair.sizes())
          .num("calibrated_dim", dim)
          .num("panel_rows", static_cast<double>(pair.panel_rows))
          .num("effective_panels", effective_panels(pair.panel_rows, default_policy))
          .num("progress_calls_per_round", static_cast<double>(polls))
          .samples("compute_alone", compute)
          .samples("collective_alone", collective)
          .samples("overlapped_pair", overlapped)
          .samples("blocking_sequence", blocking)
          .obj("overlapped_phases_s", JsonObject()
                                          .str("what",
                                               "per-rank medians, max over ranks: launch (pack, MPI start), "
                                               "compute with the collective in flight, wait (rest, unpack)")
                                          .num("launch", ph.launch)
                                          .num("compute_in_pair", ph.compute)
                                          .num("wait", ph.wait)
                                          .num("compute_slowdown", ph.compute / tc))
          .num("comm_over_compute", tm / tc)
          .num("E", row.e)
          .num("pair_over_max", row.pair_over_max)
          .num("blocking_over_max", row.blocking_over_max)
          .raw("within_1_5x", std::max(tc, tm) / std::min(tc, tm) <= 1.5 ? "true" : "false");
      if (polled) {
        const double t = samples[4].median();
        pd.obj("with_progress_between_kernels", JsonObject()
                                                    .str("what", "mlacp::progress() after each non-GEMM kernel too")
                                                    .samples("overlapped_pair", samples[4])
                                                    .num("E", overlap_e(tc, tm, t))
                                                    .num("pair_over_max", t / std::max(tc, tm)));
        table.push_back(
            Row{label + " +poll", tc, tm, t, tb, overlap_e(tc, tm, t), t / std::max(tc, tm), tb / std::max(tc, tm)});
      }
      if (pair.breakdown) {
        Region r("breakdown");
        pd.obj("compute_breakdown_s", pair.breakdown());
      }

      // The panel sweep: the same pair with OverlapPolicy::panels = 1 (one GEMM call: progress only before and after
      // it) .. 32, E against the same compute-alone and collective-alone medians.
      if (sweep) {
        std::vector<std::string> sweep_docs;
        std::string line = "  " + label + ":";
        for (std::size_t i = 0; i < sweep_panels.size(); ++i) {
          const Samples& sp = samples[sweep_first + i];
          mlacp::OverlapPolicy p = default_policy;
          p.panels = sweep_panels[i];
          const double e = overlap_e(tc, tm, sp.median());
          sweep_docs.push_back(JsonObject()
                                   .num("panels", sweep_panels[i])
                                   .num("effective_panels", effective_panels(pair.panel_rows, p))
                                   .samples("overlapped_pair", sp)
                                   .num("E", e)
                                   .num("pair_over_max", sp.median() / std::max(tc, tm))
                                   .text());
          line += "  p=" + std::to_string(sweep_panels[i]) + ":" + fixed(e, 2);
        }
        sweep_lines.push_back(line);
        pd.raw("panel_sweep", jlist(sweep_docs));
      }

      if (thread_experiment) {
        Region r("progress thread");
        std::vector<std::string> docs;
        policy.panels = 1;
        std::string line = "  " + label + " (panels=1 + progress thread):";
        for (const int interval : {50, 500}) {
          const auto ts = measure_interleaved(comm, warmup, repeats,
                                              {[&]() {
                                                 Waiter wait = go();
                                                 with_progress_thread(interval, pair.compute);
                                                 wait();
                                               },
                                               [&]() { with_progress_thread(interval, pair.compute); }});
          const Samples &s = ts[0], &c = ts[1];
          const double e = overlap_e(tc, tm, s.median());
          docs.push_back(JsonObject()
                             .num("interval_us", interval)
                             .samples("overlapped_pair", s)
                             .samples("compute_with_thread", c)
                             .num("E", e)
                             .num("pair_over_max", s.median() / std::max(tc, tm))
                             .text());
          line += "  " + std::to_string(interval) + "us: E=" + fixed(e, 2) + " compute x" + fixed(c.median() / tc, 2);
        }
        policy = default_policy;
        sweep_lines.push_back(line);
        pd.raw("progress_thread", jlist(docs));
      }
      // The balance sweep (library pairs only): E at the edges of the 1.5x band, compute longer (comm/compute 0.67)
      // and compute shorter (1.5), each calibrated and measured as above with its own compute and collective alone.
      if (ratio_sweep && !raw) {
        Region r("balance sweep");
        std::vector<std::string> docs;
        std::string line = "  " + label + ":  1.00:" + fixed(row.e, 2);
        for (const double target : {1.0 / 1.5, 1.5}) {
          calibrate(target, dim);
          const auto ts = measure_interleaved(comm, warmup, repeats,
                                              {pair.compute, [&]() { go()(); }, [&]() { overlapped_body(false); }});
          const double c = ts[0].median(), m = ts[1].median(), pt = ts[2].median();
          docs.push_back(JsonObject()
                             .num("target_comm_over_compute", target)
                             .num("comm_over_compute", m / c)
                             .samples("compute_alone", ts[0])
                             .samples("collective_alone", ts[1])
                             .samples("overlapped_pair", ts[2])
                             .num("E", overlap_e(c, m, pt))
                             .num("pair_over_max", pt / std::max(c, m))
                             .text());
          line += "  " + fixed(m / c, 2) + ":" + fixed(overlap_e(c, m, pt), 2);
        }
        balance_lines.push_back(line);
        pd.raw("balance_sweep", jlist(docs));
      }
      pair_docs.push_back(pd.text());
    }
  doc.raw("pairs", jlist(pair_docs));

  if (rank == 0) {
    std::cout << "mlacp-perf-overlap: P=" << P << " transport=" << o.transport << " rate=" << o.rate
              << " repeats=" << repeats << " (median of max over ranks), panels=" << default_policy.panels
              << " min_panel_rows=" << default_policy.min_panel_rows << "\n";
    std::cout << std::left << std::setw(54) << "pair" << std::right << std::setw(10) << "compute" << std::setw(10)
              << "comm" << std::setw(10) << "pair" << std::setw(10) << "blocking" << std::setw(8) << "E"
              << std::setw(11) << "pair/max" << std::setw(11) << "comm/comp"
              << "\n";
    for (const Row& r : table)
      std::cout << std::left << std::setw(54) << r.label << std::right << std::setw(8) << ms(r.compute) << "ms"
                << std::setw(8) << ms(r.comm) << "ms" << std::setw(8) << ms(r.pair) << "ms" << std::setw(8)
                << ms(r.blocking) << "ms" << std::setw(8) << fixed(r.e, 2) << std::setw(11) << fixed(r.pair_over_max, 3)
                << std::setw(11) << fixed(r.comm / r.compute, 2) << "\n";
    std::cout << "Where the overlapped pair's time goes (per-rank medians, max over ranks):\n"
              << std::left << std::setw(54) << "pair" << std::right << std::setw(10) << "launch" << std::setw(12)
              << "compute" << std::setw(10) << "wait" << std::setw(18) << "compute/alone\n";
    for (const Phases& p : phases)
      std::cout << std::left << std::setw(54) << p.label << std::right << std::setw(8) << ms(p.launch) << "ms"
                << std::setw(10) << ms(p.compute) << "ms" << std::setw(8) << ms(p.wait) << "ms" << std::setw(17)
                << fixed(p.compute / p.compute_alone, 3) << "\n";
    if (!sweep_lines.empty()) {
      std::cout << "E by OverlapPolicy::panels (1 = one GEMM call, no polling inside it):\n";
      for (const auto& l : sweep_lines) std::cout << l << "\n";
    }
    if (!balance_lines.empty()) {
      std::cout << "E by comm/compute (measured ratio:E; the band of the targets is 0.67..1.5):\n";
      for (const auto& l : balance_lines) std::cout << l << "\n";
    }
    write_json(o.json, doc.text());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool thread_multiple = false;
  for (int i = 1; i < argc; ++i) thread_multiple |= std::string(argv[i]) == "--progress-thread";
  return mlacp::perf::run_main(argc, argv, usage, run, thread_multiple);
}
