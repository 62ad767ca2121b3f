// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-mla-block: runs the MLA layer under MPI at the given dimensions, computes the same layer on the full sequence
// on rank 0 with P = 1, prints the relative error of the output and of every gradient and PASS or FAIL (exit code 0
// or 1), and with --dump DIR writes the tensors as .npy files (docs/spec.md "Dump format"). Run it with mpirun or srun
// to check an installation: `srun -n 4 mlacp-mla-block --strategy latent --dtype double`.
//
// It is also the timing tool the PyTorch peer (perf_tests/peers/) is compared with: --no-reference skips the P = 1
// reference (which does not fit at large S), --warmup N untimed iterations come first, and every run reports the
// median time (barrier, forward + backward, fence, max over ranks), the peak resident memory (max over ranks) and a
// roofline line: the layer's FLOPs per rank (mlacp/mla/flop_count.hpp) against the rate of one GEMM of the layer's
// q_proj shape measured in the same run, as the fraction of that rate the measured time corresponds to.
//
// With --machine FILE (MachineParams' JSON, model/machine.hpp) it also prints the performance model's prediction for
// the run's own strategy, mesh and layout beside the measured median and the measured peak of Kokkos memory, and
// --ring plan lets the planner (model/mesh_plan.hpp) choose the strategy, the ring size and the layout.
#include <mpi.h>
#include <sys/resource.h>
#include <mlacp/allocation.hpp>
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/collective_bytes.hpp>
#include <mlacp/collectives.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/detail/input_checks.hpp>
#include <mlacp/mla/flop_count.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/model/layer_model.hpp>
#include <mlacp/model/mesh_plan.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/testing/synthetic.hpp>
#include <mlacp/token_map.hpp>
#include <mlacp/version.hpp>

#include <Kokkos_Core.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "config_flags.hpp"
#include "config_json.hpp"
#include "npy.hpp"

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

struct Options {
  mlacp::MlaConfig config;
  std::string dtype = "double";
  std::uint64_t seed = 1;
  int iters = 1;
  int warmup = 0;  // untimed iterations before the `iters` timed ones
  bool reference = true;
  std::string dump;
  std::string json;             // "" = no JSON report
  double tolerance = -1;        // < 0: docs/spec.md's (1e-10 double, 1e-4 float, 2e-2 bf16)
  mlacp::Ring ring;             // --ring C | node: the two-level mesh (ring attention); default flat
  std::string machine;          // --machine FILE: the model's machine ("" = no prediction)
  bool plan_ring = false;       // --ring plan: the planner picks strategy, ring size and layout
  double memory_per_rank = 0;   // --memory-per-rank BYTES: the plan's budget (0: the machine's)
  bool strategy_given = false;  // --strategy / --ring-layout on the command line (--ring plan overrides them)
  bool layout_given = false;
};

// What the model says about the run: its prediction for the run's own choice (or why there is none), and the
// planner's choice with --ring plan.
struct ModelReport {
  std::string machine;  // MachineParams::name; "" = no --machine
  std::optional<mlacp::model::Prediction> prediction;
  std::string why_not;  // no prediction: the model's reason
  std::string planned;  // --ring plan: the choice it ran
};

const char* usage =
    "usage: mlacp-mla-block [--batch B] [--seq S] [--hidden D] [--heads H] [--nope dn] [--rope dr] [--vdim dv]\n"
    "                       [--latent R] [--strategy latent|expanded] [--dtype float|double|bf16] [--bias] [--seed N]\n"
    "                       [--iters N] [--warmup N] [--dump DIR] [--json FILE] [--tolerance X] [--blocking]\n"
    "                       [--no-reference] [--cu-seqlens 0,a,b,...,S] [--wire-dtype same|bf16|bf16_all]\n"
    "                       [--ring C|node|plan] [--ring-layout zigzag|contiguous] [--machine FILE]\n"
    "                       [--memory-per-rank BYTES] [--q-lora Rq] [--softmax-scale X]\n"
    "Defaults: B=2 S=32 D=48 H=4 dn=8 dr=4 dv=6 R=12, latent, double, seed 1, 1 iteration, no warm-up.\n"
    "--no-reference skips the single-rank full-sequence reference (timing at large S): no PASS/FAIL, exit 0.\n"
    "--cu-seqlens packs documents into the sequence (every batch row alike): positions restart and attention stays\n"
    "within each document; the reference and --dump (cu_seqlens.npy, int64) follow.\n"
    "--wire-dtype bf16 (float only) sends the all-to-alls and the latent all-gather as bf16 (bf16_all: the latent\n"
    "reduce-scatter's partial sums too); the default tolerance is then docs/spec.md's bf16 one, 2e-2.\n"
    "--ring C runs ring attention on a two-level mesh of P = U x C ranks (C Ulysses groups of U consecutive ranks;\n"
    "--ring node: one group per node); --ring-layout picks which tokens each ring chunk holds (default zigzag).\n"
    "--machine FILE (the model's machine parameters, mlacp-plan --calibrate or by hand) prints the model's prediction\n"
    "for this run beside the measured time and memory (and \"predicted\" in --json); --ring plan (needs --machine)\n"
    "runs the planner's first choice of strategy, ring size and layout (overriding --strategy and --ring-layout)\n"
    "within --memory-per-rank BYTES (default: the machine's memory per rank).\n"
    "--q-lora Rq factors the query as DeepSeek-V2/V3 do (w_qa [Rq, D], RMSNorm g_q, w_qb [H*dqk, Rq]; 0: dense w_q);\n"
    "--softmax-scale X replaces the attention's 1/sqrt(dqk) (e.g. DeepSeek-V3's YaRN-adjusted scale).\n"
    "Every MlaConfig field is a flag (src/tools/config_flags.hpp): --rope-base X, --rms-eps X, --max-documents N,\n"
    "--q-lora-rank Rq (= --q-lora), --no-overlap (= --blocking), ...\n"
    "Kokkos' own options (--kokkos-threads=N, --kokkos-device-id=N, ...) pass through to Kokkos; --kokkos-help lists\n"
    "them.\n";

