// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the three collectives share: compile-time requirements on the View, the description of the call for
// validation, buffer allocation, host staging for MPI libraries that are not GPU-aware, and the MPI launch.
#pragma once

#include <mlacp/async_collective.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/config.hpp>
#include <mlacp/detail/block_layout.hpp>
#include <mlacp/detail/buffer_pool.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/datatype.hpp>
#include <mlacp/mpi/request_transport.hpp>
#include <mlacp/nccl/nccl_transport.hpp>

#include <Kokkos_Core.hpp>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

namespace mlacp {

/// The View type a collective returns for an input of type ViewType: same value type and rank, LayoutRight, same
/// memory space, managed.
template <class ViewType>
using collective_result_t =
    Kokkos::View<typename ViewType::non_const_data_type, Kokkos::LayoutRight, typename ViewType::memory_space>;

namespace detail {

template <class ExecSpace, class ViewType>
constexpr void check_collective_types() {
  static_assert(Kokkos::is_view<ViewType>::value, "mlacp collectives take Kokkos::View arguments");
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "the first argument of an mlacp collective is a Kokkos execution-space instance");
  static_assert(compat::view_rank_v<ViewType> >= 3 && compat::view_rank_v<ViewType> <= max_collective_rank,
                "mlacp collectives take Views of rank 3 to 5");
  static_assert(std::is_same_v<typename ViewType::array_layout, Kokkos::LayoutRight>,
                "mlacp collectives take LayoutRight (row-major, contiguous) Views");
  static_assert(mpi::is_supported_value<typename ViewType::non_const_value_type>::value,
                "mlacp collectives take Views of float or double");
  static_assert(!std::is_const_v<typename ViewType::value_type>,
                "mlacp collectives take non-const Views (with P == 1 the input itself is returned)");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename ViewType::memory_space>::accessible,
                "the execution space of an mlacp collective must be able to access the View's memory space");
}

template <class ViewType>
CollectiveCall describe(CollectiveKind kind, const ViewType& view, int dim_a, int dim_b) {
  CollectiveCall call{kind,
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

/// A result View shaped like `like`, with extent(dim_a) = extent_a and, when dim_b >= 0, extent(dim_b) = extent_b.
template <class ViewType>
collective_result_t<ViewType> allocate_result(const std::string& label, const ViewType& like, int dim_a,
                                              std::int64_t extent_a, int dim_b = -1, std::int64_t extent_b = 0) {
  std::size_t n[8] = {KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX,
                      KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX};
  for (int d = 0; d < compat::view_rank_v<ViewType>; ++d) n[d] = like.extent(static_cast<unsigned>(d));
  n[dim_a] = static_cast<std::size_t>(extent_a);
  if (dim_b >= 0) n[dim_b] = static_cast<std::size_t>(extent_b);
  return collective_result_t<ViewType>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n[0], n[1], n[2], n[3],
                                       n[4]);
}

template <class T, class MemSpace>
using Buffer = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace>;

/// A communication buffer of n values from the pool (buffer_pool.hpp): an unmanaged View, plus the pooled
/// allocation that must be kept alive (by the handle) for as long as the View is used.
template <class T, class MemSpace>
struct PooledBuffer {
  Buffer<T, MemSpace> view;
  typename BufferPool<MemSpace>::bytes_view storage;
};

template <class T, class MemSpace>
PooledBuffer<T, MemSpace> allocate_buffer(const std::string& label, std::int64_t n) {
  auto storage = BufferPool<MemSpace>::instance().acquire(static_cast<std::size_t>(n) * sizeof(T), label);
  return {Buffer<T, MemSpace>(reinterpret_cast<T*>(storage.data()), static_cast<std::size_t>(n)), storage};
}

/// Where a gathering collective (all-to-all, all-gather) receives. `received` describes the P incoming blocks around
/// the gathered dimension. With nothing before that dimension (outer == 1: gathering dim 0, or batch 1 with tokens
/// gathered) the rank-ordered blocks are the result's layout already, so MPI receives into the result and nothing is
/// unpacked; otherwise into a pooled buffer that unpack() scatters into the result at wait().
template <class T, class MemSpace>
struct GatherReceive {
  PooledBuffer<T, MemSpace> pooled;
  Buffer<T, MemSpace> buffer;
  bool in_place = false;
};

template <class T, class MemSpace, class Result>
GatherReceive<T, MemSpace> gather_receive(const Result& result, const AroundDim& received, int parts,
                                          const std::string& name) {
  const auto n = static_cast<std::size_t>(received.size() * parts);
  if (received.outer == 1) return {{}, Buffer<T, MemSpace>(result.data(), n), true};
  auto pooled = allocate_buffer<T, MemSpace>(name + " recv", static_cast<std::int64_t>(n));
  return {pooled, pooled.view, false};
}

/// The wait()-time step of a gathering collective: unpacks the received blocks into `result` unless they were
/// received in place.
template <class ExecSpace, class T, class MemSpace, class Result>
auto gather_unpack(const ExecSpace& space, const Result& result, const AroundDim& received, int parts,
                   const std::string& name, bool in_place) {
  return [=](const Buffer<T, MemSpace>& r) {
    if (!in_place) unpack_blocks(space, r.data(), result.data(), received, parts, name + " unpack");
  };
}

/// The send side of a scattering collective (all-to-all, reduce-scatter): the P blocks of the input along the
/// scattered dimension, block j for rank j, each contiguous. With nothing before that dimension (`scattered.outer` ==
/// 1: scattering dim 0, or batch 1 with tokens scattered) the input already is in that layout and MPI reads it directly
/// (no copy: the caller keeps the input alive in the handle and must not write it until wait()); otherwise the blocks
/// are packed into a pooled buffer.
template <class T, class MemSpace>
struct ScatterSend {
  PooledBuffer<T, MemSpace> pooled;
  Buffer<T, MemSpace> buffer;
};

template <class T, class MemSpace, class ExecSpace>
ScatterSend<T, MemSpace> scatter_send(const ExecSpace& space, T* input, const AroundDim& scattered, int parts,
                                      const std::string& name) {
  const auto n = static_cast<std::size_t>(scattered.size());
  if (scattered.outer == 1) return {{}, Buffer<T, MemSpace>(input, n)};
  auto pooled = allocate_buffer<T, MemSpace>(name + " send", static_cast<std::int64_t>(n));
  pack_blocks(space, input, pooled.view.data(), scattered, parts, name + " pack");
  return {pooled, pooled.view};
}

/// Whether a collective on `ExecSpace` over `mesh` goes through NCCL (a CUDA build with NCCL, a CUDA execution space
/// and mesh.enable_nccl() called) rather than MPI.
template <class ExecSpace>
bool uses_nccl([[maybe_unused]] const Mesh& mesh) {
#if defined(KOKKOS_ENABLE_CUDA) && MLACP_HAVE_NCCL
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) return mesh.has_nccl();
#endif
  return false;
}

