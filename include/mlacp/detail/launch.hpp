// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the three collectives share, above the handle: compile-time requirements on the View, the prologue (describe,
// validate, P == 1), the send and receive sides around the scattered and gathered dimensions, and the hand-off of one
// described launch to the transport of the execution space (Backend<ExecSpace>::Transport: mpi/ or nccl/).
#pragma once

#include <mlacp/allocation.hpp>
#include <mlacp/async_collective.hpp>
#include <mlacp/backend.hpp>
#include <mlacp/build_config.hpp>
#include <mlacp/collective_bytes.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/detail/block_layout.hpp>
#include <mlacp/detail/buffer_pool.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/detail/transport.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/transport.hpp>
#include <mlacp/partition.hpp>

#include <Kokkos_Core.hpp>
// The NCCL backend (cuda_runtime.h, nccl.h) only where a collective can run on it: builds with NCCL configured in
// (<mlacp/build_config.hpp>) and Kokkos' CUDA backend, where it is Backend<Kokkos::Cuda>'s transport. Every
// translation unit of such a build sees the same two macros, hence the same specialisation.
#if MLACP_HAVE_NCCL && defined(KOKKOS_ENABLE_CUDA)
#include <mlacp/nccl/transport.hpp>
#endif
#include <any>
#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mlacp {

/// The View type a collective returns for an input of type ViewType: same value type and rank, LayoutRight, same
/// memory space, managed.
template <class ViewType>
using collective_result_t =
    Kokkos::View<typename ViewType::non_const_data_type, Kokkos::LayoutRight, typename ViewType::memory_space>;

namespace detail {

/// The value types the collectives sum: float, double and bf16 (compat::bf16, moved as 2-byte elements; its sums,
/// the pairwise reduce-scatter's and NCCL's, are accumulated in float; MPI's own reduce-scatter cannot sum it).
template <class T>
inline constexpr bool is_summed_value_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16>;

/// The value types the collectives move: the summed ones, and bytes (std::uint8_t: a wire codec's encoded rows,
/// wire/fp8_e4m3_codec.hpp), which they move but never sum.
template <class T>
inline constexpr bool is_communicated_value_v = is_summed_value_v<T> || std::is_same_v<T, std::uint8_t>;

template <class ExecSpace, class ViewType>
constexpr void check_collective_types() {
  static_assert(Kokkos::is_view<ViewType>::value, "mlacp collectives take Kokkos::View arguments");
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "the first argument of an mlacp collective is a Kokkos execution-space instance");
  static_assert(compat::view_rank_v<ViewType> >= 3 && compat::view_rank_v<ViewType> <= detail::max_collective_rank,
                "mlacp collectives take Views of rank 3 to 5");
  static_assert(std::is_same_v<typename ViewType::array_layout, Kokkos::LayoutRight>,
                "mlacp collectives take LayoutRight (row-major, contiguous) Views");
  static_assert(is_communicated_value_v<typename ViewType::non_const_value_type>,
                "mlacp collectives take Views of float, double, mlacp::bf16 or std::uint8_t (bytes, never summed)");
  static_assert(!std::is_const_v<typename ViewType::value_type>,
                "mlacp collectives take non-const Views (with P == 1 the input itself is returned)");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename ViewType::memory_space>::accessible,
                "the execution space of an mlacp collective must be able to access the View's memory space");
}

