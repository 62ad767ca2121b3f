// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-mla-block: runs the MLA layer under MPI at the given dimensions, computes the same layer on the full sequence
// on rank 0 with P = 1, prints the relative error of the output and of every gradient and PASS or FAIL (exit code 0
// or 1), and with --dump DIR writes the tensors as .npy files (MLA_SPEC "Dump format"). Run it with mpirun or srun
// to check an installation: `srun -n 4 mlacp-mla-block --strategy latent --dtype double`.
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mla/synthetic.hpp>
#include <mlacp/version.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "npy.hpp"

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

struct Options {
  mlacp::MlaConfig config;
  std::string dtype = "double";
  std::uint64_t seed = 1;
  int iters = 1;
  std::string dump;
  double tolerance = -1;  // < 0: MLA_SPEC's (1e-10 double, 1e-4 float)
};

const char* usage =
    "usage: mlacp-mla-block [--batch B] [--seq S] [--hidden D] [--heads H] [--nope dn] [--rope dr] [--vdim dv]\n"
    "                       [--latent R] [--strategy latent|expanded] [--dtype float|double] [--bias] [--seed N]\n"
    "                       [--iters N] [--dump DIR] [--tolerance X] [--blocking]\n"
    "Defaults: B=2 S=32 D=48 H=4 dn=8 dr=4 dv=6 R=12, latent, double, seed 1, 1 iteration.\n";

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
  const std::map<std::string, int*> ints = {{"--batch", &c.batch}, {"--seq", &c.seq},       {"--hidden", &c.hidden},
                                            {"--heads", &c.heads}, {"--nope", &c.nope},     {"--rope", &c.rope},
                                            {"--vdim", &c.vdim},   {"--latent", &c.latent}, {"--iters", &o.iters}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--bias") {
      c.bias = true;
      continue;
    }
    if (flag == "--blocking") {
      c.overlap = false;
      continue;
    }
    if (flag == "--help" || flag == "-h") throw std::invalid_argument("");
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    try {
      if (auto it = ints.find(flag); it != ints.end()) {
        std::size_t used = 0;
        *it->second = std::stoi(value, &used);
        if (used != value.size()) throw std::invalid_argument("");
      } else if (flag == "--strategy") {
        c.strategy = mlacp::parse_strategy(value);
      } else if (flag == "--dtype") {
        if (value != "float" && value != "double") throw std::invalid_argument("");
        o.dtype = value;
      } else if (flag == "--seed") {
        o.seed = std::stoull(value);
      } else if (flag == "--dump") {
        o.dump = value;
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
  if (o.iters < 1) throw std::invalid_argument("--iters " + std::to_string(o.iters) + ": expected at least 1");
  return o;
}

template <class ViewType>
std::vector<double> to_host(const ViewType& v) {
  std::vector<double> out;
  if (v.data() == nullptr) return out;
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  out.assign(h.data(), h.data() + h.size());
  return out;
}

double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

// The full [B, S, D] tensor on rank 0 from every rank's [B, s, D] shard (empty elsewhere).
std::vector<double> gather_tokens(const std::vector<double>& local, int B, int s, int D, const mlacp::Mesh& mesh) {
  std::vector<double> all(mesh.rank() == 0 ? local.size() * static_cast<std::size_t>(mesh.size()) : 0);
  MPI_Gather(local.data(), static_cast<int>(local.size()), MPI_DOUBLE, all.data(), static_cast<int>(local.size()),
             MPI_DOUBLE, 0, mesh.comm());
  if (mesh.rank() != 0) return {};
  const int P = mesh.size(), S = s * P;
  std::vector<double> full(all.size());
  for (int r = 0; r < P; ++r)
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < s; ++t)
        std::copy_n(&all[((static_cast<std::size_t>(r) * B + b) * s + t) * D], D,
                    &full[(static_cast<std::size_t>(b) * S + r * s + t) * D]);
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

template <class T>
int run(const Options& o, const mlacp::Mesh& mesh) {
  const auto& c = o.config;
  const int P = mesh.size(), rank = mesh.rank();
  const double tolerance = o.tolerance >= 0 ? o.tolerance : (std::is_same_v<T, double> ? 1e-10 : 1e-4);
  using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
  const Space space;

  // The layer validates the configuration on every rank (before any other collective).
  const auto weights = mlacp::synthetic::weights<T, Mem>(c, o.seed);
  mlacp::MlaAttention<T> layer(c, weights, mesh);
  const int s = layer.local_seq();
  Tensor3 x_full("x", c.batch, c.seq, c.hidden), dy_full("dy", c.batch, c.seq, c.hidden);
  mlacp::synthetic::fill(x_full, o.seed + 100, 1.0);
  mlacp::synthetic::fill(dy_full, o.seed + 200, 1.0);
  const auto shard = [&](const Tensor3& full) {
    Tensor3 local("shard", c.batch, s, c.hidden);
    const auto begin = static_cast<std::size_t>(rank * s);
    Kokkos::deep_copy(local, Kokkos::subview(full, Kokkos::ALL(), std::make_pair(begin, begin + s), Kokkos::ALL()));
    return local;
  };
  const Tensor3 x = shard(x_full), dy = shard(dy_full);

  std::vector<double> times;
  typename mlacp::MlaAttention<T>::gradients_type grads;
  Tensor3 y;
  for (int it = 0; it < o.iters; ++it) {
    MPI_Barrier(mesh.comm());
    const auto start = std::chrono::steady_clock::now();
    auto forward = layer.forward(space, x);
    grads = layer.backward(space, forward, dy);
    Kokkos::fence();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, mesh.comm());
    times.push_back(seconds);
    y = forward.output();
  }
  std::sort(times.begin(), times.end());

  // Distributed results, assembled on rank 0 in global order; weight gradients summed over ranks.
  std::vector<std::pair<std::string, std::vector<double>>> got;
  got.emplace_back("y", gather_tokens(to_host(y), c.batch, s, c.hidden, mesh));
  got.emplace_back("dx", gather_tokens(to_host(grads.dx), c.batch, s, c.hidden, mesh));
  const std::vector<std::pair<std::string, std::vector<double>>> local_weight_grads = {
      {"dw_q", to_host(grads.w_q)},   {"db_q", to_host(grads.b_q)},     {"dw_kva", to_host(grads.w_kva)},
      {"dg_kv", to_host(grads.g_kv)}, {"dw_kvb", to_host(grads.w_kvb)}, {"db_kvb", to_host(grads.b_kvb)},
      {"dw_o", to_host(grads.w_o)},   {"db_o", to_host(grads.b_o)}};
  for (const auto& [name, values] : local_weight_grads)
    if (!values.empty()) got.emplace_back(name, sum_to_root(values, mesh));

  int verdict = 0;
  if (rank == 0) {
    // The reference: the same layer on the full sequence, one rank, P = 1.
    mlacp::Mesh self(MPI_COMM_SELF);
    mlacp::MlaAttention<T> reference(c, weights, self);
    auto ref_forward = reference.forward(space, x_full);
    const auto ref = reference.backward(space, ref_forward, dy_full);
    const std::map<std::string, std::vector<double>> want = {
        {"y", to_host(ref_forward.output())}, {"dx", to_host(ref.dx)},
        {"dw_q", to_host(ref.w_q)},           {"db_q", to_host(ref.b_q)},
        {"dw_kva", to_host(ref.w_kva)},       {"dg_kv", to_host(ref.g_kv)},
        {"dw_kvb", to_host(ref.w_kvb)},       {"db_kvb", to_host(ref.b_kvb)},
        {"dw_o", to_host(ref.w_o)},           {"db_o", to_host(ref.b_o)}};
    std::cout << "mlacp-mla-block: " << c.describe() << " dtype=" << o.dtype << " P=" << P << " seed=" << o.seed
              << (c.overlap ? "" : " (blocking collectives)") << "\n";
    std::cout << "  iteration time (max over ranks): median " << std::setprecision(4) << times[times.size() / 2] * 1e3
              << " ms, min " << times.front() * 1e3 << " ms over " << o.iters << " iteration(s)\n";
    std::cout << "  relative error vs single-rank full-sequence reference (tolerance " << tolerance << "):\n";
    double worst = 0;
    for (const auto& [name, values] : got) {
      const double e = relative_error(values, want.at(name));
      worst = std::max(worst, e);
      std::cout << "    " << std::left << std::setw(7) << name << std::scientific << std::setprecision(3) << e
                << (e <= tolerance ? "" : "   <-- above tolerance") << std::defaultfloat << "\n";
    }
    verdict = worst <= tolerance ? 0 : 1;
    std::cout << (verdict == 0 ? "PASS" : "FAIL") << " (max relative error " << std::scientific << worst << ")\n"
              << std::defaultfloat;

    if (!o.dump.empty()) {
      std::filesystem::create_directories(o.dump);
      const auto B = static_cast<std::size_t>(c.batch), S = static_cast<std::size_t>(c.seq),
                 D = static_cast<std::size_t>(c.hidden);
      dump<T>(o.dump, "x", to_host(x_full), {B, S, D});
      dump<T>(o.dump, "dy", to_host(dy_full), {B, S, D});
      auto shape = [](const auto& v) {
        std::vector<std::size_t> e;
        for (unsigned d = 0; d < static_cast<unsigned>(std::decay_t<decltype(v)>::rank); ++d) e.push_back(v.extent(d));
        return e;
      };
      const std::vector<std::pair<std::string, std::pair<std::vector<double>, std::vector<std::size_t>>>> params = {
          {"w_q", {to_host(weights.w_q), shape(weights.w_q)}},
          {"b_q", {to_host(weights.b_q), shape(weights.b_q)}},
          {"w_kva", {to_host(weights.w_kva), shape(weights.w_kva)}},
          {"g_kv", {to_host(weights.g_kv), shape(weights.g_kv)}},
          {"w_kvb", {to_host(weights.w_kvb), shape(weights.w_kvb)}},
          {"b_kvb", {to_host(weights.b_kvb), shape(weights.b_kvb)}},
          {"w_o", {to_host(weights.w_o), shape(weights.w_o)}},
          {"b_o", {to_host(weights.b_o), shape(weights.b_o)}}};
      std::map<std::string, std::vector<std::size_t>> shapes = {{"y", {B, S, D}}, {"dx", {B, S, D}}};
      for (const auto& [name, p] : params) {
        if (p.first.empty()) continue;
        dump<T>(o.dump, name, p.first, p.second);
        shapes["d" + name] = p.second;
      }
      for (const auto& [name, values] : got) dump<T>(o.dump, name, values, shapes.at(name));
      std::ofstream json(o.dump + "/config.json");
      json << "{\n  \"batch\": " << c.batch << ",\n  \"seq\": " << c.seq << ",\n  \"hidden\": " << c.hidden
           << ",\n  \"heads\": " << c.heads << ",\n  \"qk_nope_head_dim\": " << c.nope
           << ",\n  \"qk_rope_head_dim\": " << c.rope << ",\n  \"v_head_dim\": " << c.vdim
           << ",\n  \"kv_lora_rank\": " << c.latent << ",\n  \"bias\": " << (c.bias ? "true" : "false")
           << ",\n  \"dtype\": \"" << o.dtype << "\",\n  \"strategy\": \"" << mlacp::to_string(c.strategy)
           << "\",\n  \"seed\": " << o.seed << ",\n  \"ranks\": " << P
           << ",\n  \"overlap\": " << (c.overlap ? "true" : "false") << "\n}\n";
      std::cout << "  dumped " << got.size() + 2 + params.size() << " .npy files and config.json to " << o.dump << "\n";
    }
  }
  MPI_Bcast(&verdict, 1, MPI_INT, 0, mesh.comm());
  return verdict;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      const Options options = parse(argc, argv);
      mlacp::Mesh mesh(MPI_COMM_WORLD);
      code = options.dtype == "float" ? run<float>(options, mesh) : run<double>(options, mesh);
    } catch (const std::invalid_argument& e) {
      // Same arguments on every rank: every rank gets here; rank 0 explains.
      if (rank == 0) {
        if (e.what()[0] != '\0') std::cerr << "mlacp-mla-block: " << e.what() << "\n";
        std::cerr << usage;
      }
      code = e.what()[0] == '\0' ? 0 : 2;
    } catch (const mlacp::Error& e) {
      // mlacp raises its errors on every rank (checked mode); rank 0 prints.
      if (rank == 0) std::cerr << "mlacp-mla-block: " << e.what() << "\nFAIL\n";
      code = 2;
    }
  }
  MPI_Finalize();
  return code;
}
