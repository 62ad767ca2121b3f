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

/// kv [B, n, h, dn+dv] (head i: dn key columns then dv value columns) and the shared rotary key kpe [B, n, dr] ->
/// k [B, n, h, dn+dr] = [k_nope_i, k_pe] and v [B, n, h, dv].
template <class ExecSpace, class KV, class KPE, class K, class V>
void assemble_kv(const ExecSpace& space, const KV& kv, const KPE& kpe, const K& k, const V& v, int dn) {
  const auto B = static_cast<std::int64_t>(k.extent(0)), n = static_cast<std::int64_t>(k.extent(1));
  const auto h = static_cast<std::int64_t>(k.extent(2)), dqk = static_cast<std::int64_t>(k.extent(3));
  const auto dv = static_cast<std::int64_t>(v.extent(3));
  const std::int64_t width = dqk + dv;
  Kokkos::parallel_for(
      "mlacp::assemble_kv",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, B * n * h * width),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t c = i % width, head = (i / width) % h, t = (i / (width * h)) % n, b = i / (width * h * n);
        if (c < dn)
          k(b, t, head, c) = kv(b, t, head, c);
        else if (c < dqk)
          k(b, t, head, c) = kpe(b, t, c - dn);
        else
          v(b, t, head, c - dqk) = kv(b, t, head, dn + (c - dqk));
      });
}

/// The adjoint of assemble_kv: dkv [B, n, h, dn+dv] from dk's first dn columns and dv; dkpe [B, n, dr] = the sum over
/// heads of dk's last dr columns (the rotary key is shared by all heads). dk or dv may be empty (zero gradient).
template <class ExecSpace, class DK, class DV, class DKV, class DKPE>
void disassemble_kv_grad(const ExecSpace& space, const DK& dk, const DV& dv, const DKV& dkv, const DKPE& dkpe, int dn) {
  using T = typename DKV::non_const_value_type;
  const auto B = static_cast<std::int64_t>(dkv.extent(0)), n = static_cast<std::int64_t>(dkv.extent(1));
  const auto h = static_cast<std::int64_t>(dkv.extent(2)), width = static_cast<std::int64_t>(dkv.extent(3));
  const auto dr = static_cast<std::int64_t>(dkpe.extent(2));
  const bool has_k = dk.data() != nullptr, has_v = dv.data() != nullptr;
  Kokkos::parallel_for(
      "mlacp::disassemble_kv_grad",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, B * n * h * width),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t c = i % width, head = (i / width) % h, t = (i / (width * h)) % n, b = i / (width * h * n);
        if (c < dn)
          dkv(b, t, head, c) = has_k ? dk(b, t, head, c) : T(0);
        else
          dkv(b, t, head, c) = has_v ? dv(b, t, head, c - dn) : T(0);
      });
  Kokkos::parallel_for(
      "mlacp::shared_key_grad", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, B * n * dr),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t c = i % dr, t = (i / dr) % n, b = i / (dr * n);
        T sum = 0;
        if (has_k)
          for (std::int64_t head = 0; head < h; ++head) sum += dk(b, t, head, dn + c);
        dkpe(b, t, c) = sum;
      });
}

/// The V branch of the adjoint: dkv(b, t, head, dn + c) = dv(b, t, head, c).
template <class ExecSpace, class DV, class DKV>
void write_v_grad(const ExecSpace& space, const DV& dv, const DKV& dkv, int dn) {
  const auto B = static_cast<std::int64_t>(dv.extent(0)), n = static_cast<std::int64_t>(dv.extent(1));
  const auto h = static_cast<std::int64_t>(dv.extent(2)), w = static_cast<std::int64_t>(dv.extent(3));
  Kokkos::parallel_for(
      "mlacp::write_v_grad", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, B * n * h * w),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t c = i % w, head = (i / w) % h, t = (i / (w * h)) % n, b = i / (w * h * n);
        dkv(b, t, head, dn + c) = dv(b, t, head, c);
      });
}

/// dst(b, t, dst_first + c) = src(b, t, src_first + c) for c in [0, width), on rank-3 Views with equal B and n.
template <class ExecSpace, class Src, class Dst>
void copy_columns(const ExecSpace& space, const Src& src, int src_first, const Dst& dst, int dst_first, int width) {
  const auto B = static_cast<std::int64_t>(src.extent(0)), n = static_cast<std::int64_t>(src.extent(1));
  Kokkos::parallel_for(
      "mlacp::copy_columns", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, B * n * width),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t c = i % width, t = (i / width) % n, b = i / (width * n);
        dst(b, t, dst_first + c) = src(b, t, src_first + c);
      });
}

}  // namespace mlacp::detail
