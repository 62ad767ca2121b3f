// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-efficiency: what mlacp's machinery costs against the plain calls underneath it.
//   GEMM efficiency: the library's weight-gradient and data-gradient GEMMs (detail::linear_wgrad / linear_dgrad, the
//     gemm_with_progress path), run while a collective is pending so that they are split into OverlapPolicy panels
//     with mlacp::progress() between them, against one direct KokkosBlas::gemm call on the same shapes with nothing
//     pending. Efficiency = T_direct / T_library (target >= 0.95).
//   Exchange efficiency: launch_all_to_all + wait (pack kernel, MPI_Ialltoall, MPI_Wait, unpack kernel) against a raw
//     MPI_Alltoall of pre-packed contiguous buffers of the same bytes. Efficiency = T_raw / T_library (target >= 0.85).
//     The library's time is also split into launch (allocation, pack, MPI start) and wait (transfer, unpack).
//   Reduce-scatter: launch_reduce_scatter + wait along the tokens of [1, S, C] with the mesh's two algorithms
//     (pairwise: one message per peer, summed in rank order as they arrive, the default; mpi:
//     MPI_Ireduce_scatter_block) against a raw
//     MPI_Reduce_scatter_block of the same buffer.
//   Transfer CPU cost: what an 8 MiB-per-rank all-to-all costs the CPUs while nobody computes: launched, then
//     tested every 1 ms (sleeping in between, as often as the panelled GEMMs poll) until done, many times back to
//     back; reports this thread's CPU time and the machine's busy time (/proc/stat, every process and the kernel's
//     network work) per transfer. On a loopback "link" the kernel's TCP stack runs on the compute cores, so this is
//     what the overlapped compute loses.
//
//   mpirun -n 2 mlacp-perf-efficiency [--quick] [--json FILE] [--repeats N] [--transport-label STR] [--rate-label STR]
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/mla/kernels/detail/linear.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <ctime>
#include <fstream>
#include <thread>

#include "perf_common.hpp"

namespace {

using namespace mlacp::perf;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using T = double;
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
using Tensor4 = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

// Busy time of the whole machine so far, in seconds, from /proc/stat (user, nice, system, irq, softirq, steal);
// NAN where there is no /proc/stat.
double machine_busy_s() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  double v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (!(stat >> cpu) || cpu != "cpu") return NAN;
  for (double& x : v) stat >> x;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / ticks;
}

double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

const char* usage =
    "usage: mlacp-perf-efficiency [--quick] [--json FILE] [--repeats N] [--warmup N] [--transport-label STR]\n"
    "                             [--rate-label STR]\n";

struct GemmShape {
  std::string name;
  char kind;  // 'w': dW[out, in] += dy[N, out]^T x[N, in]; 'd': dx[N, in] = dy[N, out] W[out, in]
  int n, out, in;
};

