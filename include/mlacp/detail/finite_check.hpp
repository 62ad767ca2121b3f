// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The finite-input check of the MLA layer (Mesh::check_finite).
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>

#include <cstdint>

namespace mlacp::detail {

/// Number of NaN or +-Inf values in a contiguous View (float, double or bf16), counted by a reduction on `space`
/// (blocking: the count is needed on the host).
template <class ExecSpace, class ViewType>
std::int64_t count_non_finite(const ExecSpace& space, const ViewType& view) {
  using T = typename ViewType::non_const_value_type;
  using Check = compat::accumulation_t<T>;  // bf16 is checked widened to float (exact: the same NaN and Inf)
  const T* data = view.data();
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "mlacp::count_non_finite",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, static_cast<std::int64_t>(view.size())),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& count) {
        const Check v = static_cast<Check>(data[i]);
        if (!(v - v == Check(0))) ++count;  // NaN and +-Inf are the values for which v - v is not 0
      },
      bad);
  return bad;
}

}  // namespace mlacp::detail
