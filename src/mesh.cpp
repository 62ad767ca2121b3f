// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/diagnostics.hpp>
#include <mlacp/error.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/mpi/communicator.hpp>
#include <mlacp/settings.hpp>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mlacp {

namespace {

// The settings that decide which collectives run: every rank must hold the same value of each. Codes travel as
// integers.
const char* const reduce_scatter_setting =
    "the reduce-scatter algorithm (MLACP_REDUCE_SCATTER or set_reduce_scatter_algorithm)";
const char* const checked_setting = "checked mode (MLACP_CHECKED or set_checked)";
const char* const check_finite_setting = "the finiteness check (MLACP_CHECK_FINITE or set_check_finite)";

std::string reduce_scatter_label(std::int64_t code) {
  return code == static_cast<std::int64_t>(ReduceScatterAlgorithm::mpi) ? "mpi" : "pairwise";
}
std::string checked_label(std::int64_t code) { return code != 0 ? "on" : "off"; }

// The ring as it travels in the agreement: C itself, or ring_node_code for Ring::node().
constexpr std::int64_t ring_node_code = std::numeric_limits<std::int64_t>::min() / 2;
const char* const ring_setting = "the ring of the two-level mesh (Mesh(comm, ring))";
std::string ring_label(std::int64_t code) {
  return code == ring_node_code ? "ring = node" : "ring = " + std::to_string(code);
}
std::int64_t ring_code(const Ring& ring) { return ring.per_node ? ring_node_code : ring.size; }

// The algorithm MLACP_REDUCE_SCATTER asks for (pairwise where unset, or where it does not parse: Settings::error()
// reports that).
std::int64_t reduce_scatter_from(const Settings& settings) {
  return static_cast<std::int64_t>(settings.reduce_scatter() == "mpi" ? ReduceScatterAlgorithm::mpi
                                                                      : ReduceScatterAlgorithm::pairwise);
}

// setting_table's index of the first setting that does not parse, plus one; 0 when all parse.
std::int64_t malformed_code(const Settings& settings) { return settings.first_malformed() + 1; }

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

// Every rank's `mine` (the same number of settings on every rank), in rank order: one small allgather, watched.
std::vector<std::int64_t> gather_settings(MPI_Comm comm, const std::vector<std::int64_t>& mine,
                                          const std::string& where) {
  return mpi::gather_integers(comm, mine, where + " (settings agreement)", where);
}

// Which ranks hold which value of setting `index` (of `count` per rank).
std::map<std::int64_t, std::vector<int>> ranks_by_value(const std::vector<std::int64_t>& all, std::size_t count,
                                                        std::size_t index) {
  std::map<std::int64_t, std::vector<int>> ranks;
  for (std::size_t r = 0; r * count < all.size(); ++r) ranks[all[r * count + index]].push_back(static_cast<int>(r));
  return ranks;
}

// Empty when every rank holds the same value; else a message naming the setting and the ranks of each value.
std::string disagreement(const std::string& where, const std::vector<std::int64_t>& all, std::size_t count,
                         std::size_t index, const std::string& setting, std::string (*label)(std::int64_t),
                         const std::string& consequence) {
  const auto ranks = ranks_by_value(all, count, index);
  if (ranks.size() <= 1) return {};
  std::ostringstream out;
  out << where << ": the ranks of the mesh disagree on " << setting << ":";
  bool first = true;
  for (const auto& [value, holders] : ranks) {
    out << (first ? " " : "; ") << label(value) << " on rank(s) " << rank_list(holders);
    first = false;
  }
  out << "; every rank must use the same value, or the ranks would run different collectives [" << consequence << "]";
  return out.str();
}

}  // namespace

Mesh::Mesh(MPI_Comm comm, Ownership ownership) : Mesh(comm, ownership, 1) {}

Mesh::Mesh(MPI_Comm comm, Ring ring, Ownership ownership) : Mesh(comm, ownership, ring_code(ring)) {
  // The delegated constructor agreed on the ring and checked a ring size; the mesh is complete, so a throw from here
  // on frees it (and any sub-mesh) in the destructor.
  build_levels(ring);
}

