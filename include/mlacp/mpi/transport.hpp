// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI backend of the collectives: for every execution space, the transport unless nccl/transport.hpp takes over.
#pragma once

#include <mlacp/compat.hpp>
#include <mlacp/config.hpp>
#include <mlacp/detail/buffer_pool.hpp>
#include <mlacp/detail/transport.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/collectives.hpp>
#include <mlacp/mpi/datatype.hpp>
#include <mlacp/mpi/request_transport.hpp>

#include <Kokkos_Core.hpp>
#include <memory>
#include <utility>
#include <vector>

namespace mlacp::mpi {

/// Whether MPI may be handed pointers into MemSpace directly.
template <class MemSpace>
constexpr bool reads_directly() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible || MLACP_ENABLE_GPU_AWARE_MPI;
}

struct Transport {
  /// MPI's own reduce-scatter (MPI_Ireduce_scatter_block) only when the mesh asks for it; by default the collective
  /// exchanges the blocks and sums them itself (ReduceScatterAlgorithm::pairwise).
  static bool reduces_natively(const Mesh& mesh) {
    return mesh.reduce_scatter_algorithm() == ReduceScatterAlgorithm::mpi;
  }

  /// Starts `request` over the mesh's communicator. The instance is fenced first, so that MPI never reads a send
  /// buffer a kernel is still writing. When MPI cannot read MemSpace (or the mesh asks for host staging) the data goes
  /// through pooled host buffers, and `recv` is refilled on `space` at wait().
  template <class ExecSpace, class T, class MemSpace>
  static detail::StartedTransport start(const ExecSpace& space, const Mesh& mesh,
                                        const detail::TransportRequest<T, MemSpace>& request) {
    const std::string& name = request.info.name;
    detail::StartedTransport started;
    MPI_Request handle = MPI_REQUEST_NULL;
    if (reads_directly<MemSpace>() && !mesh.host_staging()) {
      compat::fence(space, name + ": send buffer complete before MPI reads it");
      check_mpi(
          issue(request.operation, request.send.data(), request.recv.data(), request.count, mesh, started, &handle),
          name + ": MPI launch");
      started.transport = make_request_transport(handle, mesh.comm(), request.info);
      return started;
    }
    const auto host_send =
        detail::allocate_buffer<T, Kokkos::HostSpace>(space, name + " host send", request.send.size());
    const auto host_recv =
        detail::allocate_buffer<T, Kokkos::HostSpace>(space, name + " host recv", request.recv.size());
    Kokkos::deep_copy(space, host_send.view, request.send);
    compat::fence(space, name + ": host staging complete before MPI reads it");
    check_mpi(
        issue(request.operation, host_send.view.data(), host_recv.view.data(), request.count, mesh, started, &handle),
        name + ": MPI launch");
    started.transport = make_request_transport(handle, mesh.comm(), request.info);
    started.arrived = [space, recv = request.recv, staged = host_recv.view]() {
      Kokkos::deep_copy(space, recv, staged);
    };
    started.resources.emplace_back(host_send);
    started.resources.emplace_back(host_recv);
    return started;
  }

 private:
  template <class T>
  static int issue(detail::Operation operation, const T* send, T* recv, std::size_t count, const Mesh& mesh,
                   detail::StartedTransport& started, MPI_Request* handle) {
    const int n = static_cast<int>(count);  // validate_collective refused blocks beyond MPI's int count
    switch (operation) {
      case detail::Operation::all_to_all:
        return start_all_to_all(send, recv, n, datatype<T>(), mesh.comm(), handle);
      case detail::Operation::all_gather:
        return start_all_gather(send, recv, n, datatype<T>(), mesh.comm(), handle);
      case detail::Operation::reduce_scatter_sum:
        return start_reduce_scatter_block(send, recv, n, datatype<T>(), mesh.comm(), handle);
      case detail::Operation::exchange_blocks: {
        // MPI reads the counts and displacements until the exchange completes: the handle keeps them.
        auto arrays = std::make_shared<std::vector<int>>(2 * static_cast<std::size_t>(mesh.size()));
        started.resources.emplace_back(arrays);
        return start_exchange_blocks(send, recv, n, datatype<T>(), mesh.comm(), arrays->data(),
                                     arrays->data() + mesh.size(), handle);
      }
    }
    return MPI_ERR_OP;
  }
};

}  // namespace mlacp::mpi

namespace mlacp::detail {
/// MPI carries the collectives of every execution space (nccl/transport.hpp specialises this for Kokkos::Cuda).
template <class ExecSpace, class Enable>
struct TransportFor : mpi::Transport {};
}  // namespace mlacp::detail
