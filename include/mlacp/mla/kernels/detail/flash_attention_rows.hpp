// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The per-row work of the tiled attention core on one contiguous row of a score tile, shared by both paths (BLAS tiles
// on the host, team scratch anywhere): the online-softmax update of the forward, the probabilities and the dS of the
// backward. Written for vectorising compilers: loops over contiguous elements, branch-free exp (softmax_exp.hpp),
// reductions with eight independent partial results (a single running max or sum is a dependency chain that no
// compiler may reorder without fast-math).
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/bfloat16.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/mla/kernels/detail/softmax_exp.hpp>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace mlacp::detail {

/// Integer min / max usable in kernels (Kokkos::min / max are 3.7 and later).
KOKKOS_INLINE_FUNCTION std::int64_t imin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
KOKKOS_INLINE_FUNCTION std::int64_t imax(std::int64_t a, std::int64_t b) { return a < b ? b : a; }

/// The last key of a tile visible to query `query` (keys j0, j0+1, ...; -1 when none is), causal: key <= query.
KOKKOS_INLINE_FUNCTION std::int64_t last_visible(std::int64_t query, std::int64_t j0, std::int64_t nk) {
  return imin(nk - 1, query - j0);
}

/// The first key of a tile visible to a query whose document starts at token `start` (keys j0, j0+1, ...; nk when
/// none is): key >= start. 0 for every query of a single document.
KOKKOS_INLINE_FUNCTION std::int64_t first_visible(std::int64_t start, std::int64_t j0, std::int64_t nk) {
  return imin(nk, imax(std::int64_t(0), start - j0));
}

/// True when every query of [r0, r0 + nq) sees every key of [j0, j0 + nk): the keys lie at or before the first query
/// and at or after the document start of the last one (`last_start`). Such a tile needs no mask.
KOKKOS_INLINE_FUNCTION bool tile_fully_visible(std::int64_t r0, std::int64_t last_start, std::int64_t j0,
                                               std::int64_t nk) {
  return j0 + nk - 1 <= r0 && last_start <= j0;
}

/// The tile ranges of a document layout (Docs: DocumentOffsets, document_layout.hpp). The keys any query of
/// [row0, row0 + n) sees form one range, [start_of(row0), row0 + n - 1] (the per-query ranges [start_of(t), t] touch
/// or overlap as t grows), and the queries that see any key of [j0, j0 + nk) form [j0, end_of(j0 + nk - 1)): every
/// tile inside these ranges holds at least one visible (query, key) pair and every tile outside holds none.

/// The first key tile (a multiple of tile_k) that a query range starting at row0 visits.
template <class Docs>
KOKKOS_INLINE_FUNCTION std::int64_t first_key_tile(const Docs& docs, std::int64_t row0, std::int64_t tile_k) {
  return docs.start_of(row0) / tile_k * tile_k;
}

/// One past the last query that sees a key of [j0, j0 + nk).
template <class Docs>
KOKKOS_INLINE_FUNCTION std::int64_t query_end(const Docs& docs, std::int64_t j0, std::int64_t nk) {
  return docs.end_of(j0 + nk - 1);
}

/// The (query tile, key tile) pairs the core visits for a sequence of n_s tokens with tiles tq x tk, and those plain
/// causal attention visits (the same sequence as one document): their ratio is the work left by the layout.
template <class Docs>
std::pair<std::int64_t, std::int64_t> flash_tile_pairs(const Docs& docs, std::int64_t n_s, std::int64_t tq,
                                                       std::int64_t tk) {
  tq = imin(tq, n_s);
  tk = imin(tk, n_s);
  std::int64_t visited = 0, causal = 0;
  for (std::int64_t i0 = 0; i0 < n_s; i0 += tq) {
    const std::int64_t end = imin(i0 + tq, n_s);
    causal += (end + tk - 1) / tk;
    visited += (end - first_key_tile(docs, i0, tk) + tk - 1) / tk;
  }
  return {visited, causal};
}

/// The largest of s[0, n), n >= 1, found by comparing integers: a value's bits, with the magnitude bits flipped where
/// the sign bit is set, order as the values do (-0 just below +0), and a maximum over integers vectorises where one
/// over floating-point comparisons does not (without fast-math no compiler may reorder that chain; measured: the
/// forward softmax row took 1.7 times as long with it, issue 36). The result is the largest value, +0 over -0; a NaN
/// with its sign bit clear counts as larger than every number, one with it set as smaller.
template <class T>
KOKKOS_INLINE_FUNCTION T row_max(const T* s, std::int64_t n) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "row_max: float or double");
  using Key = std::conditional_t<sizeof(T) == 8, std::int64_t, std::int32_t>;
  constexpr int sign_shift = 8 * sizeof(T) - 1;
  constexpr Key magnitude = static_cast<Key>(~static_cast<std::make_unsigned_t<Key>>(0) >> 1);  // all but the sign
  Key mx = static_cast<Key>(-magnitude - 1);                                                    // the smallest Key
  for (std::int64_t c = 0; c < n; ++c) {
    Key k = 0;
    std::memcpy(&k, &s[c], sizeof k);
    k ^= (k >> sign_shift) & magnitude;
    mx = k > mx ? k : mx;
  }
  mx ^= (mx >> sign_shift) & magnitude;
  T out = 0;
  std::memcpy(&out, &mx, sizeof out);
  return out;
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

