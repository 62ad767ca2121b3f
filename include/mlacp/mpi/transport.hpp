// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI backend of the collectives: for every execution space, the transport unless nccl/transport.hpp takes over.
#pragma once

#include <mlacp/build_config.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/detail/buffer_pool.hpp>
#include <mlacp/detail/transport.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/block_exchange_transport.hpp>
#include <mlacp/mpi/collectives.hpp>
#include <mlacp/mpi/datatype.hpp>
#include <mlacp/mpi/request_transport.hpp>

#include <Kokkos_Core.hpp>
#include <memory>
#include <string>
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
  /// Whether a reduce-scatter on this mesh would be summed by MPI itself (MPI_Ireduce_scatter*), which cannot sum bf16:
  /// the collectives refuse bf16 then, on every rank, before anything is sent (validate_collective).
  static bool sums_with_mpi(const Mesh& mesh) { return reduces_natively(mesh); }

  /// Starts `request` over the mesh's communicator. The instance is fenced first, so that MPI never reads a send
  /// buffer a kernel is still writing. When MPI cannot read MemSpace (or the mesh asks for host staging) the data goes
  /// through pooled host buffers, and `recv` is refilled on `space` at wait().
  template <class ExecSpace, class T, class MemSpace>
  static detail::StartedTransport start(const ExecSpace& space, const Mesh& mesh,
                                        const detail::TransportRequest<T, MemSpace>& request) {
    const std::string& name = request.info.name;
    if constexpr (!mpi_can_sum_v<T>) {
      // validate_collective refused it on every rank already (CollectiveCall::sums_with_mpi); never reached.
      if (request.operation == detail::Operation::reduce_scatter_sum)
        throw InvalidArgument("mlacp: " + name + ": MPI's own reduce-scatter cannot sum bf16 (MPI has no bf16 sum)");
    }
    detail::StartedTransport started;
    MPI_Request handles[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // a send_recv's send and receive; else [0]
    if (reads_directly<MemSpace>() && !mesh.host_staging()) {
      compat::fence(space, name + ": send buffer complete before MPI reads it");
      if (request.operation == detail::Operation::exchange_blocks && request.block_arrived) {
        started.transport = start_block_exchange(request, mesh);
        return started;
      }
      check_mpi(issue(request, request.send.data(), request.recv.data(), mesh, started, handles),
                name + ": MPI launch");
      started.transport = transport_of(request, handles, mesh);
      return started;
    }
    const auto host_send =
        detail::allocate_buffer<T, Kokkos::HostSpace>(space, name + " host send", request.send.size());
    const auto host_recv =
        detail::allocate_buffer<T, Kokkos::HostSpace>(space, name + " host recv", request.recv.size());
    Kokkos::deep_copy(space, host_send.view, request.send);
    // A receive may be longer than its message: what the message does not cover keeps recv's values, as unstaged.
    if (request.operation == detail::Operation::send_recv) Kokkos::deep_copy(space, host_recv.view, request.recv);
    compat::fence(space, name + ": host staging complete before MPI reads it");
    check_mpi(issue(request, host_send.view.data(), host_recv.view.data(), mesh, started, handles),
              name + ": MPI launch");
    started.transport = transport_of(request, handles, mesh);
    started.arrived = [space, recv = request.recv, staged = host_recv.view]() {
      Kokkos::deep_copy(space, recv, staged);
    };
    started.resources.emplace_back(host_send);
    started.resources.emplace_back(host_recv);
    return started;
  }

 private:
  // The exchange of a pairwise reduce-scatter whose blocks are summed as they arrive: one message per peer
  // (start_block_messages), each receive reported to request.block_arrived. Read and written in place (the blocks of
  // a host staging copy would arrive only at wait(): staged exchanges take MPI_Ialltoallv).
  template <class T, class MemSpace>
  static std::unique_ptr<detail::PendingTransport> start_block_exchange(
      const detail::TransportRequest<T, MemSpace>& request, const Mesh& mesh) {
    const std::string& name = request.info.name;
    const auto P = static_cast<std::size_t>(mesh.size());
    detail::PeerBlocks even;  // an even exchange's blocks: `count` values each, in rank order
    if (!request.uneven()) {
      for (std::size_t i = 0; i < P; ++i) {
        even.counts.push_back(request.count);
        even.offsets.push_back(i * request.count);
      }
    }
    // MPI reads the block arrays' values only while posting; the datatypes are freed once the messages complete.
    const BlocksInUnits sent = in_units(request.uneven() ? request.send_blocks : even, name + " (send blocks)");
    const BlocksInUnits received = in_units(request.uneven() ? request.recv_blocks : even, name + " (receive blocks)");
    std::vector<MPI_Request> sends(P, MPI_REQUEST_NULL), recvs(P, MPI_REQUEST_NULL);
    check_mpi(start_block_messages(request.send.data(), sent, request.recv.data(), received, datatype<T>(), mesh.comm(),
                                   sends.data(), recvs.data()),
              name + ": MPI launch");
    return make_block_exchange_transport(std::move(sends), std::move(recvs), mesh.comm(), request.info,
                                         request.block_arrived);
  }

  template <class T, class MemSpace>
  static std::unique_ptr<detail::PendingTransport> transport_of(const detail::TransportRequest<T, MemSpace>& request,
                                                                const MPI_Request* handles, const Mesh& mesh) {
    if (request.operation == detail::Operation::send_recv)
      return make_request_pair_transport(handles[0], handles[1], mesh.comm(), request.info);
    return make_request_transport(handles[0], mesh.comm(), request.info);
  }

  // Starts `request` with `send` and `recv` (its buffers, or their host copies): into handles[0], and a send_recv's
  // receive into handles[1].
  template <class T, class MemSpace>
  static int issue(const detail::TransportRequest<T, MemSpace>& request, const T* send, T* recv, const Mesh& mesh,
                   detail::StartedTransport& started, MPI_Request* handle) {
    if (request.operation == detail::Operation::send_recv) {
      // launch_send_recv refused counts beyond MPI's int before anything was posted.
      return start_send_recv(send, static_cast<int>(request.send.size()), request.dest, recv,
                             static_cast<int>(request.recv.size()), request.source, request.tag, datatype<T>(),
                             mesh.comm(), handle);
    }
    if (request.uneven()) return issue_uneven(request, send, recv, mesh, started, handle);
    const int n = static_cast<int>(request.count);  // validate_collective refused blocks beyond MPI's int count
    switch (request.operation) {
      case detail::Operation::send_recv:
        break;  // above
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

  // The uneven (v) collectives: MPI_Ialltoallv, MPI_Iallgatherv, MPI_Ireduce_scatter. MPI reads the count arrays until
  // the request completes: the handle keeps them (started.resources).
  template <class T, class MemSpace>
  static int issue_uneven(const detail::TransportRequest<T, MemSpace>& request, const T* send, T* recv,
                          const Mesh& mesh, detail::StartedTransport& started, MPI_Request* handle) {
    const std::string& name = request.info.name;
    switch (request.operation) {
      case detail::Operation::send_recv:
        break;  // never uneven (issue)
      case detail::Operation::all_to_all:
      case detail::Operation::exchange_blocks: {
        auto sent = std::make_shared<BlocksInUnits>(in_units(request.send_blocks, name + " (send blocks)"));
        auto received = std::make_shared<BlocksInUnits>(in_units(request.recv_blocks, name + " (receive blocks)"));
        if (request.operation == detail::Operation::exchange_blocks) {
          // This rank's own block is neither sent nor copied: the sum reads it where it is.
          sent->counts[static_cast<std::size_t>(mesh.rank())] = 0;
          received->counts[static_cast<std::size_t>(mesh.rank())] = 0;
        }
        started.resources.emplace_back(sent);
        started.resources.emplace_back(received);
        return start_all_to_all_v(send, *sent, recv, *received, datatype<T>(), mesh.comm(), handle);
      }
      case detail::Operation::all_gather: {
        auto received = std::make_shared<BlocksInUnits>(in_units(request.recv_blocks, name + " (receive blocks)"));
        started.resources.emplace_back(received);
        return start_all_gather_v(send, recv, *received, datatype<T>(), mesh.comm(), handle);
      }
      case detail::Operation::reduce_scatter_sum: {
        // The reduction runs on the basic type: counts in values (validate_collective bounds each block by INT_MAX).
        auto counts = std::make_shared<std::vector<int>>();
        for (const auto c : request.send_blocks.counts) counts->push_back(static_cast<int>(c));
        started.resources.emplace_back(counts);
        return start_reduce_scatter_v(send, recv, counts->data(), datatype<T>(), mesh.comm(), handle);
      }
    }
    return MPI_ERR_OP;
  }
};

}  // namespace mlacp::mpi
