// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Point-to-point exchange: the ring steps of ring attention (issue 21, item 3), as the same move-only handles as the
// collectives (launched before the compute on the current chunk, waited after it).
#pragma once

#include <mlacp/detail/launch.hpp>
#include <mlacp/mpi/communicator.hpp>

#include <climits>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>

namespace mlacp {

namespace detail {
/// Throws InvalidArgument naming `name` when `view` is not contiguous, holds no data for a nonzero size, or has more
/// values than MPI's int count.
template <class View>
void check_send_recv_view(const View& view, const char* which, const std::string& name) {
  const std::string where = "mlacp::launch_send_recv '" + name + "': ";
  if (!view.span_is_contiguous())
    throw InvalidArgument(where + "the " + which + " View '" + view.label() +
                          "' is not contiguous; expected a contiguous View (span == size)");
  if (view.data() == nullptr && view.size() != 0)
    throw InvalidArgument(where + "the " + which + " View has " + std::to_string(view.size()) +
                          " values and no data; expected an allocated View");
  if (view.size() > static_cast<std::size_t>(INT_MAX))
    throw InvalidArgument(where + "the " + which + " View has " + std::to_string(view.size()) +
                          " values; expected at most INT_MAX (" + std::to_string(INT_MAX) + ") for MPI's int count");
}
}  // namespace detail

/// Sends `send` to rank `dest` of `mesh` and receives `recv` from rank `source`, both nonblocking: an MPI_Isend +
/// MPI_Irecv pair on the mesh's communicator with `tag` (NCCL on Kokkos::Cuda instances with an NCCL communicator:
/// ncclSend + ncclRecv in one group on the instance's stream; tags are not needed there, order is launch order, and a
/// receive's count must equal its message's). Point-to-point, not collective: only the two peers take part (no
/// agreement of the call in checked mode). send and recv are contiguous Views of the same value type (float, double,
/// bf16), any rank, layout and extents; `send` is NOT copied: the handle keeps it alive and the caller must not write
/// it until wait(); recv is written by the transport and returned by wait(). The execution-space instance is fenced
/// before MPI reads `send`; device memory is staged through host buffers without GPU-aware MPI (as the collectives
/// do) and with mesh.host_staging(). dest == source == rank copies locally on `space` at launch (nothing on the
/// wire: not counted in collective_bytes, not pending). Counts may differ per pair: a receive larger than its message
/// is fine (its values past the message are left as they were); a smaller one is MPI_ERR_TRUNCATE, raised at wait as
/// CommunicationError naming the exchange (on a communicator whose error handler returns errors; MPI's default
/// handler aborts). Two exchanges between the same pair may be in flight at once with different tags. Errors raised
/// at launch, before anything is posted (InvalidArgument naming the value and what was expected): dest or source
/// outside [0, P), a non-contiguous View, send and recv overlapping, a negative tag (or one of MPI_TAG_UB or above:
/// MPI_TAG_UB is the pairwise reduce-scatter's), a View of more than INT_MAX values; a broken mesh raises
/// CommunicationError; a second host thread launching while another is inside mlacp on the communicator raises
/// UsageError (as the collectives). Registered as pending (mlacp::progress()), recorded by the event recorder, counted
/// by collective_bytes().send_recv (the bytes of `send`), waited once; an unwaited handle completes at destruction.
template <class ExecSpace, class SendView, class RecvView>
AsyncCollective<RecvView> launch_send_recv(const ExecSpace& space, const SendView& send, int dest, const RecvView& recv,
                                           int source, const Mesh& mesh, const std::string& name = "send_recv",
                                           int tag = 0) {
  static_assert(Kokkos::is_view<SendView>::value && Kokkos::is_view<RecvView>::value,
                "mlacp::launch_send_recv takes Kokkos::View arguments");
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "the first argument of mlacp::launch_send_recv is a Kokkos execution-space instance");
  using T = typename RecvView::non_const_value_type;
  using MemSpace = typename RecvView::memory_space;
  static_assert(std::is_same_v<typename SendView::non_const_value_type, T>,
                "mlacp::launch_send_recv: send and recv must have the same value type");
  static_assert(std::is_same_v<typename SendView::memory_space, MemSpace>,
                "mlacp::launch_send_recv: send and recv must be in the same memory space");
  static_assert(!std::is_const_v<typename RecvView::value_type>, "mlacp::launch_send_recv: recv must be writable");
  static_assert(detail::is_communicated_value_v<T>,
                "mlacp::launch_send_recv moves Views of float, double, mlacp::bf16 or std::uint8_t");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, MemSpace>::accessible,
                "the execution space of mlacp::launch_send_recv must be able to access the Views' memory space");

  const detail::EntryGuard entry(mesh, "mlacp::launch_send_recv '" + name + "'");
  const std::string where = "mlacp::launch_send_recv '" + name + "': ";
  if (mpi::finalized()) throw UsageError(where + "called after MPI_Finalize");
  const int size = mesh.size();
  if (dest < 0 || dest >= size)
    throw InvalidArgument(where + "dest is " + std::to_string(dest) + "; expected a rank in [0, " +
                          std::to_string(size) + ")");
  if (source < 0 || source >= size)
    throw InvalidArgument(where + "source is " + std::to_string(source) + "; expected a rank in [0, " +
                          std::to_string(size) + ")");
  if (tag < 0 || tag >= mpi::block_message_tag())
    throw InvalidArgument(where + "tag is " + std::to_string(tag) + "; expected a tag in [0, " +
                          std::to_string(mpi::block_message_tag() - 1) +
                          "] (MPI_TAG_UB - 1: MPI_TAG_UB itself tags mlacp's reduce-scatter blocks)");
  detail::check_send_recv_view(send, "send", name);
  detail::check_send_recv_view(recv, "recv", name);
  const auto address = [](const auto* p) { return reinterpret_cast<std::uintptr_t>(p); };
  if (send.size() > 0 && recv.size() > 0 && address(send.data()) < address(recv.data() + recv.size()) &&
      address(recv.data()) < address(send.data() + send.size()))
    throw InvalidArgument(where + "send '" + send.label() + "' and recv '" + recv.label() +
                          "' overlap; expected separate Views (the transport writes recv while it reads send)");
  mesh.throw_if_broken("send_recv '" + name + "'");

  compat::ScopedRegion region("mlacp::launch_send_recv " + name);
  if (dest == mesh.rank() && source == mesh.rank()) {
    // To itself: copied on `space` now, nothing on the wire (not counted, not pending); a receive shorter than the
    // message is raised at wait, as MPI would (Open MPI's self path truncates silently).
    const std::size_t n = send.size() < recv.size() ? send.size() : recv.size();
    Kokkos::deep_copy(space, detail::Vector<T, MemSpace, detail::Unmanaged>(recv.data(), n),
                      detail::Vector<const T, MemSpace, detail::Unmanaged>(send.data(), n));
    std::function<void()> check;
    if (send.size() > recv.size())
      check = [name, sent = send.size(), room = recv.size()]() {
        throw CommunicationError("mlacp: MPI_Wait of '" + name + "' failed: MPI_ERR_TRUNCATE: a message of " +
                                 std::to_string(sent) + " values to this rank itself, into a receive of " +
                                 std::to_string(room) + " values");
      };
    AsyncCollective<RecvView> handle(name, nullptr, recv, std::move(check));
    handle.extend_lifetime(send);
    return handle;
  }
  const auto bytes = static_cast<std::int64_t>(send.size() * sizeof(T));
  CollectiveInfo info;
  info.name = name;
  info.operation = "mlacp::launch_send_recv(dest=" + std::to_string(dest) + ", source=" + std::to_string(source) +
                   ", tag=" + std::to_string(tag) + ")";
  info.shape = "send " + std::to_string(send.size()) + " values, recv " + std::to_string(recv.size()) + " values";
  info.bytes = bytes;
  detail::TransportRequest<T, MemSpace> request{detail::Operation::send_recv,
                                                detail::Vector<T, MemSpace>(const_cast<T*>(send.data()), send.size()),
                                                detail::Vector<T, MemSpace>(recv.data(), recv.size()),
                                                0,
                                                std::move(info),
                                                {},
                                                {},
                                                {}};
  request.dest = dest;
  request.source = source;
  request.tag = tag;
  detail::count_collective_bytes(detail::CountedCollective::send_recv, static_cast<std::uint64_t>(bytes));
  detail::StartedTransport started = Backend<ExecSpace>::Transport::start(space, mesh, request);
  started.transport->set_polled(detail::worth_polling(mesh, bytes));
  AsyncCollective<RecvView> handle(name, std::move(started.transport), recv, std::move(started.arrived));
  handle.extend_lifetime(send);  // read by the transport until it completes
  for (const auto& resource : started.resources) handle.extend_lifetime(resource);
  return handle;
}

}  // namespace mlacp