Mesh::Mesh(MPI_Comm comm, Ownership ownership, std::int64_t ring) {
  const bool finalized = mpi::finalized();
  if (!mpi::initialized() || finalized)
    throw UsageError(std::string("mlacp::Mesh: MPI is ") + (finalized ? "already finalized" : "not initialized") +
                     "; create meshes between MPI_Init and MPI_Finalize");
  if (comm == MPI_COMM_NULL) throw InvalidArgument("mlacp::Mesh: the communicator is MPI_COMM_NULL");
  if (mpi::is_intercommunicator(comm))
    throw InvalidArgument("mlacp::Mesh: an inter-communicator was given; expected an intra-communicator");
  if (ownership == Ownership::duplicate) {
    comm_ = mpi::duplicate(comm);
    owned_ = true;
    diagnostics::detail::count_communicator(+1);
  } else {
    comm_ = comm;
  }
  rank_ = mpi::rank(comm_);
  size_ = mpi::size(comm_);
  events::detail::set_trace_rank(mpi::rank(MPI_COMM_WORLD));  // the process's name in an MLACP_TRACE file
  try {
    agree_on_environment(ring);
    failure_ = std::make_unique<mpi::FailureChannel>(comm_);  // collective: after the agreement, on every rank
    // Collective (all_on_one_node first, on every rank).
    shared_memory_ = mpi::all_on_one_node(comm_) && mpi::shared_memory_transport_enabled();
  } catch (...) {
    release();
    throw;
  }
}

void Mesh::agree_on_environment(std::int64_t ring) {
  const std::string where = "mlacp::Mesh";
  const Settings settings = Settings::from_environment();  // the mesh's one read of the environment
  checked_ = settings.checked();
  check_finite_ = settings.check_finite();
  const std::int64_t malformed = malformed_code(settings);
  // The ring travels with the settings (one allgather, as before): a rank asking for another ring than its peers
  // would split the communicator differently, or not at all, and hang them.
  constexpr std::size_t count = 5;
  const auto all = gather_settings(
      comm_, {malformed, reduce_scatter_from(settings), checked_ ? 1 : 0, check_finite_ ? 1 : 0, ring}, where);
  // A value that does not parse, on any rank: every rank refuses, the ranks that hold it with its text.
  for (const auto& [code, holders] : ranks_by_value(all, count, 0)) {
    if (code == 0) continue;
    if (malformed != 0) throw InvalidArgument(where + ": " + settings.error() + " [the mesh was not created]");
    const auto& info = setting_table[static_cast<std::size_t>(code - 1)];
    throw InvalidArgument(where + ": " + info.variable + " does not parse on rank(s) " + rank_list(holders) +
                          " (expected " + info.expected + ") [the mesh was not created]");
  }
  const std::string consequence = "the mesh was not created";
  std::string error = disagreement(where, all, count, 1, reduce_scatter_setting, reduce_scatter_label, consequence);
  if (error.empty()) error = disagreement(where, all, count, 2, checked_setting, checked_label, consequence);
  if (error.empty()) error = disagreement(where, all, count, 3, check_finite_setting, checked_label, consequence);
  if (error.empty()) error = disagreement(where, all, count, 4, ring_setting, ring_label, consequence);
  // Agreed, so every rank finds the same verdict on the ring size (the node layout is checked in build_levels).
  if (error.empty() && ring != ring_node_code) error = detail::group_by_ring(size_, static_cast<int>(ring)).error;
  if (!error.empty()) throw InvalidArgument(error);
  reduce_scatter_ = static_cast<ReduceScatterAlgorithm>(reduce_scatter_from(settings));
}

void Mesh::build_levels(const Ring& ring) {
  const std::string where = "mlacp::Mesh(" + ring.describe() + ")";
  detail::MeshGrouping grouping;
  if (ring.per_node) {
    // Every rank learns every rank's node (the lowest rank on it), so that all find the same groups, or the same error.
    const std::int64_t leader = mpi::node_leader(comm_);
    const auto leaders = gather_settings(comm_, {leader}, where);
    grouping = detail::group_by_node(std::vector<int>(leaders.begin(), leaders.end()));
    if (!grouping.error.empty()) throw InvalidArgument(grouping.error + " [the mesh was not created]");
  } else {
    grouping = detail::group_by_ring(size_, ring.size);  // checked already
  }
  if (grouping.ring_size == 1) return;  // flat: exactly today's mesh
  const auto me = static_cast<std::size_t>(rank_);
  const int group = grouping.group_of[me];
  const int position = grouping.position_of[me];
  // Both splits on every rank, in this order: the Ulysses group (same group, by position), then the ring (same
  // position, by group).
  auto adopt = [this](MPI_Comm part) {
    std::unique_ptr<Mesh> level;
    try {
      level = std::make_unique<Mesh>(part, Ownership::borrow);
    } catch (...) {
      mpi::free_communicator(part);
      throw;
    }
    level->owned_ = true;  // the split communicator is the sub-mesh's own
    diagnostics::detail::count_communicator(+1);
    level->host_staging_ = host_staging_;
    level->check_finite_ = check_finite_;
    return level;
  };
  ulysses_ = adopt(mpi::split(comm_, group, position));
  ring_ = adopt(mpi::split(comm_, position, group));
  ring_size_ = grouping.ring_size;
  // A failure reported on a sub-mesh names the failed rank by its rank in this mesh: the members of a Ulysses group in
  // position order, those of a ring in group order (the splits' keys).
  std::vector<int> group_members(static_cast<std::size_t>(grouping.ulysses_size)),
      ring_members(static_cast<std::size_t>(grouping.ring_size));
  for (int r = 0; r < size_; ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (grouping.group_of[i] == group) group_members[static_cast<std::size_t>(grouping.position_of[i])] = r;
    if (grouping.position_of[i] == position) ring_members[static_cast<std::size_t>(grouping.group_of[i])] = r;
  }
  if (ulysses_->failure_) ulysses_->failure_->set_rank_labels(std::move(group_members));
  if (ring_->failure_) ring_->failure_->set_rank_labels(std::move(ring_members));
}

