// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The per-row work of the tiled attention core on one contiguous row of a score tile, shared by both paths (BLAS tiles
// on the host, team scratch anywhere): the online-softmax update of the forward, the probabilities and the dS of the
// backward. Written for vectorising compilers: loops over contiguous elements, branch-free exp (softmax_exp.hpp),
// reductions with eight independent partial results (a single running max or sum is a dependency chain that no
// compiler may reorder without fast-math).
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/mla/softmax_exp.hpp>

#include <cstdint>

namespace mlacp::detail {

/// Integer min / max usable in kernels (Kokkos::min / max are 3.7 and later).
KOKKOS_INLINE_FUNCTION std::int64_t imin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
KOKKOS_INLINE_FUNCTION std::int64_t imax(std::int64_t a, std::int64_t b) { return a < b ? b : a; }

/// The last key of a tile visible to query `query` (keys j0, j0+1, ...; -1 when none is), causal: key <= query.
KOKKOS_INLINE_FUNCTION std::int64_t last_visible(std::int64_t query, std::int64_t j0, std::int64_t nk) {
  return imin(nk - 1, query - j0);
}

template <class T>
KOKKOS_INLINE_FUNCTION T row_max(const T* s, std::int64_t n) {
  T acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = s[0];
  std::int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int j = 0; j < 8; ++j) acc[j] = s[c + j] > acc[j] ? s[c + j] : acc[j];
  for (; c < n; ++c) acc[0] = s[c] > acc[0] ? s[c] : acc[0];
  T mx = acc[0];
  for (int j = 1; j < 8; ++j) mx = acc[j] > mx ? acc[j] : mx;
  return mx;
}

template <class T>
KOKKOS_INLINE_FUNCTION double row_sum(const T* s, std::int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(s[c + j]);
  for (; c < n; ++c) acc[0] += static_cast<double>(s[c]);
  double sum = 0;
  for (int j = 0; j < 8; ++j) sum += acc[j];
  return sum;
}

/// Online-softmax update of one row of raw scores s[0, nk) of which s[0, last] are visible: s becomes
/// P = exp(scale*s - m') (zero past `last`), m' = max(m, scale * rowmax), l = l*exp(m - m') + rowsum(P). Returns the
/// factor exp(m - m') by which the row's output accumulator must be rescaled (0 on the first tile, where m and l start
/// here). A row with no visible key (last < 0) is set to zero and leaves m and l as they are (factor 1).
template <class T>
KOKKOS_INLINE_FUNCTION double online_softmax_row(T* s, std::int64_t nk, std::int64_t last, double scale, bool first,
                                                 double& m, double& l) {
  if (last < 0) {
    for (std::int64_t c = 0; c < nk; ++c) s[c] = T(0);
    return 1.0;
  }
  const std::int64_t n = last + 1;
  const double tile_max = static_cast<double>(row_max(s, n)) * scale;
  const double m_new = first ? tile_max : compat::math::fmax(m, tile_max);
  // The argument in double: scores of large magnitude cancel against the maximum without float's rounding.
  for (std::int64_t c = 0; c < n; ++c) s[c] = softmax_exp(static_cast<T>(static_cast<double>(s[c]) * scale - m_new));
  for (std::int64_t c = n; c < nk; ++c) s[c] = T(0);
  const double sum = row_sum(s, n);
  const double alpha = first ? 0.0 : compat::math::exp(m - m_new);
  l = first ? sum : l * alpha + sum;
  m = m_new;
  return alpha;
}

/// One row of the backward's probabilities: p[c] = exp(scale*p[c] - lse) for c <= last, 0 after.
template <class T>
KOKKOS_INLINE_FUNCTION void probabilities_row(T* p, std::int64_t nk, std::int64_t last, double scale, double lse) {
  const std::int64_t n = imax(last + 1, 0);
  for (std::int64_t c = 0; c < n; ++c) p[c] = softmax_exp(static_cast<T>(static_cast<double>(p[c]) * scale - lse));
  for (std::int64_t c = n; c < nk; ++c) p[c] = T(0);
}

/// One row of dS = scale * P o (dP - D): ds holds dP = dO_i V_j^T on entry.
template <class T>
KOKKOS_INLINE_FUNCTION void score_grad_row(T* ds, const T* p, std::int64_t nk, double scale, double d) {
  const T scale_t = static_cast<T>(scale), d_t = static_cast<T>(d);
  for (std::int64_t c = 0; c < nk; ++c) ds[c] = scale_t * p[c] * (ds[c] - d_t);
}

}  // namespace mlacp::detail