int run(int argc, char** argv) {
  const Options o = parse_options(argc, argv, {});
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mesh.set_checked(false);
  const int P = mesh.size(), rank = mesh.rank();
  const MPI_Comm comm = mesh.comm();
  const int repeats = o.repeats_or(3, 11), warmup = o.warmup;
  const Space space;
  auto& policy = mlacp::overlap_policy();
  const mlacp::OverlapPolicy default_policy = policy;
  JsonObject doc = header("mlacp-perf-efficiency", o, P, repeats);
  doc.obj("default_policy", JsonObject()
                                .num("panels", default_policy.panels)
                                .num("min_panel_rows", static_cast<double>(default_policy.min_panel_rows)));

  // ---- GEMM efficiency --------------------------------------------------------------------------------------------
  // The shapes of the overlapped GEMMs of mlacp-perf-overlap at its full size (N = 8192 sequence rows), and two
  // data-gradient GEMMs (panels are row blocks of dy and dx there).
  const int n = o.quick ? 2048 : 8192;
  const std::vector<GemmShape> shapes = {{"w_o wgrad", 'w', n, 512, 128},
                                         {"w_kvb wgrad", 'w', n, 1024, 120},
                                         {"w_kva wgrad", 'w', n / 2, 152, 256},
                                         {"w_kvb dgrad", 'd', n, 192, 120},
                                         {"w_o dgrad", 'd', n, 512, 128}};
  const std::vector<int> panel_counts = o.quick ? std::vector<int>{8} : std::vector<int>{8, 16, 32};
  // A small collective kept pending during the library's GEMM, polled whatever its size and placement (OverlapPolicy
  // would not poll it), so that the GEMM runs in panels and polls between them.
  Tensor4 token("token", 1, P, P, 1);
  Json gemm_docs = Json::array();
  std::vector<std::string> gemm_lines;
  double worst_default = 1e9;
  {
    Region region("gemm efficiency");
    for (const GemmShape& g : shapes) {
      Matrix dy("dy", g.n, g.out), x("x", g.n, g.in), w("w", g.out, g.in), dw("dw", g.out, g.in), dx("dx", g.n, g.in);
      mlacp::testing::synthetic::fill(dy, 41, 1.0);
      mlacp::testing::synthetic::fill(x, 42, 1.0);
      mlacp::testing::synthetic::fill(w, 43, 0.1);
      auto direct = [&]() {
        if (g.kind == 'w')
          mlacp::compat::gemm(space, "T", "N", T(1), dy, x, T(1), dw);
        else
          mlacp::compat::gemm(space, "N", "N", T(1), dy, w, T(0), dx);
      };
      auto library = [&](int panels) {
        policy.panels = panels;
        policy.poll_shared_memory = true;  // the token is small and may move through shared memory: polled all the
        policy.min_poll_bytes = 0;         // same, since what is measured is the panelled GEMM itself
        auto pending = mlacp::launch_all_to_all(space, token, 1, 2, mesh, "pending token");
        if (g.kind == 'w')
          mlacp::detail::linear_wgrad(space, dy, x, dw);
        else
          mlacp::detail::linear_dgrad(space, dy, w, T(0), dx);
        pending.wait();
        policy = default_policy;
      };
      std::vector<std::function<void()>> bodies = {direct};
      for (const int p : panel_counts) bodies.push_back([&library, p]() { library(p); });
      const auto samples = measure_interleaved(comm, warmup, repeats, bodies);
      const double td = samples[0].median();
      const std::int64_t rows = g.n;
      JsonObject gd;
      gd.str("gemm", g.name)
          .str("form", g.kind == 'w' ? "dW[out,in] += dy[N,out]^T x[N,in]" : "dx[N,in] = dy[N,out] W[out,in]")
          .num("N", g.n)
          .num("out", g.out)
          .num("in", g.in)
          .num("flops", 2.0 * g.n * g.out * g.in)
          .samples("direct_blas", samples[0])
          .num("direct_gflops", 2.0 * g.n * g.out * g.in / td * 1e-9);
      Json per_panels = Json::array();
      std::string line = "  " + g.name + " [N=" + std::to_string(g.n) + ", out=" + std::to_string(g.out) +
                         ", in=" + std::to_string(g.in) + "] direct " + ms(td) + "ms (" +
                         fixed(2.0 * g.n * g.out * g.in / td * 1e-9, 1) + " GFLOP/s);";
      for (std::size_t i = 0; i < panel_counts.size(); ++i) {
        const double eff = td / samples[1 + i].median();
        const int effective = static_cast<int>(std::clamp<std::int64_t>(
            rows / std::max<std::int64_t>(1, default_policy.min_panel_rows), 1, panel_counts[i]));
        per_panels.push_back(JsonObject()
                                 .num("panels", panel_counts[i])
                                 .num("effective_panels", effective)
                                 .samples("library", samples[1 + i])
                                 .num("efficiency", eff)
                                 .json());
        line += " p=" + std::to_string(panel_counts[i]) + "(" + std::to_string(effective) + "): " + fixed(eff, 3);
        if (panel_counts[i] == default_policy.panels) worst_default = std::min(worst_default, eff);
      }
      gd.set("library_panelled", per_panels);
      gemm_docs.push_back(gd.json());
      gemm_lines.push_back(line);
    }
  }
  doc.set("gemm_efficiency", gemm_docs);
  doc.num("gemm_efficiency_worst_at_default_panels", worst_default);

  // ---- exchange efficiency ----------------------------------------------------------------------------------------
  // [1, s, H, d] token-local -> head-local (gather 1, scatter 2), the dO all-to-all's layout, at two sizes.
  Json exchange_docs = Json::array();
  std::vector<std::string> exchange_lines;
  double worst_exchange = 1e9;
  {
    Region region("exchange efficiency");
    const std::vector<int> rows_list = o.quick ? std::vector<int>{1024} : std::vector<int>{1024, 8192};
    for (const int rows : rows_list) {
      const int H = 8 * P, d = std::max(1, 128 / H);
      Tensor4 view("exchange in", 1, rows, H, d);
      mlacp::testing::synthetic::fill(view, 51, 1.0);
      const std::size_t total = view.size(), count = total / static_cast<std::size_t>(P);
      std::vector<T> send(total, 1.0), recv(total, 0.0);
      double launch_s = 0, wait_s = 0;
      int lib_runs = 0;
      auto library = [&]() {
        const double t0 = now();
        auto handle = mlacp::launch_all_to_all(space, view, 1, 2, mesh, "exchange");
        const double t1 = now();
        auto result = handle.wait();
        space.fence();
        const double t2 = now();
        launch_s += t1 - t0;
        wait_s += t2 - t1;
        ++lib_runs;
      };
      auto raw = [&]() {
        MPI_Alltoall(send.data(), static_cast<int>(count), MPI_DOUBLE, recv.data(), static_cast<int>(count), MPI_DOUBLE,
                     comm);
      };
      auto raw_nonblocking = [&]() {
        MPI_Request request;
        MPI_Ialltoall(send.data(), static_cast<int>(count), MPI_DOUBLE, recv.data(), static_cast<int>(count),
                      MPI_DOUBLE, comm, &request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
      };
      const auto samples = measure_interleaved(comm, warmup, repeats, {library, raw, raw_nonblocking});
      const double tl = samples[0].median(), tr = samples[1].median(), tn = samples[2].median();
      const double eff = tr / tl;
      worst_exchange = std::min(worst_exchange, eff);
      exchange_docs.push_back(JsonObject()
                                  .num("s", rows)
                                  .num("H", H)
                                  .num("d", d)
                                  .num("bytes_per_rank", 8.0 * static_cast<double>(total))
                                  .samples("library_launch_wait", samples[0])
                                  .samples("raw_mpi_alltoall", samples[1])
                                  .samples("raw_mpi_ialltoall_wait", samples[2])
                                  .num("library_mean_launch_s", launch_s / lib_runs)
                                  .num("library_mean_wait_s", wait_s / lib_runs)
                                  .num("efficiency", eff)
                                  .num("efficiency_vs_ialltoall", tn / tl)
                                  .json());
      exchange_lines.push_back("  all-to-all " + fixed(8.0 * static_cast<double>(total) / 1048576.0, 1) +
                               " MiB/rank: library " + ms(tl) + "ms (launch " + ms(launch_s / lib_runs) +
                               "ms incl. pack, wait " + ms(wait_s / lib_runs) + "ms incl. unpack), raw MPI_Alltoall " +
                               ms(tr) + "ms, raw Ialltoall+Wait " + ms(tn) + "ms: efficiency " + fixed(eff, 3));
    }
  }
  doc.set("exchange_efficiency", exchange_docs);
  doc.num("exchange_efficiency_worst", worst_exchange);

  // ---- reduce-scatter algorithms ----------------------------------------------------------------------------------
  Json rs_docs = Json::array();
  std::vector<std::string> rs_lines;
  {
    Region region("reduce-scatter algorithms");
    const int rows = (o.quick ? 1024 : 8192) / P * P, C = 128;  // the scattered rows divisible by P
    Tensor3 view("reduce-scatter in", 1, rows, C);
    mlacp::testing::synthetic::fill(view, 52, 1.0);
    const std::size_t total = view.size(), count = total / static_cast<std::size_t>(P);
    std::vector<T> send(total, 1.0), recv(count, 0.0);
    mlacp::Mesh library_mesh(comm, mlacp::Mesh::Ownership::borrow);
    library_mesh.set_checked(false);
    library_mesh.set_reduce_scatter_algorithm(mlacp::ReduceScatterAlgorithm::mpi);
    const auto samples = measure_interleaved(
        comm, warmup, repeats,
        {[&]() { mlacp::launch_reduce_scatter(space, view, 1, mesh, "pairwise").wait(); },
         [&]() { mlacp::launch_reduce_scatter(space, view, 1, library_mesh, "mpi").wait(); },
         [&]() {
           MPI_Reduce_scatter_block(send.data(), recv.data(), static_cast<int>(count), MPI_DOUBLE, MPI_SUM, comm);
         }});
    const double tp = samples[0].median(), tm = samples[1].median(), tr = samples[2].median();
    rs_docs.push_back(JsonObject()
                          .num("S", rows)
                          .num("C", C)
                          .num("bytes_per_rank", 8.0 * static_cast<double>(total))
                          .samples("library_pairwise", samples[0])
                          .samples("library_mpi", samples[1])
                          .samples("raw_mpi_reduce_scatter_block", samples[2])
                          .num("raw_over_pairwise", tr / tp)
                          .num("raw_over_library_mpi", tr / tm)
                          .json());
    rs_lines.push_back("  " + fixed(8.0 * static_cast<double>(total) / 1048576.0, 1) + " MiB/rank: pairwise " + ms(tp) +
                       "ms, library with MPI_Ireduce_scatter_block " + ms(tm) + "ms, raw MPI_Reduce_scatter_block " +
                       ms(tr) + "ms: raw/pairwise " + fixed(tr / tp, 2) + ", raw/library-mpi " + fixed(tr / tm, 2));
  }
  doc.set("reduce_scatter", rs_docs);

  // ---- transfer CPU cost ------------------------------------------------------------------------------------------
  std::string cpu_line;
  {
    Region region("transfer cpu cost");
    const int rows = o.quick ? 1024 : 8192, H = 8 * P, d = std::max(1, 128 / H);
    const int transfers = o.quick ? 4 : 24;
    Kokkos::View<T*****, Kokkos::LayoutRight, Mem> blocks("cpu cost in", P, 1, rows, H / P, d);  // sent as it is
    mlacp::testing::synthetic::fill(blocks, 53, 1.0);
    auto one = [&]() {
      auto handle = mlacp::launch_all_to_all(space, blocks, 2, 0, mesh, "cpu cost");
      while (!handle.test()) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // test() polls MPI
      handle.wait();
    };
    one();
    MPI_Barrier(comm);
    const double busy0 = machine_busy_s(), cpu0 = thread_cpu_s(), t0 = now();
    for (int i = 0; i < transfers; ++i) one();
    double cpu = (thread_cpu_s() - cpu0) / transfers;
    MPI_Barrier(comm);
    const double wall = (now() - t0) / transfers, busy = (machine_busy_s() - busy0) / transfers;
    MPI_Allreduce(MPI_IN_PLACE, &cpu, 1, MPI_DOUBLE, MPI_MAX, comm);
    const double bytes = 8.0 * static_cast<double>(blocks.size());
    doc.obj("transfer_cpu_cost",
            JsonObject()
                .str("what",
                     "all-to-all sent from per-rank blocks, polled every 1 ms, nobody "
                     "computing; per transfer")
                .num("bytes_per_rank", bytes)
                .num("transfers", transfers)
                .num("wall_s", wall)
                .num("thread_cpu_s_max_over_ranks", cpu)
                .num("machine_busy_s", busy)
                .num("hardware_concurrency", static_cast<double>(std::thread::hardware_concurrency()))
                .num("machine_busy_per_rank_over_wall", busy / P / wall));
    cpu_line = "  " + fixed(bytes / 1048576.0, 1) + " MiB/rank all-to-all, polled every 1 ms: wall " + ms(wall) +
               "ms; CPU in this rank's MPI calls " + ms(cpu) + "ms (max over ranks); machine busy " + ms(busy) +
               "ms (" + ms(busy / P) + "ms per rank: " + fixed(100.0 * busy / P / wall, 1) +
               "% of the transfer's time)";
  }

  if (rank == 0) {
    std::cout << "mlacp-perf-efficiency: P=" << P << " transport=" << o.transport << " rate=" << o.rate
              << " repeats=" << repeats << " (median of max over ranks)\n";
    std::cout
        << "GEMM efficiency (direct BLAS / library panelled with a collective pending; p=requested(effective)):\n";
    for (const auto& l : gemm_lines) std::cout << l << "\n";
    std::cout << "  worst at the default panels (" << default_policy.panels << "): " << fixed(worst_default, 3)
              << " (target >= 0.95)\n";
    std::cout << "exchange efficiency (raw MPI_Alltoall of pre-packed buffers / launch_all_to_all + wait):\n";
    for (const auto& l : exchange_lines) std::cout << l << "\n";
    std::cout << "  worst: " << fixed(worst_exchange, 3) << " (target >= 0.85)\n";
    std::cout << "reduce-scatter along the tokens (library algorithms against the raw blocking call):\n";
    for (const auto& l : rs_lines) std::cout << l << "\n";
    std::cout << "transfer CPU cost (the machine's busy time while only the transfer runs; all ranks share it):\n"
              << cpu_line << "\n";
    write_json(o.json, doc.json());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return mlacp::perf::run_main(argc, argv, usage, run); }