const Mesh& Mesh::ring_group() const {
  if (!ring_)
    throw UsageError(
        "mlacp::Mesh::ring_group: this mesh is flat (ring = 1) and has no ring sub-mesh; check "
        "ring_size() > 1 first");
  return *ring_;
}

std::string Ring::describe() const { return per_node ? "ring = node" : "ring = " + std::to_string(size); }

namespace detail {

MeshGrouping group_by_ring(int ranks, int ring) {
  MeshGrouping out;
  if (ring <= 0) {
    out.error = "mlacp::Mesh: ring = " + std::to_string(ring) +
                "; expected a positive ring size C (the number of Ulysses groups) that divides the " +
                std::to_string(ranks) + " ranks, or Ring::node()";
    return out;
  }
  if (ranks % ring != 0) {
    std::vector<int> divisors;
    for (int d = 1; d <= ranks; ++d)
      if (ranks % d == 0) divisors.push_back(d);
    out.error = "mlacp::Mesh: ring = " + std::to_string(ring) + " does not divide the " + std::to_string(ranks) +
                " ranks of the communicator; expected a divisor of " + std::to_string(ranks) + " (" +
                rank_list(divisors) + "), so that each of the C Ulysses groups holds P / C ranks";
    return out;
  }
  out.ring_size = ring;
  out.ulysses_size = ranks / ring;
  for (int r = 0; r < ranks; ++r) {
    out.group_of.push_back(r / out.ulysses_size);
    out.position_of.push_back(r % out.ulysses_size);
  }
  return out;
}

MeshGrouping group_by_node(const std::vector<int>& node_of_rank) {
  MeshGrouping out;
  std::vector<int> nodes;        // in order of their first rank
  std::vector<int> sizes;        // ranks on each
  std::vector<int> first_ranks;  // first rank of each
  std::vector<int> position_of;
  std::vector<int> group_of;
  for (std::size_t r = 0; r < node_of_rank.size(); ++r) {
    std::size_t g = 0;
    while (g < nodes.size() && nodes[g] != node_of_rank[r]) ++g;
    if (g == nodes.size()) {
      nodes.push_back(node_of_rank[r]);
      sizes.push_back(0);
      first_ranks.push_back(static_cast<int>(r));
    }
    group_of.push_back(static_cast<int>(g));
    position_of.push_back(sizes[g]++);
  }
  for (std::size_t g = 1; g < sizes.size(); ++g) {
    if (sizes[g] == sizes[0]) continue;
    std::ostringstream text;
    text << "mlacp::Mesh: ring = node: the nodes hold different numbers of ranks (";
    for (std::size_t i = 0; i < sizes.size(); ++i)
      text << (i ? ", " : "") << "the node of rank " << first_ranks[i] << ": " << sizes[i]
           << (sizes[i] == 1 ? " rank" : " ranks");
    text << "); expected the same number of ranks on every node, as every Ulysses group (one per node) must hold P / "
            "C ranks";
    out.error = text.str();
    return out;
  }
  out.ring_size = static_cast<int>(nodes.size());
  out.ulysses_size = sizes.empty() ? 0 : sizes[0];
  out.group_of = std::move(group_of);
  out.position_of = std::move(position_of);
  return out;
}

}  // namespace detail

void Mesh::set_checked(bool checked) {
  const std::string where = "mlacp::Mesh::set_checked";
  const auto all = gather_settings(comm_, {checked ? 1 : 0}, where);
  const std::string error =
      disagreement(where, all, 1, 0, checked_setting, checked_label, "the setting was not changed on any rank");
  if (!error.empty()) throw InvalidArgument(error);
  checked_ = checked;
  for (Mesh* level : {ulysses_.get(), ring_.get()})  // agreed over the whole mesh, so over each sub-mesh too
    if (level != nullptr) level->checked_ = checked;
}

