// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Shared by the perf_tests: command line, the timing protocol (warm-up, repeats, per-iteration time = max over ranks,
// median), the GEMM rate a roofline is measured against, the reports' JSON objects and machine facts.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <mlacp/compat.hpp>
#include <mlacp/mla/flop_count.hpp>
#include <mlacp/mla/mla_config.hpp>

#include <Kokkos_Core.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mlacp::perf {

// ---- command line ---------------------------------------------------------------------------------------------------

struct Options {
  bool quick = false;
  std::string json;  // "" = no file
  int repeats = 0;   // 0 = the benchmark's default (quick or full)
  int warmup = 2;
  std::string transport = "shm";
  std::string rate = "none";
  std::map<std::string, std::string> extra;  // benchmark-specific --key value flags

  int repeats_or(int quick_default, int full_default) const {
    return repeats > 0 ? repeats : (quick ? quick_default : full_default);
  }
  std::string get(const std::string& key, const std::string& fallback) const {
    const auto it = extra.find(key);
    return it == extra.end() ? fallback : it->second;
  }
  int get_int(const std::string& key, int fallback) const {
    const auto it = extra.find(key);
    return it == extra.end() ? fallback : std::stoi(it->second);
  }
};

// Parses the common flags and the benchmark's own (`known`, each taking a value; `switches`, each without one).
// Throws std::invalid_argument naming the flag.
inline Options parse_options(int argc, char** argv, const std::vector<std::string>& known,
                             const std::vector<std::string>& switches = {}) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--quick") {
      o.quick = true;
      continue;
    }
    if (std::find(switches.begin(), switches.end(), flag) != switches.end()) {
      o.extra[flag.substr(2)] = "1";
      continue;
    }
    if (flag == "--help" || flag == "-h") throw std::invalid_argument("");
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--json") {
      o.json = value;
    } else if (flag == "--repeats") {
      o.repeats = std::stoi(value);
      if (o.repeats < 1) throw std::invalid_argument("--repeats " + value + ": expected at least 1");
    } else if (flag == "--warmup") {
      o.warmup = std::stoi(value);
    } else if (flag == "--transport-label") {
      o.transport = value;
    } else if (flag == "--rate-label") {
      o.rate = value;
    } else if (std::find(known.begin(), known.end(), flag) != known.end()) {
      o.extra[flag.substr(2)] = value;
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  return o;
}

// ---- timing ---------------------------------------------------------------------------------------------------------

/// The CPU's model name (/proc/cpuinfo) and whether its flags include what bounds a GEMM rate (vector width, FMA, bf16
/// and AMX instructions): "avx2=yes fma=yes ...", printed beside every figure.
inline std::pair<std::string, std::string> cpu_model_and_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown", flags;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && model == "unknown") model = value;
    if (key == "flags" && flags.empty()) flags = " " + value + " ";
  }
  std::string summary;
  for (const char* f : {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    summary += std::string(summary.empty() ? "" : " ") + f +
               (flags.find(std::string(" ") + f + " ") != std::string::npos ? "=yes" : "=no");
  return {model, summary};
}

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Samples {
  std::vector<double> times;  // per iteration, max over ranks, seconds
  double median() const { return perf::median(times); }
  double min() const { return times.empty() ? NAN : *std::min_element(times.begin(), times.end()); }
};

// The protocol: `warmup` untimed iterations, then `repeats` timed ones; each starts after a barrier, ends after a
// global Kokkos fence, and its time is the maximum over the ranks of `comm`. `setup` (untimed) runs before each.
inline Samples measure(MPI_Comm comm, int warmup, int repeats, const std::function<void()>& body,
                       const std::function<void()>& setup = {}) {
  Samples s;
  for (int it = 0; it < warmup + repeats; ++it) {
    if (setup) setup();
    Kokkos::fence();
    MPI_Barrier(comm);
    const double start = now();
    body();
    Kokkos::fence();
    double t = now() - start;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
    if (it >= warmup) s.times.push_back(t);
  }
  return s;
}

// The same protocol for several bodies measured together: each round runs every body once (in an order rotated from
// round to round), so that a load change on a shared machine affects all of them alike and their ratios stay
// meaningful. Returns one Samples per body.
inline std::vector<Samples> measure_interleaved(MPI_Comm comm, int warmup, int repeats,
                                                const std::vector<std::function<void()>>& bodies) {
  std::vector<Samples> out(bodies.size());
  const std::size_t n = bodies.size();
  for (int it = 0; it < warmup + repeats; ++it) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t b = (k + static_cast<std::size_t>(it)) % n;
      Kokkos::fence();
      MPI_Barrier(comm);
      const double start = now();
      bodies[b]();
      Kokkos::fence();
      double t = now() - start;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
      if (it >= warmup) out[b].times.push_back(t);
    }
  }
  return out;
}

