// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Kernels that move the MLA block's tensors between layouts: keys/values from the KV up-projection and the shared
// rotary key, their gradients back, and column blocks of token tensors.
//
// Every kernel here is memory-bound, so each work item is one row (a token, or a token and head) whose values are
// contiguous: the index arithmetic (one divide) is per row, and the inner loops run over the contiguous last dimension
// through plain pointers, so that compilers vectorise them. The Views must be LayoutRight and contiguous (the layer's
// are; checked where a View comes from a caller).
#pragma once

#include <mlacp/view_types.hpp>

#include <Kokkos_Core.hpp>
#include <cstdint>

namespace mlacp::detail {

/// kv [B, n, h, dn+dv] (head i: dn key columns then dv value columns) and the shared rotary key, columns
/// [kpe_first, kpe_first + dr) of the rank-3 kpe [B, n, W] (dr = k.extent(3) - dn) -> k [B, n, h, dn+dr] =
/// [k_nope_i, k_pe] and v [B, n, h, dv]. Reading the rotary key where it already is (e.g. inside the gathered payload)
/// spares a copy. One work item per (b, t, head) row.
template <class ExecSpace, class KV, class KPE, class K, class V>
void assemble_kv(const ExecSpace& space, const KV& kv, const KPE& kpe, const K& k, const V& v, int dn,
                 int kpe_first = 0) {
  using T = typename K::non_const_value_type;
  const auto h = static_cast<std::int64_t>(k.extent(2));
  const auto rows = static_cast<std::int64_t>(k.extent(0) * k.extent(1)) * h;
  const int dqk = static_cast<int>(k.extent(3)), dv = static_cast<int>(v.extent(3)), dr = dqk - dn;
  const std::int64_t kv_width = dn + dv, kpe_width = static_cast<std::int64_t>(kpe.extent(2));
  const T* kv_data = kv.data();
  const T* kpe_data = kpe.data() + kpe_first;
  T* k_data = k.data();
  T* v_data = v.data();
  Kokkos::parallel_for(
      "mlacp::assemble_kv", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t token = row / h;
        const T* source = kv_data + row * kv_width;
        const T* rotary = kpe_data + token * kpe_width;
        T* key = k_data + row * dqk;
        T* value = v_data + row * dv;
        for (int c = 0; c < dn; ++c) key[c] = source[c];
        for (int c = 0; c < dr; ++c) key[dn + c] = rotary[c];
        for (int c = 0; c < dv; ++c) value[c] = source[dn + c];
      });
}

/// The key half of assemble_kv's adjoint, from the P head blocks of dk that the inverse all-to-all delivers
/// ([P, B, n, h, dqk], block r holding heads [r*h, (r+1)*h); P = 1 for a plain [B, n, h, dqk]): dkv's first dn
/// columns of each head [B, n, P*h, dn+dv], and dkpe [B, n, dr] = the sum over all heads of dk's last dr columns (the
/// rotary key is shared by all heads). dk empty: zero key gradient. Reading the blocks where they arrived replaces an
/// unpack. One work item per (b, t) token (the sum over heads stays in the work item: no atomics).
template <class ExecSpace, class T, class DKV, class DKPE>
void key_grad_from_blocks(const ExecSpace& space, const T* dk_blocks, std::int64_t parts, const DKV& dkv,
                          const DKPE& dkpe, int dn) {
  const auto n = static_cast<std::int64_t>(dkv.extent(1));
  const auto tokens = static_cast<std::int64_t>(dkv.extent(0)) * n;
  const std::int64_t heads = static_cast<std::int64_t>(dkv.extent(2)), h = heads / parts;
  const int width = static_cast<int>(dkv.extent(3)), dr = static_cast<int>(dkpe.extent(2)), dqk = dn + dr;
  const std::int64_t block = tokens * h * dqk;
  T* dkv_data = dkv.data();
  T* dkpe_data = dkpe.data();
  Kokkos::parallel_for(
      "mlacp::key_grad_from_blocks", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, tokens),
      KOKKOS_LAMBDA(const std::int64_t token) {
        T* shared = dkpe_data + token * dr;
        for (int c = 0; c < dr; ++c) shared[c] = T(0);
        for (std::int64_t r = 0; r < parts; ++r) {
          for (std::int64_t i = 0; i < h; ++i) {
            T* target = dkv_data + (token * heads + r * h + i) * width;
            if (dk_blocks == nullptr) {
              for (int c = 0; c < dn; ++c) target[c] = T(0);
              continue;
            }
            const T* source = dk_blocks + r * block + (token * h + i) * dqk;
            for (int c = 0; c < dn; ++c) target[c] = source[c];
            for (int c = 0; c < dr; ++c) shared[c] += source[dn + c];
          }
        }
      });
}

