// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The two kernels every codec runs through: `rows` rows of `width` values encoded into the wire (each row's
// Codec::wire_width(width) wire values, packed one after the other) and decoded back. Where a row comes from and
// where it goes are functors of the row index, so that a collective's contiguous payload and the output projection's
// per-destination blocks (a row gathered from a strided tensor) share them. Element-wise codecs run one flat range
// over every value; row-scaled ones a team per row.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

namespace mlacp::detail {

/// Row r of a contiguous [rows, width] tensor at `data`.
template <class T>
struct ContiguousRows {
  T* data;
  std::int64_t width;
  KOKKOS_INLINE_FUNCTION T* operator()(const std::int64_t r) const { return data + r * width; }
};

template <class Rows>
struct is_contiguous_rows : std::false_type {};
template <class T>
struct is_contiguous_rows<ContiguousRows<T>> : std::true_type {};

/// out (rows * Codec::wire_width(width) wire values) = the rows src_row(0 .. rows - 1), encoded, on `space`.
template <class Codec, class T, class ExecSpace, class SrcRow>
void encode_rows(const ExecSpace& space, const char* label, std::int64_t rows, std::int64_t width,
                 const SrcRow& src_row, typename Codec::template wire_t<T>* out) {
  if (rows <= 0) return;
  if constexpr (Codec::row_scaled) {
    const std::int64_t wide = Codec::wire_width(width);
    Kokkos::parallel_for(
        label, Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(rows), Kokkos::AUTO),
        KOKKOS_LAMBDA(const typename Kokkos::TeamPolicy<ExecSpace>::member_type& team) {
          const std::int64_t r = team.league_rank();
          Codec::encode_row(team, src_row(r), out + r * wide, width);
        });
  } else {
    if (width <= 0) return;
    const Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>> all(space, 0, rows * width);
    if constexpr (is_contiguous_rows<SrcRow>::value) {
      const auto* in = src_row.data;
      Kokkos::parallel_for(
          label, all, KOKKOS_LAMBDA(const std::int64_t i) { out[i] = Codec::template encode_value<T>(in[i]); });
    } else {
      Kokkos::parallel_for(
          label, all, KOKKOS_LAMBDA(const std::int64_t i) {
            out[i] = Codec::template encode_value<T>(src_row(i / width)[i % width]);
          });
    }
  }
}

/// The rows dst_row(0 .. rows - 1) = `in` (rows * Codec::wire_width(width) wire values), decoded, on `space`.
template <class Codec, class T, class ExecSpace, class DstRow>
void decode_rows(const ExecSpace& space, const char* label, std::int64_t rows, std::int64_t width,
                 const typename Codec::template wire_t<T>* in, const DstRow& dst_row) {
  if (rows <= 0) return;
  if constexpr (Codec::row_scaled) {
    const std::int64_t wide = Codec::wire_width(width);
    Kokkos::parallel_for(
        label, Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(rows), Kokkos::AUTO),
        KOKKOS_LAMBDA(const typename Kokkos::TeamPolicy<ExecSpace>::member_type& team) {
          const std::int64_t r = team.league_rank();
          Codec::decode_row(team, in + r * wide, dst_row(r), width);
        });
  } else {
    if (width <= 0) return;
    const Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>> all(space, 0, rows * width);
    if constexpr (is_contiguous_rows<DstRow>::value) {
      T* out = dst_row.data;
      Kokkos::parallel_for(
          label, all, KOKKOS_LAMBDA(const std::int64_t i) { out[i] = Codec::template decode_value<T>(in[i]); });
    } else {
      Kokkos::parallel_for(
          label, all, KOKKOS_LAMBDA(const std::int64_t i) {
            dst_row(i / width)[i % width] = Codec::template decode_value<T>(in[i]);
          });
    }
  }
}

}  // namespace mlacp::detail
