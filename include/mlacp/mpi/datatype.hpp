// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI datatype of each value type mlacp communicates. bf16 moves as 2-byte elements (MPI_UINT16_T: its bits,
// untouched); MPI has no bf16 sum, so no MPI reduction is ever given it (the collectives refuse the mpi reduce-scatter
// algorithm for bf16 and sum it themselves, in float).
#pragma once

#include <mpi.h>
#include <mlacp/compat.hpp>

#include <cstdint>
#include <type_traits>

namespace mlacp::mpi {

template <class T>
struct is_supported_value : std::false_type {};
template <>
struct is_supported_value<float> : std::true_type {};
template <>
struct is_supported_value<double> : std::true_type {};
template <>
struct is_supported_value<bf16> : std::true_type {};
template <>
struct is_supported_value<std::uint8_t> : std::true_type {};

/// Whether MPI can reduce (MPI_SUM) values of T: float and double, not bf16.
template <class T>
inline constexpr bool mpi_can_sum_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class T>
MPI_Datatype datatype() {
  static_assert(is_supported_value<T>::value, "mlacp communicates float, double, bf16 and byte Views only");
  static_assert(sizeof(bf16) == sizeof(std::uint16_t), "bf16 moves as MPI_UINT16_T");
  if constexpr (std::is_same_v<T, float>) {
    return MPI_FLOAT;
  } else if constexpr (std::is_same_v<T, double>) {
    return MPI_DOUBLE;
  } else if constexpr (std::is_same_v<T, std::uint8_t>) {
    return MPI_UINT8_T;  // a wire codec's encoded bytes: moved, never reduced
  } else {
    return MPI_UINT16_T;
  }
}

}  // namespace mlacp::mpi