template <class ViewType>
detail::CollectiveCall describe(detail::CollectiveKind kind, const ViewType& view, int dim_a, int dim_b) {
  detail::CollectiveCall call{kind,
                              compat::view_rank_v<ViewType>,
                              {},
                              dim_a,
                              dim_b,
                              static_cast<int>(sizeof(typename ViewType::value_type)),
                              view.data() != nullptr || view.size() == 0};
  for (int d = 0; d < call.rank; ++d)
    call.extents[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(view.extent(static_cast<unsigned>(d)));
  return call;
}

/// Reports on a mesh's failure channel when the launch whose scope it lives in is left by an exception after its
/// validation (an allocation that did not fit on this rank, a backend's error). The other ranks, which may already
/// have launched, then raise CommunicationError naming this rank at their wait instead of waiting for the watchdog;
/// this rank raises its own error (an OutOfMemory names the View and the bytes, and the report quotes it).
class FailureReporter {
 public:
  FailureReporter() = default;
  FailureReporter(FailureReporter&& other) noexcept
      : mesh_(std::exchange(other.mesh_, nullptr)),
        name_(std::move(other.name_)),
        exceptions_(other.exceptions_),
        failures_(other.failures_) {}
  FailureReporter& operator=(FailureReporter&&) = delete;
  FailureReporter(const FailureReporter&) = delete;
  FailureReporter& operator=(const FailureReporter&) = delete;
  ~FailureReporter() {
    if (mesh_ == nullptr || std::uncaught_exceptions() <= exceptions_) return;
    try {
      std::string what = "mlacp: launch of '" + name_ + "' failed on rank " + std::to_string(mesh_->rank());
      if (out_of_memory_count() != failures_) what += ": " + last_out_of_memory();
      mesh_->report_failure(what);
    } catch (...) {
      mesh_->report_failure("mlacp: a launch failed");
    }
  }
  void arm(const Mesh& mesh, const std::string& name) {
    mesh_ = &mesh;
    name_ = name;
    exceptions_ = std::uncaught_exceptions();
    failures_ = out_of_memory_count();
  }

 private:
  const Mesh* mesh_ = nullptr;
  std::string name_;
  int exceptions_ = 0;
  std::uint64_t failures_ = 0;
};

/// The outcome of a collective's prologue: the validated call, and the finished handle when nothing moves (P == 1:
/// the input itself is the result).
template <class ViewType>
struct Prologue {
  detail::CollectiveCall call;
  std::optional<AsyncCollective<collective_result_t<ViewType>>> done;
  FailureReporter reporter;  // armed once the call is validated: a throw after that is reported on the mesh
};

/// What every collective does first: the compile-time requirements, the description of the call, its validation
/// (agreed by every rank in checked mode; throws before anything is sent), and P == 1. The uneven collectives pass
/// their partitions (`partition_a` for dim_a, `partition_b` for dim_b of an all-to-all).
template <class ExecSpace, class ViewType>
Prologue<ViewType> prologue(detail::CollectiveKind kind, const ViewType& view, int dim_a, int dim_b, const Mesh& mesh,
                            const std::string& name, const collective_result_t<ViewType>& into,
                            const Partition* partition_a = nullptr, const Partition* partition_b = nullptr) {
  check_collective_types<ExecSpace, ViewType>();
  Prologue<ViewType> p{describe(kind, view, dim_a, dim_b), std::nullopt, {}};
  if (partition_a != nullptr) {
    p.call.uneven = true;
    p.call.counts_a = partition_a->counts();
    if (partition_b != nullptr) p.call.counts_b = partition_b->counts();
  }
  p.call.sums_with_mpi =
      kind == detail::CollectiveKind::reduce_scatter && Backend<ExecSpace>::Transport::sums_with_mpi(mesh);
  if (into.data() != nullptr) {
    p.call.has_into = true;
    for (int d = 0; d < p.call.rank; ++d)
      p.call.into_extents[static_cast<std::size_t>(d)] =
          static_cast<std::int64_t>(into.extent(static_cast<unsigned>(d)));
    p.call.into_aliases_input = into.data() == view.data();
  }
  detail::validate_collective(mesh, p.call, name);
  // Uniform partitions take the even path (the callers test the same): validated against their partitions above, the
  // call describes from here on the path that runs, so that `uneven` means the uneven (v) transport.
  if (p.call.uneven && partition_a->uniform() && (partition_b == nullptr || partition_b->uniform())) {
    p.call.uneven = false;
    p.call.counts_a.clear();
    p.call.counts_b.clear();
  }
  if (mesh.size() == 1)
    p.done.emplace(name, nullptr, collective_result_t<ViewType>(view), std::function<void()>{});
  else
    p.reporter.arm(mesh, name);
  return p;
}

/// `like`'s extents as a View constructor takes them: eight, KOKKOS_INVALID_INDEX past its rank.
template <class ViewType>
std::array<std::size_t, 8> extents_of(const ViewType& like) {
  std::array<std::size_t, 8> n;
  n.fill(KOKKOS_INVALID_INDEX);
  for (int d = 0; d < compat::view_rank_v<ViewType>; ++d) n[d] = like.extent(static_cast<unsigned>(d));
  return n;
}

/// The result View: `into` when the caller provided one (its shape was validated by the prologue), else a new View
/// shaped like `like`, with extent(dim_a) = extent_a and, when dim_b >= 0, extent(dim_b) = extent_b.
template <class ViewType>
collective_result_t<ViewType> allocate_result(const collective_result_t<ViewType>& into, const std::string& label,
                                              const ViewType& like, int dim_a, std::int64_t extent_a, int dim_b = -1,
                                              std::int64_t extent_b = 0) {
  if (into.data() != nullptr) return into;
  std::array<std::size_t, 8> n = extents_of(like);
  n[dim_a] = static_cast<std::size_t>(extent_a);
  if (dim_b >= 0) n[dim_b] = static_cast<std::size_t>(extent_b);
  std::int64_t bytes = static_cast<std::int64_t>(sizeof(typename ViewType::value_type));
  for (int d = 0; d < compat::view_rank_v<ViewType>; ++d)
    bytes = checked_product(bytes, static_cast<std::int64_t>(n[d]));
  refuse_beyond_available<typename ViewType::memory_space>("mlacp: a collective's result", label, bytes);
  try {
    return collective_result_t<ViewType>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n[0], n[1], n[2], n[3],
                                         n[4]);
  } catch (const std::exception& e) {
    if (!translate_allocation_failure(e, "")) throw;
    throw out_of_memory("mlacp: a collective's result", label, bytes, e.what());
  }
}

