// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The bf16 GEMM: C = beta*C + alpha*op(A)*op(B) with A and B Views of mlacp::bf16, C a View of float (or of bf16,
// rounded once at the end), accumulated in float, on an execution-space instance.
//
// Backends (Bf16GemmBackend):
// - onednn: oneDNN's matmul primitive, bf16 x bf16 -> f32/bf16 (host execution spaces of builds with oneDNN,
//   MLACP_HAVE_ONEDNN; inner stride 1). One primitive per call signature (transposes, extents, leading dimensions,
//   alpha, beta, C's type), created on first use and kept in the plan. It uses the CPU's bf16 instructions
//   (AVX512-BF16, AMX) where oneDNN finds them at run time, emulates them on plain AVX512; below AVX512 (or under
//   ONEDNN_MAX_CPU_ISA=AVX2) oneDNN 2.6 has no bf16 matmul at all, and the plan takes float_blas instead.
// - float_blas: A and B widened to float into the plan's workspace (Kokkos kernels, device-ready), then the float
//   GEMM of compat::gemm (the BLAS TPL on host, cuBLAS/rocBLAS where Kokkos Kernels has them). Works everywhere.
// - cublas: cuBLAS's cublasGemmEx, bf16 x bf16 -> f32/bf16 with CUBLAS_COMPUTE_32F, enqueued on the instance's stream
//   (Kokkos::Cuda in builds with cuBLAS, MLACP_HAVE_CUBLAS; inner stride 1). Kokkos Kernels has no bf16 TPL GEMM, so
//   the plan calls cuBLAS itself (src/cuda/bf16_gemm_cublas.cpp), with a handle of its own.
// - kokkos_kernels: KokkosBlas::gemm on the bf16 Views themselves (bf16 A and B, float C), where Kokkos Kernels takes
//   them: no build so far (detail::kokkos_kernels_gemm_takes_bf16 says why), so it is compiled out and reported
//   unavailable everywhere; the name stays, parsed and refused with the reason.
//
// The choice (Bf16GemmPlan): per call shape (transposes, m, n, k, beta zero or not, C's type), made on the shape's
// first use and kept. `auto` times every candidate available for the call (one warm-up and three timed runs each,
// into a scratch C of the plan's, so the caller's C is written once, by the winner) and keeps the fastest; the
// environment variable MLACP_BF16_GEMM=auto|onednn|float_blas|kokkos_kernels|cublas read when the plan is made (or the
// plan's constructor argument) forces one. A forced backend that this build or execution space lacks (Backend's
// has_bf16_gemm) is refused when the plan is made; one that cannot take a particular call (oneDNN or cuBLAS with an
// inner stride other than 1, oneDNN on a CPU it has no bf16 matmul for) falls back to float_blas for that call, and
// choices() records float_blas. Zero extents follow compat::gemm (no-op for an empty C; C = beta*C for k = 0), before
// any backend.
//
// Note that auto's choice is the machine's timing: two runs (or two ranks) may pick different backends, whose sums run
// in different orders (float either way); force a backend where bitwise reproducibility matters.
//
// Threads: the BLAS TPL's own (OPENBLAS_NUM_THREADS) for float_blas; OpenMP's (OMP_NUM_THREADS) for oneDNN, whose
// Debian build (2.6) runs on OpenMP: set it to the cores per rank, as for the BLAS.
//
// A plan is not thread-safe; each caller (the layer, a test) owns its own, like an FFT plan.
#pragma once

#include <mlacp/backend.hpp>
#include <mlacp/bf16_gemm_backend.hpp>
#include <mlacp/build_config.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/wire/cast.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace mlacp {

/// The instruction set oneDNN dispatches to on this CPU (after ONEDNN_MAX_CPU_ISA), e.g. "avx512_core_bf16"; a note
/// when built without oneDNN.
std::string onednn_cpu_isa();
/// Whether oneDNN dispatches bf16 matmuls to AMX tiles on this CPU (after ONEDNN_MAX_CPU_ISA); false when built without
/// oneDNN.
bool onednn_has_amx();

