// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-bf16-gemm: the bf16 GEMM's backends (bf16_gemm.hpp) at the MLA layer's GEMM shapes, each against the float
// GEMM (compat::gemm, the BLAS TPL on host) of the same shape in the same run: the ratio bf16 time / float time, median
// of the repeats (the bodies interleaved round by round, so that a load change on a shared machine affects them
// alike), and the backend `auto` picks for the shape.
//
// Shapes (issue 20's DeepSeek-like shape, B=1 S=1024 D=1024 H=8 dn=128 dr=64 dv=128 R=512 at P=2: s = S/P = 512 local
// tokens, h = H/P = 4 local heads), in nn.Linear form y = x W^T, dX = dY W, dW += dY^T X (linear.hpp):
//   q      x [s, D],   W [H(dn+dr), D]
//   kv_a   x [s, D],   W [R+dr, D]
//   w_kvb  x [S, R],   W [h(dn+dv), R]     (the latent strategy's expansion, over all S tokens)
//   w_o    x [s, H dv], W [D, H dv]
// each as forward (N,T, beta 0), dgrad (N,N, beta 0) and wgrad (T,N, beta 1).
//
// Threads come from the environment, as the layer gets them: OPENBLAS_NUM_THREADS for the BLAS TPL and OMP_NUM_THREADS
// for oneDNN (Debian's libdnnl 2.6 uses OpenMP); ONEDNN_MAX_CPU_ISA=AVX2 (or DNNL_MAX_CPU_ISA) caps oneDNN's
// instruction set, emulating a CPU without bf16 instructions. The CPU's model and bf16 flags, those variables and the
// instruction set oneDNN dispatches to are printed and written to the JSON.
//
//   mpirun -n 1 mlacp-perf-bf16-gemm [--quick] [--json FILE] [--repeats N] [--warmup N] [--tokens s] [--seq S]
#include <mpi.h>
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/compat.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "perf_common.hpp"