/// One collective, ready for its backend: what moves, where the result is, and what its handle must keep alive.
template <class T, class MemSpace, class ResultView>
struct CollectiveLaunch {
  CollectiveLaunch(std::string name_, detail::CollectiveCall call_, detail::Operation operation_)
      : name(std::move(name_)), call(call_), operation(operation_) {}

  std::string name;             ///< the caller's name of the collective (events, watchdog, errors)
  detail::CollectiveCall call;  ///< the validated call (for the watchdog's report)
  detail::Operation operation;
  detail::Vector<T, MemSpace> send;  ///< what the transport reads
  detail::Vector<T, MemSpace> recv;  ///< where the transport writes
  std::size_t count = 0;             ///< values per peer block (even collectives)
  detail::PeerBlocks send_blocks;    ///< uneven collectives: the blocks of `send` (see TransportRequest)
  detail::PeerBlocks recv_blocks;    ///< uneven collectives: the blocks of `recv`
  ResultView result;                 ///< what wait() returns
  /// Runs at wait() once the data arrived, on the launch's instance: the unpack or the block sum into `result`; may
  /// be empty (received in place).
  std::function<void()> finish;
  /// exchange_blocks, optional: consumes peer i's block as soon as it has arrived (TransportRequest::block_arrived);
  /// `finish` then consumes whatever it has not.
  std::function<void(int)> block_arrived;
  /// What the transport reads or writes and nobody else owns: the input when sent in place, pooled buffers.
  std::vector<std::any> lifetimes;

  template <class Owner>
  void extend_lifetime(const Owner& owner) {
    lifetimes.emplace_back(owner);
  }
};

