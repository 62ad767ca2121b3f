// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The GEMMs of the MLA block in nn.Linear form (y = x W^T + b, W is [out, in]) on row-major tensors viewed as
// matrices, through the panelled GEMM of panelled_gemm.hpp (progress of in-flight collectives between panels).
#pragma once

#include <mlacp/mla/kernels/reductions.hpp>
#include <mlacp/panelled_gemm.hpp>

#include <Kokkos_Core.hpp>
#include <cstdint>

namespace mlacp {
namespace detail {

/// y[n, :] += b for every row of the row-major y [N, out] (rows `y.stride(0)` apart): one work item per row, a
/// contiguous inner loop (no divide per element).
template <class ExecSpace, class YMat, class BVec>
void add_bias(const ExecSpace& space, const YMat& y, const BVec& b) {
  using T = typename YMat::non_const_value_type;
  const auto cols = static_cast<std::int64_t>(y.extent(1)), row_stride = static_cast<std::int64_t>(y.stride(0));
  T* data = y.data();
  const auto* bias = b.data();
  Kokkos::parallel_for(
      "mlacp::add_bias",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, static_cast<std::int64_t>(y.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t n) {
        T* row = data + n * row_stride;
        for (std::int64_t c = 0; c < cols; ++c) row[c] += bias[c];
      });
}

/// y[N, out] = x[N, in] W[out, in]^T (+ b[out] when b is not empty).
template <class ExecSpace, class XMat, class WMat, class BVec, class YMat>
void linear_forward(const ExecSpace& space, const XMat& x, const WMat& w, const BVec& b, const YMat& y) {
  using T = typename YMat::non_const_value_type;
  gemm_with_progress(space, "N", "T", T(1), x, w, T(0), y);
  if (b.data() == nullptr) return;
  add_bias(space, y, b);
}

/// dx[N, in] = beta * dx + dy[N, out] W[out, in].
template <class ExecSpace, class DyMat, class WMat, class DxMat>
void linear_dgrad(const ExecSpace& space, const DyMat& dy, const WMat& w, typename DxMat::non_const_value_type beta,
                  const DxMat& dx) {
  using T = typename DxMat::non_const_value_type;
  gemm_with_progress(space, "N", "N", T(1), dy, w, beta, dx);
}

/// dW[out, in] += dy[N, out]^T x[N, in].
template <class ExecSpace, class DyMat, class XMat, class DwMat>
void linear_wgrad(const ExecSpace& space, const DyMat& dy, const XMat& x, const DwMat& dw) {
  using T = typename DwMat::non_const_value_type;
  gemm_with_progress(space, "T", "N", T(1), dy, x, T(1), dw);
}

/// db[out] += column sums of dy[N, out].
template <class ExecSpace, class DyMat, class DbVec>
void bias_grad(const ExecSpace& space, const DyMat& dy, const DbVec& db) {
  sum_rows_accumulate(space, dy, db);
}

}  // namespace detail
}  // namespace mlacp
