// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-gemm-shapes: where the layer's forward + backward loses time against the machine's GEMM rate (issue 23,
// "the last 30%"), split into what the BLAS costs on the layer's GEMM shapes and what the library adds.
//
// For each configuration (shape, strategy, value type, q-LoRA rank), at the run's P:
// 1. the layer's forward + backward, uninstrumented, median of the iterations (max over ranks): the layer time;
// 2. the same iterations under an in-process Kokkos Tools profiler that attributes every instant of the rank's time to
//    one category, innermost first: a GEMM of the layer (the region detail::gemm_with_progress opens,
//    "mlacp::gemm NT 4096x512x1024 float beta=0", panels included), the attention core (the "attention fprop" and
//    "attention bprop" phases, their BLAS tiles and kernels included), a communication wait (the "mlacp::wait <name>"
//    region of AsyncCollective::wait, less the unpack kernels it runs), a memory-bound kernel (any other Kokkos kernel:
//    RMSNorm, RoPE, packing, conversions, bias sums; by label), or the rest (host code, MPI launches and progress,
//    allocations; by the enclosing ComputePhase). Deep copies count as memory-bound kernels. The profiler fences at
//    every boundary (a host execution space: cheap), so its total is a little above the layer time;
// 3. each distinct GEMM shape alone: the same detail::gemm_with_progress call (no collective pending: one BLAS call),
//    fresh operands, warm, on every rank at once as the layer runs them, median per call over >= --alone-ms of repeats:
//    the CPU's ceiling for that shape;
// and, once per value type, the machine's square-GEMM rate (--square N, N x N x N, NT) as the reference rate.
//
// Per shape: calls per iteration, layer time, alone time, layer/alone, GFLOP/s alone, alone rate / square rate.
// Totals: the layer's FLOPs per rank (mlacp/mla/flop_count.hpp) / square rate = the limit; time / limit; and the
// breakdown of the profiled time in units of the limit: GEMMs alone (what the BLAS costs on these shapes), GEMM
// overhead in the layer (layer GEMM time - alone: panels, progress polls, cache state), attention core, memory-bound
// kernels, waits, rest. Times are per iteration and per rank, averaged over the ranks.
//
// The hook's cost: gemm_with_progress on a 2x2x2 GEMM with no tool, and with an empty region callback installed (the
// region name built and pushed), so that the report shows that an unprofiled run does not pay the name.
//
//   mpirun -n 2 mlacp-perf-gemm-shapes [--quick] [--json FILE] [--shapes block,deepseek] [--strategies latent,expanded]
//                                      [--dtypes float,double] [--q-lora 0,1536] [--iters N] [--alone-ms MS]
//                                      [--square N]
#include <mpi.h>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/panelled_gemm.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <unordered_map>

#include "perf_common.hpp"

