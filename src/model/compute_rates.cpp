// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Calibration's compute measurements: GEMM, the attention core, memory bandwidth (compute_rates.hpp). No MPI here.
#include "compute_rates.hpp"

#include <Kokkos_Core.hpp>
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/kernels/flash_attention.hpp>
#include <mlacp/mla/kernels/rms_norm.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::model::detail {

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
template <class T>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
template <class T>
using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
template <class T>
using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// Fills v with a deterministic pattern of values in [-1, 1] (on the device, no host copy).
template <class V>
void fill(const V& v, unsigned seed) {
  using T = typename V::non_const_value_type;
  const auto flat = Kokkos::View<T*, Mem, Kokkos::MemoryUnmanaged>(v.data(), v.span());
  Kokkos::parallel_for(
      "mlacp::calibrate fill", Kokkos::RangePolicy<Space>(0, static_cast<std::int64_t>(flat.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const auto h = static_cast<std::uint32_t>(i * 2654435761u + seed * 40503u);
        const float x = static_cast<float>(h % 2001u) / 1000.0f - 1.0f;
        flat(i) = static_cast<T>(x);
      });
}

/// Median seconds of one `run` over `repeats` timed runs after a warm-up, each after sync() and fenced. A timed run
/// repeats `run` back to back for at least `min_run_s` (the count from the warm-up), so that runs of every rank
/// overlap even where one call is shorter than the ranks' start skew: the rate is the loaded one.
template <class Run>
double median_time(int repeats, double min_run_s, const std::function<void()>& sync, const Run& run) {
  sync();
  const double w0 = now();
  run();
  Kokkos::fence();
  const double warm = now() - w0;
  const int calls =
      warm >= min_run_s ? 1 : static_cast<int>(std::min(1e5, std::ceil(min_run_s / std::max(warm, 1e-7))));
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    sync();
    const double t0 = now();
    for (int c = 0; c < calls; ++c) run();
    Kokkos::fence();
    times.push_back((now() - t0) / calls);
  }
  return median(times);
}

template <class T>
struct TypeTag {
  using type = T;
};
/// f(TypeTag<T>{}) for the element type T of `dtype`: one dispatch for every measurement.
template <class F>
auto with_type(Dtype dtype, const F& f) {
  switch (dtype) {
    case Dtype::float64:
      return f(TypeTag<double>{});
    case Dtype::float32:
      return f(TypeTag<float>{});
    case Dtype::bfloat16:
      break;
  }
  return f(TypeTag<bf16>{});  // Dtype::bfloat16
}

/// Operand sets of one GEMM shape, A [m, k] and B [k, n] of TA and C [m, n] of TC, enough of them to span 128 MiB
/// (at most 1024): a timed loop takes the next set at every call, so that its operands come from memory, as the
/// layer's do (each of its GEMMs reads what other kernels wrote or read last), not from a cache the previous call
/// warmed. Timing one set over and over measured the layer's GEMMs 10-15% too fast.
template <class TA, class TC>
struct ColdOperands {
  struct Set {
    Matrix<TA> a, b;
    Matrix<TC> c;
  };
  std::vector<Set> sets;
  std::size_t next = 0;

  explicit ColdOperands(const GemmShape& s) {
    const double bytes = (static_cast<double>(s.m) * s.k + static_cast<double>(s.k) * s.n) * sizeof(TA) +
                         static_cast<double>(s.m) * s.n * sizeof(TC);
    const auto count = static_cast<std::size_t>(std::clamp(std::ceil(128.0 * (1 << 20) / bytes), 1.0, 1024.0));
    for (std::size_t i = 0; i < count; ++i) {
      sets.push_back({Matrix<TA>(std::string("mlacp::calibrate A"), s.m, s.k),
                      Matrix<TA>(std::string("mlacp::calibrate B"), s.k, s.n),
                      Matrix<TC>(std::string("mlacp::calibrate C"), s.m, s.n)});
      fill(sets.back().a, 1 + 2 * static_cast<unsigned>(i));
      fill(sets.back().b, 2 + 2 * static_cast<unsigned>(i));
    }
  }
  const Set& take() {
    const Set& set = sets[next];
    next = (next + 1) % sets.size();
    return set;
  }
};

template <class T>
double time_gemm_t(const GemmShape& s, int repeats, double min_run_s, const std::function<void()>& sync) {
  ColdOperands<T, T> operands(s);
  const Space space;
  return median_time(repeats, min_run_s, sync, [&] {
    const auto& o = operands.take();
    compat::gemm(space, "N", "N", T(1), o.a, o.b, T(0), o.c);
  });
}