// A timed body with an untimed preparation (e.g. a fresh invocation of a library piece, whose backward can run once)
// and an untimed follow-up (e.g. reading what an event recorder logged during the body).
struct PreparedBody {
  PreparedBody() = default;
  PreparedBody(std::function<void()> prepare_, std::function<void()> body_, std::function<void()> finish_ = {})
      : prepare(std::move(prepare_)), body(std::move(body_)), finish(std::move(finish_)) {}
  std::function<void()> prepare;  // untimed, before the round's barrier; may be empty
  std::function<void()> body;     // timed
  std::function<void()> finish;   // untimed, after the round's time is taken; may be empty
};

// measure_interleaved for bodies that need an untimed preparation each round: every round prepares each body right
// before timing it, and finishes it right after, in the same rotated order on every rank (a preparation may run
// collectives).
inline std::vector<Samples> measure_interleaved_prepared(MPI_Comm comm, int warmup, int repeats,
                                                         const std::vector<PreparedBody>& bodies) {
  std::vector<Samples> out(bodies.size());
  const std::size_t n = bodies.size();
  for (int it = 0; it < warmup + repeats; ++it) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t b = (k + static_cast<std::size_t>(it)) % n;
      if (bodies[b].prepare) bodies[b].prepare();
      Kokkos::fence();
      MPI_Barrier(comm);
      const double start = now();
      bodies[b].body();
      Kokkos::fence();
      double t = now() - start;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
      if (it >= warmup) out[b].times.push_back(t);
      if (bodies[b].finish) bodies[b].finish();
    }
  }
  return out;
}

// The machine's GEMM rate for a roofline: one compat::gemm C[m, n] = A[m, k] B[n, k]^T (a projection's forward shape,
// x W^T) on every rank at once, as the layer runs (one rank per core). `measure`'s protocol, one untimed call first;
// the rate is 2*m*n*k over the median time. Call it before the layer runs, in the same process.
struct GemmRate {
  double flops_per_s = NAN;
  std::string shape;
  int repeats = 0;
};

template <class T>
GemmRate measure_gemm_rate(MPI_Comm comm, int m, int k, int n, int repeats = 5) {
  using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space>;
  Matrix a("gemm a", m, k), b("gemm b", n, k), c("gemm c", m, n);
  Kokkos::deep_copy(a, T(0.5));
  Kokkos::deep_copy(b, T(0.25));
  const Kokkos::DefaultExecutionSpace space;
  const Samples s = measure(comm, 1, repeats, [&] { mlacp::compat::gemm(space, "N", "T", T(1), a, b, T(0), c); });
  GemmRate rate;
  rate.flops_per_s = 2.0 * m * k * n / s.median();
  rate.shape = "[" + std::to_string(m) + " x " + std::to_string(k) + "] x [" + std::to_string(k) + " x " +
               std::to_string(n) + "]";
  rate.repeats = repeats;
  return rate;
}

// Kokkos Tools region for a scope (users' space-time-stack / NVTX connector show the benchmark's phases).
class Region : public compat::ScopedRegion {
 public:
  explicit Region(const std::string& name) : compat::ScopedRegion("mlacp-perf::" + name) {}
};

// ---- JSON -----------------------------------------------------------------------------------------------------------
// nlohmann/json's ordered_json: keys in the order written, the order the reports have always had.
using Json = nlohmann::ordered_json;

