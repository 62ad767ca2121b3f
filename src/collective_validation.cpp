// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <Kokkos_Core.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/error.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/mpi/communicator.hpp>

#include <climits>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace mlacp::detail {

const char* collective_name(CollectiveKind kind) noexcept {
  switch (kind) {
    case CollectiveKind::all_to_all:
      return "mlacp::launch_all_to_all";
    case CollectiveKind::all_gather:
      return "mlacp::launch_all_gather";
    case CollectiveKind::reduce_scatter:
      return "mlacp::launch_reduce_scatter";
  }
  return "mlacp collective";
}

namespace {

std::string extents_string(const std::array<std::int64_t, max_collective_rank>& extents, int rank) {
  std::ostringstream out;
  out << '[';
  for (int d = 0; d < rank; ++d) out << (d ? ", " : "") << extents[static_cast<std::size_t>(d)];
  out << ']';
  return out.str();
}

std::string shape_string(const CollectiveCall& call) { return extents_string(call.extents, call.rank); }

std::string check_dimension(const CollectiveCall& call, const char* what, int dim) {
  if (dim >= 0 && dim < call.rank) return {};
  std::ostringstream out;
  out << collective_name(call.kind) << ": " << what << " = " << dim << " is out of range for a rank-" << call.rank
      << " View of shape " << shape_string(call) << "; expected 0 <= " << what << " < " << call.rank;
  return out.str();
}

std::string check_divisible(const CollectiveCall& call, const char* what, int dim, int group_size) {
  const auto extent = call.extents[static_cast<std::size_t>(dim)];
  if (extent % group_size == 0) return {};
  std::ostringstream out;
  out << collective_name(call.kind) << ": " << what << " " << dim << " has size " << extent
      << ", which is not divisible by the group size P = " << group_size << " (View shape " << shape_string(call)
      << ")";
  return out.str();
}

// The local checks; an empty string when the call is valid on this rank.
std::string local_error(const CollectiveCall& call, int group_size) {
  // (MPI_Finalize is checked by validate_collective before anything, as the agreement itself needs MPI.)
  if (!Kokkos::is_initialized())
    return std::string(collective_name(call.kind)) + ": called while Kokkos is not initialized (or already finalized)";
  if (!call.allocated)
    return std::string(collective_name(call.kind)) + ": the View of shape " + shape_string(call) +
           " is not allocated (data() is null)";
  std::string error;
  switch (call.kind) {
    case CollectiveKind::all_to_all:
      if (!(error = check_dimension(call, "gather_dim", call.dim_a)).empty()) return error;
      if (!(error = check_dimension(call, "scatter_dim", call.dim_b)).empty()) return error;
      if (call.dim_a == call.dim_b)
        return std::string(collective_name(call.kind)) + ": gather_dim and scatter_dim are both " +
               std::to_string(call.dim_a) + "; expected two different dimensions";
      if (!(error = check_divisible(call, "scattered dimension", call.dim_b, group_size)).empty()) return error;
      break;
    case CollectiveKind::all_gather:
      if (!(error = check_dimension(call, "dim", call.dim_a)).empty()) return error;
      break;
    case CollectiveKind::reduce_scatter:
      if (!(error = check_dimension(call, "dim", call.dim_a)).empty()) return error;
      if (!(error = check_divisible(call, "scattered dimension", call.dim_a, group_size)).empty()) return error;
      break;
  }
  if (call.has_into) {
    auto expected = call.extents;
    const auto a = static_cast<std::size_t>(call.dim_a);
    if (call.kind == CollectiveKind::reduce_scatter)
      expected[a] /= group_size;
    else
      expected[a] *= group_size;
    if (call.kind == CollectiveKind::all_to_all) expected[static_cast<std::size_t>(call.dim_b)] /= group_size;
    if (call.into_extents != expected)
      return std::string(collective_name(call.kind)) + ": the destination View has shape " +
             extents_string(call.into_extents, call.rank) + "; expected the result's shape " +
             extents_string(expected, call.rank) + " (input " + shape_string(call) +
             ", P = " + std::to_string(group_size) + ")";
    if (call.into_aliases_input)
      return std::string(collective_name(call.kind)) +
             ": the destination View is the input's own memory; expected a separate View";
  }
  std::int64_t elements = 1;
  for (int d = 0; d < call.rank; ++d) elements *= call.extents[static_cast<std::size_t>(d)];
  const std::int64_t per_message = call.kind == CollectiveKind::all_gather ? elements : elements / group_size;
  if (per_message > INT_MAX)
    return std::string(collective_name(call.kind)) + ": " + std::to_string(per_message) +
           " elements per rank and message exceed MPI's int count limit (" + std::to_string(INT_MAX) +
           "); split the View";
  return {};
}

// The fields every rank must agree on, in order, with their names for the message.
AgreementFields agreement_fields(const CollectiveCall& call) {
  AgreementFields fields;
  fields.emplace_back("the operation", static_cast<std::int64_t>(call.kind));
  fields.emplace_back("the View rank", call.rank);
  for (int d = 0; d < max_collective_rank; ++d)
    fields.emplace_back("extent(" + std::to_string(d) + ")", call.extents[static_cast<std::size_t>(d)]);
  fields.emplace_back(call.kind == CollectiveKind::all_to_all ? "gather_dim" : "dim", call.dim_a);
  fields.emplace_back("scatter_dim", call.dim_b);
  fields.emplace_back("the value size (sizeof float or double)", call.value_size);
  return fields;
}

}  // namespace