double time_gemm_bf16(const GemmShape& s, int repeats, double min_run_s, const std::function<void()>& sync) {
  ColdOperands<bf16, float> operands(s);
  const Space space;
  // The warm-up makes the plan's choice for the shape (auto times its candidates), as the layer's first call does.
  Bf16GemmPlan<Space> plan;
  return median_time(repeats, min_run_s, sync, [&] {
    const auto& o = operands.take();
    plan.gemm(space, "N", "N", 1.0f, o.a, o.b, 0.0f, o.c);
  });
}

template <class T>
AttentionTimes time_attention_t(const AttentionProblem& p, int repeats, double min_run_s,
                                const std::function<void()>& sync) {
  using Lse = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int dqk = p.nope + p.rope;
  const View4<T> q(std::string("mlacp::calibrate q"), p.batch, p.seq, p.heads, dqk);
  const View4<T> k(std::string("mlacp::calibrate k"), p.batch, p.seq, p.heads, dqk);
  const View4<T> v(std::string("mlacp::calibrate v"), p.batch, p.seq, p.heads, p.vdim);
  const View4<T> o(std::string("mlacp::calibrate o"), p.batch, p.seq, p.heads, p.vdim);
  const View4<T> d_o(std::string("mlacp::calibrate dO"), p.batch, p.seq, p.heads, p.vdim);
  const View4<T> dq(std::string("mlacp::calibrate dq"), p.batch, p.seq, p.heads, dqk);
  const View4<T> dk(std::string("mlacp::calibrate dk"), p.batch, p.seq, p.heads, dqk);
  const View4<T> dv(std::string("mlacp::calibrate dv"), p.batch, p.seq, p.heads, p.vdim);
  const View3<Lse> lse(std::string("mlacp::calibrate lse"), p.batch, p.heads, p.seq);
  fill(q, 1);
  fill(k, 2);
  fill(v, 3);
  fill(d_o, 4);
  FlashAttentionCore core;
  const std::string bad = core.resolve<Space>();
  if (!bad.empty()) throw InvalidArgument("calibration: the attention core's settings: " + bad);
  // bf16 tile products go through the installed plan, as in the layer.
  Bf16GemmPlan<Space> plan;
  const ScopedBf16GemmPlan<Space> installed(plan);
  const Space space;
  AttentionTimes t;
  t.forward_s =
      median_time(repeats, min_run_s, sync, [&] { core.forward(space, mlacp::attention_problem(q, k, v, o, lse)); });
  t.backward_s = median_time(repeats, min_run_s, sync,
                             [&] { core.backward(space, mlacp::attention_problem(q, k, v, o, lse, d_o, dq, dk, dv)); });
  return t;
}

}  // namespace

double GemmShape::effective_size() const {
  const double a = m, b = n, c = k;
  return 3.0 * a * b * c / (b * c + a * c + a * b);
}

std::vector<GemmShape> calibration_squares(bool quick) {
  std::vector<GemmShape> out;
  for (const int n : {32, 64, 128, 256, 512}) {
    if (quick && n > 128) break;
    out.push_back({n, n, n});
  }
  return out;
}

std::vector<GemmShape> calibration_skinny(bool quick) {
  // The layer's products: tokens x head width x latent, tokens x (H (dn + dr)) x latent, and a thin inner dimension.
  if (quick) return {{256, 32, 128}, {128, 256, 16}};
  return {{1024, 64, 512}, {2048, 576, 256}, {512, 1024, 32}};
}

double time_gemm(Dtype dtype, const GemmShape& shape, int repeats, double min_run_s,
                 const std::function<void()>& sync) {
  return with_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bf16>) {
      return time_gemm_bf16(shape, repeats, min_run_s, sync);
    } else {
      return time_gemm_t<T>(shape, repeats, min_run_s, sync);
    }
  });
}

struct GemmLoop::Buffers {
  Matrix<float> a, b, c;
};

GemmLoop::GemmLoop(const GemmShape& s)
    : buffers_(new Buffers{Matrix<float>(std::string("mlacp::calibrate A"), s.m, s.k),
                           Matrix<float>(std::string("mlacp::calibrate B"), s.k, s.n),
                           Matrix<float>(std::string("mlacp::calibrate C"), s.m, s.n)}) {
  fill(buffers_->a, 1);
  fill(buffers_->b, 2);
}

GemmLoop::~GemmLoop() { delete buffers_; }

double GemmLoop::run(int calls, const std::function<void()>& between) const {
  const Space space;
  const double t0 = now();
  for (int c = 0; c < calls; ++c) {
    compat::gemm(space, "N", "N", 1.0f, buffers_->a, buffers_->b, 0.0f, buffers_->c);
    space.fence();
    if (between) between();
  }
  Kokkos::fence();
  return now() - t0;
}