namespace detail {

/// One bf16 matmul as the library backends (oneDNN, cuBLAS) take it, row-major: A [m, k] (stored transposed where
/// trans_a), B [k, n] likewise, C [m, n]; lda, ldb, ldc are the storage's row strides in elements. a and b point to
/// bf16, c to float (or bf16 where c_bf16).
struct Bf16MatmulCall {
  bool trans_a, trans_b;
  std::int64_t m, n, k;
  const void* a;
  std::int64_t lda;
  const void* b;
  std::int64_t ldb;
  void* c;
  std::int64_t ldc;
  bool c_bf16;
  float alpha, beta;
};

#if MLACP_HAVE_ONEDNN
namespace onednn {
using MatmulCall = Bf16MatmulCall;
struct MatmulCache;
struct MatmulCacheDeleter {
  void operator()(MatmulCache* cache) const;
};
std::unique_ptr<MatmulCache, MatmulCacheDeleter> make_matmul_cache();
/// Whether oneDNN has an implementation of the call on this CPU (under ONEDNN_MAX_CPU_ISA); creates the primitive
/// (or remembers that there is none) on first use.
bool supported(MatmulCache& cache, const MatmulCall& call);
/// Runs the call (which must be supported), synchronously.
void matmul(MatmulCache& cache, const MatmulCall& call);
/// oneDNN's name of the implementation it picked for the call (e.g. "brg:avx512_core_bf16"); creates it if needed.
std::string impl_info(MatmulCache& cache, const MatmulCall& call);
/// Primitives created (supported calls) so far.
std::size_t primitives(const MatmulCache& cache);
}  // namespace onednn
#endif

#if MLACP_HAVE_CUBLAS
namespace cublas {
/// A cuBLAS handle (src/cuda/bf16_gemm_cublas.cpp), created on the plan's first cuBLAS call and kept.
struct Handle;
struct HandleDeleter {
  void operator()(Handle* handle) const;
};
std::unique_ptr<Handle, HandleDeleter> make_handle();
/// Enqueues the call on `stream` (a cudaStream_t): cublasGemmEx with bf16 A and B, a float or bf16 C and float
/// accumulation (CUBLAS_COMPUTE_32F). Throws mlacp::Error naming cuBLAS's status where the call fails.
void matmul(Handle& handle, void* stream, const Bf16MatmulCall& call);
}  // namespace cublas
#endif

inline bool is_transposed(const char* trans) { return !(trans[0] == 'N' || trans[0] == 'n'); }

/// Row stride of a rank-2 View in elements, at least its column count (a one-row View may report any stride).
template <class V>
std::int64_t leading_dimension(const V& v) {
  return std::max<std::int64_t>({static_cast<std::int64_t>(v.stride(0)), static_cast<std::int64_t>(v.extent(1)), 1});
}
template <class V>
bool unit_inner_stride(const V& v) {
  return v.extent(1) <= 1 || v.extent(0) == 0 || v.stride(1) == 1;
}

/// Empty C: nothing. k = 0: C = beta*C (0 where beta is 0; C not read). Returns true where the call is done.
template <class ExecSpace, class AView, class CView>
bool bf16_gemm_empty(const ExecSpace& space, const char* trans_a, const AView& a, float beta, const CView& c) {
  using TC = typename CView::non_const_value_type;
  const auto rows = static_cast<std::int64_t>(c.extent(0)), cols = static_cast<std::int64_t>(c.extent(1));
  if (rows == 0 || cols == 0) return true;
  if ((detail::is_transposed(trans_a) ? a.extent(0) : a.extent(1)) != 0) return false;
  Kokkos::parallel_for(
      "mlacp::bf16_gemm k = 0: C = beta*C",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(space, {0, 0}, {rows, cols}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
        c(i, j) = beta == 0.0f ? TC(0.0f) : TC(beta * static_cast<float>(c(i, j)));
      });
  return true;
}

/// dst = src widened to float (widen_to_float) or rounded to bf16 (round_to_bf16): one work item per element.
template <class ExecSpace, class Src, class Dst>
void widen_to_float(const ExecSpace& space, const Src& src, const Dst& dst) {
  Kokkos::parallel_for(
      "mlacp::bf16_gemm widen",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
          space, {0, 0}, {static_cast<std::int64_t>(dst.extent(0)), static_cast<std::int64_t>(dst.extent(1))}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) { dst(i, j) = cast_value<float>(src(i, j)); });
}
template <class ExecSpace, class Src, class Dst>
void round_to_bf16(const ExecSpace& space, const Src& src, const Dst& dst) {
  Kokkos::parallel_for(
      "mlacp::bf16_gemm round",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
          space, {0, 0}, {static_cast<std::int64_t>(dst.extent(0)), static_cast<std::int64_t>(dst.extent(1))}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) { dst(i, j) = cast_value<bf16>(src(i, j)); });
}

}  // namespace detail

