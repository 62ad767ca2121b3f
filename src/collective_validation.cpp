// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <Kokkos_Core.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/error.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/mpi/communicator.hpp>

#include <algorithm>
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

const char* value_type_name(int value_size) noexcept {
  switch (value_size) {
    case 2:
      return "bf16";
    case 4:
      return "float";
    case 8:
      return "double";
  }
  return "an unknown value type";
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

std::string counts_string(const std::vector<std::int64_t>& counts) {
  std::ostringstream out;
  out << '{';
  for (std::size_t r = 0; r < counts.size(); ++r) out << (r ? ", " : "") << counts[r];
  out << '}';
  return out.str();
}

std::int64_t sum(const std::vector<std::int64_t>& counts) {
  std::int64_t total = 0;
  for (const auto c : counts) total += c;
  return total;
}

// What a partition of an uneven call is called in messages: "the gather partition (gather_dim 1)".
std::string partition_name(const CollectiveCall& call, bool b) {
  if (call.kind != CollectiveKind::all_to_all) return "the partition (dim " + std::to_string(call.dim_a) + ")";
  return b ? "the scatter partition (scatter_dim " + std::to_string(call.dim_b) + ")"
           : "the gather partition (gather_dim " + std::to_string(call.dim_a) + ")";
}

// The shape of the result on rank `me`.
std::array<std::int64_t, max_collective_rank> result_extents(const CollectiveCall& call, int group_size, int me) {
  auto expected = call.extents;
  const auto a = static_cast<std::size_t>(call.dim_a);
  const auto r = static_cast<std::size_t>(me);
  switch (call.kind) {
    case CollectiveKind::all_to_all: {
      const auto b = static_cast<std::size_t>(call.dim_b);
      expected[a] = call.uneven ? sum(call.counts_a) : expected[a] * group_size;
      expected[b] = call.uneven ? call.counts_b[r] : expected[b] / group_size;
      break;
    }
    case CollectiveKind::all_gather:
      expected[a] = call.uneven ? sum(call.counts_a) : expected[a] * group_size;
      break;
    case CollectiveKind::reduce_scatter:
      expected[a] = call.uneven ? call.counts_a[r] : expected[a] / group_size;
      break;
  }
  return expected;
}

// The values of one index of dimension `dim` of a tensor of these extents (the product of the others).
std::int64_t slice(const std::array<std::int64_t, max_collective_rank>& extents, int rank, int dim) {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d)
    if (d != dim) n *= extents[static_cast<std::size_t>(d)];
  return n;
}

// The checks of an uneven call's partitions against the mesh and the View; empty when they hold.
std::string check_partitions(const CollectiveCall& call, int group_size, int me) {
  const std::string who = collective_name(call.kind);
  const bool two = call.kind == CollectiveKind::all_to_all;
  for (int b = 0; b < (two ? 2 : 1); ++b) {
    const auto& counts = b ? call.counts_b : call.counts_a;
    if (static_cast<int>(counts.size()) != group_size)
      return who + ": " + partition_name(call, b) + " " + counts_string(counts) + " has " +
             std::to_string(counts.size()) +
             " parts; expected one part per rank of the mesh, P = " + std::to_string(group_size);
    if (sum(counts) > INT_MAX)
      return who + ": " + partition_name(call, b) + " " + counts_string(counts) + " has the total " +
             std::to_string(sum(counts)) + "; expected at most INT_MAX (" + std::to_string(INT_MAX) +
             ") for MPI's int counts";
  }
  const auto r = static_cast<std::size_t>(me);
  auto mismatch = [&](int dim, const char* what, bool b, const char* expected_what, std::int64_t expected) {
    std::ostringstream out;
    out << who << ": " << what << " " << dim << " has extent " << call.extents[static_cast<std::size_t>(dim)]
        << " on rank " << me << "; expected " << partition_name(call, b) << "'s " << expected_what << " = " << expected
        << " (partition " << counts_string(b ? call.counts_b : call.counts_a) << ", View shape " << shape_string(call)
        << ")";
    return out.str();
  };
  const auto extent_a = call.extents[static_cast<std::size_t>(call.dim_a)];
  switch (call.kind) {
    case CollectiveKind::all_to_all: {
      if (extent_a != call.counts_a[r])
        return mismatch(call.dim_a, "gather_dim", false, ("count(" + std::to_string(me) + ")").c_str(),
                        call.counts_a[r]);
      const auto extent_b = call.extents[static_cast<std::size_t>(call.dim_b)];
      if (extent_b != sum(call.counts_b)) return mismatch(call.dim_b, "scatter_dim", true, "total", sum(call.counts_b));
      break;
    }
    case CollectiveKind::all_gather:
      if (extent_a != call.counts_a[r])
        return mismatch(call.dim_a, "dim", false, ("count(" + std::to_string(me) + ")").c_str(), call.counts_a[r]);
      break;
    case CollectiveKind::reduce_scatter:
      if (extent_a != sum(call.counts_a)) return mismatch(call.dim_a, "dim", false, "total", sum(call.counts_a));
      break;
  }
  return {};
}