/// Hands `launch` to the backend of ExecSpace and returns the handle that owns it.
template <class ExecSpace, class T, class MemSpace, class ResultView>
AsyncCollective<ResultView> start(const ExecSpace& space, const Mesh& mesh,
                                  CollectiveLaunch<T, MemSpace, ResultView>&& launch) {
  detail::TransportRequest<T, MemSpace> request{
      launch.operation,
      launch.send,
      launch.recv,
      launch.count,
      detail::describe_for_watchdog(launch.call, launch.name,
                                    static_cast<std::int64_t>(launch.send.size() * sizeof(T))),
      std::move(launch.send_blocks),
      std::move(launch.recv_blocks),
      std::move(launch.block_arrived)};
  // What this launch hands to the wire (collective_bytes.hpp): the send buffer, in the collective's value type.
  detail::count_collective_bytes(launch.operation == detail::Operation::all_to_all   ? CountedCollective::all_to_all
                                 : launch.operation == detail::Operation::all_gather ? CountedCollective::all_gather
                                 : launch.operation == detail::Operation::send_recv  ? CountedCollective::send_recv
                                                                                    : CountedCollective::reduce_scatter,
                                 static_cast<std::uint64_t>(launch.send.size() * sizeof(T)));
  detail::StartedTransport started = Backend<ExecSpace>::Transport::start(space, mesh, request);
  started.transport->set_polled(detail::worth_polling(mesh, request.info.bytes));
  std::function<void()> finish = [arrived = std::move(started.arrived), finish = std::move(launch.finish)]() {
    if (arrived) arrived();
    if (finish) finish();
  };
  AsyncCollective<ResultView> handle(launch.name, std::move(started.transport), std::move(launch.result),
                                     std::move(finish));
  for (const auto& owner : launch.lifetimes) handle.extend_lifetime(owner);
  for (const auto& resource : started.resources) handle.extend_lifetime(resource);
  return handle;
}

/// The send side of a scattering collective (all-to-all, reduce-scatter): the P blocks of the input along the
/// scattered dimension, block j for rank j, each contiguous. With nothing before that dimension (`scattered.outer` ==
/// 1: scattering dim 0, or batch 1 with tokens scattered) the input already is in that layout and the transport reads
/// it directly (no copy: the caller keeps the input alive in the handle and must not write it until wait());
/// otherwise the blocks are packed on `space` into a pooled buffer.
template <class T, class MemSpace>
struct ScatterSend {
  detail::Vector<T, MemSpace> buffer;
  std::any owner;  ///< the pooled buffer (empty when the input is sent in place)
};

template <class T, class MemSpace, class ExecSpace, class ViewType>
ScatterSend<T, MemSpace> scatter_send(const ExecSpace& space, const ViewType& input, const detail::AroundDim& scattered,
                                      int parts, const std::string& name) {
  const auto n = static_cast<std::size_t>(scattered.size());
  if (scattered.outer == 1) return {detail::Vector<T, MemSpace>(input.data(), n), {}};
  auto pooled = detail::allocate_buffer<T, MemSpace>(space, name + " send", n);
  detail::pack_blocks(space, input.data(), pooled.view.data(), scattered, parts, name + " pack");
  return {pooled.view, pooled};
}

/// Where a gathering collective (all-to-all, all-gather) receives. `received` describes the P incoming blocks around
/// the gathered dimension. With nothing before that dimension (outer == 1: gathering dim 0, or batch 1 with tokens
/// gathered) the rank-ordered blocks are the result's layout already, so the transport receives into the result and
/// nothing is unpacked; otherwise into a pooled buffer that `unpack` scatters into the result at wait().
template <class T, class MemSpace>
struct GatherReceive {
  detail::Vector<T, MemSpace> buffer;
  std::any owner;                ///< the pooled buffer (empty when received in place: the handle holds the result)
  std::function<void()> unpack;  ///< empty when received in place
};

template <class T, class MemSpace, class ExecSpace, class Result>
GatherReceive<T, MemSpace> gather_receive(const ExecSpace& space, const Result& result,
                                          const detail::AroundDim& received, int parts, const std::string& name) {
  const auto n = static_cast<std::size_t>(received.size() * parts);
  if (received.outer == 1) return {detail::Vector<T, MemSpace>(result.data(), n), {}, {}};
  auto pooled = detail::allocate_buffer<T, MemSpace>(space, name + " recv", n);
  const T* in = pooled.view.data();
  T* out = result.data();
  auto unpack = [space, in, out, received, parts, name]() {
    detail::unpack_blocks(space, in, out, received, parts, name + " unpack");
  };
  return {pooled.view, pooled, unpack};
}

// ---- The uneven (v) collectives' sides: the same structure, blocks sized by a Partition. ----