/// The shape of a call, the key of the plan's choice.
struct Bf16GemmShape {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  bool beta_zero = true;
  bool c_bf16 = false;
  friend bool operator<(const Bf16GemmShape& x, const Bf16GemmShape& y) {
    return std::tie(x.trans_a, x.trans_b, x.m, x.n, x.k, x.beta_zero, x.c_bf16) <
           std::tie(y.trans_a, y.trans_b, y.m, y.n, y.k, y.beta_zero, y.c_bf16);
  }
};

/// What the plan chose for a shape, and (auto) the seconds each candidate took (median of its timed runs).
struct Bf16GemmChoice {
  Bf16GemmBackend backend = Bf16GemmBackend::float_blas;
  std::vector<std::pair<Bf16GemmBackend, double>> timings;
};

template <class ExecSpace = Kokkos::DefaultExecutionSpace>
class Bf16GemmPlan {
 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using FloatMatrix = Kokkos::View<float**, Kokkos::LayoutRight, memory_space>;
  using UnmanagedFloatMatrix = Kokkos::View<float**, Kokkos::LayoutRight, memory_space, Kokkos::MemoryUnmanaged>;

  /// `requested`: automatic (choose per shape) or one backend for every call; by default MLACP_BF16_GEMM's. Throws
  /// mlacp::InvalidArgument where the requested backend is not available for ExecSpace in this build (Backend).
  explicit Bf16GemmPlan(Bf16GemmBackend requested = bf16_gemm_backend_from_env()) : requested_(requested) {
    if (requested_ != Bf16GemmBackend::automatic && !available(requested_))
      throw mlacp::InvalidArgument(std::string("mlacp: bf16 GEMM backend '") + bf16_gemm_backend_name(requested_) +
                                   "' is not available in this build for this execution space (" + why_not(requested_) +
                                   "); available: " + available_names());
  }

  /// Whether the plan's bf16 GEMMs run on bf16 matrix hardware: cuBLAS on a CUDA space (tensor cores), or oneDNN on a
  /// CPU with AMX, where the plan may take them (auto, or that backend forced). There a bf16 layer computes in bf16
  /// without timing the float path (Bf16Compute::automatic). AVX512-BF16 alone does not count: a bf16 dot product
  /// per lane is not known to beat float BLAS there, so that is timed.
  bool on_bf16_hardware() const {
    const auto may = [&](Bf16GemmBackend b) {
      return available(b) && (requested_ == Bf16GemmBackend::automatic || requested_ == b);
    };
    return may(Bf16GemmBackend::cublas) || (may(Bf16GemmBackend::onednn) && onednn_has_amx());
  }

  /// Whether this build has the backend for ExecSpace (automatic: always): Backend<ExecSpace>::has_bf16_gemm.
  static bool available(Bf16GemmBackend backend) { return Backend<ExecSpace>::has_bf16_gemm(backend); }
  /// The backends available for ExecSpace, in the order auto tries them.
  static std::vector<Bf16GemmBackend> available_backends() {
    std::vector<Bf16GemmBackend> out;
    for (const auto b : {Bf16GemmBackend::onednn, Bf16GemmBackend::cublas, Bf16GemmBackend::kokkos_kernels,
                         Bf16GemmBackend::float_blas})
      if (available(b)) out.push_back(b);
    return out;
  }

