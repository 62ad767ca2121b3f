// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Kernels that move the MLA block's tensors between layouts: keys/values from the KV up-projection and the shared
// rotary key, their gradients back, and column blocks of token tensors.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>

namespace mlacp::detail {

template <class T, class MemSpace>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, MemSpace>;
template <class T, class MemSpace>
using Tensor4 = Kokkos::View<T****, Kokkos::LayoutRight, MemSpace>;
/// P per-rank blocks of a rank-4 tensor, [P, ...] (the backward all-to-alls' send and receive layout).
template <class T, class MemSpace>
using Tensor5 = Kokkos::View<T*****, Kokkos::LayoutRight, MemSpace>;

/// kv [B, n, h, dn+dv] (head i: dn key columns then dv value columns) and the shared rotary key kpe [B, n, dr] ->
/// k [B, n, h, dn+dr] = [k_nope_i, k_pe] and v [B, n, h, dv]. One work item per (b, t, head) row.
template <class ExecSpace, class KV, class KPE, class K, class V>
void assemble_kv(const ExecSpace& space, const KV& kv, const KPE& kpe, const K& k, const V& v, int dn) {
  const auto n = static_cast<std::int64_t>(k.extent(1)), h = static_cast<std::int64_t>(k.extent(2));
  const auto rows = static_cast<std::int64_t>(k.extent(0)) * n * h;
  const int dqk = static_cast<int>(k.extent(3)), dv = static_cast<int>(v.extent(3));
  Kokkos::parallel_for(
      "mlacp::assemble_kv", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t head = row % h, t = (row / h) % n, b = row / (h * n);
        for (int c = 0; c < dn; ++c) k(b, t, head, c) = kv(b, t, head, c);
        for (int c = dn; c < dqk; ++c) k(b, t, head, c) = kpe(b, t, c - dn);
        for (int c = 0; c < dv; ++c) v(b, t, head, c) = kv(b, t, head, dn + c);
      });
}

/// The adjoint of assemble_kv: dkv [B, n, h, dn+dv] from dk's first dn columns and dv; dkpe [B, n, dr] = the sum over
/// heads of dk's last dr columns (the rotary key is shared by all heads). dk or dv may be empty (zero gradient).
/// One work item per (b, t) token.
template <class ExecSpace, class DK, class DV, class DKV, class DKPE>
void disassemble_kv_grad(const ExecSpace& space, const DK& dk, const DV& dv, const DKV& dkv, const DKPE& dkpe, int dn) {
  using T = typename DKV::non_const_value_type;
  const auto n = static_cast<std::int64_t>(dkv.extent(1)), h = static_cast<std::int64_t>(dkv.extent(2));
  const auto tokens = static_cast<std::int64_t>(dkv.extent(0)) * n;
  const int width = static_cast<int>(dkv.extent(3)), dr = static_cast<int>(dkpe.extent(2));
  const bool has_k = dk.data() != nullptr, has_v = dv.data() != nullptr;
  Kokkos::parallel_for(
      "mlacp::disassemble_kv_grad", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, tokens),
      KOKKOS_LAMBDA(const std::int64_t token) {
        const std::int64_t t = token % n, b = token / n;
        for (int c = 0; c < dr; ++c) dkpe(b, t, c) = T(0);
        for (std::int64_t head = 0; head < h; ++head) {
          for (int c = 0; c < dn; ++c) dkv(b, t, head, c) = has_k ? dk(b, t, head, c) : T(0);
          for (int c = dn; c < width; ++c) dkv(b, t, head, c) = has_v ? dv(b, t, head, c - dn) : T(0);
          if (has_k)
            for (int c = 0; c < dr; ++c) dkpe(b, t, c) += dk(b, t, head, dn + c);
        }
      });
}

/// The V branch of the adjoint: dkv(b, t, head, dn + c) = dv(b, t, head, c). One work item per (b, t, head) row.
template <class ExecSpace, class DV, class DKV>
void write_v_grad(const ExecSpace& space, const DV& dv, const DKV& dkv, int dn) {
  const auto n = static_cast<std::int64_t>(dv.extent(1)), h = static_cast<std::int64_t>(dv.extent(2));
  const auto rows = static_cast<std::int64_t>(dv.extent(0)) * n * h;
  const int w = static_cast<int>(dv.extent(3));
  Kokkos::parallel_for(
      "mlacp::write_v_grad", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t head = row % h, t = (row / h) % n, b = row / (h * n);
        for (int c = 0; c < w; ++c) dkv(b, t, head, dn + c) = dv(b, t, head, c);
      });
}

/// dst(b, t, dst_first + c) = src(b, t, src_first + c) for c in [0, width), on rank-3 Views with equal B and n. One
/// work item per (b, t) row.
template <class ExecSpace, class Src, class Dst>
void copy_columns(const ExecSpace& space, const Src& src, int src_first, const Dst& dst, int dst_first, int width) {
  const auto n = static_cast<std::int64_t>(src.extent(1));
  const auto rows = static_cast<std::int64_t>(src.extent(0)) * n;
  Kokkos::parallel_for(
      "mlacp::copy_columns", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t t = row % n, b = row / n;
        for (int c = 0; c < width; ++c) dst(b, t, dst_first + c) = src(b, t, src_first + c);
      });
}

}  // namespace mlacp::detail