// Parses argv; throws std::invalid_argument with a message naming the flag and value.
Options parse(int argc, char** argv) {
  Options o;
  auto& c = o.config;
  c.batch = 2;
  c.seq = 32;
  c.hidden = 48;
  c.heads = 4;
  c.nope = 8;
  c.rope = 4;
  c.vdim = 6;
  c.latent = 12;
  const std::map<std::string, int*> ints = {{"--iters", &o.iters}, {"--warmup", &o.warmup}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag.rfind("--kokkos-", 0) == 0) continue;  // Kokkos' own (--kokkos-threads=4): Kokkos reads them
    if (flag == "--no-reference") {
      o.reference = false;
      continue;
    }
    if (flag == "--help" || flag == "-h") throw std::invalid_argument("");
    // The configuration's fields (config_flags.hpp: --batch ... --ring-layout, --bias, --blocking, --q-lora).
    try {
      const auto next = [&] {
        if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
        return std::string(argv[++i]);
      };
      if (mlacp::tools::apply_config_flag(c, flag, next)) {
        if (flag == "--strategy") o.strategy_given = true;
        if (flag == "--ring-layout") o.layout_given = true;
        continue;
      }
    } catch (const mlacp::Error& e) {
      throw std::invalid_argument(e.what());
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    try {
      if (auto it = ints.find(flag); it != ints.end()) {
        std::size_t used = 0;
        *it->second = std::stoi(value, &used);
        if (used != value.size()) throw std::invalid_argument("");
      } else if (flag == "--ring") {
        o.plan_ring = value == "plan";
        if (!o.plan_ring) o.ring = value == "node" ? mlacp::Ring::node() : mlacp::Ring(std::stoi(value));
      } else if (flag == "--machine") {
        o.machine = value;
      } else if (flag == "--memory-per-rank") {
        std::size_t used = 0;
        o.memory_per_rank = std::stod(value, &used);
        if (used != value.size() || !(o.memory_per_rank > 0)) throw std::invalid_argument("");
      } else if (flag == "--dtype") {
        if (value != "float" && value != "double" && value != "bf16") throw std::invalid_argument("");
        o.dtype = value;
      } else if (flag == "--seed") {
        o.seed = std::stoull(value);
      } else if (flag == "--dump") {
        o.dump = value;
      } else if (flag == "--json") {
        o.json = value;
      } else if (flag == "--tolerance") {
        o.tolerance = std::stod(value);
      } else {
        throw std::invalid_argument("unknown flag " + flag);
      }
    } catch (const mlacp::Error& e) {
      throw std::invalid_argument(e.what());
    } catch (const std::logic_error& e) {
      const std::string what = e.what();
      throw std::invalid_argument(what.rfind("unknown flag", 0) == 0 ? what
                                                                     : flag + " " + value + ": not a valid value");
    }
  }
  // A bf16 wire's default tolerance is docs/spec.md's bf16 bound (an explicit --tolerance wins).
  if (c.wire_dtype != mlacp::WireDtype::same && o.tolerance < 0) o.tolerance = 2e-2;
  if (o.iters < 1) throw std::invalid_argument("--iters " + std::to_string(o.iters) + ": expected at least 1");
  if (o.warmup < 0) throw std::invalid_argument("--warmup " + std::to_string(o.warmup) + ": expected at least 0");
  if (o.plan_ring && o.machine.empty()) throw std::invalid_argument("--ring plan needs --machine FILE");
  if (o.memory_per_rank > 0 && !o.plan_ring) throw std::invalid_argument("--memory-per-rank needs --ring plan");
  return o;
}

template <class ViewType>
std::vector<double> to_host(const ViewType& v) {
  std::vector<double> out;
  if (v.data() == nullptr) return out;
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  out.reserve(h.size());
  // Explicitly: Kokkos' native bhalf_t (mlacp::bf16 on CUDA) converts to double only explicitly.
  for (std::size_t i = 0; i < h.size(); ++i) out.push_back(static_cast<double>(h.data()[i]));
  return out;
}

// `to` (same extents) gets `from`'s values converted (bf16 to double: exact).
template <class From, class To>
void widen_into(const From& from, const To& to) {
  auto h_from = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), from);
  auto h_to = Kokkos::create_mirror_view(to);
  using V = typename To::non_const_value_type;
  for (std::size_t i = 0; i < h_from.size(); ++i)
    h_to.data()[i] = static_cast<V>(static_cast<double>(h_from.data()[i]));
  Kokkos::deep_copy(to, h_to);
}
template <class Ref, class T>
Kokkos::View<Ref***, Kokkos::LayoutRight, Mem> widened(const Kokkos::View<T***, Kokkos::LayoutRight, Mem>& v) {
  if constexpr (std::is_same_v<Ref, T>) {
    return v;
  } else {
    Kokkos::View<Ref***, Kokkos::LayoutRight, Mem> out("widened", v.extent(0), v.extent(1), v.extent(2));
    widen_into(v, out);
    return out;
  }
}

// ||a - b|| / max(||b||, floor): a tensor that is zero in exact arithmetic (dq and the query's weight gradients when
// no query sees another key, S = 1) is rounding noise in both runs, measured against `floor` instead of itself.
double relative_error(const std::vector<double>& a, const std::vector<double>& b, double floor) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max({std::sqrt(den), floor, 1e-300});
}

double norm(const std::vector<double>& v) {
  double sum = 0;
  for (const double e : v) sum += e * e;
  return std::sqrt(sum);
}

// Every rank's global token ranges (the layer's TokenMap at each rank's place in the mesh), known on every rank.
std::vector<std::vector<mlacp::TokenRange>> ranges_of_ranks(const mlacp::TokenMap& map, const mlacp::Mesh& mesh) {
  const int place[2] = {mesh.ring_rank(), mesh.ulysses_rank()};
  std::vector<int> places(2 * static_cast<std::size_t>(mesh.size()));
  MPI_Allgather(place, 2, MPI_INT, places.data(), 2, MPI_INT, mesh.comm());
  std::vector<std::vector<mlacp::TokenRange>> out;
  for (int r = 0; r < mesh.size(); ++r) out.push_back(map.ranges(places[2 * r], places[2 * r + 1]));
  return out;
}