  Bf16GemmBackend requested() const { return requested_; }
  /// Every shape seen so far and what was chosen for it.
  const std::map<Bf16GemmShape, Bf16GemmChoice>& choices() const { return choices_; }
  /// Bytes of the float workspace (float_blas's widened operands) held now.
  std::size_t workspace_bytes() const { return workspace_.span() * sizeof(float); }
  /// oneDNN primitives created so far (0 without oneDNN).
  std::size_t onednn_primitives() const {
#if MLACP_HAVE_ONEDNN
    return onednn_ ? detail::onednn::primitives(*onednn_) : 0;
#else
    return 0;
#endif
  }

  /// C = beta*C + alpha*op(A)*op(B) (trans "N" or "T"), through the backend chosen for the call's shape.
  template <class AView, class BView, class CView>
  void gemm(const ExecSpace& space, const char* trans_a, const char* trans_b, float alpha, const AView& a,
            const BView& b, float beta, const CView& c) {
    if (detail::bf16_gemm_empty(space, trans_a, a, beta, c)) return;
    const Bf16GemmShape shape = shape_of(trans_a, trans_b, a, b, beta, c);
    auto it = choices_.find(shape);
    if (it == choices_.end()) it = choices_.emplace(shape, choose(space, trans_a, trans_b, alpha, a, b, beta, c)).first;
    run(it->second.backend, space, trans_a, trans_b, alpha, a, b, beta, c);
  }

  /// The same through one given backend (tests, benchmarks); it must be available. A call it cannot take (oneDNN:
  /// inner stride other than 1) goes to float_blas.
  template <class AView, class BView, class CView>
  void gemm_with(Bf16GemmBackend backend, const ExecSpace& space, const char* trans_a, const char* trans_b, float alpha,
                 const AView& a, const BView& b, float beta, const CView& c) {
    if (backend == Bf16GemmBackend::automatic || !available(backend))
      throw mlacp::InvalidArgument(std::string("mlacp: gemm_with: backend '") + bf16_gemm_backend_name(backend) +
                                   "' is not available here; available: " + available_names());
    if (detail::bf16_gemm_empty(space, trans_a, a, beta, c)) return;
    run(backend, space, trans_a, trans_b, alpha, a, b, beta, c);
  }

  /// oneDNN's implementation name for a call ("" where oneDNN is not available or cannot take the call).
  template <class AView, class BView, class CView>
  std::string onednn_impl(const char* trans_a, const char* trans_b, float alpha, const AView& a, const BView& b,
                          float beta, const CView& c) {
#if MLACP_HAVE_ONEDNN
    if constexpr (detail::host_space<ExecSpace>) {
      if (!onednn_takes(trans_a, trans_b, alpha, a, b, beta, c)) return "";
      return detail::onednn::impl_info(onednn_cache(), matmul_call(trans_a, trans_b, alpha, a, b, beta, c));
    }
#endif
    (void)trans_a, (void)trans_b, (void)alpha, (void)a, (void)b, (void)beta, (void)c;
    return "";
  }

 private:
  static std::string why_not(Bf16GemmBackend backend) {
    switch (backend) {
      case Bf16GemmBackend::onednn:
        return MLACP_HAVE_ONEDNN ? "oneDNN runs on host execution spaces only"
                                 : "built without oneDNN: MLACP_HAVE_ONEDNN is 0";
      case Bf16GemmBackend::kokkos_kernels:
        return "Kokkos Kernels' gemm takes no bf16 A and B with a float C (Kokkos Kernels 4.6.02 not even on CUDA)";
      case Bf16GemmBackend::cublas:
        return MLACP_HAVE_CUBLAS ? "cuBLAS runs on Kokkos::Cuda only"
                                 : "built without cuBLAS: MLACP_HAVE_CUBLAS is 0 (it needs Kokkos' CUDA backend)";
      default:
        return "";
    }
  }
  static std::string available_names() {
    std::string s = "auto";
    for (const auto b : available_backends()) s += std::string(", ") + bf16_gemm_backend_name(b);
    return s;
  }