namespace {

using namespace mlacp::perf;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

const char* usage =
    "usage: mlacp-perf-gemm-shapes [--quick] [--json FILE] [--repeats N] [--warmup N] [--shapes block,deepseek]\n"
    "                              [--strategies latent,expanded] [--dtypes float,double] [--q-lora 0,1536]\n"
    "                              [--iters N] [--alone-ms MS] [--square N]\n";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// ---- CPU facts ------------------------------------------------------------------------------------------------------

// ---- the profiler ---------------------------------------------------------------------------------------------------
// Kokkos Tools callbacks (C function pointers) over one process-wide state. A stack of categories: every boundary
// fences, charges the time since the previous boundary to the innermost category, then pushes or pops.

enum class Category { rest, gemm, attention, wait, kernel };

struct Frame {
  Category category;
  std::string key;  // the GEMM's shape or the kernel's label
};

struct Profile {
  std::map<std::string, double> gemm_s, kernel_s, rest_by_phase_s;
  std::map<std::string, long> gemm_calls;
  double attention_s = 0, wait_s = 0, rest_s = 0;
  double total_s = 0;
};

struct ProfilerState {
  bool on = false;
  std::vector<Frame> stack;
  std::vector<bool> region_pushed;  // per open region: whether it pushed a category
  std::vector<std::string> phases;  // the open regions that are no category (ComputePhase names): where rest is spent
  std::vector<bool> deep_copy_pushed;
  std::vector<std::uint64_t> kernel_pushed;
  std::uint64_t next_kernel = 1;
  double last = 0;
  Profile profile;
};
ProfilerState& state() {
  static ProfilerState s;
  return s;
}

void charge(ProfilerState& s) {
  Kokkos::fence();
  const double t = now();
  const double dt = t - s.last;
  s.last = t;
  const Frame& top = s.stack.back();
  switch (top.category) {
    case Category::gemm:
      s.profile.gemm_s[top.key] += dt;
      break;
    case Category::attention:
      s.profile.attention_s += dt;
      break;
    case Category::wait:
      s.profile.wait_s += dt;
      break;
    case Category::kernel:
      s.profile.kernel_s[top.key] += dt;
      break;
    case Category::rest:
      s.profile.rest_s += dt;
      s.profile.rest_by_phase_s[s.phases.empty() ? "(between phases)" : s.phases.back()] += dt;
      break;
  }
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

void on_push_region(const char* name) {
  auto& s = state();
  const std::string n = name;
  Category c = Category::rest;
  std::string key;
  const Category top = s.stack.back().category;
  // GEMMs and the attention core keep what runs inside them; a wait keeps the MPI wait, not the unpack kernels.
  if (top != Category::gemm && top != Category::attention) {
    if (starts_with(n, "mlacp::gemm ")) {
      c = Category::gemm;
      key = n.substr(12);
      ++s.profile.gemm_calls[key];
    } else if (n == std::string("mlacp::") + mlacp::names::attention_fprop ||
               n == std::string("mlacp::") + mlacp::names::attention_bprop) {
      c = Category::attention;
    } else if (starts_with(n, "mlacp::wait ")) {
      c = Category::wait;
    }
  }
  const bool push = c != Category::rest;
  s.region_pushed.push_back(push);
  if (!push) {
    if (top == Category::rest) charge(s);  // the rest before the phase is its enclosing phase's
    s.phases.push_back(n);
    return;
  }
  charge(s);
  s.stack.push_back({c, key});
}

void on_pop_region() {
  auto& s = state();
  if (s.region_pushed.empty()) return;
  const bool pushed = s.region_pushed.back();
  s.region_pushed.pop_back();
  if (!pushed) {
    if (s.stack.back().category == Category::rest) charge(s);
    if (!s.phases.empty()) s.phases.pop_back();
    return;
  }
  charge(s);
  s.stack.pop_back();
}

void on_begin_kernel(const char* name, std::uint32_t, std::uint64_t* id) {
  auto& s = state();
  *id = s.next_kernel++;
  const Category top = s.stack.back().category;
  if (top == Category::gemm || top == Category::attention) return;
  charge(s);
  s.stack.push_back({Category::kernel, name});
  s.kernel_pushed.push_back(*id);
}

void on_end_kernel(std::uint64_t id) {
  auto& s = state();
  if (s.kernel_pushed.empty() || s.kernel_pushed.back() != id) return;
  s.kernel_pushed.pop_back();
  charge(s);
  s.stack.pop_back();
}

// A deep copy is memory-bound work like a kernel (labelled by its destination), except inside a GEMM or the core.
void on_begin_deep_copy(mlacp::compat::tools::space_handle, const char* dst, const void*,
                        mlacp::compat::tools::space_handle, const char*, const void*, std::uint64_t) {
  auto& s = state();
  const Category top = s.stack.back().category;
  const bool push = top != Category::gemm && top != Category::attention;
  s.deep_copy_pushed.push_back(push);
  if (!push) return;
  charge(s);
  s.stack.push_back({Category::kernel, std::string("deep_copy -> ") + dst});
}

void on_end_deep_copy() {
  auto& s = state();
  if (s.deep_copy_pushed.empty()) return;
  const bool pushed = s.deep_copy_pushed.back();
  s.deep_copy_pushed.pop_back();
  if (!pushed) return;
  charge(s);
  s.stack.pop_back();
}

// Installs the callbacks for its lifetime (restoring whatever was installed before) and collects one Profile.
class Profiler {
 public:
  Profiler() : saved_(mlacp::compat::tools::current_callbacks()) {
    auto& s = state();
    s = ProfilerState();
    s.stack.push_back({Category::rest, ""});
    mlacp::compat::tools::set_push_region_callback(on_push_region);
    mlacp::compat::tools::set_pop_region_callback(on_pop_region);
    mlacp::compat::tools::set_kernel_callbacks(on_begin_kernel, on_end_kernel);
    mlacp::compat::tools::set_deep_copy_callbacks(on_begin_deep_copy, on_end_deep_copy);
  }
  ~Profiler() { mlacp::compat::tools::set_callbacks(saved_); }
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;
  void start() {
    Kokkos::fence();
    state().last = now();
    start_ = state().last;
  }
  void stop() {
    charge(state());
    state().profile.total_s += now() - start_;
  }
  const Profile& profile() const { return state().profile; }

 private:
  mlacp::compat::tools::callbacks saved_;
  double start_ = 0;
};

// ---- GEMM shapes ----------------------------------------------------------------------------------------------------

struct Shape {
  char trans_a = 'N', trans_b = 'N';
  long m = 0, n = 0, k = 0;
  std::string type;
  int beta = 0;
  double flops() const { return 2.0 * m * n * k; }
};

// The key gemm_region_name wrote: "NT 4096x512x1024 float beta=0".
Shape parse_shape(const std::string& key) {
  Shape s;
  char ta = 0, tb = 0, type[16] = {};
  if (std::sscanf(key.c_str(), "%c%c %ldx%ldx%ld %15s beta=%d", &ta, &tb, &s.m, &s.n, &s.k, type, &s.beta) != 7)
    throw std::runtime_error("unparsable GEMM region key '" + key + "'");
  s.trans_a = ta;
  s.trans_b = tb;
  s.type = type;
  return s;
}

double mean_over_ranks(MPI_Comm comm, double v) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, comm);
  return v / size;
}