// The full [B, S, D] tensor on rank 0 from every rank's [B, s_r, D] shard (empty elsewhere): rank r's rows are the
// global tokens of its ranges, in order (the layer's token map; Partition(S, P) on a flat mesh).
std::vector<double> gather_tokens(const std::vector<double>& local, int B, int D,
                                  const std::vector<std::vector<mlacp::TokenRange>>& ranges, std::size_t S,
                                  const mlacp::Mesh& mesh) {
  const int P = mesh.size();
  std::vector<int> counts(static_cast<std::size_t>(P)), displs(static_cast<std::size_t>(P));
  int offset = 0;
  for (int r = 0; r < P; ++r) {
    std::int64_t tokens = 0;
    for (const auto& range : ranges[static_cast<std::size_t>(r)]) tokens += range.count;
    counts[static_cast<std::size_t>(r)] = static_cast<int>(tokens) * B * D;
    displs[static_cast<std::size_t>(r)] = offset;
    offset += counts[static_cast<std::size_t>(r)];
  }
  std::vector<double> all(mesh.rank() == 0 ? S * static_cast<std::size_t>(B) * static_cast<std::size_t>(D) : 0);
  MPI_Gatherv(local.data(), static_cast<int>(local.size()), MPI_DOUBLE, all.data(), counts.data(), displs.data(),
              MPI_DOUBLE, 0, mesh.comm());
  if (mesh.rank() != 0) return {};
  std::vector<double> full(all.size());
  for (int r = 0; r < P; ++r) {
    const auto base = static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]);
    const auto s = static_cast<std::size_t>(counts[static_cast<std::size_t>(r)] / (B * D));
    for (std::size_t b = 0; b < static_cast<std::size_t>(B); ++b) {
      std::size_t t = 0;
      for (const auto& range : ranges[static_cast<std::size_t>(r)])
        for (std::int64_t i = 0; i < range.count; ++i, ++t)
          std::copy_n(&all[base + (b * s + t) * D], D, &full[(b * S + static_cast<std::size_t>(range.begin + i)) * D]);
    }
  }
  return full;
}

std::vector<double> sum_to_root(const std::vector<double>& local, const mlacp::Mesh& mesh) {
  std::vector<double> sum(mesh.rank() == 0 ? local.size() : 0);
  MPI_Reduce(local.data(), sum.data(), static_cast<int>(local.size()), MPI_DOUBLE, MPI_SUM, 0, mesh.comm());
  return sum;
}

template <class T>
void dump(const std::string& dir, const std::string& name, const std::vector<double>& values,
          const std::vector<std::size_t>& shape) {
  std::vector<T> data(values.begin(), values.end());
  mlacp::tools::write_npy(dir + "/" + name + ".npy", data, shape);
}

// The tool's own collectives that a rank may reach while another has failed (a probe's or the reference's
// allocation, a file it cannot write) are watched ones (mpi/agreement.hpp): they look at the mesh's failure channel,
// so that the others raise the failing rank's error instead of waiting for it.
mlacp::CollectiveInfo tool_step(const std::string& what) {
  mlacp::CollectiveInfo info;
  info.name = "mlacp-mla-block: " + what;
  info.operation = "MPI_Iallreduce(MAX)";
  return info;
}
// Element-wise maximum over the ranks, in place.
void max_over_ranks(const mlacp::Mesh& mesh, std::vector<double>& values, const std::string& what) {
  if (mesh.size() > 1) mlacp::mpi::allreduce_max(mesh.comm(), values, tool_step(what), "mlacp-mla-block: " + what);
}
double max_over_ranks(const mlacp::Mesh& mesh, double value, const std::string& what) {
  std::vector<double> values{value};
  max_over_ranks(mesh, values, what);
  return values[0];
}
// Every rank arrives before any leaves (the start of a timed iteration).
void barrier(const mlacp::Mesh& mesh, const std::string& what) { max_over_ranks(mesh, 0.0, what); }

// Peak resident set size of this process in bytes (getrusage's high-water mark, KiB on Linux), max over the ranks.
double peak_rss_bytes(const mlacp::Mesh& mesh) {
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  return max_over_ranks(mesh, static_cast<double>(self.ru_maxrss) * 1024.0, "peak resident memory");
}

// The machine's GEMM rate for this layer: one compat::gemm of q_proj's forward shape, [B*s, D] x [D, H*dqk] (x w_q^T),
// in T, on every rank at once (each rank has its core, as in the layer). Each repeat starts after a barrier and its
// time is the maximum over the ranks; the rate is the FLOPs over the median time, after one untimed call. It is
// measured before and after the layer's iterations and the higher rate is the machine's (a load spike on this
// shared machine during one measurement must not make the layer look closer to the roofline than it is).
struct GemmRate {
  double flops_per_s = 0;
  std::string shape;
  int repeats = 0;
};

template <class T>
GemmRate gemm_rate(const mlacp::MlaConfig& c, int s, const mlacp::Mesh& mesh) {
  using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
  // bf16: the layer's way, bf16 operands accumulated in float (a Bf16GemmPlan choosing its backend on the untimed
  // first call), the result rounded to bf16 as q_proj's is.
  std::optional<mlacp::Bf16GemmPlan<Space>> plan;
  std::optional<mlacp::ScopedBf16GemmPlan<Space>> installed;
  if constexpr (std::is_same_v<T, mlacp::bf16>) {
    plan.emplace();
    installed.emplace(*plan);
  }
  const int m = c.batch * s, k = c.hidden, n = c.heads * c.qk_dim();
  std::string problem;  // a probe that does not fit is one error on every rank
  Matrix a, b, out;
  try {
    const std::string where = "mlacp-mla-block: the GEMM-rate probe";
    a = mlacp::detail::allocate_view_or_throw<Matrix>(where, "gemm a", m, k);
    b = mlacp::detail::allocate_view_or_throw<Matrix>(where, "gemm b", n, k);
    out = mlacp::detail::allocate_view_or_throw<Matrix>(where, "gemm c", m, n);
  } catch (const mlacp::OutOfMemory& e) {
    problem = e.what();
  }
  mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the GEMM-rate probe", problem);
  mlacp::testing::synthetic::fill(a, 11, 1.0);
  mlacp::testing::synthetic::fill(b, 12, 1.0);
  const Space space;
  GemmRate rate;
  rate.repeats = 7;
  std::vector<double> times;
  for (int it = 0; it <= rate.repeats; ++it) {
    Kokkos::fence();
    barrier(mesh, "GEMM-rate probe");
    const auto start = std::chrono::steady_clock::now();
    mlacp::detail::gemm_values(space, "N", "T", 1.0f, a, b, 0.0f, out);
    Kokkos::fence();
    const double seconds = max_over_ranks(
        mesh, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), "GEMM-rate probe");
    if (it > 0) times.push_back(seconds);
  }
  std::sort(times.begin(), times.end());
  rate.flops_per_s = 2.0 * m * k * n / times[times.size() / 2];
  rate.shape = "[" + std::to_string(m) + " x " + std::to_string(k) + "] x [" + std::to_string(k) + " x " +
               std::to_string(n) + "]";
  return rate;
}

