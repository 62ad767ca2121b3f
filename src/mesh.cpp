// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/diagnostics.hpp>
#include <mlacp/error.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/mpi/communicator.hpp>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mlacp {

namespace {
bool checked_by_default() {
  const char* value = std::getenv("MLACP_CHECKED");
  return value == nullptr || std::string(value) != "0";
}
bool check_finite_by_default() {
  const char* value = std::getenv("MLACP_CHECK_FINITE");
  return value != nullptr && std::string(value) != "0";
}

// The settings that decide which collectives run: every rank must hold the same value of each. Codes travel as
// integers; `invalid_code` marks an environment value that could not be parsed.
constexpr std::int64_t invalid_code = -1;
const char* const reduce_scatter_setting =
    "the reduce-scatter algorithm (MLACP_REDUCE_SCATTER or set_reduce_scatter_algorithm)";
const char* const checked_setting = "checked mode (MLACP_CHECKED or set_checked)";

std::string reduce_scatter_label(std::int64_t code) {
  return code == static_cast<std::int64_t>(ReduceScatterAlgorithm::mpi) ? "mpi" : "pairwise";
}
std::string checked_label(std::int64_t code) { return code != 0 ? "on" : "off"; }

// The algorithm MLACP_REDUCE_SCATTER asks for, or invalid_code with `error` set.
std::int64_t reduce_scatter_from_environment(std::string& error) {
  const char* value = std::getenv("MLACP_REDUCE_SCATTER");
  if (value == nullptr || std::string(value) == "pairwise")
    return static_cast<std::int64_t>(ReduceScatterAlgorithm::pairwise);
  if (std::string(value) == "mpi") return static_cast<std::int64_t>(ReduceScatterAlgorithm::mpi);
  error = std::string("mlacp::Mesh: MLACP_REDUCE_SCATTER='") + value + "'; expected 'pairwise' or 'mpi'";
  return invalid_code;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

// Every rank's `mine` (the same number of settings on every rank), in rank order: one small allgather, watched.
std::vector<std::int64_t> gather_settings(MPI_Comm comm, int size, const std::vector<std::int64_t>& mine,
                                          const std::string& where) {
  if (size == 1) return mine;
  CollectiveInfo info;
  info.name = where + " (settings agreement)";
  info.operation = "MPI_Iallgather of the mesh's settings";
  info.bytes = static_cast<std::int64_t>(mine.size() * sizeof(std::int64_t));
  return mpi::allgather(comm, mine, info, where + ": MPI_Iallgather of the mesh's settings");
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

Mesh::Mesh(MPI_Comm comm, Ownership ownership)
    : checked_(checked_by_default()), check_finite_(check_finite_by_default()) {
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
    agree_on_environment();
    failure_ = std::make_unique<mpi::FailureChannel>(comm_);  // collective: after the agreement, on every rank
  } catch (...) {
    release();
    throw;
  }
}

void Mesh::agree_on_environment() {
  const std::string where = "mlacp::Mesh";
  std::string parse_error;
  const std::int64_t algorithm = reduce_scatter_from_environment(parse_error);
  const auto all = gather_settings(comm_, size_, {algorithm, checked_ ? 1 : 0}, where);
  const auto algorithms = ranks_by_value(all, 2, 0);
  if (const auto invalid = algorithms.find(invalid_code); invalid != algorithms.end()) {
    if (!parse_error.empty()) throw InvalidArgument(parse_error);
    throw InvalidArgument(where + ": MLACP_REDUCE_SCATTER is neither 'pairwise' nor 'mpi' on rank(s) " +
                          rank_list(invalid->second) + " [the mesh was not created]");
  }
  const std::string consequence = "the mesh was not created";
  std::string error = disagreement(where, all, 2, 0, reduce_scatter_setting, reduce_scatter_label, consequence);
  if (error.empty()) error = disagreement(where, all, 2, 1, checked_setting, checked_label, consequence);
  if (!error.empty()) throw InvalidArgument(error);
  reduce_scatter_ = static_cast<ReduceScatterAlgorithm>(algorithm);
}

void Mesh::set_checked(bool checked) {
  const std::string where = "mlacp::Mesh::set_checked";
  const auto all = gather_settings(comm_, size_, {checked ? 1 : 0}, where);
  const std::string error =
      disagreement(where, all, 1, 0, checked_setting, checked_label, "the setting was not changed on any rank");
  if (!error.empty()) throw InvalidArgument(error);
  checked_ = checked;
}

void Mesh::set_reduce_scatter_algorithm(ReduceScatterAlgorithm algorithm) {
  const std::string where = "mlacp::Mesh::set_reduce_scatter_algorithm";
  const auto all = gather_settings(comm_, size_, {static_cast<std::int64_t>(algorithm)}, where);
  const std::string error = disagreement(where, all, 1, 0, reduce_scatter_setting, reduce_scatter_label,
                                         "the setting was not changed on any rank");
  if (!error.empty()) throw InvalidArgument(error);
  reduce_scatter_ = algorithm;
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
      reduce_scatter_(other.reduce_scatter_),
      nccl_(std::move(other.nccl_)),
      failure_(std::move(other.failure_)) {}

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
    reduce_scatter_ = other.reduce_scatter_;
    nccl_ = std::move(other.nccl_);
    failure_ = std::move(other.failure_);
  }
  return *this;
}

void Mesh::release() noexcept {
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
}

bool Mesh::broken() const noexcept { return comm_ != MPI_COMM_NULL && mpi::channels_failed(comm_); }

void Mesh::throw_if_broken(const std::string& where) const {
  if (comm_ != MPI_COMM_NULL) mpi::throw_if_failed(comm_, where);
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