// One GEMM of `shape` alone, through the layer's path, on every rank at once: the median time per call over enough
// repeats to fill `min_s` (the count agreed over the ranks), averaged over the ranks.
template <class T>
double time_alone(MPI_Comm comm, const Shape& shape, double min_s) {
  using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
  const bool ta = shape.trans_a == 'T', tb = shape.trans_b == 'T';
  Matrix a("alone a", ta ? shape.k : shape.m, ta ? shape.m : shape.k);
  Matrix b("alone b", tb ? shape.n : shape.k, tb ? shape.k : shape.n);
  Matrix c("alone c", shape.m, shape.n);
  Kokkos::deep_copy(a, T(0.5));
  Kokkos::deep_copy(b, T(0.25));
  const Space space;
  const char ta_s[2] = {shape.trans_a, 0}, tb_s[2] = {shape.trans_b, 0};
  const auto call = [&] {
    mlacp::detail::gemm_with_progress(space, ta_s, tb_s, T(1), a, b, T(shape.beta), c);
    Kokkos::fence();
  };
  call();  // warm: operands in cache as far as they fit, the BLAS's buffers allocated
  double t0 = now();
  call();
  double first = now() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_DOUBLE, MPI_MAX, comm);
  const int repeats = std::max(5, static_cast<int>(std::ceil(min_s / std::max(first, 1e-7))));
  std::vector<double> times;
  MPI_Barrier(comm);
  for (int r = 0; r < repeats; ++r) {
    t0 = now();
    call();
    times.push_back(now() - t0);
  }
  return mean_over_ranks(comm, median(times));
}

