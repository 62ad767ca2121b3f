// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Argument checks of the collectives, done before anything is sent, and (in checked mode) agreed on by every rank.
#pragma once

#include <array>
#include <cstdint>

namespace mlacp {
class Mesh;
}

namespace mlacp::detail {

enum class CollectiveKind : int { all_to_all = 1, all_gather = 2, reduce_scatter = 3 };

const char* collective_name(CollectiveKind kind) noexcept;

inline constexpr int max_collective_rank = 5;

/// What one rank passed to a collective.
struct CollectiveCall {
  CollectiveKind kind;
  int rank;                                               ///< number of dimensions of the View
  std::array<std::int64_t, max_collective_rank> extents;  ///< unused entries are 0
  int dim_a;                                              ///< all_to_all: gather_dim; all_gather / reduce_scatter: dim
  int dim_b;                                              ///< all_to_all: scatter_dim; otherwise -1
  int value_size;                                         ///< sizeof the value type
  bool allocated;                                         ///< data() != nullptr or the View is empty
};

/// Validates `call` for a group of `mesh.size()` ranks. Throws InvalidArgument naming the value and what was expected.
/// Unchecked mesh: local checks only. Checked mesh: one MPI_Allreduce also compares the calls of all ranks, and an
/// error found on any rank is thrown on every rank (with the message of the lowest such rank), so nothing hangs.
void validate_collective(const Mesh& mesh, const CollectiveCall& call);

}  // namespace mlacp::detail
