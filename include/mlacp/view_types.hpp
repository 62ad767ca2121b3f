// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The View types mlacp's headers name, defined once: row-major (LayoutRight) Views of rank 1 to 5 in a memory space
// (or a Kokkos::Device), owning their allocation by default or, with the `Unmanaged` traits, windows on memory another
// View owns (a row block of a weight, a matrix over a tensor's data) that cost no reference count.
#pragma once

#include <Kokkos_Core.hpp>

namespace mlacp::detail {

/// The memory traits of a View that does not own its data: `Matrix<T, Mem, Unmanaged>`.
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;

/// [n]: a bias, a norm's gain, a flat buffer.
template <class T, class MemSpace, class... Traits>
using Vector = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace, Traits...>;
/// [rows, cols]: a weight (nn.Linear form, [out, in]) or a tensor seen as rows of features.
template <class T, class MemSpace, class... Traits>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace, Traits...>;
/// [B, n, d]: tokens of a batch.
template <class T, class MemSpace, class... Traits>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, MemSpace, Traits...>;
/// [B, n, heads, d]: tokens of a batch per head.
template <class T, class MemSpace, class... Traits>
using Tensor4 = Kokkos::View<T****, Kokkos::LayoutRight, MemSpace, Traits...>;
/// P per-rank blocks of a rank-4 tensor, [P, ...] (the backward all-to-alls' send and receive layout).
template <class T, class MemSpace, class... Traits>
using Tensor5 = Kokkos::View<T*****, Kokkos::LayoutRight, MemSpace, Traits...>;

}  // namespace mlacp::detail