// The largest number of values one message of the call carries (for MPI's int counts).
std::int64_t largest_message(const CollectiveCall& call, int group_size, int me) {
  std::int64_t elements = 1;
  for (int d = 0; d < call.rank; ++d) elements *= call.extents[static_cast<std::size_t>(d)];
  if (!call.uneven) return call.kind == CollectiveKind::all_gather ? elements : elements / group_size;
  std::int64_t largest = 0;
  auto blocks = [&](const std::vector<std::int64_t>& counts, std::int64_t per_index) {
    for (const auto c : counts) largest = std::max(largest, c * per_index);
  };
  switch (call.kind) {
    case CollectiveKind::all_to_all:
      blocks(call.counts_b, slice(call.extents, call.rank, call.dim_b));
      blocks(call.counts_a, slice(result_extents(call, group_size, me), call.rank, call.dim_a));
      break;
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
      blocks(call.counts_a, slice(call.extents, call.rank, call.dim_a));
      break;
  }
  return largest;
}

}  // namespace

std::string collective_call_error(const CollectiveCall& call, int group_size, int me) {
  // (MPI_Finalize is checked by validate_collective before anything, as the agreement itself needs MPI.)
  if (!Kokkos::is_initialized())
    return std::string(collective_name(call.kind)) + ": called while Kokkos is not initialized (or already finalized)";
  if (!call.allocated)
    return std::string(collective_name(call.kind)) + ": the View of shape " + shape_string(call) +
           " is not allocated (data() is null)";
  if (call.kind == CollectiveKind::reduce_scatter && call.sums_with_mpi && call.value_size == 2)
    return std::string(collective_name(call.kind)) + ": the View of shape " + shape_string(call) +
           " holds bf16, which the mpi reduce-scatter algorithm (MLACP_REDUCE_SCATTER=mpi or "
           "ReduceScatterAlgorithm::mpi) cannot sum (MPI has no bf16 sum); expected pairwise (the default), which sums "
           "bf16 in float, for bf16 reduce-scatters";
  std::string error;
  switch (call.kind) {
    case CollectiveKind::all_to_all:
      if (!(error = check_dimension(call, "gather_dim", call.dim_a)).empty()) return error;
      if (!(error = check_dimension(call, "scatter_dim", call.dim_b)).empty()) return error;
      if (call.dim_a == call.dim_b)
        return std::string(collective_name(call.kind)) + ": gather_dim and scatter_dim are both " +
               std::to_string(call.dim_a) + "; expected two different dimensions";
      if (!call.uneven && !(error = check_divisible(call, "scattered dimension", call.dim_b, group_size)).empty())
        return error;
      break;
    case CollectiveKind::all_gather:
      if (!(error = check_dimension(call, "dim", call.dim_a)).empty()) return error;
      break;
    case CollectiveKind::reduce_scatter:
      if (!(error = check_dimension(call, "dim", call.dim_a)).empty()) return error;
      if (!call.uneven && !(error = check_divisible(call, "scattered dimension", call.dim_a, group_size)).empty())
        return error;
      break;
  }
  if (call.uneven && !(error = check_partitions(call, group_size, me)).empty()) return error;
  if (call.has_into) {
    const auto expected = result_extents(call, group_size, me);
    if (call.into_extents != expected)
      return std::string(collective_name(call.kind)) + ": the destination View has shape " +
             extents_string(call.into_extents, call.rank) + "; expected the result's shape " +
             extents_string(expected, call.rank) + " (input " + shape_string(call) +
             ", P = " + std::to_string(group_size) + ")";
    if (call.into_aliases_input)
      return std::string(collective_name(call.kind)) +
             ": the destination View is the input's own memory; expected a separate View";
  }
  const std::int64_t per_message = largest_message(call, group_size, me);
  if (per_message > INT_MAX)
    return std::string(collective_name(call.kind)) + ": " + std::to_string(per_message) +
           " elements per rank and message exceed MPI's int count limit (" + std::to_string(INT_MAX) +
           "); split the View";
  // Uneven calls: MPI's counts and displacements travel in units (mpi::in_units: the gcd of the blocks' sizes and
  // offsets, a multiple of one index of the partitioned dimension of the tensor the blocks are cut from, the input on
  // the send side and the result on the receive side). That unit is at most the smallest non-empty block, hence at most
  // per_message; a displacement in units is at most the partition's offset, hence at most its total (both checked
  // above). Nothing more can exceed INT_MAX, so nothing more is checked (the input's extents are not the unit of the
  // gathered side: a [1, B, S, h, d] View gathered on dim 0 receives blocks of B * S/P * h * d values, not B*S*h*d).
  return {};
}