double AttentionProblem::forward_flops() const {
  const double e = static_cast<double>(batch) * heads * seq * (seq + 1.0) / 2.0;
  return 2.0 * e * (nope + rope + vdim);
}

double AttentionProblem::backward_flops() const {
  const double e = static_cast<double>(batch) * heads * seq * (seq + 1.0) / 2.0;
  return 2.0 * e * (3.0 * (nope + rope) + 2.0 * vdim);
}

AttentionProblem attention_problem(bool quick) {
  AttentionProblem p;
  if (quick) p.seq = 64;
  return p;
}

std::vector<AttentionProblem> attention_width_problems(bool quick) {
  AttentionProblem small = attention_problem(quick), wide = small;
  small.nope = 16;
  small.rope = 16;
  small.vdim = 32;
  wide.nope = 128;
  wide.rope = 64;
  wide.vdim = 128;
  return {small, attention_problem(quick), wide};
}

namespace {
template <class T>
ElementwiseTime time_elementwise_t(bool quick, int repeats, double min_run_s, const std::function<void()>& sync) {
  using A = compat::accumulation_t<T>;
  const std::int64_t tokens = quick ? 128 : 1024, width = 512;
  const View3<T> x(std::string("mlacp::calibrate x"), 1, tokens, width),
      y(std::string("mlacp::calibrate y"), 1, tokens, width);
  const View3<T> dy(std::string("mlacp::calibrate dy"), 1, tokens, width),
      dx(std::string("mlacp::calibrate dx"), 1, tokens, width);
  // LayoutRight as RMSNorm requires (a rank-1 View's default on CUDA is LayoutLeft; on host it is LayoutRight).
  const Kokkos::View<T*, Kokkos::LayoutRight, Mem> gain(std::string("mlacp::calibrate gain"), width);
  const Kokkos::View<A*, Mem> dgain(std::string("mlacp::calibrate dgain"), width);
  const Kokkos::View<A*, Mem> rstd(std::string("mlacp::calibrate rstd"), tokens);
  fill(x, 1);
  fill(dy, 2);
  fill(gain, 3);
  const Space space;
  ElementwiseTime t;
  t.bytes = 5.0 * static_cast<double>(tokens * width) * sizeof(T);
  t.seconds = median_time(repeats, min_run_s, sync, [&] {
    rms_norm_forward(space, x, gain, y, rstd);
    rms_norm_backward(space, x, gain, rstd, dy, dx, dgain);
  });
  return t;
}
}  // namespace

ElementwiseTime time_elementwise(Dtype dtype, bool quick, int repeats, double min_run_s,
                                 const std::function<void()>& sync) {
  return with_type(dtype, [&](auto tag) {
    return time_elementwise_t<typename decltype(tag)::type>(quick, repeats, min_run_s, sync);
  });
}

AttentionTimes time_attention(Dtype dtype, const AttentionProblem& problem, int repeats, double min_run_s,
                              const std::function<void()>& sync) {
  return with_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Where the core takes no bf16 Views (its team path, on a GPU), the layer widens into float around it
    // (ScheduleContext::core_forward): the float core's rate is the one it runs at.
    if constexpr (std::is_same_v<T, bf16>) {
      if (!FlashAttentionCore().computes_bf16<Space>())
        return time_attention_t<float>(problem, repeats, min_run_s, sync);
    }
    return time_attention_t<T>(problem, repeats, min_run_s, sync);
  });
}

double copy_bytes(bool quick) { return (quick ? 4.0 : 64.0) * 1024 * 1024; }

double time_copy(double bytes, int repeats, double min_run_s, const std::function<void()>& sync) {
  const auto n = static_cast<std::int64_t>(bytes / sizeof(double));
  const Kokkos::View<double*, Mem> src(std::string("mlacp::calibrate copy source"), n);
  const Kokkos::View<double*, Mem> dst(std::string("mlacp::calibrate copy destination"), n);
  fill(src, 5);
  return median_time(repeats, min_run_s, sync, [&] {
    Kokkos::parallel_for(
        "mlacp::calibrate copy", Kokkos::RangePolicy<Space>(0, n),
        KOKKOS_LAMBDA(const std::int64_t i) { dst(i) = src(i); });
  });
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      auto name = line.substr(colon + 1);
      const auto first = name.find_first_not_of(" \t");
      const auto last = name.find_last_not_of(" \t\r");
      if (first != std::string::npos) return name.substr(first, last - first + 1);
    }
  }
  return "unknown CPU";
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t h = values.size() / 2;
  return values.size() % 2 ? values[h] : (values[h - 1] + values[h]) / 2;
}

}  // namespace mlacp::model::detail