// A report's object, built by chained calls: JsonObject().str("benchmark", name).num("P", P).
class JsonObject {
 public:
  JsonObject& set(const std::string& key, Json v) {
    value_[key] = std::move(v);
    return *this;
  }
  // A whole number (P, repeats, a byte count) is written as an integer, as the readers index and count with them;
  // one that is not finite as null.
  JsonObject& num(const std::string& key, double v) {
    if (v == std::floor(v) && std::fabs(v) <= 9007199254740992.0) return set(key, static_cast<std::int64_t>(v));
    return set(key, v);
  }
  JsonObject& str(const std::string& key, const std::string& v) { return set(key, v); }
  JsonObject& obj(const std::string& key, const JsonObject& v) { return set(key, v.json()); }
  JsonObject& samples(const std::string& key, const Samples& s) {
    return obj(key, JsonObject().num("median_s", s.median()).num("min_s", s.min()).set("times_s", s.times));
  }
  const Json& json() const { return value_; }

 private:
  Json value_ = Json::object();
};

// The roofline fields of a report: the block's FLOPs per rank (mlacp/mla/flop_count.hpp), the GEMM rate, and for a
// measured phase (`timed_flops` in `seconds`) its FLOP rate and the fraction of the GEMM rate it corresponds to,
// (timed_flops / GEMM rate) / seconds.
inline JsonObject roofline_json(const mlacp::MlaFlops& f, const GemmRate& gemm, double timed_flops, double seconds) {
  return JsonObject()
      .num("forward_flops", f.forward)
      .num("backward_flops", f.backward)
      .num("attention_forward_flops", f.attention_forward)
      .num("attention_backward_flops", f.attention_backward)
      .num("projections_forward_flops", f.projections_forward)
      .num("projections_backward_flops", f.projections_backward)
      .num("gemm_rate_flops_per_s", gemm.flops_per_s)
      .str("gemm_shape", gemm.shape)
      .num("timed_flops", timed_flops)
      .num("flop_rate_per_s", timed_flops / seconds)
      .num("fraction_of_gemm_rate", timed_flops / gemm.flops_per_s / seconds);
}

inline std::string hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

inline std::string mpi_library() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string v(version, static_cast<std::size_t>(length));
  const auto nl = v.find_first_of("\r\n,");
  return nl == std::string::npos ? v : v.substr(0, nl);
}

// The header every JSON file starts with: machine, transport, rate, P, protocol.
inline JsonObject header(const std::string& benchmark, const Options& o, int nranks, int repeats) {
  JsonObject h;
  h.str("benchmark", benchmark)
      .str("hostname", hostname())
      .num("hardware_concurrency", static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN)))
      .str("mpi", mpi_library())
      .str("kokkos_execution_space", Kokkos::DefaultExecutionSpace::name())
      .str("transport", o.transport)
      .str("rate", o.rate)
      .num("P", nranks)
      .set("quick", o.quick)
      .num("warmup", o.warmup)
      .num("repeats", repeats)
      .str("protocol", "per iteration: barrier, body, fence, time = max over ranks (MPI_Allreduce MAX); median");
  return h;
}

// Writes `doc` to `path` (nothing when `path` is ""), indented; bytes that are not UTF-8 become U+FFFD.
inline void write_json(const std::string& path, const Json& doc) {
  if (path.empty()) return;
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << doc.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
  std::cout << "wrote " << path << "\n";
}

inline std::string ms(double seconds, int precision = 2) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(precision) << seconds * 1e3;
  return s.str();
}

inline std::string fixed(double v, int precision = 3) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(precision) << v;
  return s.str();
}

// Runs `body` inside MPI and Kokkos, turning exceptions into a message and exit code 1 (on every rank that threw).
inline int run_main(int argc, char** argv, const char* usage, const std::function<int(int, char**)>& body,
                    bool thread_multiple = false) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      rc = body(argc, argv);
    } catch (const std::invalid_argument& e) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0) std::cerr << (std::string(e.what()).empty() ? "" : std::string(e.what()) + "\n") << usage;
      rc = 2;
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << "\n";
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}

/// A layer configuration's dimensions as JSON (docs/spec.md's names: B, S, D, H, dn, dr, dv, R and Rq).
inline JsonObject config_json(const MlaConfig& c) {
  return JsonObject()
      .num("B", c.batch)
      .num("S", c.seq)
      .num("D", c.hidden)
      .num("H", c.heads)
      .num("dn", c.nope)
      .num("dr", c.rope)
      .num("dv", c.vdim)
      .num("R", c.latent)
      .num("Rq", c.q_lora_rank);
}

}  // namespace mlacp::perf