// The hook's cost per gemm_with_progress call (2x2x2 float): without a region callback, and with an empty one.
std::pair<double, double> hook_cost() {
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
  Matrix a("hook a", 2, 2), b("hook b", 2, 2), c("hook c", 2, 2);
  const Space space;
  const int n = 20000;
  const auto run = [&] {
    const double t0 = now();
    for (int i = 0; i < n; ++i) mlacp::detail::gemm_with_progress(space, "N", "T", 1.0f, a, b, 0.0f, c);
    return (now() - t0) / n;
  };
  const auto saved = mlacp::compat::tools::current_callbacks();
  const bool tool_loaded = mlacp::compat::tools::regions_active();
  run();
  const double without = tool_loaded ? NAN : run();
  mlacp::compat::tools::set_push_region_callback([](const char*) {});
  mlacp::compat::tools::set_pop_region_callback([] {});
  const double with = run();
  mlacp::compat::tools::set_callbacks(saved);
  return {without, with};
}

// ---- one configuration ----------------------------------------------------------------------------------------------

struct Configuration {
  std::string shape_name;
  mlacp::MlaConfig config;
};

mlacp::MlaConfig shape_config(const std::string& name, bool quick) {
  mlacp::MlaConfig c;
  c.batch = 1;
  if (quick) {  // small enough for the ctest run; the same structure
    c.seq = 256, c.hidden = 64, c.heads = 16, c.nope = 8, c.rope = 4, c.vdim = 8, c.latent = 32;
  } else if (name == "block") {  // perf_block's full shape
    c.seq = 512, c.hidden = 1024, c.heads = 8, c.nope = 16, c.rope = 16, c.vdim = 32, c.latent = 512;
  } else if (name == "deepseek") {  // issue 20's DeepSeek-like shape: DeepSeek-V3's head dims and R, D and H scaled
    c.seq = 1024, c.hidden = 1024, c.heads = 8, c.nope = 128, c.rope = 64, c.vdim = 128, c.latent = 512;
  } else {
    throw std::invalid_argument("--shapes " + name + ": expected block or deepseek");
  }
  return c;
}

struct RunSettings {
  int warmup = 1, iters = 5;
  double alone_s = 0.05;
  int square = 1024;
};

