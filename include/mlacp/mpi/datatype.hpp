// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI datatype of each value type mlacp communicates.
#pragma once

#include <mpi.h>

#include <type_traits>

namespace mlacp::mpi {

template <class T>
struct is_supported_value : std::false_type {};
template <>
struct is_supported_value<float> : std::true_type {};
template <>
struct is_supported_value<double> : std::true_type {};

template <class T>
MPI_Datatype datatype() {
  static_assert(is_supported_value<T>::value, "mlacp communicates float and double Views only");
  if constexpr (std::is_same_v<T, float>) {
    return MPI_FLOAT;
  } else {
    return MPI_DOUBLE;
  }
}

}  // namespace mlacp::mpi