/// Whether MPI may be handed pointers into MemSpace directly.
template <class MemSpace>
constexpr bool mpi_reads_directly() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible || MLACP_ENABLE_GPU_AWARE_MPI;
}

/// Starts the collective `kind` from `send` into `recv` (both already sized; `count` elements per peer block) and
/// returns its handle; `unpack(recv)` runs at wait(), on `space`, to produce `result`.
///
/// MPI: the instance is fenced first so that MPI never reads a send buffer that a kernel is still writing;
/// `mpi_start(const T* send, T* recv, MPI_Request*)` issues the nonblocking call. When MPI cannot read MemSpace (or
/// the mesh asks for host staging), the data goes through host buffers and `recv` is refilled on `space` at wait().
/// NCCL (CUDA builds, mesh.enable_nccl() called, CUDA execution space): enqueued on the mesh's stream after an event
/// of `space`'s stream; no host fence, no host staging.
template <class ExecSpace, class T, class MemSpace, class ResultView, class MpiStart, class Unpack>
AsyncCollective<ResultView> launch_transport(const ExecSpace& space, const Mesh& mesh, const CollectiveCall& call,
                                             const std::string& name, Buffer<T, MemSpace> send,
                                             Buffer<T, MemSpace> recv, std::function<void()> storage, std::size_t count,
                                             ResultView result, MpiStart mpi_start, Unpack unpack) {
#if defined(KOKKOS_ENABLE_CUDA) && MLACP_HAVE_NCCL
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) {
    if (uses_nccl<ExecSpace>(mesh)) {
      const auto operation = call.kind == CollectiveKind::all_to_all   ? nccl::Operation::all_to_all
                             : call.kind == CollectiveKind::all_gather ? nccl::Operation::all_gather
                                                                       : nccl::Operation::reduce_scatter_sum;
      auto transport = nccl::launch(operation, send.data(), recv.data(), count, nccl::datatype<T>(), sizeof(T),
                                    *mesh.nccl(), space.cuda_stream(), name);
      auto finish = [=]() { unpack(recv); };
      auto keep_alive = [storage]() {};
      return AsyncCollective<ResultView>(name, std::move(transport), std::move(result), std::move(finish),
                                         std::move(keep_alive));
    }
  }
#endif
  (void)count;
  CollectiveInfo info = describe_for_watchdog(call, name, static_cast<std::int64_t>(send.size() * sizeof(T)));
  MPI_Request request = MPI_REQUEST_NULL;
  if (mpi_reads_directly<MemSpace>() && !mesh.host_staging()) {
    compat::fence(space, name + ": send buffer complete before MPI reads it");
    mpi::check_mpi(mpi_start(send.data(), recv.data(), &request), name + ": MPI launch");
    auto finish = [=]() { unpack(recv); };
    auto keep_alive = [storage]() {};
    return AsyncCollective<ResultView>(name, mpi::make_request_transport(request, mesh.comm(), info), std::move(result),
                                       std::move(finish), std::move(keep_alive));
  }
  const auto host_send_buffer =
      allocate_buffer<T, Kokkos::HostSpace>(name + " host send", static_cast<std::int64_t>(send.size()));
  const auto host_recv_buffer =
      allocate_buffer<T, Kokkos::HostSpace>(name + " host recv", static_cast<std::int64_t>(recv.size()));
  const auto host_send = host_send_buffer.view;
  const auto host_recv = host_recv_buffer.view;
  Kokkos::deep_copy(space, host_send, send);
  compat::fence(space, name + ": host staging complete before MPI reads it");
  mpi::check_mpi(mpi_start(host_send.data(), host_recv.data(), &request), name + ": MPI launch");
  auto finish = [=]() {
    Kokkos::deep_copy(space, recv, host_recv);
    unpack(recv);
  };
  auto keep_alive = [storage, host_send_buffer, host_recv_buffer]() {};
  return AsyncCollective<ResultView>(name, mpi::make_request_transport(request, mesh.comm(), info), std::move(result),
                                     std::move(finish), std::move(keep_alive));
}

}  // namespace detail
}  // namespace mlacp