namespace {

// The fields every rank must agree on, in order, with their names for the message. The same number on every rank
// of a mesh of `group_size` ranks, whatever each passed (the agreement is one allreduce of them).
AgreementFields agreement_fields(const CollectiveCall& call, int group_size) {
  AgreementFields fields;
  const bool two = call.kind == CollectiveKind::all_to_all;
  fields.emplace_back("the operation", static_cast<std::int64_t>(call.kind));
  fields.emplace_back("the split (0: even, 1: uneven, with Partitions)", call.uneven ? 1 : 0);
  fields.emplace_back("the View rank", call.rank);
  fields.emplace_back(two ? "gather_dim" : "dim", call.dim_a);
  fields.emplace_back("scatter_dim", call.dim_b);
  for (int d = 0; d < max_collective_rank; ++d) {
    // An uneven call's gathered dimension holds this rank's count: its partition is agreed on instead.
    const bool own_count = call.uneven && d == call.dim_a && call.kind != CollectiveKind::reduce_scatter;
    fields.emplace_back("extent(" + std::to_string(d) + ")", own_count ? 0 : call.extents[static_cast<std::size_t>(d)]);
  }
  fields.emplace_back("the value size in bytes (the value type: 4 float, 8 double, 2 bf16)", call.value_size);
  for (int b = 0; b < 2; ++b) {
    const auto& counts = b ? call.counts_b : call.counts_a;
    const std::string which = b == 0 || two ? partition_name(call, b) : "the second partition (none)";
    fields.emplace_back("the number of parts of " + which, static_cast<std::int64_t>(counts.size()));
    for (int r = 0; r < group_size; ++r)
      fields.emplace_back("count(" + std::to_string(r) + ") of " + which,
                          static_cast<std::size_t>(r) < counts.size() ? counts[static_cast<std::size_t>(r)] : -1);
  }
  return fields;
}

// An uneven call's partitions, for messages (empty for an even call): ", the gather partition (gather_dim 1) {3, 2}".
std::string partitions_string(const CollectiveCall& call) {
  if (!call.uneven) return {};
  std::string text = ", " + partition_name(call, false) + " " + counts_string(call.counts_a);
  if (call.kind == CollectiveKind::all_to_all)
    text += ", " + partition_name(call, true) + " " + counts_string(call.counts_b);
  return text;
}

// What this rank passed, for the agreement's message: the shape, and the partitions of an uneven call.
std::string call_context(const CollectiveCall& call) {
  const std::string passed = "shape " + shape_string(call) + " of " + value_type_name(call.value_size);
  if (!call.uneven) return passed;
  return passed + partitions_string(call) + "; every rank must pass the same partitions";
}

}  // namespace

