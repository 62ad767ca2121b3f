// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The GEMMs of the MLA block in nn.Linear form (y = x W^T + b, W is [out, in]) on row-major tensors viewed as
// matrices, with named compute phases (Kokkos Tools regions and the event recorder) and, for weight gradients
// overlapped with a collective, panels between which in-flight collectives are progressed.
#pragma once

#include <mlacp/compat.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/reductions.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

namespace mlacp {

/// How weight-gradient GEMMs that overlap a collective make that collective progress on host execution spaces (MPI
/// implementations such as Open MPI move a nonblocking collective only inside MPI calls). The GEMM is split along
/// its reduction dimension into panels of at least `min_panel_rows` rows, at most `panels` of them, and the in-flight
/// handles are tested before each panel. Device execution spaces never poll (NCCL progresses on its own).
struct OverlapPolicy {
  int panels = 8;
  std::int64_t min_panel_rows = 256;
};

/// The process-wide policy (defaults above; MLACP_WGRAD_PANELS overrides `panels`, 1 disables panelling).
OverlapPolicy& overlap_policy();

namespace detail {

template <class T, class MemSpace>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class T, class MemSpace>
using Vector = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// A row-major [rows, cols] matrix over the first rows*cols elements of a contiguous View.
template <class ViewType>
Matrix<typename ViewType::value_type, typename ViewType::memory_space> as_matrix(const ViewType& v, std::int64_t rows,
                                                                                 std::int64_t cols) {
  return Matrix<typename ViewType::value_type, typename ViewType::memory_space>(
      v.data(), static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
}

/// A named compute phase: a Kokkos Tools region, and compute_begin/compute_end events. When recording, the instance
/// is fenced at the end so that the end time is the time the work finished, not the time it was enqueued.
template <class ExecSpace>
class ComputePhase {
 public:
  ComputePhase(const ExecSpace& space, std::string name) : space_(space), name_(std::move(name)) {
    Kokkos::Profiling::pushRegion("mlacp::" + name_);
    if (events::enabled()) events::record(EventKind::compute_begin, name_);
  }
  ~ComputePhase() {
    if (events::enabled()) {
      compat::fence(space_, "mlacp: end of " + name_);
      events::record(EventKind::compute_end, name_);
    }
    Kokkos::Profiling::popRegion();
  }
  ComputePhase(const ComputePhase&) = delete;
  ComputePhase& operator=(const ComputePhase&) = delete;

 private:
  ExecSpace space_;
  std::string name_;
};

/// y[N, out] = x[N, in] W[out, in]^T (+ b[out] when b is not empty).
template <class ExecSpace, class XMat, class WMat, class BVec, class YMat>
void linear_forward(const ExecSpace& space, const XMat& x, const WMat& w, const BVec& b, const YMat& y) {
  using T = typename YMat::non_const_value_type;
  compat::gemm(space, "N", "T", T(1), x, w, T(0), y);
  if (b.data() == nullptr) return;
  const auto cols = static_cast<std::int64_t>(y.extent(1));
  const auto n = static_cast<std::int64_t>(y.extent(0)) * cols;
  Kokkos::parallel_for(
      "mlacp::add_bias", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { y(i / cols, i % cols) += b(i % cols); });
}

/// dx[N, in] = beta * dx + dy[N, out] W[out, in].
template <class ExecSpace, class DyMat, class WMat, class DxMat>
void linear_dgrad(const ExecSpace& space, const DyMat& dy, const WMat& w, typename DxMat::non_const_value_type beta,
                  const DxMat& dx) {
  using T = typename DxMat::non_const_value_type;
  compat::gemm(space, "N", "N", T(1), dy, w, beta, dx);
}

/// dW[out, in] += dy[N, out]^T x[N, in]. With a `progress` callback on a host execution space, the reduction over N
/// runs in panels (overlap_policy()) and `progress()` is called before each panel and at the end.
template <class ExecSpace, class DyMat, class XMat, class DwMat>
void linear_wgrad(const ExecSpace& space, const DyMat& dy, const XMat& x, const DwMat& dw,
                  const std::function<void()>& progress = {}) {
  using T = typename DwMat::non_const_value_type;
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
  const auto rows = static_cast<std::int64_t>(dy.extent(0));
  const OverlapPolicy policy = overlap_policy();
  std::int64_t panels = 1;
  if (host && progress && policy.panels > 1)
    panels = std::max<std::int64_t>(
        1, std::min<std::int64_t>(policy.panels, rows / std::max<std::int64_t>(1, policy.min_panel_rows)));
  if (panels == 1) {
    if (host && progress) progress();
    compat::gemm(space, "T", "N", T(1), dy, x, T(1), dw);
    if (host && progress) progress();
    return;
  }
  for (std::int64_t p = 0; p < panels; ++p) {
    const std::int64_t begin = rows * p / panels, end = rows * (p + 1) / panels;
    const auto range = std::make_pair(static_cast<std::size_t>(begin), static_cast<std::size_t>(end));
    progress();
    compat::gemm(space, "T", "N", T(1), Kokkos::subview(dy, range, Kokkos::ALL()),
                 Kokkos::subview(x, range, Kokkos::ALL()), T(1), dw);
  }
  progress();
}

/// db[out] += column sums of dy[N, out].
template <class ExecSpace, class DyMat, class DbVec>
void bias_grad(const ExecSpace& space, const DyMat& dy, const DbVec& db) {
  sum_rows_accumulate(space, dy, db);
}

}  // namespace detail
}  // namespace mlacp
