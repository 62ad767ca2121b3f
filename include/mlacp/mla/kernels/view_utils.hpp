// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Small View helpers shared by the MLA kernels.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/view_types.hpp>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace mlacp {

/// True when `v` holds no element: a default-constructed View or one with a zero extent. The kernels read an empty
/// View argument as "not needed" where they say so.
template <class ViewType>
bool view_is_empty(const ViewType& v) {
  return v.size() == 0 || v.data() == nullptr;
}

/// Compile-time check that a kernel running on ExecSpace may access the memory of ViewType.
template <class ExecSpace, class ViewType>
constexpr void static_assert_accessible() {
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename ViewType::memory_space>::accessible,
                "mlacp: a View argument is not accessible from the execution space the kernel runs on");
}

/// An unmanaged LayoutRight rank-4 View `[B, s, 1, d]` over the data of a rank-3 LayoutRight View `[B, s, d]` (same
/// value type, same device), so that the rank-4 kernels (RoPE) apply to rank-3 tensors such as the shared key of the
/// latent payload. `v` must be contiguous (not a strided subview); the result does not keep `v`'s allocation alive.
template <class View3>
auto as_rank4(const View3& v) {
  static_assert(compat::view_rank_v<View3> == 3, "mlacp::as_rank4: expects a rank-3 View");
  static_assert(std::is_same_v<typename View3::array_layout, Kokkos::LayoutRight>,
                "mlacp::as_rank4: expects a LayoutRight View");
  using result_type = detail::Tensor4<typename View3::value_type, typename View3::device_type, detail::Unmanaged>;
  if (v.size() != 0 && !v.span_is_contiguous()) {
    throw mlacp::InvalidArgument("mlacp::as_rank4: the rank-3 View (label '" + v.label() +
                                 "') is not contiguous; expected a contiguous LayoutRight View");
  }
  return result_type(v.data(), v.extent(0), v.extent(1), 1, v.extent(2));
}

namespace detail {

/// "name = value" for error messages.
template <class Int>
std::string named(const char* name, Int value) {
  return std::string(name) + " = " + std::to_string(value);
}

}  // namespace detail
}  // namespace mlacp
