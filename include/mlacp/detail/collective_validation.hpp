// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Argument checks of the collectives, done before anything is sent, and (in checked mode) agreed on by every rank.
#pragma once

#include <mlacp/watchdog.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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
  int value_size;                                         ///< sizeof the value type: 4 float, 8 double, 2 bf16
  bool allocated;                                         ///< data() != nullptr or the View is empty
  /// A caller-provided destination of the result (`into`), when one was given: its extents (unused entries 0) and
  /// whether it is the input's own memory. Checked against the result's shape with the rest of the call.
  bool has_into = false;
  std::array<std::int64_t, max_collective_rank> into_extents{};
  bool into_aliases_input = false;
  /// A reduce-scatter that the backend would have MPI sum (MPI_Ireduce_scatter*: ReduceScatterAlgorithm::mpi over
  /// MPI), which a bf16 call cannot use (MPI has no bf16 sum): refused, naming the pairwise algorithm.
  bool sums_with_mpi = false;
  /// Uneven (v) collectives, called with Partitions: `uneven` is set and counts_a / counts_b hold the partitions'
  /// counts (all_to_all: the gather partition of dim_a and the scatter partition of dim_b; all_gather and
  /// reduce_scatter: the partition of dim_a, counts_b empty). Even calls leave them empty.
  bool uneven = false;
  std::vector<std::int64_t> counts_a{};
  std::vector<std::int64_t> counts_b{};
};

/// The watchdog's description of a launched collective (operation with its dimensions, shape, bytes sent).
CollectiveInfo describe_for_watchdog(const CollectiveCall& call, const std::string& name, std::int64_t bytes);

/// Named integers that every rank of a mesh must pass identically.
using AgreementFields = std::vector<std::pair<std::string, std::int64_t>>;

/// The mechanism behind every "raised on every rank" error. `local_error` is this rank's verdict (empty: valid).
/// Unchecked mesh or P == 1: throws InvalidArgument(local_error) if it is not empty. Checked mesh: one MPI_Allreduce
/// compares `fields` across ranks and collects the lowest failing rank; if any rank failed, every rank throws that
/// rank's message (one MPI_Bcast); else if a field differs, every rank throws a message naming it, its range and
/// `context` (what this rank passed).
/// `usage` selects UsageError instead of InvalidArgument for this rank's local error (the kind travels with the
/// message).
void agree_or_throw(const Mesh& mesh, const std::string& where, const std::string& local_error,
                    const AgreementFields& fields, const std::string& context, bool usage = false);

/// The kind of error a rank's local verdict raises on every rank (it travels with the message).
enum class AgreedErrorKind : char { invalid_argument = 'I', usage = 'U', communication = 'C', out_of_memory = 'M' };
/// agree_or_throw raising `kind` (OutOfMemory: the failing rank's message on every rank) for a local error.
void agree_or_throw(const Mesh& mesh, const std::string& where, const std::string& local_error,
                    const AgreementFields& fields, const std::string& context, AgreedErrorKind kind);

/// Every rank's `mine` (the same count on every rank), in rank order: one MPI_Iallgather on `mesh` whatever its
/// checked mode, recorded and watched as the collective `name` (`where`: the call it serves, for messages). `mine`
/// itself when the mesh has one rank.
std::vector<std::int64_t> gather_from_every_rank(const Mesh& mesh, const std::vector<std::int64_t>& mine,
                                                 const std::string& name, const std::string& where);

/// Every rank of `mesh` learns whether any failed a step that the next collective depends on (e.g. creating a
/// resource): whatever the checked mode, if `local_error` is not empty on some rank, every rank throws
/// CommunicationError with the lowest such rank's message. One allreduce (and a broadcast on failure).
void agree_on_success(const Mesh& mesh, const std::string& where, const std::string& local_error);

/// agree_on_success for an allocation: whatever the checked mode, if `local_error` (an OutOfMemory's message) is not
/// empty on some rank, every rank throws OutOfMemory with the lowest such rank's message.
void agree_on_allocation(const Mesh& mesh, const std::string& where, const std::string& local_error);

/// The local checks of validate_collective, on rank `me` of a group of `group_size` ranks: an empty string when the
/// call is valid, else the message of its first error. Pure host code (reads nothing of the View): the counts MPI would
/// be passed are bounded here from the call alone, per message as the transport really passes them (the even path's
/// P equal blocks, the uneven path's blocks of the partitions).
std::string collective_call_error(const CollectiveCall& call, int group_size, int me);

/// The name of the value type of `value_size` bytes, for messages: "float", "double", "bf16".
const char* value_type_name(int value_size) noexcept;

/// Validates `call` (of the collective named `name`) for a group of `mesh.size()` ranks. Throws InvalidArgument naming
/// the value and what was expected. Uneven calls: each partition must have mesh.size() parts, the View's extents must
/// be this rank's counts (or the totals, see the collectives), and in checked mode every rank must pass the same
/// partitions. Unchecked mesh: local checks only. Checked mesh: one MPI_Allreduce also compares
/// the calls of all ranks, and an error found on any rank is thrown on every rank (with the message of the lowest such
/// rank), so nothing hangs.
void validate_collective(const Mesh& mesh, const CollectiveCall& call, const std::string& name);

}  // namespace mlacp::detail
