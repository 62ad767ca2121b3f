// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/diagnostics.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mpi/communicator.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mlacp::mpi {

bool initialized() noexcept {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool finalized() noexcept {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

int tag_upper_bound() noexcept {
  int* value = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag);
  return flag != 0 && value != nullptr ? *value : 32767;
}

bool is_intercommunicator(MPI_Comm comm) {
  int flag = 0;
  MPI_Comm_test_inter(comm, &flag);
  return flag != 0;
}

MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  if (MPI_Comm_dup(comm, &copy) != MPI_SUCCESS) throw CommunicationError("mlacp::Mesh: MPI_Comm_dup failed");
  return copy;
}

void free_communicator(MPI_Comm& comm) noexcept {
  if (comm != MPI_COMM_NULL && !finalized()) MPI_Comm_free(&comm);
  comm = MPI_COMM_NULL;
}

int rank(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

int size(MPI_Comm comm) {
  int s = 0;
  MPI_Comm_size(comm, &s);
  return s;
}

MPI_Comm split(MPI_Comm comm, int color, int key) {
  MPI_Comm part = MPI_COMM_NULL;
  if (MPI_Comm_split(comm, color, key, &part) != MPI_SUCCESS)
    throw CommunicationError("mlacp::Mesh: MPI_Comm_split failed");
  return part;
}

int node_leader(MPI_Comm comm) {
  MPI_Comm shared = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank(comm), MPI_INFO_NULL, &shared) != MPI_SUCCESS)
    throw CommunicationError("mlacp::Mesh: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  // Rank 0 of the node's communicator is the node's lowest rank of `comm` (the key is the rank): translate it.
  MPI_Group shared_group = MPI_GROUP_NULL;
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Comm_group(shared, &shared_group);
  MPI_Comm_group(comm, &group);
  const int first = 0;
  int leader = MPI_UNDEFINED;
  MPI_Group_translate_ranks(shared_group, 1, &first, group, &leader);
  MPI_Group_free(&shared_group);
  MPI_Group_free(&group);
  free_communicator(shared);
  if (leader == MPI_UNDEFINED) throw CommunicationError("mlacp::Mesh: MPI_Group_translate_ranks of the node failed");
  return leader;
}

namespace {

// The value of the MPI_T control variable `name` when the library has one of type MPI_CHAR; nullopt otherwise.
std::optional<std::string> read_string_cvar(const char* name) {
  int count = 0;
  if (MPI_T_cvar_get_num(&count) != MPI_SUCCESS) return std::nullopt;
  for (int i = 0; i < count; ++i) {
    char found[256] = {};
    char description[16] = {};
    int name_length = sizeof(found), description_length = sizeof(description);
    int verbosity = 0, binding = 0, scope = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum enumtype = MPI_T_ENUM_NULL;
    if (MPI_T_cvar_get_info(i, found, &name_length, &verbosity, &type, &enumtype, description, &description_length,
                            &binding, &scope) != MPI_SUCCESS ||
        std::strcmp(found, name) != 0 || type != MPI_CHAR)
      continue;
    MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
    int elements = 0;
    if (MPI_T_cvar_handle_alloc(i, nullptr, &handle, &elements) != MPI_SUCCESS) return std::nullopt;
    std::vector<char> value(static_cast<std::size_t>(std::max(elements, 0)) + 1, '\0');
    const bool read = MPI_T_cvar_read(handle, value.data()) == MPI_SUCCESS;
    MPI_T_cvar_handle_free(&handle);
    if (!read) return std::nullopt;
    return std::string(value.data());
  }
  return std::nullopt;
}

// Whether an Open MPI component selection ("a,b" includes, "^a,b" excludes, "" = the default: all) keeps the
// transport `components` name (one component under several names across versions): an inclusion list names one of
// them, an exclusion list names none.
bool selects_any(const std::string& selection, const std::vector<std::string>& components) {
  const bool exclude = !selection.empty() && selection[0] == '^';
  std::vector<std::string> listed;
  std::string item;
  for (const char ch : selection.substr(exclude ? 1 : 0) + ",") {
    if (ch == ',') {
      if (!item.empty()) listed.push_back(item);
      item.clear();
    } else if (ch != ' ') {
      item += ch;
    }
  }
  if (listed.empty()) return true;  // the default selection
  const auto named = [&](const std::string& c) { return std::find(listed.begin(), listed.end(), c) != listed.end(); };
  const bool any_named = std::any_of(components.begin(), components.end(), named);
  return exclude ? !any_named : any_named;
}

}  // namespace

bool shared_memory_transport_enabled() {
  static const bool enabled = [] {
    int provided = 0;
    if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return true;
    const std::optional<std::string> btl = read_string_cvar("btl");
    const std::optional<std::string> pml = read_string_cvar("pml");
    MPI_T_finalize();
    if (!btl) return true;  // not Open MPI (or no such variable): assume the library uses shared memory on a node
    // Open MPI: the shared-memory BTL is "vader" (4.x) or "sm" (5.x); the UCX PML brings its own shared memory.
    const bool ucx = pml && !pml->empty() && (*pml)[0] != '^' && selects_any(*pml, {"ucx"});
    return ucx || selects_any(*btl, {"vader", "sm"});
  }();
  return enabled;
}

bool all_on_one_node(MPI_Comm comm) {
  MPI_Comm shared = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank(comm), MPI_INFO_NULL, &shared) != MPI_SUCCESS)
    throw CommunicationError("mlacp::Mesh: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  // A node's ranks are all of comm on one rank exactly when they are on every rank.
  const bool all = size(shared) == size(comm);
  free_communicator(shared);
  return all;
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<std::size_t>(length));
  if (const auto newline = version.find('\n'); newline != std::string::npos) version.resize(newline);
  return version;
}

