// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once

#include <mlacp/build_config.hpp>

#include <iosfwd>
#include <string>

namespace mlacp {

/// The library version, "major.minor.patch".
std::string version();

/// Writes what this build was configured with (mlacp, Kokkos and MPI versions, backends) to `out`.
void print_configuration(std::ostream& out);

}  // namespace mlacp