/// The per-peer blocks, in values, of a buffer that holds a [outer, partition.total(), inner] tensor's blocks in rank
/// order, block j being [outer, count(j), inner] (packed or, with outer == 1, the tensor itself).
inline detail::PeerBlocks peer_blocks(const Partition& partition, std::int64_t outer, std::int64_t inner) {
  detail::PeerBlocks blocks;
  for (int j = 0; j < partition.parts(); ++j) {
    blocks.counts.push_back(static_cast<std::size_t>(outer * partition.count(j) * inner));
    blocks.offsets.push_back(static_cast<std::size_t>(outer * partition.offset(j) * inner));
  }
  return blocks;
}

/// The partition's parts + 1 offsets where kernels on `space` read them: pooled buffers (filled on the host, copied
/// on `space` where MemSpace is not HostSpace), so that a steady state allocates nothing. `owners` keeps them alive.
template <class MemSpace, class ExecSpace>
const std::int64_t* partition_offsets(const ExecSpace& space, const Partition& partition, const std::string& name,
                                      std::vector<std::any>& owners) {
  const auto n = static_cast<std::size_t>(partition.parts()) + 1;
  auto host = detail::allocate_buffer<std::int64_t, Kokkos::HostSpace>(space, name + " offsets", n);
  for (std::size_t j = 0; j < n; ++j) host.view(j) = partition.offset(static_cast<int>(j));
  owners.emplace_back(host);
  if constexpr (std::is_same_v<MemSpace, Kokkos::HostSpace>) {
    return host.view.data();
  } else {
    auto device = detail::allocate_buffer<std::int64_t, MemSpace>(space, name + " offsets", n);
    Kokkos::deep_copy(space, device.view, host.view);
    owners.emplace_back(device);
    return device.view.data();
  }
}

/// The send side of an uneven scattering collective: `scattered` describes the input around the partitioned
/// dimension (mid = partition.total()); block j (rows offset(j) .. offset(j) + count(j) - 1) is for rank j. As
/// scatter_send: read in place when nothing precedes the dimension, else packed on `space` into a pooled buffer.
template <class T, class MemSpace, class ExecSpace, class ViewType>
ScatterSend<T, MemSpace> scatter_send_v(const ExecSpace& space, const ViewType& input,
                                        const detail::AroundDim& scattered, const Partition& partition,
                                        const std::string& name) {
  const auto n = static_cast<std::size_t>(scattered.size());
  if (scattered.outer == 1) return {detail::Vector<T, MemSpace>(input.data(), n), {}};
  std::vector<std::any> owners;
  const std::int64_t* offsets = partition_offsets<MemSpace>(space, partition, name + " send", owners);
  auto pooled = detail::allocate_buffer<T, MemSpace>(space, name + " send", n);
  detail::pack_blocks_v(space, input.data(), pooled.view.data(), scattered, offsets, partition.parts(), name + " pack");
  owners.emplace_back(pooled);
  return {pooled.view, owners};
}

/// The receive side of an uneven gathering collective: `gathered` describes the result around the partitioned
/// dimension (mid = partition.total()); rank i's block lands at rows offset(i) .. offset(i) + count(i) - 1. As
/// gather_receive: received in place when nothing precedes the dimension, else unpacked on `space` at wait().
template <class T, class MemSpace, class ExecSpace, class Result>
GatherReceive<T, MemSpace> gather_receive_v(const ExecSpace& space, const Result& result,
                                            const detail::AroundDim& gathered, const Partition& partition,
                                            const std::string& name) {
  const auto n = static_cast<std::size_t>(gathered.size());
  if (gathered.outer == 1) return {detail::Vector<T, MemSpace>(result.data(), n), {}, {}};
  std::vector<std::any> owners;
  const std::int64_t* offsets = partition_offsets<MemSpace>(space, partition, name + " recv", owners);
  auto pooled = detail::allocate_buffer<T, MemSpace>(space, name + " recv", n);
  owners.emplace_back(pooled);
  const T* in = pooled.view.data();
  T* out = result.data();
  const int parts = partition.parts();
  auto unpack = [space, in, out, gathered, offsets, parts, name]() {
    detail::unpack_blocks_v(space, in, out, gathered, offsets, parts, name + " unpack");
  };
  return {pooled.view, owners, unpack};
}

}  // namespace detail
}  // namespace mlacp