template <class T>
JsonObject run_configuration(const Configuration& cfg, const mlacp::Mesh& mesh, const RunSettings& run,
                             const GemmRate& square, const std::string& type_name) {
  using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
  using Layer = mlacp::MlaAttention<T, Space>;
  const Space space;
  const MPI_Comm comm = mesh.comm();
  const int P = mesh.size();
  const mlacp::MlaConfig& c = cfg.config;
  const auto weights = mlacp::testing::synthetic::weights<T, Mem>(c, 7);
  const Layer layer(c, weights, mesh);
  const int s = layer.local_seq();
  Tensor3 x("x", c.batch, s, c.hidden), dy("dy", c.batch, s, c.hidden);
  mlacp::testing::synthetic::fill(x, 100 + static_cast<std::uint64_t>(mesh.rank()), 1.0);
  mlacp::testing::synthetic::fill(dy, 200 + static_cast<std::uint64_t>(mesh.rank()), 1.0);
  const auto step = [&] {
    auto f = layer.forward(space, x);
    auto g = layer.backward(space, f, dy);
  };

  // 1. Uninstrumented.
  const Samples plain = measure(comm, run.warmup, run.iters, step);
  // 2. Profiled: the same iterations, every boundary fenced and charged.
  Profile prof;
  {
    Profiler profiler;
    for (int it = 0; it < run.iters; ++it) {
      Kokkos::fence();
      MPI_Barrier(comm);
      profiler.start();
      step();
      profiler.stop();
    }
    prof = profiler.profile();
  }
  const double iters = run.iters;
  // Every rank runs the same shapes (even splits); rank 0's list is the one the ranks replay, in its order.
  std::string keys;
  for (const auto& [key, t] : prof.gemm_s) keys += key + "\n";
  int length = static_cast<int>(keys.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, comm);
  keys.resize(static_cast<std::size_t>(length));
  MPI_Bcast(keys.data(), length, MPI_CHAR, 0, comm);

  // 3. Each shape alone.
  struct Row {
    std::string key;
    Shape shape;
    double calls = 0, layer_s = 0, alone_s = 0;
  };
  std::vector<Row> rows;
  double layer_gemm_s = 0, alone_gemm_s = 0;
  for (const auto& key : split(keys, '\n')) {
    Row r;
    r.key = key;
    r.shape = parse_shape(key);
    const auto it = prof.gemm_s.find(key);
    r.layer_s = mean_over_ranks(comm, it == prof.gemm_s.end() ? 0.0 : it->second / iters);
    const auto ct = prof.gemm_calls.find(key);
    r.calls = mean_over_ranks(comm, ct == prof.gemm_calls.end() ? 0.0 : static_cast<double>(ct->second) / iters);
    r.alone_s = r.calls * time_alone<T>(comm, r.shape, run.alone_s);
    layer_gemm_s += r.layer_s;
    alone_gemm_s += r.alone_s;
    rows.push_back(r);
  }
  // Shapes that only some rank ran (none at even splits) still count in its GEMM total.
  double own_gemm_s = 0;
  for (const auto& [key, t] : prof.gemm_s) own_gemm_s += t / iters;
  const double all_gemm_s = mean_over_ranks(comm, own_gemm_s);
  double own_kernels_s = 0;
  for (const auto& [label, t] : prof.kernel_s) own_kernels_s += t / iters;
  const double kernels_s = mean_over_ranks(comm, own_kernels_s);
  const double attention_s = mean_over_ranks(comm, prof.attention_s / iters);
  const double wait_s = mean_over_ranks(comm, prof.wait_s / iters);
  const double rest_s = mean_over_ranks(comm, prof.rest_s / iters);
  const double profiled_s = mean_over_ranks(comm, prof.total_s / iters);

  const mlacp::MlaFlops flops = mlacp::mla_flops(c, P);
  const double total_flops = flops.forward + flops.backward;
  const double limit = total_flops / square.flops_per_s;
  const double attention_flops = flops.attention_forward + flops.attention_backward;

  const std::string title = cfg.shape_name + " " + mlacp::to_string(c.strategy) + " " + type_name +
                            " Rq=" + std::to_string(c.q_lora_rank) + " P=" + std::to_string(P);
  if (mesh.rank() == 0) {
    std::cout << "\n== " << title << "  (S=" << c.seq << " D=" << c.hidden << " H=" << c.heads << " dn=" << c.nope
              << " dr=" << c.rope << " dv=" << c.vdim << " R=" << c.latent << ")\n";
    std::cout << "layer fwd+bwd " << ms(plain.median()) << "ms (profiled " << ms(profiled_s) << "ms), "
              << fixed(total_flops * 1e-9, 3) << " GFLOP/rank, limit " << ms(limit) << "ms at the square rate "
              << fixed(square.flops_per_s * 1e-9, 1) << " GFLOP/s, time/limit " << fixed(plain.median() / limit, 2)
              << "\n";
    std::printf("  %-30s %7s %10s %10s %8s %9s %8s\n", "GEMM (trans m x n x k type)", "calls", "layer ms", "alone ms",
                "l/alone", "GFLOP/s", "/square");
    for (const auto& r : rows) {
      const double rate = r.calls * r.shape.flops() / r.alone_s;
      std::printf("  %-30s %7.1f %10.3f %10.3f %8.2f %9.2f %8.2f\n", r.key.c_str(), r.calls, r.layer_s * 1e3,
                  r.alone_s * 1e3, r.layer_s / r.alone_s, rate * 1e-9, rate / square.flops_per_s);
    }
    const auto line = [&](const char* what, double t) {
      std::printf("  %-44s %9.3f ms %7.3f x limit\n", what, t * 1e3, t / limit);
    };
    std::cout << "  breakdown per iteration and rank (profiled):\n";
    line("GEMMs alone (the BLAS on these shapes)", alone_gemm_s);
    line("GEMM overhead in the layer (layer - alone)", all_gemm_s - alone_gemm_s);
    line("attention core", attention_s);
    line("memory-bound kernels", kernels_s);
    line("communication waits", wait_s);
    line("rest (host code, MPI launches, allocations)", rest_s);
    line("total (profiled)", profiled_s);
    std::printf("  attention core: %.3f GFLOP at %.2f GFLOP/s = %.2f of the square rate\n", attention_flops * 1e-9,
                attention_flops / attention_s * 1e-9, attention_flops / attention_s / square.flops_per_s);
  }
  // The kernels by label (rank 0's), largest first.
  std::vector<std::pair<double, std::string>> kernels;
  for (const auto& [label, t] : prof.kernel_s) kernels.emplace_back(t / iters, label);
  std::sort(kernels.rbegin(), kernels.rend());
  std::vector<std::pair<double, std::string>> rest_phases;
  for (const auto& [phase, t] : prof.rest_by_phase_s) rest_phases.emplace_back(t / iters, phase);
  std::sort(rest_phases.rbegin(), rest_phases.rend());
  if (mesh.rank() == 0) {
    std::cout << "  memory-bound kernels and deep copies (rank 0, largest first):\n";
    for (std::size_t i = 0; i < kernels.size() && i < 8; ++i)
      std::printf("    %-60s %9.3f ms\n", kernels[i].second.c_str(), kernels[i].first * 1e3);
    std::cout << "  rest by enclosing phase (rank 0, largest first):\n";
    for (std::size_t i = 0; i < rest_phases.size() && i < 6; ++i)
      std::printf("    %-60s %9.3f ms\n", rest_phases[i].second.c_str(), rest_phases[i].first * 1e3);
  }

  Json shape_rows = Json::array(), kernel_rows = Json::array();
  for (const auto& r : rows)
    shape_rows.push_back(JsonObject()
                             .str("gemm", r.key)
                             .num("m", static_cast<double>(r.shape.m))
                             .num("n", static_cast<double>(r.shape.n))
                             .num("k", static_cast<double>(r.shape.k))
                             .num("calls_per_iteration", r.calls)
                             .num("layer_s", r.layer_s)
                             .num("alone_s", r.alone_s)
                             .num("layer_over_alone", r.layer_s / r.alone_s)
                             .num("alone_flops_per_s", r.calls * r.shape.flops() / r.alone_s)
                             .num("alone_over_square", r.calls * r.shape.flops() / r.alone_s / square.flops_per_s)
                             .json());
  for (const auto& [t, label] : kernels) kernel_rows.push_back(JsonObject().str("label", label).num("s", t).json());
  Json rest_rows = Json::array();
  for (const auto& [t, phase] : rest_phases) rest_rows.push_back(JsonObject().str("phase", phase).num("s", t).json());
  return JsonObject()
      .str("name", title)
      .str("shape", cfg.shape_name)
      .str("strategy", mlacp::to_string(c.strategy))
      .str("dtype", type_name)
      .obj("config", config_json(c))
      .samples("layer", plain)
      .num("profiled_s", profiled_s)
      .num("flops_per_rank", total_flops)
      .num("square_rate_flops_per_s", square.flops_per_s)
      .num("limit_s", limit)
      .num("time_over_limit", plain.median() / limit)
      .obj("breakdown_s", JsonObject()
                              .num("gemm_alone", alone_gemm_s)
                              .num("gemm_overhead", all_gemm_s - alone_gemm_s)
                              .num("attention_core", attention_s)
                              .num("memory_bound_kernels", kernels_s)
                              .num("waits", wait_s)
                              .num("rest", rest_s)
                              .num("total_profiled", profiled_s))
      .num("attention_flops", attention_flops)
      .set("gemms", shape_rows)
      .set("kernels_rank0", kernel_rows)
      .set("rest_by_phase_rank0", rest_rows);
}