namespace {

[[noreturn]] void raise(AgreedErrorKind kind, const std::string& text) {
  if (kind == AgreedErrorKind::usage) throw UsageError(text);
  if (kind == AgreedErrorKind::communication) throw CommunicationError(text);
  if (kind == AgreedErrorKind::out_of_memory) throw OutOfMemory(text, "", -1, -1);
  throw InvalidArgument(text);
}

// FNV-1a, continued over `text`'s bytes and an int64's.
std::uint64_t fnv1a(std::uint64_t h, const std::string& text) {
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}
std::uint64_t fnv1a(std::uint64_t h, std::int64_t value) {
  for (int byte = 0; byte < 8; ++byte)
    h = (h ^ ((static_cast<std::uint64_t>(value) >> (8 * byte)) & 0xffu)) * 1099511628211ull;
  return h;
}
constexpr std::uint64_t fnv1a_basis = 14695981039346656037ull;

// The agreement's message has the same length on every rank, whatever fields a rank passes (a bf16 layer and a core's
// settings add some; ranks started differently may pass different lists): the lowest failing rank, the number of
// fields, a hash of their names, then kFieldSlots slots of (value, -value). Fields past the last slot are folded, names
// and values, into that slot as a hash. So a difference in the list itself is reported like any other difference, and
// never becomes a mismatched collective.
constexpr std::size_t kFieldSlots = 40;
constexpr std::size_t kHeader = 5;

// The agreement itself (see agree_or_throw), run whatever the mesh's checked mode.
void agree(const Mesh& mesh, const std::string& where, const std::string& local_error, const AgreementFields& given,
           const std::string& context, AgreedErrorKind kind) {
  if (mesh.size() == 1) {
    if (!local_error.empty()) raise(kind, local_error);
    return;
  }
  AgreementFields fields(given.begin(),
                         given.begin() + static_cast<std::ptrdiff_t>(std::min(given.size(), kFieldSlots)));
  if (given.size() > kFieldSlots) {
    std::uint64_t h = fnv1a_basis;
    for (std::size_t i = kFieldSlots - 1; i < given.size(); ++i) h = fnv1a(fnv1a(h, given[i].first), given[i].second);
    fields.back() = {"the settings from " + given[kFieldSlots - 1].first + " on (FNV-1a hash of " +
                         std::to_string(given.size() - kFieldSlots + 1) + " names and values)",
                     static_cast<std::int64_t>(h)};
  }
  std::uint64_t names = fnv1a_basis;
  for (const auto& field : given) names = fnv1a(names, field.first);
  // One allreduce (MAX) carries: the lowest failing rank (negated), the field count and the names' hash, then every
  // field, each with its negation, so that max and min arrive together.
  std::vector<std::int64_t> values(kHeader + 2 * kFieldSlots, 0);
  values[0] = -static_cast<std::int64_t>(local_error.empty() ? mesh.size() : mesh.rank());
  values[1] = static_cast<std::int64_t>(given.size());
  values[2] = -static_cast<std::int64_t>(given.size());
  values[3] = static_cast<std::int64_t>(names);
  values[4] = -static_cast<std::int64_t>(names);
  for (std::size_t i = 0; i < fields.size(); ++i) {
    values[kHeader + 2 * i] = fields[i].second;
    values[kHeader + 2 * i + 1] = -fields[i].second;
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
    raise(static_cast<AgreedErrorKind>(message[0]), text);
  }
  auto disagree = [&](const std::string& what, std::int64_t smallest, std::int64_t largest, std::int64_t mine) {
    std::ostringstream out;
    out << where << ": the ranks of the mesh disagree on " << what << " (from " << smallest << " to " << largest
        << " across ranks; this rank passed " << mine << ", " << context
        << "); every rank must pass the same shape, dimensions and type [nothing was sent]";
    throw InvalidArgument(out.str());
  };
  // The first field that differs names the cause (ranks of different types differ in their element size before the
  // fields only one of them adds); then a list of another length, then one of other names.
  for (std::size_t i = 0; i < kFieldSlots; ++i) {
    const std::int64_t largest = values[kHeader + 2 * i];
    const std::int64_t smallest = -values[kHeader + 2 * i + 1];
    if (largest == smallest) continue;
    const bool mine = i < fields.size();
    disagree(mine ? fields[i].first
                  : "setting " + std::to_string(i + 1) + " of the agreement, which this rank does not pass",
             smallest, largest, mine ? fields[i].second : 0);
  }
  if (values[1] != -values[2])
    disagree("the number of settings agreed", -values[2], values[1], static_cast<std::int64_t>(given.size()));
  if (values[3] != -values[4])
    disagree("the names of the settings agreed (FNV-1a hash)", -values[4], values[3], static_cast<std::int64_t>(names));
}

}  // namespace

