// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// mlacp-mla-block's measuring and checking helpers: the tensors on the host, relative errors against the reference,
// the ranks' token ranges, reductions over the ranks (errors, peak memory), the GEMM rate of the roofline line, the
// attention balance of a ring run, the reference's weights and the preflight check. mla_block.cpp runs them.
#pragma once

#include <mpi.h>
#include <sys/resource.h>
#include <mlacp/collective_bytes.hpp>
#include <mlacp/collectives.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/mla/detail/input_checks.hpp>
#include <mlacp/mla/flop_count.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/testing/synthetic.hpp>
#include <mlacp/token_map.hpp>

#include <Kokkos_Core.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "mla_block_options.hpp"

namespace mlacp::tools::block {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

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
inline double relative_error(const std::vector<double>& a, const std::vector<double>& b, double floor) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max({std::sqrt(den), floor, 1e-300});
}

inline double norm(const std::vector<double>& v) {
  double sum = 0;
  for (const double e : v) sum += e * e;
  return std::sqrt(sum);
}

// Every rank's global token ranges (the layer's TokenMap at each rank's place in the mesh), known on every rank.
inline std::vector<std::vector<mlacp::TokenRange>> ranges_of_ranks(const mlacp::TokenMap& map,
                                                                   const mlacp::Mesh& mesh) {
  const int place[2] = {mesh.ring_rank(), mesh.ulysses_rank()};
  std::vector<int> places(2 * static_cast<std::size_t>(mesh.size()));
  MPI_Allgather(place, 2, MPI_INT, places.data(), 2, MPI_INT, mesh.comm());
  std::vector<std::vector<mlacp::TokenRange>> out;
  for (int r = 0; r < mesh.size(); ++r) out.push_back(map.ranges(places[2 * r], places[2 * r + 1]));
  return out;
}

// The full [B, S, D] tensor on rank 0 from every rank's [B, s_r, D] shard (empty elsewhere): rank r's rows are the
// global tokens of its ranges, in order (the layer's token map; Partition(S, P) on a flat mesh).
inline std::vector<double> gather_tokens(const std::vector<double>& local, int B, int D,
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

inline std::vector<double> sum_to_root(const std::vector<double>& local, const mlacp::Mesh& mesh) {
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
inline mlacp::CollectiveInfo tool_step(const std::string& what) {
  mlacp::CollectiveInfo info;
  info.name = "mlacp-mla-block: " + what;
  info.operation = "MPI_Iallreduce(MAX)";
  return info;
}
// Element-wise maximum over the ranks, in place.
inline void max_over_ranks(const mlacp::Mesh& mesh, std::vector<double>& values, const std::string& what) {
  if (mesh.size() > 1) mlacp::mpi::allreduce_max(mesh.comm(), values, tool_step(what), "mlacp-mla-block: " + what);
}
inline double max_over_ranks(const mlacp::Mesh& mesh, double value, const std::string& what) {
  std::vector<double> values{value};
  max_over_ranks(mesh, values, what);
  return values[0];
}
// Every rank arrives before any leaves (the start of a timed iteration).
void barrier(const mlacp::Mesh& mesh, const std::string& what) { max_over_ranks(mesh, 0.0, what); }

// Peak resident set size of this process in bytes (getrusage's high-water mark, KiB on Linux), max over the ranks.
inline double peak_rss_bytes(const mlacp::Mesh& mesh) {
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
inline std::string json_text(const Json& v, int indent = -1) {
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

}  // namespace mlacp::tools::block