// Keys in the order written (the reports and check_dump.py read them by name; a person reads them in this order).
using Json = nlohmann::ordered_json;

// `v` as JSON text (a number that is not finite becomes null; bytes that are not UTF-8 become U+FFFD).
std::string json_text(const Json& v, int indent = -1) {
  return v.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// The reference's weights: the layer's own for float and double; for bf16, the float64 layer on the same values
// (docs/spec.md: bf16 storage with float accumulation is checked against the float64 reference).
template <class Ref, class T>
mlacp::MlaWeights<Ref, Mem> reference_weights(const mlacp::MlaConfig& c, const mlacp::MlaWeights<T, Mem>& w) {
  if constexpr (std::is_same_v<Ref, T>) {
    return w;
  } else {
    auto out = mlacp::MlaWeights<Ref, Mem>::allocate(c);
    mlacp::for_each_parameter(
        [&](const mlacp::ParameterInfo& info, const auto& from, const auto& to) {
          if (info.present(c)) widen_into(from, to);
        },
        w, out);
    return out;
  }
}

// How evenly the ranks share the attention core's work (the ring layout's purpose): this rank's visible (query, key)
// pairs times its heads (its attention FLOPs are proportional), and the thread CPU time of its attention phases over
// one more forward + backward, recorded; max / min over the ranks of each.
struct AttentionBalance {
  double pairs_max = 0, pairs_min = 0, cpu_max = 0, cpu_min = 0;
  double pairs_ratio() const { return pairs_min > 0 ? pairs_max / pairs_min : INFINITY; }
  double cpu_ratio() const { return cpu_min > 0 ? cpu_max / cpu_min : INFINITY; }
};

template <class Layer, class View>
AttentionBalance attention_balance(const Layer& layer, const View& x, const View& dy, const mlacp::Mesh& mesh) {
  AttentionBalance out;
  if (mlacp::events::enabled()) return out;  // a trace is being recorded (MLACP_TRACE): leave it alone
  mlacp::events::clear();
  mlacp::events::enable(true);
  {
    auto forward = layer.forward(Space(), x);
    layer.backward(Space(), forward, dy);
  }
  mlacp::events::enable(false);
  double cpu = 0, begun = 0;
  for (const auto& e : mlacp::events::snapshot()) {
    if (e.name != mlacp::names::attention_fprop && e.name != mlacp::names::attention_bprop) continue;
    if (e.kind == mlacp::EventKind::compute_begin) begun = e.thread_cpu_s;
    if (e.kind == mlacp::EventKind::compute_end) cpu += e.thread_cpu_s - begun;
  }
  mlacp::events::clear();
  const double pairs =
      static_cast<double>(mlacp::causal_pairs(layer.token_map(), mesh.ring_rank(), layer.documents())) *
      layer.local_heads();
  std::vector<double> values = {pairs, -pairs, cpu, -cpu};
  max_over_ranks(mesh, values, "attention balance");
  out.pairs_max = values[0];
  out.pairs_min = -values[1];
  out.cpu_max = values[2];
  out.cpu_min = -values[3];
  return out;
}

// (predicted - measured) / measured, in percent.
double error_percent(double predicted, double measured) { return (predicted - measured) / measured * 100.0; }

// Before anything is allocated: the bytes the weights, their gradients and this rank's inputs take, times the ranks
// that share this node, against what the node has. A run that cannot fit is refused at once, instead of after
// minutes of filling the weights it can hold ("" when it may fit; the layer's workspaces are checked as they come).
template <class T>
std::string preflight_error(const Options& o, const mlacp::Mesh& mesh, const std::string& where) {
  const auto& c = o.config;
  double bytes = 0;
  for (const auto& info : mlacp::parameter_table())
    if (info.present(c))
      bytes += static_cast<double>(info.shape(c).size()) * (sizeof(T) + sizeof(mlacp::gradient_value_t<T>));
  const double tokens = static_cast<double>(c.batch) * c.seq;
  bytes += tokens * c.hidden * sizeof(T) * ((o.reference || !o.dump.empty() ? 2.0 : 0.0) + 2.0 / mesh.size());
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(mesh.comm(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int on_node = 1;
  MPI_Comm_size(node, &on_node);
  MPI_Comm_free(&node);
  const std::int64_t available = mlacp::available_memory_bytes();
  if (available < 0 || bytes * on_node <= static_cast<double>(available)) return "";
  std::ostringstream out;
  out << where << ": this run needs at least " << mlacp::bytes_string(static_cast<std::int64_t>(bytes))
      << " per rank (the weights, their gradients and the inputs) and " << on_node
      << " rank(s) share this node, which has " << mlacp::bytes_string(available)
      << " available; refused before allocating (smaller sizes, more nodes, or --no-reference)";
  return out.str();
}

template <class T>
int run(const Options& o, const mlacp::Mesh& mesh, const ModelReport& model) {
  const auto& c = o.config;
  const int P = mesh.size(), rank = mesh.rank();
  constexpr bool bf16 = std::is_same_v<T, mlacp::bf16>;
  // The reference's value type and the dump's: double for bf16 runs' reference; float for their dump (bf16 widens to
  // float exactly, docs/spec.md's dump format).
  using Ref = std::conditional_t<bf16, double, T>;
  using DumpT = std::conditional_t<bf16, float, T>;
  const double tolerance = o.tolerance >= 0 ? o.tolerance : (std::is_same_v<T, double> ? 1e-10 : bf16 ? 2e-2 : 1e-4);
  using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
  const Space space;

  // The full x and dy only when the reference or the dump needs them: at large S they would count in the peak
  // memory of every rank, which is reported next to the peer's (which holds only its shard).
  const bool need_full = o.reference || !o.dump.empty();
  // The configuration first, on every rank, before anything is allocated from its sizes: a bad size (negative, or a
  // product past INT_MAX) is the layer's own clear error on every rank, and ranks started with different settings
  // (an MPMD launch) learn which differs.
  {
    auto fields = mlacp::detail::config_fields(c);
    fields.push_back({"bytes per element of the layer's value type (--dtype)", static_cast<std::int64_t>(sizeof(T))});
    mlacp::detail::agree_or_throw(mesh, "mlacp-mla-block", c.error(P), fields, c.describe());
  }
  const std::string where = "mlacp-mla-block: rank " + std::to_string(rank);
  std::string allocation_problem = preflight_error<T>(o, mesh, where);
  mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the run's memory", allocation_problem);
  Tensor3 x_full, dy_full;
  try {
    if (need_full) {
      x_full = mlacp::detail::allocate_view_or_throw<Tensor3>(where, "x (full sequence)", c.batch, c.seq, c.hidden);
      dy_full = mlacp::detail::allocate_view_or_throw<Tensor3>(where, "dy (full sequence)", c.batch, c.seq, c.hidden);
      mlacp::testing::synthetic::fill(x_full, o.seed + 100, 1.0);
      mlacp::testing::synthetic::fill(dy_full, o.seed + 200, 1.0);
    }
  } catch (const mlacp::OutOfMemory& e) {
    allocation_problem = e.what();
  }
  mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the inputs", allocation_problem);
  // The Kokkos memory of the distributed run (diagnostics.hpp), what the model's memory per rank predicts: counted
  // from here, so that the weights, their gradients, this rank's inputs and outputs and the layer's workspaces are
  // in; the full x and dy above (the reference's and the dump's), the GEMM-rate probes and the reference are not.
  mlacp::diagnostics::count_view_allocations();
  const double view_base = static_cast<double>(mlacp::diagnostics::view_live_bytes());
  mlacp::diagnostics::reset_view_peak_bytes();
  double view_peak = 0;  // bytes above view_base, the highest seen outside the probes
  auto note_view_peak = [&] {
    view_peak = std::max(view_peak, static_cast<double>(mlacp::diagnostics::view_peak_bytes()) - view_base);
  };

  // The layer validates the configuration on every rank (before any other collective).
  mlacp::MlaWeights<T, Mem> weights;
  try {
    weights = mlacp::testing::synthetic::weights<T, Mem>(c, o.seed);
  } catch (const mlacp::OutOfMemory& e) {
    allocation_problem = e.what();
  }
  mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the weights", allocation_problem);
  mlacp::MlaAttention<T> layer(c, weights, mesh);
  const int s = layer.local_seq();
  Tensor3 x, dy;
  try {
    x = mlacp::detail::allocate_view_or_throw<Tensor3>(where, "x", c.batch, s, c.hidden);
    dy = mlacp::detail::allocate_view_or_throw<Tensor3>(where, "dy", c.batch, s, c.hidden);
  } catch (const mlacp::OutOfMemory& e) {
    allocation_problem = e.what();
  }
  mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the rank's inputs", allocation_problem);
  if (need_full) {
    // This rank's tokens: its ranges of the layer's token map (one contiguous range on a flat mesh).
    mlacp::shard(space, layer.token_map(), mesh.ring_rank(), mesh.ulysses_rank(), x_full, x);
    mlacp::shard(space, layer.token_map(), mesh.ring_rank(), mesh.ulysses_rank(), dy_full, dy);
  } else {
    mlacp::testing::synthetic::fill(x, o.seed + 100 + 7919 * static_cast<std::uint64_t>(rank), 1.0);
    mlacp::testing::synthetic::fill(dy, o.seed + 200 + 7919 * static_cast<std::uint64_t>(rank), 1.0);
  }

  note_view_peak();
  GemmRate gemm = gemm_rate<T>(c, s, mesh);
  mlacp::diagnostics::reset_view_peak_bytes();  // the probe's matrices are not the layer's
  std::vector<double> times;
  typename mlacp::MlaAttention<T>::gradients_type grads;
  Tensor3 y;
  // The layer's own collectives only: the bytes this rank hands to them per iteration (collective_bytes.hpp).
  mlacp::reset_collective_bytes();
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    barrier(mesh, "iteration start");
    const auto start = std::chrono::steady_clock::now();
    auto forward = layer.forward(space, x);
    grads = layer.backward(space, forward, dy);
    Kokkos::fence();
    const double seconds = max_over_ranks(
        mesh, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), "iteration time");
    if (it >= o.warmup) times.push_back(seconds);
    y = forward.output();
  }
  note_view_peak();
  view_peak = max_over_ranks(mesh, view_peak, "peak Kokkos bytes");
  const double wire_bytes_per_iteration =
      static_cast<double>(mlacp::collective_bytes().total()) / static_cast<double>(o.warmup + o.iters);
  gemm.flops_per_s = std::max(gemm.flops_per_s, gemm_rate<T>(c, s, mesh).flops_per_s);
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  // Before the reference runs on rank 0: the distributed layer's own high-water mark.
  const double peak_rss = peak_rss_bytes(mesh);
  const AttentionBalance balance = attention_balance(layer, x, dy, mesh);
  const mlacp::MlaFlops flops = mlacp::mla_flops(c, P);
  const double fraction = flops.total() / gemm.flops_per_s / median;

  // Distributed results, assembled on rank 0 in global order; weight gradients summed over ranks.
  std::vector<std::pair<std::string, std::vector<double>>> got;
  if (need_full) {
    // This rank's values on the host first (an allocation that fails here is agreed before the raw MPI gathers).
    std::vector<std::pair<std::string, std::vector<double>>> local;
    try {
      local.emplace_back("y", to_host(y));
      local.emplace_back("dx", to_host(grads.dx));
      // Weight gradients in the parameter table's order (parameter_table.hpp): "d" + name, those the layer has.
      mlacp::for_each_parameter(
          [&](const mlacp::ParameterInfo& info, const auto& gradient) {
            std::vector<double> values = to_host(gradient);
            if (!values.empty()) local.emplace_back(std::string("d") + info.name, std::move(values));
          },
          grads);
    } catch (const std::exception& e) {
      const auto out_of_memory = mlacp::detail::translate_allocation_failure(e, where);
      if (!out_of_memory) throw;
      allocation_problem = out_of_memory->what();
    }
    mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the results' host copies", allocation_problem);
    const auto ranges = ranges_of_ranks(layer.token_map(), mesh);
    const auto S = static_cast<std::size_t>(c.seq);
    for (auto& [name, values] : local)
      got.emplace_back(name, name == "y" || name == "dx" ? gather_tokens(values, c.batch, c.hidden, ranges, S, mesh)
                                                         : sum_to_root(values, mesh));
  }

  int verdict = 0;
  if (rank == 0) {
    std::cout << "mlacp-mla-block: " << c.describe() << " dtype=" << o.dtype << " P=" << P
              << " (U=" << mesh.ulysses_size() << " x C=" << mesh.ring_size() << ") seed=" << o.seed
              << (c.overlap ? "" : " (blocking collectives)") << "\n";
    std::cout << "  iteration time (max over ranks): median " << std::setprecision(4) << median * 1e3 << " ms, min "
              << times.front() * 1e3 << " ms over " << o.iters << " iteration(s) after " << o.warmup << " warm-up\n";
    std::cout << "  peak resident memory (max over ranks): " << std::setprecision(4) << peak_rss / (1 << 20)
              << " MiB\n";
    std::cout << "  peak Kokkos bytes (max over ranks): " << std::setprecision(4) << view_peak / (1 << 20) << " MiB ("
              << std::setprecision(15) << view_peak
              << " bytes: weights, gradients, the rank's inputs and outputs, the layer's workspaces)\n";
    if (!model.machine.empty() && model.prediction) {
      const mlacp::model::Prediction& p = *model.prediction;
      std::cout << "  model (" << model.machine << "; " << p.choice.describe() << "): predicted forward+backward "
                << std::setprecision(4) << p.total_s() * 1e3 << " ms (forward " << p.forward_s * 1e3 << ", backward "
                << p.backward_s * 1e3 << "), measured " << median * 1e3 << " ms, error " << std::fixed
                << std::setprecision(1) << error_percent(p.total_s(), median) << "%" << std::defaultfloat << "\n";
      std::cout << "  model memory per rank: predicted " << std::setprecision(4) << p.memory.total() / (1 << 20)
                << " MiB, measured peak Kokkos bytes (max over ranks) " << view_peak / (1 << 20) << " MiB, error "
                << std::fixed << std::setprecision(1) << error_percent(p.memory.total(), view_peak) << "%"
                << std::defaultfloat << "; predicted hidden fraction " << std::setprecision(3) << p.hidden_fraction
                << ", bytes intra " << std::setprecision(4) << p.bytes.intra / (1 << 20) << " MiB, inter "
                << p.bytes.inter / (1 << 20) << " MiB\n";
    } else if (!model.machine.empty()) {
      std::cout << "  model (" << model.machine << "): no prediction: " << model.why_not << "\n";
    }
    std::cout << "  attention balance (" << mlacp::to_string(c.ring_layout) << ", U=" << mesh.ulysses_size()
              << " x C=" << mesh.ring_size() << "): visible pairs x heads max/min " << std::setprecision(4)
              << balance.pairs_ratio() << ", attention thread CPU time max/min " << balance.cpu_ratio() << " ("
              << balance.cpu_max * 1e3 << " / " << balance.cpu_min * 1e3 << " ms)\n";
    std::cout << "  bytes handed to the layer's collectives per iteration (rank 0): " << std::setprecision(4)
              << wire_bytes_per_iteration / (1 << 20) << " MiB; forward workspace "
              << layer.forward_workspace_bytes() / double(1 << 20) << " MiB\n";
    std::cout << "  roofline per rank: forward " << std::setprecision(4) << flops.forward * 1e-9
              << " GFLOP (attention core " << flops.attention_forward * 1e-9 << "), backward " << flops.backward * 1e-9
              << " GFLOP (attention core " << flops.attention_backward * 1e-9 << "); GEMM rate "
              << gemm.flops_per_s * 1e-9 << " GFLOP/s (" << gemm.shape << ", " << o.dtype << ", median of "
              << gemm.repeats << ", the higher of before and after the layer); fraction of the machine's GEMM rate "
              << std::fixed << std::setprecision(3) << fraction << std::defaultfloat << "\n";
    std::string reference_status = "skipped";
    double worst = NAN;
    if (o.reference) {
      // The reference: the same layer on the full sequence, one rank, P = 1.
      mlacp::Mesh self(MPI_COMM_SELF);
      mlacp::MlaAttention<Ref> reference(c, reference_weights<Ref>(c, weights), self);
      auto ref_forward = reference.forward(space, widened<Ref>(x_full));
      const auto ref = reference.backward(space, ref_forward, widened<Ref>(dy_full));
      std::map<std::string, std::vector<double>> want = {{"y", to_host(ref_forward.output())}, {"dx", to_host(ref.dx)}};
      mlacp::for_each_parameter([&](const mlacp::ParameterInfo& info,
                                    const auto& gradient) { want[std::string("d") + info.name] = to_host(gradient); },
                                ref);
      std::cout << "  relative error vs single-rank full-sequence reference (tolerance " << tolerance << "):\n";
      worst = 0;
      double floor = 0;  // 1% of the largest reference tensor (the layer tests' floor, layer_reference_checks.hpp)
      for (const auto& [name, values] : want) floor = std::max(floor, 1e-2 * norm(values));
      for (const auto& [name, values] : got) {
        const double e = relative_error(values, want.at(name), floor);
        worst = std::max(worst, e);
        std::cout << "    " << std::left << std::setw(7) << name << std::scientific << std::setprecision(3) << e
                  << (e <= tolerance ? "" : "   <-- above tolerance") << std::defaultfloat << "\n";
      }
      verdict = worst <= tolerance ? 0 : 1;
      reference_status = verdict == 0 ? "PASS" : "FAIL";
      std::cout << reference_status << " (max relative error " << std::scientific << worst << ")\n"
                << std::defaultfloat;
    } else {
      std::cout << "  reference: skipped (--no-reference), no PASS/FAIL verdict\n";
    }
    if constexpr (bf16) {
      // Which backend the layer's bf16 plan chose per GEMM shape, and what oneDNN dispatches to on this CPU.
      std::map<std::string, int> backends;
      for (const auto& entry : layer.bf16_gemm_plan()->choices())
        ++backends[mlacp::bf16_gemm_backend_name(entry.second.backend)];
      std::cout << "  bf16 GEMM backends (shapes):";
      for (const auto& [name, n] : backends) std::cout << " " << name << " " << n;
      std::cout << "; oneDNN ISA " << mlacp::onednn_cpu_isa() << "\n";
    }

    if (!o.dump.empty()) {
      std::filesystem::create_directories(o.dump);
      const auto B = static_cast<std::size_t>(c.batch), S = static_cast<std::size_t>(c.seq),
                 D = static_cast<std::size_t>(c.hidden);
      dump<DumpT>(o.dump, "x", to_host(x_full), {B, S, D});
      dump<DumpT>(o.dump, "dy", to_host(dy_full), {B, S, D});
      if (!c.cu_seqlens.empty())
        mlacp::tools::write_npy(o.dump + "/cu_seqlens.npy", c.cu_seqlens, {c.cu_seqlens.size()});
      auto shape = [](const auto& v) {
        std::vector<std::size_t> e;
        for (unsigned d = 0; d < static_cast<unsigned>(std::decay_t<decltype(v)>::rank); ++d) e.push_back(v.extent(d));
        return e;
      };
      std::vector<std::pair<std::string, std::pair<std::vector<double>, std::vector<std::size_t>>>> params;
      mlacp::for_each_parameter(
          [&](const mlacp::ParameterInfo& info, const auto& weight) {
            params.emplace_back(info.name, std::make_pair(to_host(weight), shape(weight)));
          },
          weights);
      std::map<std::string, std::vector<std::size_t>> shapes = {{"y", {B, S, D}}, {"dx", {B, S, D}}};
      for (const auto& [name, p] : params) {
        if (p.first.empty()) continue;
        dump<DumpT>(o.dump, name, p.first, p.second);
        shapes["d" + name] = p.second;
      }
      for (const auto& [name, values] : got) dump<DumpT>(o.dump, name, values, shapes.at(name));
      const Json config = {{"batch", c.batch},
                           {"seq", c.seq},
                           {"hidden", c.hidden},
                           {"heads", c.heads},
                           {"qk_nope_head_dim", c.nope},
                           {"qk_rope_head_dim", c.rope},
                           {"v_head_dim", c.vdim},
                           {"kv_lora_rank", c.latent},
                           {"q_lora_rank", c.q_lora_rank},
                           {"softmax_scale", c.attention_scale()},
                           {"bias", c.bias},
                           {"dtype", o.dtype},
                           {"strategy", mlacp::to_string(c.strategy)},
                           {"wire_dtype", mlacp::to_string(c.wire_dtype)},
                           {"ulysses_size", mesh.ulysses_size()},
                           {"ring_size", mesh.ring_size()},
                           {"ring_layout", mlacp::to_string(c.ring_layout)},
                           {"seed", o.seed},
                           {"ranks", P},
                           {"overlap", c.overlap},
                           {"cu_seqlens", c.cu_seqlens}};
      std::ofstream(o.dump + "/config.json") << json_text(config, 2) << "\n";
      std::cout << "  dumped " << got.size() + 2 + params.size() + (c.cu_seqlens.empty() ? 0 : 1)
                << " .npy files and config.json to " << o.dump << "\n";
    }

    if (!o.json.empty()) {
      std::ofstream json(o.json);
      if (!json) throw std::runtime_error("cannot write " + o.json);
      Json config_json = mlacp::tools::config_dims_json(c);  // B, S, D, H, dn, dr, dv, R, Rq from the table
      config_json["softmax_scale"] = c.attention_scale();
      config_json["bias"] = c.bias;
      Json report = {{"tool", "mlacp-mla-block"},
                     {"status", "ok"},
                     {"config", config_json},
                     {"P", P},
                     {"dtype", o.dtype},
                     {"strategy", mlacp::to_string(c.strategy)},
                     {"wire_dtype", mlacp::to_string(c.wire_dtype)},
                     {"overlap", c.overlap},
                     {"warmup", o.warmup},
                     {"iters", o.iters},
                     {"ulysses_size", mesh.ulysses_size()},
                     {"ring_size", mesh.ring_size()},
                     {"ring_layout", mlacp::to_string(c.ring_layout)},
                     {"attention_pairs_max_over_min", balance.pairs_ratio()},
                     {"attention_cpu_max_over_min", balance.cpu_ratio()},
                     {"forward_workspace_bytes", layer.forward_workspace_bytes()},
                     {"collective_bytes_per_iteration", wire_bytes_per_iteration},
                     {"protocol", "per iteration: barrier, forward + backward, fence, time = max over ranks; median"},
                     {"time_median_s", median},
                     {"time_min_s", times.front()},
                     {"times_s", times},
                     {"peak_rss_bytes", peak_rss},
                     {"peak_view_bytes", view_peak}};
      if (!model.planned.empty()) report["planned"] = model.planned;
      if (model.prediction) {
        const mlacp::model::Prediction& p = *model.prediction;
        report["predicted"] = {
            {"machine", model.machine},         {"choice", p.choice.describe()}, {"forward_s", p.forward_s},
            {"backward_s", p.backward_s},       {"total_s", p.total_s()},        {"hidden_fraction", p.hidden_fraction},
            {"memory_bytes", p.memory.total()}, {"bytes_intra", p.bytes.intra},  {"bytes_inter", p.bytes.inter}};
      } else if (!model.machine.empty()) {
        // No "predicted" key then: the reports read its presence as "a prediction" (ring_report.py,
        // validate_report.py).
        report["prediction_unavailable"] = model.why_not;
      }
      report["roofline"] = {{"forward_flops", flops.forward},
                            {"backward_flops", flops.backward},
                            {"attention_forward_flops", flops.attention_forward},
                            {"attention_backward_flops", flops.attention_backward},
                            {"projections_forward_flops", flops.projections_forward},
                            {"projections_backward_flops", flops.projections_backward},
                            {"total_flops", flops.total()},
                            {"gemm_rate_flops_per_s", gemm.flops_per_s},
                            {"gemm_shape", gemm.shape},
                            {"flop_rate_per_s", flops.total() / median},
                            {"fraction_of_gemm_rate", fraction}};
      report["reference"] = reference_status;
      report["max_relative_error"] = worst;
      json << json_text(report) << "\n";
      std::cout << "  wrote " << o.json << "\n";
    }
  }
  // Watched: when rank 0 fails on its own (the reference's memory, a file it cannot write), it reports the failure on
  // the mesh, and the others raise it here instead of waiting.
  if (P > 1) {
    mlacp::CollectiveInfo info = tool_step("the verdict");
    info.operation = "MPI_Ibcast";
    mlacp::mpi::broadcast(mesh.comm(), &verdict, sizeof verdict, 0, info, "mlacp-mla-block: the verdict");
  }
  return verdict;
}

// The tool's flags, agreed over MPI_COMM_WORLD before Kokkos starts: -1 and the options to run, or the exit code (0
// after --help, 2 after a bad flag on any rank; rank 0 prints the usage and the lowest failing rank's message), so
// that ranks started with different flags (an MPMD launch) all stop instead of some entering the mesh's collectives.
int parse_agreed(int argc, char** argv, int rank, Options& options) {
  int status = 0;  // 0 run, 1 help, 2 a bad flag
  std::string message;
  try {
    options = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    message = e.what();
    status = message.empty() ? 1 : 2;
  }
  int worst = status;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst == 0) return -1;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failing = status == worst ? rank : size;
  MPI_Allreduce(MPI_IN_PLACE, &failing, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  char text[1024] = {};
  if (rank == failing) std::strncpy(text, message.c_str(), sizeof(text) - 1);
  MPI_Bcast(text, sizeof text, MPI_CHAR, failing, MPI_COMM_WORLD);
  if (rank == 0) {
    if (worst == 2)
      std::cerr << "mlacp-mla-block: " << text << (size > 1 ? " [rank " + std::to_string(failing) + "]" : "") << "\n";
    (worst == 2 ? std::cerr : std::cout) << usage;
  }
  return worst == 2 ? 2 : 0;
}

bool asks_for_kokkos_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--kokkos-help") return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Options options;
  int code = parse_agreed(argc, argv, rank, options);
  if (code < 0 && asks_for_kokkos_help(argc, argv)) {
    Kokkos::ScopeGuard kokkos(argc, argv);  // prints Kokkos' own options
    code = 0;
  }
  if (code < 0) {
    Kokkos::ScopeGuard kokkos(argc, argv);
    std::optional<mlacp::Mesh> mesh;  // once it exists, a failure on one rank is reported on it (report_failure)
    try {
      namespace model = mlacp::model;
      ModelReport report;
      std::optional<model::MachineParams> machine;
      const model::Dtype dtype = model::parse_dtype(options.dtype);  // "double", "float", "bf16": the tool's names
      if (!options.machine.empty()) {
        // Read on rank 0 and broadcast: the same parameters, or the same error, on every rank.
        machine = model::read_machine(MPI_COMM_WORLD, options.machine);
        report.machine = machine->name.empty() ? options.machine : machine->name;
      }
      if (options.plan_ring) {
        // The same choice on every rank, or the same InvalidArgument (nothing fits the budget) on every rank.
        const model::PlannedMesh pm =
            model::plan_mesh(MPI_COMM_WORLD, options.config, dtype, *machine, options.memory_per_rank);
        const model::PlanRow& best = *pm.plan.best();
        report.planned = pm.choice.describe();
        if (rank == 0) {
          std::ostringstream line;
          line << "mlacp-mla-block: --ring plan on " << pm.cluster.nodes << " node(s) x " << pm.cluster.ranks_per_node
               << " rank(s) (" << report.machine << "): " << pm.choice.describe() << ", predicted forward+backward "
               << std::setprecision(4) << best.prediction.total_s() * 1e3 << " ms, memory "
               << best.prediction.memory.total() / (1 << 20) << " MiB per rank";
          if (pm.plan.budget > 0) line << " (budget " << pm.plan.budget / (1 << 20) << " MiB)";
          line << ", first of " << pm.plan.rows.size() << " choices";
          if (options.strategy_given && options.config.strategy != pm.choice.strategy)
            line << "; overrides --strategy " << mlacp::to_string(options.config.strategy);
          else if (options.strategy_given)
            line << "; --strategy " << mlacp::to_string(options.config.strategy) << " is the plan's too";
          if (options.layout_given && pm.choice.ring == 1)
            line << "; overrides --ring-layout " << mlacp::to_string(options.config.ring_layout)
                 << " (a flat mesh has no ring layout)";
          else if (options.layout_given && options.config.ring_layout != pm.choice.layout)
            line << "; overrides --ring-layout " << mlacp::to_string(options.config.ring_layout);
          else if (options.layout_given)
            line << "; --ring-layout " << mlacp::to_string(options.config.ring_layout) << " is the plan's too";
          std::cout << line.str() << "\n" << std::flush;
        }
        options.config = model::apply(pm.choice, options.config);
        options.ring = mlacp::Ring(pm.choice.ring);
      }
      mesh.emplace(MPI_COMM_WORLD, options.ring);
      if (machine) {
        // The model's prediction for this run's own choice; a choice the model cannot place (or a machine without
        // this dtype's figures) is reported, on every rank alike, and the run goes on.
        const model::Choice choice{options.config.strategy, mesh->ulysses_size(), mesh->ring_size(),
                                   options.config.ring_layout};
        try {
          report.prediction =
              model::predict(options.config, dtype, choice, model::cluster_of(MPI_COMM_WORLD), *machine);
        } catch (const mlacp::InvalidArgument& e) {
          report.why_not = e.what();
        }
      }
      code = options.dtype == "float"  ? run<float>(options, *mesh, report)
             : options.dtype == "bf16" ? run<mlacp::bf16>(options, *mesh, report)
                                       : run<double>(options, *mesh, report);
    } catch (const std::exception& caught) {
      // mlacp raises its errors on every rank (an agreement, or the failure channel): every rank says so (a rank that
      // did not would be one left waiting in a collective), rank 0 prints the verdict. Anything else (an allocation
      // that did not fit, a file that cannot be written) happened on this rank alone: it is reported on the mesh, so
      // that the others' next wait raises it instead of hanging.
      std::string what = caught.what();
      if (auto out_of_memory = mlacp::detail::translate_allocation_failure(caught, "mlacp-mla-block"))
        what = out_of_memory->what();
      const bool agreed = dynamic_cast<const mlacp::InvalidArgument*>(&caught) != nullptr ||
                          dynamic_cast<const mlacp::UsageError*>(&caught) != nullptr;
      if (mesh && !agreed) mesh->report_failure("mlacp-mla-block: rank " + std::to_string(rank) + ": " + what);
      std::cerr << "mlacp-mla-block: rank " + std::to_string(rank) + ": " + what + "\n" << std::flush;
      if (rank == 0) std::cerr << "FAIL\n";
      code = 2;
    }
  }
  MPI_Finalize();
  return code;
}