void agree_or_throw(const Mesh& mesh, const std::string& where, const std::string& local_error,
                    const AgreementFields& fields, const std::string& context, bool usage) {
  agree_or_throw(mesh, where, local_error, fields, context,
                 usage ? AgreedErrorKind::usage : AgreedErrorKind::invalid_argument);
}

void agree_or_throw(const Mesh& mesh, const std::string& where, const std::string& local_error,
                    const AgreementFields& fields, const std::string& context, AgreedErrorKind kind) {
  if (!mesh.checked()) {
    if (!local_error.empty()) raise(kind, local_error);
    return;
  }
  agree(mesh, where, local_error, fields, context, kind);
}

std::vector<std::int64_t> gather_from_every_rank(const Mesh& mesh, const std::vector<std::int64_t>& mine,
                                                 const std::string& name, const std::string& where) {
  return mpi::gather_integers(mesh.comm(), mine, name, where);
}

void agree_on_success(const Mesh& mesh, const std::string& where, const std::string& local_error) {
  agree(mesh, where, local_error, {}, "", AgreedErrorKind::communication);
}

void agree_on_allocation(const Mesh& mesh, const std::string& where, const std::string& local_error) {
  agree(mesh, where, local_error, {}, "", AgreedErrorKind::out_of_memory);
}

CollectiveInfo describe_for_watchdog(const CollectiveCall& call, const std::string& name, std::int64_t bytes) {
  CollectiveInfo info;
  info.name = name;
  info.operation = std::string(collective_name(call.kind)) +
                   (call.kind == CollectiveKind::all_to_all ? "(gather_dim=" + std::to_string(call.dim_a) +
                                                                  ", scatter_dim=" + std::to_string(call.dim_b) + ")"
                                                            : "(dim=" + std::to_string(call.dim_a) + ")");
  info.shape = shape_string(call) + partitions_string(call);
  info.bytes = bytes;
  return info;
}

void validate_collective(const Mesh& mesh, const CollectiveCall& call, const std::string& name) {
  if (mpi::finalized()) throw UsageError(std::string(collective_name(call.kind)) + ": called after MPI_Finalize");
  mesh.throw_if_broken(std::string(collective_name(call.kind)) + " '" + name + "'");
  agree_or_throw(mesh, std::string(collective_name(call.kind)) + " '" + name + "'",
                 collective_call_error(call, mesh.size(), mesh.rank()), agreement_fields(call, mesh.size()),
                 call_context(call));
}

}  // namespace mlacp::detail