  template <class AView, class BView, class CView>
  static Bf16GemmShape shape_of(const char* trans_a, const char* trans_b, const AView& a, const BView& b, float beta,
                                const CView& c) {
    static_assert(compat::view_rank_v<AView> == 2 && compat::view_rank_v<BView> == 2 && compat::view_rank_v<CView> == 2,
                  "bf16 GEMM: A, B and C are rank-2 Views");
    static_assert(std::is_same_v<typename AView::non_const_value_type, compat::bf16> &&
                      std::is_same_v<typename BView::non_const_value_type, compat::bf16>,
                  "bf16 GEMM: A and B are Views of mlacp::bf16");
    static_assert(
        std::is_same_v<typename CView::value_type, float> || std::is_same_v<typename CView::value_type, compat::bf16>,
        "bf16 GEMM: C is a View of float or of mlacp::bf16");
    Bf16GemmShape s;
    s.trans_a = detail::is_transposed(trans_a);
    s.trans_b = detail::is_transposed(trans_b);
    s.m = static_cast<std::int64_t>(c.extent(0));
    s.n = static_cast<std::int64_t>(c.extent(1));
    s.k = static_cast<std::int64_t>(s.trans_a ? a.extent(0) : a.extent(1));
    const auto kb = static_cast<std::int64_t>(s.trans_b ? b.extent(1) : b.extent(0));
    const auto ma = static_cast<std::int64_t>(s.trans_a ? a.extent(1) : a.extent(0));
    const auto nb = static_cast<std::int64_t>(s.trans_b ? b.extent(0) : b.extent(1));
    if (kb != s.k || ma != s.m || nb != s.n)
      throw mlacp::InvalidArgument("mlacp: bf16 GEMM: op(A) is " + std::to_string(ma) + " x " + std::to_string(s.k) +
                                   ", op(B) " + std::to_string(kb) + " x " + std::to_string(nb) + ", C " +
                                   std::to_string(s.m) + " x " + std::to_string(s.n));
    s.beta_zero = beta == 0.0f;
    s.c_bf16 = std::is_same_v<typename CView::non_const_value_type, compat::bf16>;
    return s;
  }

