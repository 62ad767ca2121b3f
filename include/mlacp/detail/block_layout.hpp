// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Pack and unpack kernels of the collectives. A LayoutRight tensor seen around one dimension `d` is a 3-D array
// [outer, mid, inner] (outer = product of the extents before d, mid = extent(d), inner = product after d), so every
// rank-N exchange is a 3-D re-indexing, written once here for any N.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>

#include <cstdint>
#include <string>

namespace mlacp::detail {

struct AroundDim {
  std::int64_t outer = 1;
  std::int64_t mid = 1;
  std::int64_t inner = 1;
  std::int64_t size() const { return outer * mid * inner; }
};

template <class ViewType>
AroundDim around_dim(const ViewType& view, int dim) {
  AroundDim a;
  for (int d = 0; d < static_cast<int>(ViewType::rank); ++d) {
    const auto extent = static_cast<std::int64_t>(view.extent(static_cast<unsigned>(d)));
    if (d < dim) a.outer *= extent;
    if (d == dim) a.mid = extent;
    if (d > dim) a.inner *= extent;
  }
  return a;
}

/// out = the P contiguous blocks of `in` split along `a.mid`: block j holds in[:, j*m:(j+1)*m, :] (m = a.mid / parts)
/// as a LayoutRight [outer, m, inner] array. Used to send block j to rank j. One work item per (outer, mid) row copies
/// its contiguous run of `inner` values, so the index arithmetic is per row, not per element.
template <class ExecSpace, class T>
void pack_blocks(const ExecSpace& space, const T* in, T* out, AroundDim a, int parts, const std::string& label) {
  const std::int64_t m = a.mid / parts;
  const std::int64_t block = a.outer * m * a.inner;
  const std::int64_t mid = a.mid, inner = a.inner;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, a.outer * a.mid),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t o = row / mid;
        const std::int64_t x = row - o * mid;
        const std::int64_t j = x / m;
        const T* source = in + row * inner;
        T* target = out + j * block + (o * m + (x - j * m)) * inner;
        for (std::int64_t n = 0; n < inner; ++n) target[n] = source[n];
      });
}

/// The inverse direction: `in` holds P blocks, each a LayoutRight [outer, mid, inner] array (block i from rank i);
/// out is [outer, mid * P, inner] with block i at out[:, i*mid:(i+1)*mid, :]. One work item per received row.
template <class ExecSpace, class T>
void unpack_blocks(const ExecSpace& space, const T* in, T* out, AroundDim a, int parts, const std::string& label) {
  const std::int64_t rows_per_block = a.outer * a.mid;
  const std::int64_t mid = a.mid, inner = a.inner, wide = a.mid * parts;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows_per_block * parts),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t r = row / rows_per_block;
        const std::int64_t k = row - r * rows_per_block;
        const std::int64_t o = k / mid;
        const std::int64_t y = k - o * mid;
        const T* source = in + row * inner;
        T* target = out + (o * wide + r * mid + y) * inner;
        for (std::int64_t n = 0; n < inner; ++n) target[n] = source[n];
      });
}

/// The block of an uneven partition that holds index x: the j with offsets[j] <= x < offsets[j + 1], where `offsets`
/// holds parts + 1 ascending prefix sums (offsets[0] = 0 <= x < offsets[parts]); empty blocks are never returned.
KOKKOS_INLINE_FUNCTION int block_of(const std::int64_t* offsets, int parts, std::int64_t x) {
  int lo = 0, hi = parts;  // offsets[lo] <= x < offsets[hi]
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (offsets[mid] <= x)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/// Which way copy_blocks_v moves the rows: from the tensor into its blocks (pack) or from the blocks into the tensor
/// (unpack).
enum class BlockDirection { pack, unpack };

/// The uneven pack and unpack, one body: the tensor is [outer, mid, inner] with mid = offsets[parts]; its block j,
/// tensor[:, offsets[j]:offsets[j+1], :], is a LayoutRight [outer, count_j, inner] array at blocks + outer * offsets[j]
/// * inner (the blocks concatenated in rank order). pack: `in` is the tensor, `out` the blocks; unpack: the reverse.
/// One work item per row of the tensor copies its contiguous run of `inner` values. `offsets` (parts + 1 prefix sums
/// of the partition) must be readable by `space`.
template <BlockDirection direction, class ExecSpace, class T>
void copy_blocks_v(const ExecSpace& space, const T* in, T* out, AroundDim a, const std::int64_t* offsets, int parts,
                   const std::string& label) {
  const std::int64_t outer = a.outer, mid = a.mid, inner = a.inner;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, a.outer * a.mid),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t o = row / mid;
        const std::int64_t x = row - o * mid;
        const int j = block_of(offsets, parts, x);
        const std::int64_t first = offsets[j], count = offsets[j + 1] - first;
        const std::int64_t block_row = outer * first + o * count + (x - first);
        constexpr bool packing = direction == BlockDirection::pack;
        const T* source = in + (packing ? row : block_row) * inner;
        T* target = out + (packing ? block_row : row) * inner;
        for (std::int64_t n = 0; n < inner; ++n) target[n] = source[n];
      });
}

/// The uneven pack: `in` is the [outer, mid, inner] tensor, `out` receives its blocks in rank order (copy_blocks_v).
template <class ExecSpace, class T>
void pack_blocks_v(const ExecSpace& space, const T* in, T* out, AroundDim a, const std::int64_t* offsets, int parts,
                   const std::string& label) {
  copy_blocks_v<BlockDirection::pack>(space, in, out, a, offsets, parts, label);
}

/// The uneven unpack, the inverse of pack_blocks_v: `in` holds the blocks in rank order, `out` is the [outer, mid,
/// inner] tensor (copy_blocks_v).
template <class ExecSpace, class T>
void unpack_blocks_v(const ExecSpace& space, const T* in, T* out, AroundDim a, const std::int64_t* offsets, int parts,
                     const std::string& label) {
  copy_blocks_v<BlockDirection::unpack>(space, in, out, a, offsets, parts, label);
}

/// out[i] = the sum over r = 0..parts-1, in that order, of block r's value i, where block r is received[r*n + i] for
/// r != self_index and own[i] for r == self_index (this rank's own block, read where it already is). The fixed order
/// gives every rank's part of a reduce-scatter the same association whatever the MPI library. The sum is accumulated
/// in compat::accumulation_t<T>: bf16 blocks are widened to float, added in float and rounded once, at the store (a
/// bf16 accumulator would round after every addition); float and double add in their own type.
template <class ExecSpace, class T>
void sum_blocks(const ExecSpace& space, const T* received, const T* own, int self_index, T* out, std::int64_t n,
                int parts, const std::string& label) {
  using Acc = compat::accumulation_t<T>;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
      KOKKOS_LAMBDA(const std::int64_t i) {
        Acc sum = static_cast<Acc>(self_index == 0 ? own[i] : received[i]);
        for (int r = 1; r < parts; ++r) sum += static_cast<Acc>(r == self_index ? own[i] : received[r * n + i]);
        out[i] = static_cast<T>(sum);
      });
}

/// out[i] = in[i] converted to To (a copy between value types: bf16 widened to float exactly, float rounded to bf16
/// to nearest even), n values, on `space`.
template <class ExecSpace, class From, class To>
void convert_values(const ExecSpace& space, const From* in, To* out, std::int64_t n, const std::string& label) {
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { out[i] = static_cast<To>(in[i]); });
}

}  // namespace mlacp::detail