template <class T>
GemmRate square_rate(MPI_Comm comm, int n) {
  return measure_gemm_rate<T>(comm, n, n, n, 5);
}

int run_benchmark(int argc, char** argv) {
  const Options o = parse_options(
      argc, argv, {"--shapes", "--strategies", "--dtypes", "--q-lora", "--iters", "--alone-ms", "--square"});
  const mlacp::Mesh mesh(MPI_COMM_WORLD);
  RunSettings run;
  run.iters = o.get_int("iters", o.repeats_or(2, 5));
  run.warmup = o.quick ? 1 : std::max(1, o.warmup);
  run.alone_s = std::stod(o.get("alone-ms", o.quick ? "2" : "50")) * 1e-3;
  run.square = o.get_int("square", o.quick ? 256 : 1024);
  const auto shapes = split(o.get("shapes", o.quick ? "quick" : "block,deepseek"), ',');
  const auto strategies = split(o.get("strategies", "latent,expanded"), ',');
  const auto dtypes = split(o.get("dtypes", "float,double"), ',');
  const auto q_loras = split(o.get("q-lora", o.quick ? "0,32" : "0,1536"), ',');

  const auto [model, flags] = cpu_model_and_flags();
  const auto [hook_without, hook_with] = hook_cost();
  if (mesh.rank() == 0) {
    std::cout << "mlacp-perf-gemm-shapes: P=" << mesh.size() << " iters=" << run.iters
              << " alone>=" << run.alone_s * 1e3 << "ms/shape\n";
    std::cout << "CPU: " << model << " (" << flags << ")\n";
    std::cout << "hook per gemm_with_progress call (2x2x2): no tool " << fixed(hook_without * 1e9, 1)
              << " ns, region callback installed " << fixed(hook_with * 1e9, 1) << " ns\n";
  }
  JsonObject doc = header("perf_gemm_shapes", o, mesh.size(), run.iters);
  doc.str("cpu_model", model).str("cpu_flags", flags);
  doc.num("hook_ns_without_tool", hook_without * 1e9).num("hook_ns_with_region_callback", hook_with * 1e9);
  Json results = Json::array(), rates = Json::array();
  for (const auto& type : dtypes) {
    if (type != "float" && type != "double") throw std::invalid_argument("--dtypes " + type + ": float or double");
    const GemmRate square =
        type == "float" ? square_rate<float>(mesh.comm(), run.square) : square_rate<double>(mesh.comm(), run.square);
    if (mesh.rank() == 0)
      std::cout << "square GEMM rate " << type << " " << square.shape << ": " << fixed(square.flops_per_s * 1e-9, 2)
                << " GFLOP/s per rank\n";
    rates.push_back(
        JsonObject().str("dtype", type).str("shape", square.shape).num("flops_per_s", square.flops_per_s).json());
    for (const auto& shape : shapes)
      for (const auto& strategy : strategies)
        for (const auto& rq : q_loras) {
          Configuration cfg{o.quick ? "quick" : shape, shape_config(shape, o.quick)};
          cfg.config.strategy = mlacp::parse_strategy(strategy);
          cfg.config.q_lora_rank = std::stoi(rq);
          const std::string error = cfg.config.error(mesh.size());
          if (!error.empty()) throw std::invalid_argument("configuration " + shape + ": " + error);
          results.push_back((type == "float" ? run_configuration<float>(cfg, mesh, run, square, type)
                                             : run_configuration<double>(cfg, mesh, run, square, type))
                                .json());
        }
  }
  doc.set("square_rates", rates).set("results", results);
  if (mesh.rank() == 0) write_json(o.json, doc.json());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_main(argc, argv, usage, run_benchmark); }