  template <class AView, class BView, class CView>
  Bf16GemmChoice choose(const ExecSpace& space, const char* trans_a, const char* trans_b, float alpha, const AView& a,
                        const BView& b, float beta, const CView& c) {
    Bf16GemmChoice choice;
    if (requested_ != Bf16GemmBackend::automatic) {
      // A forced oneDNN or cuBLAS that cannot take the call is recorded as what runs instead.
      choice.backend =
          takes(requested_, trans_a, trans_b, alpha, a, b, beta, c) ? requested_ : Bf16GemmBackend::float_blas;
      return choice;
    }
    std::vector<Bf16GemmBackend> candidates;
    for (const auto backend : available_backends())
      if (takes(backend, trans_a, trans_b, alpha, a, b, beta, c)) candidates.push_back(backend);
    if (candidates.size() == 1) {
      choice.backend = candidates.front();
      return choice;
    }
    // Timed into a scratch C of the same shape and type: the caller's C is written only by the real call.
    using Scratch = Kokkos::View<typename CView::non_const_value_type**, Kokkos::LayoutRight, memory_space>;
    const Scratch scratch("mlacp::bf16_gemm choice scratch", c.extent(0), c.extent(1));
    double best = 0;
    for (const auto backend : candidates) {
      std::array<double, 3> seconds{};
      run(backend, space, trans_a, trans_b, alpha, a, b, beta, scratch);  // warm-up (primitive creation, workspace)
      for (double& s : seconds) {
        compat::fence(space, "mlacp: bf16 GEMM choice");
        const auto t0 = std::chrono::steady_clock::now();
        run(backend, space, trans_a, trans_b, alpha, a, b, beta, scratch);
        compat::fence(space, "mlacp: bf16 GEMM choice");
        s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      std::sort(seconds.begin(), seconds.end());
      choice.timings.emplace_back(backend, seconds[1]);
      if (choice.timings.size() == 1 || seconds[1] < best) {
        best = seconds[1];
        choice.backend = backend;
      }
    }
    return choice;
  }

  template <class AView, class BView, class CView>
  void run(Bf16GemmBackend backend, const ExecSpace& space, const char* trans_a, const char* trans_b, float alpha,
           const AView& a, const BView& b, float beta, const CView& c) {
    if (backend == Bf16GemmBackend::onednn) {
#if MLACP_HAVE_ONEDNN
      if constexpr (detail::host_space<ExecSpace>) {
        if (onednn_takes(trans_a, trans_b, alpha, a, b, beta, c)) {
          compat::fence(space, "mlacp: before the oneDNN bf16 matmul");
          detail::onednn::matmul(onednn_cache(), matmul_call(trans_a, trans_b, alpha, a, b, beta, c));
          return;
        }
      }
#endif
      backend = Bf16GemmBackend::float_blas;
    }
    if (backend == Bf16GemmBackend::cublas) {
#if MLACP_HAVE_CUBLAS && defined(KOKKOS_ENABLE_CUDA)
      if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) {
        if (takes(backend, trans_a, trans_b, alpha, a, b, beta, c)) {
          if (!cublas_) cublas_ = detail::cublas::make_handle();
          detail::cublas::matmul(*cublas_, space.cuda_stream(), matmul_call(trans_a, trans_b, alpha, a, b, beta, c));
          return;
        }
      }
#endif
      backend = Bf16GemmBackend::float_blas;
    }
    if (backend == Bf16GemmBackend::kokkos_kernels) {
      if constexpr (detail::kokkos_kernels_gemm_takes_bf16) {
        run_kokkos_kernels(space, trans_a, trans_b, alpha, a, b, beta, c);
        return;
      }
      backend = Bf16GemmBackend::float_blas;
    }
    run_float_blas(space, trans_a, trans_b, alpha, a, b, beta, c);
  }

  /// Float views over the plan's workspace: [rows_i, cols_i] each, grown (never shrunk) as needed.
  template <std::size_t N>
  std::array<UnmanagedFloatMatrix, N> workspace(const std::array<std::pair<std::size_t, std::size_t>, N>& dims) {
    std::size_t total = 0;
    for (const auto& d : dims) total += d.first * d.second;
    if (workspace_.span() < total)
      workspace_ = Kokkos::View<float*, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::bf16_gemm float workspace"), total);
    std::array<UnmanagedFloatMatrix, N> out;
    std::size_t offset = 0;
    for (std::size_t i = 0; i < N; ++i) {
      out[i] = UnmanagedFloatMatrix(workspace_.data() + offset, dims[i].first, dims[i].second);
      offset += dims[i].first * dims[i].second;
    }
    return out;
  }

  template <class AView, class BView, class CView>
  void run_float_blas(const ExecSpace& space, const char* trans_a, const char* trans_b, float alpha, const AView& a,
                      const BView& b, float beta, const CView& c) {
    constexpr bool c_bf16 = std::is_same_v<typename CView::non_const_value_type, compat::bf16>;
    auto views = workspace<3>({std::make_pair(a.extent(0), a.extent(1)), std::make_pair(b.extent(0), b.extent(1)),
                               std::make_pair(c_bf16 ? c.extent(0) : 0, c_bf16 ? c.extent(1) : 0)});
    detail::widen_to_float(space, a, views[0]);
    detail::widen_to_float(space, b, views[1]);
    if constexpr (c_bf16) {
      if (beta != 0.0f) detail::widen_to_float(space, c, views[2]);
      compat::gemm(space, trans_a, trans_b, alpha, views[0], views[1], beta, views[2]);
      detail::round_to_bf16(space, views[2], c);
    } else {
      compat::gemm(space, trans_a, trans_b, alpha, views[0], views[1], beta, c);
    }
  }