namespace {

// The kind of error a rank's local verdict raises; it travels with the message as its first character.
enum class ErrorKind : char { invalid_argument = 'I', usage = 'U', communication = 'C' };

[[noreturn]] void raise(ErrorKind kind, const std::string& text) {
  if (kind == ErrorKind::usage) throw UsageError(text);
  if (kind == ErrorKind::communication) throw CommunicationError(text);
  throw InvalidArgument(text);
}

// The agreement itself (see agree_or_throw), run whatever the mesh's checked mode.
void agree(const Mesh& mesh, const std::string& where, const std::string& local_error, const AgreementFields& fields,
           const std::string& context, ErrorKind kind) {
  if (mesh.size() == 1) {
    if (!local_error.empty()) raise(kind, local_error);
    return;
  }
  // One allreduce (MAX) carries: the lowest failing rank (negated), then every field and its negation, so that max
  // and min of each field arrive together.
  std::vector<std::int64_t> values(1 + 2 * fields.size());
  values[0] = -static_cast<std::int64_t>(local_error.empty() ? mesh.size() : mesh.rank());
  for (std::size_t i = 0; i < fields.size(); ++i) {
    values[1 + 2 * i] = fields[i].second;
    values[2 + 2 * i] = -fields[i].second;
  }
  CollectiveInfo info;
  info.name = where + " (checked-mode agreement)";
  info.operation = "MPI_Iallreduce(MAX) of the arguments of " + where;
  info.shape = context;
  info.bytes = static_cast<std::int64_t>(values.size() * sizeof(std::int64_t));
  mpi::allreduce_max(mesh.comm(), values, info, where + ": checked-mode MPI_Iallreduce");

  const auto failing_rank = static_cast<int>(-values[0]);
  if (failing_rank < mesh.size()) {
    // message[0] carries the kind, the text follows.
    char message[1024] = {};
    if (mesh.rank() == failing_rank) {
      message[0] = static_cast<char>(kind);
      std::strncpy(message + 1, local_error.c_str(), sizeof(message) - 2);
    }
    mpi::broadcast(mesh.comm(), message, sizeof(message), failing_rank, info, where + ": checked-mode MPI_Ibcast");
    const std::string text = std::string(message + 1) + " [raised on rank " + std::to_string(failing_rank) + " of " +
                             std::to_string(mesh.size()) + "; nothing was sent]";
    raise(static_cast<ErrorKind>(message[0]), text);
  }
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const std::int64_t largest = values[1 + 2 * i];
    const std::int64_t smallest = -values[2 + 2 * i];
    if (largest != smallest) {
      std::ostringstream out;
      out << where << ": the ranks of the mesh disagree on " << fields[i].first << " (from " << smallest << " to "
          << largest << " across ranks; this rank passed " << fields[i].second << ", " << context
          << "); every rank must pass the same shape, dimensions and type [nothing was sent]";
      throw InvalidArgument(out.str());
    }
  }
}

}  // namespace

void agree_or_throw(const Mesh& mesh, const std::string& where, const std::string& local_error,
                    const AgreementFields& fields, const std::string& context, bool usage) {
  const ErrorKind kind = usage ? ErrorKind::usage : ErrorKind::invalid_argument;
  if (!mesh.checked()) {
    if (!local_error.empty()) raise(kind, local_error);
    return;
  }
  agree(mesh, where, local_error, fields, context, kind);
}

void agree_on_success(const Mesh& mesh, const std::string& where, const std::string& local_error) {
  agree(mesh, where, local_error, {}, "", ErrorKind::communication);
}

CollectiveInfo describe_for_watchdog(const CollectiveCall& call, const std::string& name, std::int64_t bytes) {
  CollectiveInfo info;
  info.name = name;
  info.operation = std::string(collective_name(call.kind)) +
                   (call.kind == CollectiveKind::all_to_all ? "(gather_dim=" + std::to_string(call.dim_a) +
                                                                  ", scatter_dim=" + std::to_string(call.dim_b) + ")"
                                                            : "(dim=" + std::to_string(call.dim_a) + ")");
  info.shape = shape_string(call);
  info.bytes = bytes;
  return info;
}

void validate_collective(const Mesh& mesh, const CollectiveCall& call, const std::string& name) {
  if (mpi::finalized()) throw UsageError(std::string(collective_name(call.kind)) + ": called after MPI_Finalize");
  agree_or_throw(mesh, std::string(collective_name(call.kind)) + " '" + name + "'", local_error(call, mesh.size()),
                 agreement_fields(call), "shape " + shape_string(call));
}

}  // namespace mlacp::detail