/// The value half: dkv(b, t, head, dn + c) = dv(b, t, head, c) from the P head blocks of dv ([P, B, n, h, dv]; P = 1
/// for a plain [B, n, h, dv]); dv empty: zero. One work item per (b, t, head) row.
template <class ExecSpace, class T, class DKV>
void value_grad_from_blocks(const ExecSpace& space, const T* dv_blocks, std::int64_t parts, const DKV& dkv, int dn) {
  const auto tokens = static_cast<std::int64_t>(dkv.extent(0) * dkv.extent(1));
  const std::int64_t heads = static_cast<std::int64_t>(dkv.extent(2)), h = heads / parts;
  const int width = static_cast<int>(dkv.extent(3)), dv = width - dn;
  T* dkv_data = dkv.data();
  Kokkos::parallel_for(
      "mlacp::value_grad_from_blocks",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, tokens * heads),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t token = row / heads, head = row - token * heads;
        const std::int64_t r = head / h, i = head - r * h;
        T* target = dkv_data + row * width + dn;
        if (dv_blocks == nullptr) {
          for (int c = 0; c < dv; ++c) target[c] = T(0);
          return;
        }
        const T* source = dv_blocks + ((r * tokens + token) * h + i) * dv;
        for (int c = 0; c < dv; ++c) target[c] = source[c];
      });
}

/// The adjoint of assemble_kv on head-local tensors: dkv [B, n, h, dn+dv] from dk's first dn columns and dv; dkpe
/// [B, n, dr] = the sum over heads of dk's last dr columns. dk or dv may be empty (zero gradient).
template <class ExecSpace, class DK, class DV, class DKV, class DKPE>
void disassemble_kv_grad(const ExecSpace& space, const DK& dk, const DV& dv, const DKV& dkv, const DKPE& dkpe, int dn) {
  key_grad_from_blocks(space, dk.data(), 1, dkv, dkpe, dn);
  value_grad_from_blocks(space, dv.data(), 1, dkv, dn);
}

/// dst(b, t, dst_first + c) = src(b, t, src_first + c) for c in [0, width), on contiguous LayoutRight rank-3 Views with
/// equal B and n. One work item per (b, t) row.
template <class ExecSpace, class Src, class Dst>
void copy_columns(const ExecSpace& space, const Src& src, int src_first, const Dst& dst, int dst_first, int width) {
  using T = typename Dst::non_const_value_type;
  const auto rows = static_cast<std::int64_t>(src.extent(0) * src.extent(1));
  const auto src_width = static_cast<std::int64_t>(src.extent(2)), dst_width = static_cast<std::int64_t>(dst.extent(2));
  const auto* from = src.data() + src_first;
  T* to = dst.data() + dst_first;
  Kokkos::parallel_for(
      "mlacp::copy_columns", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const auto* source = from + row * src_width;
        T* target = to + row * dst_width;
        for (int c = 0; c < width; ++c) target[c] = source[c];
      });
}

/// whole(b, t, :) = [left(b, t, :), right(b, t, :)] for contiguous LayoutRight rank-3 Views [B, n, a], [B, n, b] and
/// [B, n, a + b]: one pass instead of two column copies. One work item per (b, t) row.
template <class ExecSpace, class Left, class Right, class Whole>
void join_columns(const ExecSpace& space, const Left& left, const Right& right, const Whole& whole) {
  using T = typename Whole::non_const_value_type;
  const auto rows = static_cast<std::int64_t>(whole.extent(0) * whole.extent(1));
  const int wa = static_cast<int>(left.extent(2)), wb = static_cast<int>(right.extent(2)), width = wa + wb;
  const auto* a = left.data();
  const auto* b = right.data();
  T* w = whole.data();
  Kokkos::parallel_for(
      "mlacp::join_columns", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t row) {
        T* target = w + row * width;
        const auto* first = a + row * wa;
        const auto* second = b + row * wb;
        // static_cast: the halves may be bf16 and the whole float, and Kokkos' native bhalf_t (mlacp::bf16 on CUDA)
        // widens only explicitly.
        for (int c = 0; c < wa; ++c) target[c] = static_cast<T>(first[c]);
        for (int c = 0; c < wb; ++c) target[wa + c] = static_cast<T>(second[c]);
      });
}

}  // namespace mlacp::detail