  template <class AView, class BView, class CView>
  void run_kokkos_kernels([[maybe_unused]] const ExecSpace& space, [[maybe_unused]] const char* trans_a,
                          [[maybe_unused]] const char* trans_b, [[maybe_unused]] float alpha,
                          [[maybe_unused]] const AView& a, [[maybe_unused]] const BView& b, [[maybe_unused]] float beta,
                          [[maybe_unused]] const CView& c) {
    if constexpr (detail::kokkos_kernels_gemm_takes_bf16) {
      // bf16 x bf16 into float C (Kokkos Kernels accumulates in C's type); a bf16 C goes through a float one.
      if constexpr (std::is_same_v<typename CView::non_const_value_type, compat::bf16>) {
        auto views = workspace<1>({std::make_pair(c.extent(0), c.extent(1))});
        if (beta != 0.0f) detail::widen_to_float(space, c, views[0]);
        compat::gemm(space, trans_a, trans_b, alpha, a, b, beta, views[0]);
        detail::round_to_bf16(space, views[0], c);
      } else {
        compat::gemm(space, trans_a, trans_b, alpha, a, b, beta, c);
      }
    }
  }

  /// Whether `backend` can run the call: oneDNN where onednn_takes; cuBLAS with inner strides 1 (its leading
  /// dimensions are the row strides); the others always. A backend that cannot runs float_blas instead.
  template <class AView, class BView, class CView>
  bool takes(Bf16GemmBackend backend, const char* trans_a, const char* trans_b, float alpha, const AView& a,
             const BView& b, float beta, const CView& c) {
    if (backend == Bf16GemmBackend::onednn) return onednn_takes(trans_a, trans_b, alpha, a, b, beta, c);
    if (backend == Bf16GemmBackend::cublas)
      return detail::unit_inner_stride(a) && detail::unit_inner_stride(b) && detail::unit_inner_stride(c);
    return true;
  }

#if MLACP_HAVE_ONEDNN
  /// oneDNN takes the call: host space, inner strides 1, and an implementation on this CPU (oneDNN 2.6 has no bf16
  /// matmul below AVX512, e.g. under ONEDNN_MAX_CPU_ISA=AVX2).
  template <class AView, class BView, class CView>
  bool onednn_takes(const char* trans_a, const char* trans_b, float alpha, const AView& a, const BView& b, float beta,
                    const CView& c) {
    if (!(detail::host_space<ExecSpace> && detail::unit_inner_stride(a) && detail::unit_inner_stride(b) &&
          detail::unit_inner_stride(c)))
      return false;
    return detail::onednn::supported(onednn_cache(), matmul_call(trans_a, trans_b, alpha, a, b, beta, c));
  }
  detail::onednn::MatmulCache& onednn_cache() {
    if (!onednn_) onednn_ = detail::onednn::make_matmul_cache();
    return *onednn_;
  }
#endif
  /// The call as oneDNN and cuBLAS take it.
  template <class AView, class BView, class CView>
  static detail::Bf16MatmulCall matmul_call(const char* trans_a, const char* trans_b, float alpha, const AView& a,
                                            const BView& b, float beta, const CView& c) {
    detail::Bf16MatmulCall call{};
    call.trans_a = detail::is_transposed(trans_a);
    call.trans_b = detail::is_transposed(trans_b);
    call.m = static_cast<std::int64_t>(c.extent(0));
    call.n = static_cast<std::int64_t>(c.extent(1));
    call.k = static_cast<std::int64_t>(call.trans_a ? a.extent(0) : a.extent(1));
    call.a = a.data();
    call.lda = detail::leading_dimension(a);
    call.b = b.data();
    call.ldb = detail::leading_dimension(b);
    call.c = c.data();
    call.ldc = detail::leading_dimension(c);
    call.c_bf16 = std::is_same_v<typename CView::non_const_value_type, compat::bf16>;
    call.alpha = alpha;
    call.beta = beta;
    return call;
  }

#if MLACP_HAVE_ONEDNN
  std::unique_ptr<detail::onednn::MatmulCache, detail::onednn::MatmulCacheDeleter> onednn_;
#else
  template <class AView, class BView, class CView>
  static bool onednn_takes(const char*, const char*, float, const AView&, const BView&, float, const CView&) {
    return false;
  }
#endif

#if MLACP_HAVE_CUBLAS
  std::unique_ptr<detail::cublas::Handle, detail::cublas::HandleDeleter> cublas_;
#endif
  Bf16GemmBackend requested_;
  std::map<Bf16GemmShape, Bf16GemmChoice> choices_;
  Kokkos::View<float*, memory_space> workspace_;
};