void Mesh::set_reduce_scatter_algorithm(ReduceScatterAlgorithm algorithm) {
  const std::string where = "mlacp::Mesh::set_reduce_scatter_algorithm";
  const auto all = gather_settings(comm_, {static_cast<std::int64_t>(algorithm)}, where);
  const std::string error = disagreement(where, all, 1, 0, reduce_scatter_setting, reduce_scatter_label,
                                         "the setting was not changed on any rank");
  if (!error.empty()) throw InvalidArgument(error);
  reduce_scatter_ = algorithm;
  for (Mesh* level : {ulysses_.get(), ring_.get()})
    if (level != nullptr) level->reduce_scatter_ = algorithm;
}

Mesh::~Mesh() { release(); }

Mesh::Mesh(Mesh&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(other.rank_),
      size_(other.size_),
      owned_(std::exchange(other.owned_, false)),
      checked_(other.checked_),
      host_staging_(other.host_staging_),
      check_finite_(other.check_finite_),
      shared_memory_(other.shared_memory_),
      reduce_scatter_(other.reduce_scatter_),
      nccl_(std::move(other.nccl_)),
      failure_(std::move(other.failure_)),
      ring_size_(std::exchange(other.ring_size_, 1)),
      ulysses_(std::move(other.ulysses_)),
      ring_(std::move(other.ring_)) {}

Mesh& Mesh::operator=(Mesh&& other) noexcept {
  if (this != &other) {
    release();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = other.rank_;
    size_ = other.size_;
    owned_ = std::exchange(other.owned_, false);
    checked_ = other.checked_;
    host_staging_ = other.host_staging_;
    check_finite_ = other.check_finite_;
    shared_memory_ = other.shared_memory_;
    reduce_scatter_ = other.reduce_scatter_;
    nccl_ = std::move(other.nccl_);
    failure_ = std::move(other.failure_);
    ring_size_ = std::exchange(other.ring_size_, 1);
    ulysses_ = std::move(other.ulysses_);
    ring_ = std::move(other.ring_);
  }
  return *this;
}

void Mesh::release() noexcept {
  ring_.reset();  // the sub-meshes free their own communicators
  ulysses_.reset();
  ring_size_ = 1;
  nccl_.reset();
  failure_.reset();  // before the communicator it is registered under
  if (owned_ && comm_ != MPI_COMM_NULL) {
    mpi::free_communicator(comm_);
    diagnostics::detail::count_communicator(-1);
  }
  comm_ = MPI_COMM_NULL;
  owned_ = false;
}

void Mesh::report_failure(const std::string& what) const noexcept {
  if (failure_) failure_->report(what);
  // A two-level mesh: the peers of this rank's Ulysses group and ring may be waiting in a collective of a sub-mesh,
  // whose own failure channel is the one they watch; each learns it there (and, raising, reports on in turn).
  for (const Mesh* level : {ulysses_.get(), ring_.get()})
    if (level != nullptr) level->report_failure(what);
}

bool Mesh::broken() const noexcept {
  if (comm_ == MPI_COMM_NULL) return false;
  if (mpi::channels_failed(comm_)) return true;
  for (const Mesh* level : {ulysses_.get(), ring_.get()})
    if (level != nullptr && level->broken()) return true;
  return false;
}

void Mesh::throw_if_broken(const std::string& where) const {
  if (comm_ == MPI_COMM_NULL) return;
  mpi::throw_if_failed(comm_, where);
  for (const Mesh* level : {ulysses_.get(), ring_.get()})
    if (level != nullptr) level->throw_if_broken(where);
}

namespace detail {
namespace {
struct Entry {
  std::thread::id owner;
  int depth = 0;
};
struct EntryRegistry {
  std::mutex mutex;
  std::map<MPI_Comm, Entry> entries;
};
EntryRegistry& entry_registry() {
  static auto* registry = new EntryRegistry;  // never destroyed: guards may run during static destruction
  return *registry;
}
}  // namespace

EntryGuard::EntryGuard(const Mesh& mesh, const std::string& where) : comm_(mesh.comm()) {
  auto& registry = entry_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  auto& entry = registry.entries[comm_];
  const auto me = std::this_thread::get_id();
  if (entry.depth > 0 && entry.owner != me)
    throw UsageError(where + ": another thread is inside mlacp on this communicator (rank " +
                     std::to_string(mesh.rank()) + " of " + std::to_string(mesh.size()) +
                     "); a mesh, and every mesh on the same communicator, is used by one host thread at a time (its "
                     "buffers and the order of its collectives are not shared between threads) [nothing was run]");
  entry.owner = me;
  ++entry.depth;
}

EntryGuard::~EntryGuard() { release(); }

void EntryGuard::release() noexcept {
  if (!held_) return;
  held_ = false;
  auto& registry = entry_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  const auto found = registry.entries.find(comm_);
  if (found != registry.entries.end() && --found->second.depth <= 0) registry.entries.erase(found);
}
}  // namespace detail

}  // namespace mlacp