namespace {

// The failure channels of each communicator (usually one; two meshes borrowing one communicator register two).
struct ChannelRegistry {
  std::mutex mutex;
  std::map<MPI_Comm, std::vector<FailureChannel*>> channels;
};
ChannelRegistry& channel_registry() {
  static auto* registry = new ChannelRegistry;  // never destroyed: meshes may outlive static destruction
  return *registry;
}

struct Parked {
  std::mutex mutex;
  std::vector<std::pair<MPI_Request, std::shared_ptr<void>>> requests;
};
Parked& parked() {
  static auto* p = new Parked;  // never destroyed: what it holds is never freed, by design
  return *p;
}

// The tag of failure messages on the channel's own duplicate.
constexpr int failure_tag = 19;

}  // namespace

FailureChannel::FailureChannel(MPI_Comm comm) : key_(comm) {
  size_ = size(comm);
  rank_ = rank(comm);
  if (size_ > 1) {
    comm_ = duplicate(comm);
    receives_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    inbox_.resize(static_cast<std::size_t>(size_));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      const auto i = static_cast<std::size_t>(peer);
      if (MPI_Irecv(inbox_[i].data(), message_bytes, MPI_CHAR, peer, failure_tag, comm_, &receives_[i]) !=
          MPI_SUCCESS) {
        for (auto& request : receives_)
          if (request != MPI_REQUEST_NULL) {
            MPI_Cancel(&request);
            MPI_Wait(&request, MPI_STATUS_IGNORE);
          }
        free_communicator(comm_);
        throw CommunicationError("mlacp::Mesh: MPI_Irecv of the failure channel failed");
      }
    }
  }
  auto& registry = channel_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.channels[key_].push_back(this);
}

FailureChannel::~FailureChannel() {
  {
    auto& registry = channel_registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto& list = registry.channels[key_];
    list.erase(std::remove(list.begin(), list.end(), this), list.end());
    if (list.empty()) registry.channels.erase(key_);
  }
  if (comm_ == MPI_COMM_NULL || finalized()) return;  // after MPI_Finalize there is nothing left to complete
  for (auto& request : receives_) {
    if (request == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&request);  // a receive that matched already completes normally instead
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
  free_communicator(comm_);
}

void FailureChannel::mark_broken(const std::string& text) {
  if (broken_.load()) return;
  failure_ = text;
  broken_.store(true);
}

void FailureChannel::report(const std::string& what) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_.load()) return;
    mark_broken("rank " + label(rank_) + " failed: " + what);
    if (comm_ == MPI_COMM_NULL || finalized()) return;
    // One buffer for every peer, never freed: the sends are freed (MPI_Request_free) instead of waited, as a peer may
    // never look again; a report happens at most once per mesh.
    auto* message = new std::array<char, message_bytes>{};
    diagnostics::detail::keep_until_exit(message);  // MPI may read it after the mesh is gone
    std::strncpy(message->data(), what.c_str(), message_bytes - 1);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(message->data(), message_bytes, MPI_CHAR, peer, failure_tag, comm_, &request) == MPI_SUCCESS)
        MPI_Request_free(&request);
    }
  } catch (...) {
    broken_.store(true);  // out of memory while reporting: at least this rank stops
  }
}

bool FailureChannel::poll() noexcept {
  if (broken_.load()) return true;
  if (comm_ == MPI_COMM_NULL) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_.load()) return true;
  int index = MPI_UNDEFINED;
  int done = 0;
  if (MPI_Testany(size_, receives_.data(), &index, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
  if (done == 0 || index == MPI_UNDEFINED) return false;
  auto& text = inbox_[static_cast<std::size_t>(index)];
  text[message_bytes - 1] = '\0';
  try {
    mark_broken("rank " + label(index) + " failed: " + std::string(text.data()));
  } catch (...) {
    broken_.store(true);
  }
  return true;
}

void FailureChannel::set_rank_labels(std::vector<int> labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  labels_ = std::move(labels);
}

// Called with mutex_ held (report, poll).
std::string FailureChannel::label(int rank) const {
  const auto i = static_cast<std::size_t>(rank);
  return std::to_string(i < labels_.size() ? labels_[i] : rank);
}

std::string FailureChannel::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

bool channels_failed(MPI_Comm comm, std::string* failure) noexcept {
  auto& registry = channel_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  const auto found = registry.channels.find(comm);
  if (found == registry.channels.end()) return false;
  for (auto* channel : found->second) {
    if (!channel->poll()) continue;
    if (failure != nullptr) {
      try {
        *failure = channel->failure();
      } catch (...) {
      }
    }
    return true;
  }
  return false;
}

std::string broken_mesh_message(const std::string& where, const std::string& failure) {
  return where + ": " + failure +
         "; the mesh is broken (collectives that were pending on it are abandoned; every later call on it raises "
         "this error, on every rank)";
}

void throw_if_failed(MPI_Comm comm, const std::string& where) {
  std::string failure;
  if (channels_failed(comm, &failure)) throw CommunicationError(broken_mesh_message(where, failure));
}

void park(MPI_Request request, std::shared_ptr<void> keep_alive) noexcept {
  auto& p = parked();
  try {
    std::lock_guard<std::mutex> lock(p.mutex);
    p.requests.emplace_back(request, std::move(keep_alive));
  } catch (...) {
    new std::shared_ptr<void>(std::move(keep_alive));  // out of memory: leak the buffers rather than free them
  }
}

std::size_t parked_requests() noexcept {
  auto& p = parked();
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.requests.size();
}

}  // namespace mlacp::mpi