namespace detail {
/// The plan installed on this thread for ExecSpace (ScopedBf16GemmPlan), or null.
template <class ExecSpace>
Bf16GemmPlan<ExecSpace>*& installed_bf16_gemm_plan() {
  thread_local Bf16GemmPlan<ExecSpace>* plan = nullptr;
  return plan;
}
}  // namespace detail

/// Installs `plan` as the one mlacp's own bf16 GEMMs (detail::gemm_values: the layer's linears and their panels) use
/// on this thread while the object lives; the previous one comes back at its end. The MLA layer installs its plan for
/// each forward and backward, so that every shape it runs is chosen once and its oneDNN primitives are kept.
template <class ExecSpace>
class ScopedBf16GemmPlan {
 public:
  explicit ScopedBf16GemmPlan(Bf16GemmPlan<ExecSpace>& plan)
      : previous_(std::exchange(detail::installed_bf16_gemm_plan<ExecSpace>(), &plan)) {}
  ~ScopedBf16GemmPlan() { detail::installed_bf16_gemm_plan<ExecSpace>() = previous_; }
  ScopedBf16GemmPlan(const ScopedBf16GemmPlan&) = delete;
  ScopedBf16GemmPlan& operator=(const ScopedBf16GemmPlan&) = delete;

 private:
  Bf16GemmPlan<ExecSpace>* previous_;
};

namespace detail {

/// C = beta*C + alpha*op(A)*op(B) for the value types mlacp's kernels use: Views of float or double through
/// compat::gemm; A and B of bf16 (C of float or bf16) through the bf16 plan installed on this thread
/// (ScopedBf16GemmPlan), or, where none is, a plan made for this call alone that runs MLACP_BF16_GEMM's backend
/// (float_blas where it asks for auto: a one-call plan cannot amortise auto's timing).
template <class ExecSpace, class AView, class BView, class CView, class Scalar>
void gemm_values(const ExecSpace& space, const char* trans_a, const char* trans_b, Scalar alpha, const AView& a,
                 const BView& b, Scalar beta, const CView& c) {
  if constexpr (std::is_same_v<typename AView::non_const_value_type, compat::bf16>) {
    static_assert(std::is_same_v<typename BView::non_const_value_type, compat::bf16>,
                  "mlacp: a bf16 GEMM takes A and B of bf16");
    if (Bf16GemmPlan<ExecSpace>* plan = installed_bf16_gemm_plan<ExecSpace>()) {
      plan->gemm(space, trans_a, trans_b, static_cast<float>(alpha), a, b, static_cast<float>(beta), c);
      return;
    }
    const Bf16GemmBackend env = bf16_gemm_backend_from_env();
    Bf16GemmPlan<ExecSpace> one_call(env == Bf16GemmBackend::automatic ? Bf16GemmBackend::float_blas : env);
    one_call.gemm(space, trans_a, trans_b, static_cast<float>(alpha), a, b, static_cast<float>(beta), c);
    compat::fence(space, "mlacp: a one-call bf16 GEMM plan's workspace is released");
  } else {
    using T = typename CView::non_const_value_type;
    compat::gemm(space, trans_a, trans_b, static_cast<T>(alpha), a, b, static_cast<T>(beta), c);
  }
}

}  // namespace detail
}  // namespace mlacp