/// The largest |shift| for which exp_shifted_row forms a float row's exponent in float.
inline constexpr double float_exponent_max_shift = 16.0;

/// row[c] = exp(scale * row[c] - shift), c in [0, n): the softmax's exponentials against a row maximum or log-sum-exp.
/// The exponent is formed in double, where scores of large magnitude cancel against the shift without float's
/// rounding, except for a float row whose |shift| is at most float_exponent_max_shift: there it is formed in float,
/// which saves two conversions per score (measured at dqk = dv = 32: the float core's forward 6-7% and its backward
/// 3-4% less time, docs/performance.md). The scores that matter lie near the shift (the others' exponentials are
/// negligible beside the row's largest, which is about 1), so the float exponent's error stays within two roundings of
/// 16 plus that of the float scale, about 2e-6 absolute: 2e-6 relative on a probability, against float's 1e-4
/// tolerance. Beyond it, where the 2e-5 bound of the core's large-score tests would no longer hold, the double form
/// stands. In double nothing changes.
template <class T>
KOKKOS_INLINE_FUNCTION void exp_shifted_row(T* row, std::int64_t n, double scale, double shift) {
  if constexpr (sizeof(T) == 4) {
    if (compat::math::fabs(shift) <= float_exponent_max_shift) {
      const T scale_t = static_cast<T>(scale), shift_t = static_cast<T>(shift);
      for (std::int64_t c = 0; c < n; ++c) row[c] = softmax_exp(row[c] * scale_t - shift_t);
      return;
    }
  }
  for (std::int64_t c = 0; c < n; ++c)
    row[c] = softmax_exp(static_cast<T>(static_cast<double>(row[c]) * scale - shift));
}

/// Online-softmax update of one row of raw scores s[0, nk) of which s[first, last] are visible: s becomes
/// P = exp(scale*s - m') (zero outside [first, last]), m' = max(m, scale * rowmax), l = l*exp(m - m') + rowsum(P).
/// Returns the factor exp(m - m') by which the row's output accumulator must be rescaled (0 when `start` is set: m and
/// l start here). A row with no visible key (last < first) is set to zero and leaves m and l as they are (factor 1).
/// m' is rounded to T (a no-op in double), so that exp_shifted_row subtracts exactly the m the statistics record.
template <class T>
KOKKOS_INLINE_FUNCTION double online_softmax_row(T* s, std::int64_t nk, std::int64_t first, std::int64_t last,
                                                 double scale, bool start, double& m, double& l) {
  if (last < first) {
    for (std::int64_t c = 0; c < nk; ++c) s[c] = T(0);
    return 1.0;
  }
  for (std::int64_t c = 0; c < first; ++c) s[c] = T(0);
  T* const row = s + first;
  const std::int64_t n = last + 1 - first;
  // The running maximum is kept in T (rounded once here), so that the exponent subtracts exactly the m that the
  // statistics and the log-sum-exp record.
  const double tile_max = static_cast<double>(static_cast<T>(static_cast<double>(row_max(row, n)) * scale));
  const double m_new = start ? tile_max : compat::math::fmax(m, tile_max);
  exp_shifted_row(row, n, scale, m_new);
  for (std::int64_t c = last + 1; c < nk; ++c) s[c] = T(0);
  const double sum = row_sum(row, n);
  const double alpha = start ? 0.0 : compat::math::exp(m - m_new);
  l = start ? sum : l * alpha + sum;
  m = m_new;
  return alpha;
}