namespace {

using namespace mlacp::perf;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using mlacp::bf16;
using mlacp::Bf16GemmBackend;
template <class T>
using Mat = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;

const char* usage =
    "usage: mlacp-perf-bf16-gemm [--quick] [--json FILE] [--repeats N] [--warmup N] [--tokens s] [--seq S]\n"
    "  threads and oneDNN's ISA from OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, ONEDNN_MAX_CPU_ISA\n";

struct Shape {
  std::string gemm, form;
  bool ta, tb;
  std::int64_t m, n, k;
  float beta;
};

/// The layer's three GEMM forms for a linear of x [rows, in] and W [out, in].
void add_linear(std::vector<Shape>& out, const std::string& name, std::int64_t rows, std::int64_t in,
                std::int64_t out_features) {
  out.push_back({name, "forward", false, true, rows, out_features, in, 0.0f});  // y = x W^T
  out.push_back({name, "dgrad", false, false, rows, in, out_features, 0.0f});   // dX = dY W
  out.push_back({name, "wgrad", true, false, out_features, in, rows, 1.0f});    // dW += dY^T X
}

std::string env_or(const char* name, const char* fallback = "(unset)") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

template <class T>
void fill(const Mat<T>& v, std::uint32_t seed) {
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (std::size_t i = 0; i < h.span(); ++i) h.data()[i] = static_cast<T>(dist(gen));
  Kokkos::deep_copy(v, h);
}

int run(int argc, char** argv) {
  const Options o = parse_options(argc, argv, {"--tokens", "--seq"});
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int repeats = o.repeats_or(2, 9);
  const int warmup = o.quick ? 1 : o.warmup;

  // DeepSeek-like shape at P = 2.
  const std::int64_t S = o.get_int("seq", 1024), s = o.get_int("tokens", static_cast<int>(S / 2));
  const std::int64_t D = 1024, H = 8, dn = 128, dr = 64, dv = 128, R = 512, h = H / 2;
  std::vector<Shape> shapes;
  add_linear(shapes, "q", s, D, H * (dn + dr));
  add_linear(shapes, "kv_a", s, D, R + dr);
  add_linear(shapes, "w_kvb", S, R, h * (dn + dv));
  add_linear(shapes, "w_o", s, H * dv, D);

  const auto [model, flags] = cpu_model_and_flags();
  const std::string isa = mlacp::onednn_cpu_isa();
  const std::vector<std::pair<std::string, std::string>> env = {
      {"OPENBLAS_NUM_THREADS", env_or("OPENBLAS_NUM_THREADS")},
      {"OMP_NUM_THREADS", env_or("OMP_NUM_THREADS")},
      {"ONEDNN_MAX_CPU_ISA", env_or("ONEDNN_MAX_CPU_ISA")},
      {"DNNL_MAX_CPU_ISA", env_or("DNNL_MAX_CPU_ISA")},
      {"MLACP_BF16_GEMM", env_or("MLACP_BF16_GEMM")}};
  const auto backends = mlacp::Bf16GemmPlan<Space>::available_backends();
  if (rank == 0) {
    std::cout << "CPU: " << model << "\nCPU flags: " << flags << "\noneDNN ISA: " << isa << "\nenvironment:";
    for (const auto& [k, v] : env) std::cout << ' ' << k << '=' << v;
    std::cout << "\nbackends:";
    for (const auto b : backends) std::cout << ' ' << mlacp::bf16_gemm_backend_name(b);
    std::cout << "\nmedian of " << repeats << " (after " << warmup << " warm-up), ms; ratio = bf16 / float\n\n";
    std::cout << std::left << std::setw(7) << "gemm" << std::setw(9) << "form" << std::setw(4) << "op" << std::right
              << std::setw(6) << "m" << std::setw(6) << "n" << std::setw(6) << "k" << std::setw(10) << "float";
    for (const auto b : backends)
      std::cout << std::setw(13) << mlacp::bf16_gemm_backend_name(b) << std::setw(7) << "ratio";
    std::cout << std::setw(12) << "auto" << std::setw(10) << "GFLOP/s"
              << "  oneDNN impl\n";
  }

  Json json_rows = Json::array();
  const Space space;
  for (const auto& sh : shapes) {
    const std::int64_t ar = sh.ta ? sh.k : sh.m, ac = sh.ta ? sh.m : sh.k;
    const std::int64_t br = sh.tb ? sh.n : sh.k, bc = sh.tb ? sh.k : sh.n;
    Mat<float> af("af", ar, ac), bf("bf", br, bc), cf("cf", sh.m, sh.n);
    Mat<bf16> ab("ab", ar, ac), bb("bb", br, bc);
    Mat<float> cb("cb", sh.m, sh.n);
    fill(af, 1);
    fill(bf, 2);
    fill(ab, 1);
    fill(bb, 2);
    const char* ta = sh.ta ? "T" : "N";
    const char* tb = sh.tb ? "T" : "N";
    // wgrad accumulates (beta 1) into C over the iterations, as the layer does over micro-batches.
    mlacp::Bf16GemmPlan<Space> plan(Bf16GemmBackend::automatic);
    std::vector<std::function<void()>> bodies;
    bodies.emplace_back([&] {
      mlacp::compat::gemm(space, ta, tb, 1.0f, af, bf, sh.beta, cf);
      space.fence();
    });
    for (const auto b : backends)
      bodies.emplace_back([&, b] {
        plan.gemm_with(b, space, ta, tb, 1.0f, ab, bb, sh.beta, cb);
        space.fence();
      });
    const auto samples = measure_interleaved(MPI_COMM_WORLD, warmup, repeats, bodies);
    mlacp::Bf16GemmPlan<Space> chooser(Bf16GemmBackend::automatic);
    chooser.gemm(space, ta, tb, 1.0f, ab, bb, sh.beta, cb);
    space.fence();
    const auto& choice = chooser.choices().begin()->second;
    const std::string impl = plan.onednn_impl(ta, tb, 1.0f, ab, bb, sh.beta, cb);
    const double flops = 2.0 * double(sh.m) * double(sh.n) * double(sh.k);
    const double float_s = samples[0].median();
    double best = float_s;
    JsonObject times;
    for (std::size_t i = 0; i < backends.size(); ++i) {
      times.obj(mlacp::bf16_gemm_backend_name(backends[i]),
                JsonObject()
                    .num("median_s", samples[i + 1].median())
                    .num("ratio_to_float", samples[i + 1].median() / float_s)
                    .set("times_s", samples[i + 1].times));
      best = std::min(best, samples[i + 1].median());
    }
    if (rank == 0) {
      std::cout << std::left << std::setw(7) << sh.gemm << std::setw(9) << sh.form << std::setw(4)
                << (std::string(ta) + tb) << std::right << std::setw(6) << sh.m << std::setw(6) << sh.n << std::setw(6)
                << sh.k << std::setw(10) << ms(float_s, 3);
      for (std::size_t i = 0; i < backends.size(); ++i)
        std::cout << std::setw(13) << ms(samples[i + 1].median(), 3) << std::setw(7)
                  << fixed(samples[i + 1].median() / float_s, 2);
      std::cout << std::setw(12) << mlacp::bf16_gemm_backend_name(choice.backend) << std::setw(10)
                << fixed(flops / best * 1e-9, 1) << "  " << (impl.empty() ? "none (onednn ran float_blas)" : impl)
                << "\n";
    }
    JsonObject auto_timings;
    for (const auto& [b, t] : choice.timings) auto_timings.num(mlacp::bf16_gemm_backend_name(b), t);
    json_rows.push_back(JsonObject()
                            .str("gemm", sh.gemm)
                            .str("form", sh.form)
                            .str("op", std::string(ta) + tb)
                            .num("m", double(sh.m))
                            .num("n", double(sh.n))
                            .num("k", double(sh.k))
                            .num("beta", sh.beta)
                            .num("flops", flops)
                            .samples("float", samples[0])
                            .obj("bf16", times)
                            .str("auto_choice", mlacp::bf16_gemm_backend_name(choice.backend))
                            .obj("auto_choice_timings_s", auto_timings)
                            .str("onednn_impl", impl)
                            .json());
  }
  JsonObject doc = header("mlacp-perf-bf16-gemm", o, size, repeats);
  JsonObject environment;
  for (const auto& [k, v] : env) environment.str(k, v);
  doc.str("cpu_model", model).str("cpu_flags", flags).str("onednn_isa", isa).obj("environment", environment);
  doc.set("results", json_rows);
  if (rank == 0) write_json(o.json, doc.json());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_main(argc, argv, usage, run); }