/// The log-sum-exp merge of an earlier partial result (o_old normalised, lse_old its log-sum-exp; -inf: none) with a
/// new one held as online-softmax statistics (max m, sum l > 0 of exp(score - m), and an unnormalised accumulator
/// acc): the merged row is o = w_old * o_old + w_new * acc with log-sum-exp lse. Both paths of the tiled core merge
/// through it (flash_forward_blas_range, flash_forward_team_range).
struct LseMerge {
  double lse, w_old, w_new;
};
KOKKOS_INLINE_FUNCTION LseMerge lse_merge(double lse_old, double m, double l) {
  const bool none = lse_old < -DBL_MAX;  // -inf: no earlier result
  const double lse_new = m + compat::math::log(l);
  const double hi = lse_old > lse_new ? lse_old : lse_new;
  const double lse_all =
      none ? lse_new : hi + compat::math::log(compat::math::exp(lse_old - hi) + compat::math::exp(lse_new - hi));
  const double w_old = none ? 0.0 : compat::math::exp(lse_old - lse_all);
  const double w_new = compat::math::exp(lse_new - lse_all) / l;
  return {lse_all, w_old, w_new};
}

/// One row of the backward's probabilities: p[c] = exp(scale*p[c] - lse) for first <= c <= last, 0 elsewhere.
template <class T>
KOKKOS_INLINE_FUNCTION void probabilities_row(T* p, std::int64_t nk, std::int64_t first, std::int64_t last,
                                              double scale, double lse) {
  const std::int64_t end = imax(last + 1, first);
  for (std::int64_t c = 0; c < first; ++c) p[c] = T(0);
  exp_shifted_row(p + first, end - first, scale, lse);
  for (std::int64_t c = end; c < nk; ++c) p[c] = T(0);
}

/// One row of dS = scale * P o (dP - D): ds holds dP = dO_i V_j^T on entry.
template <class T>
KOKKOS_INLINE_FUNCTION void score_grad_row(T* ds, const T* p, std::int64_t nk, double scale, double d) {
  const T scale_t = static_cast<T>(scale), d_t = static_cast<T>(d);
  for (std::int64_t c = 0; c < nk; ++c) ds[c] = scale_t * p[c] * (ds[c] - d_t);
}

/// One row rounded to bf16: dst[c] = mlacp::bfloat16(src[c]) for c in [0, n), bit for bit. For float the rounding is
/// written without a branch (bfloat16::round_to_bits' NaN test as a select), so that the loop vectorises.
KOKKOS_INLINE_FUNCTION void round_bf16_row(const float* src, mlacp::bfloat16* dst, std::int64_t n) {
  for (std::int64_t c = 0; c < n; ++c) {
    std::uint32_t u = 0;
    std::memcpy(&u, &src[c], sizeof u);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
    dst[c] =
        mlacp::bfloat16::from_bits(static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded));
  }
}
KOKKOS_INLINE_FUNCTION void round_bf16_row(const double* src, mlacp::bfloat16* dst, std::int64_t n) {
  for (std::int64_t c = 0; c < n; ++c) dst[c] = mlacp::bfloat16(src[c]);
}

}  // namespace mlacp::detail
