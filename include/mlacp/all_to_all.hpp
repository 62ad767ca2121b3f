// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The Ulysses layout exchange: sequence-sharded <-> head-sharded.
#pragma once

#include <mlacp/detail/launch.hpp>
#include <mlacp/wire/coded_collective.hpp>

namespace mlacp {

namespace detail {
/// What the even and uneven all-to-all share once their blocks are described (launch.count even, launch.send_blocks
/// and recv_blocks uneven): the transport reads `sent` and writes `receive`'s buffer, which is unpacked into the
/// result at wait(); the handle keeps the input (read in place, or by the pack kernel queued on `space`) and both
/// pooled buffers alive.
template <class ExecSpace, class ViewType, class T, class MemSpace, class Result>
AsyncCollective<Result> all_to_all_start(const ExecSpace& space, const ViewType& view, const Mesh& mesh,
                                         CollectiveLaunch<T, MemSpace, Result>&& launch,
                                         const ScatterSend<T, MemSpace>& sent,
                                         const GatherReceive<T, MemSpace>& receive) {
  launch.send = sent.buffer;
  launch.recv = receive.buffer;
  launch.finish = receive.unpack;
  launch.extend_lifetime(view);
  launch.extend_lifetime(sent.owner);
  launch.extend_lifetime(receive.owner);
  return detail::start(space, mesh, std::move(launch));
}

/// The even all-to-all after its prologue (also the uneven one's, when both partitions are uniform).
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> all_to_all_even(const ExecSpace& space, const ViewType& view,
                                                               int gather_dim, int scatter_dim, const Mesh& mesh,
                                                               const std::string& name,
                                                               const collective_result_t<ViewType>& into,
                                                               const detail::CollectiveCall& call) {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  compat::ScopedRegion region("mlacp::launch_all_to_all " + name);
  const int parts = mesh.size();
  detail::CollectiveLaunch<T, MemSpace, Result> launch(name, call, detail::Operation::all_to_all);
  const auto sent = detail::scatter_send<T, MemSpace>(space, view, detail::around_dim(view, scatter_dim), parts, name);
  launch.result =
      detail::allocate_result(into, name, view, gather_dim, static_cast<std::int64_t>(view.extent(gather_dim)) * parts,
                              scatter_dim, static_cast<std::int64_t>(view.extent(scatter_dim)) / parts);
  detail::AroundDim received = detail::around_dim(launch.result, gather_dim);
  received.mid /= parts;
  const auto receive = detail::gather_receive<T, MemSpace>(space, launch.result, received, parts, name);
  launch.count = view.size() / static_cast<std::size_t>(parts);
  return all_to_all_start(space, view, mesh, std::move(launch), sent, receive);
}

}  // namespace detail

/// Launches an all-to-all that gathers `gather_dim` (its extent grows by P) and scatters `scatter_dim` (its extent
/// shrinks by P), with the semantics of hyper_parallel's async_ulysses_seq_to_head_launch: `scatter_dim` is split into
/// P contiguous blocks, block j goes to rank j, and the received blocks are concatenated along `gather_dim` in rank
/// order. On [B, S, H, d]: (1, 2) sends token-local to head-local, (2, 1) the inverse.
///
/// `view`: rank 3..5, LayoutRight, float, double or mlacp::bf16 (moved as 2-byte elements), accessible from `space`.
/// Pack and unpack run as kernels on the instance `space`, which is fenced before MPI reads the send buffer; the result
/// is ready in `space`'s order after wait(). Like an MPI send buffer, `view` must not be written until wait(): where
/// its blocks are contiguous (nothing before `scatter_dim`, e.g. batch 1 with tokens scattered) MPI reads it directly,
/// without a pack, and the handle keeps it alive; likewise, where the received blocks are the result's layout (nothing
/// before `gather_dim`), MPI receives into the result without an unpack. P == 1 returns `view` itself (same allocation)
/// without communication. Errors (InvalidArgument, before anything is sent): a dimension out of range, gather_dim ==
/// scatter_dim, extent(scatter_dim) not divisible by P, and, in checked mode, ranks passing different shapes. A
/// second host thread launching while another thread is inside mlacp on the mesh's communicator gets UsageError
/// naming the rank (detail::EntryGuard, as the layer's forward and backward; the thread inside may launch itself).
///
/// `into` (optional): the destination of the result, a View of the result's shape (checked with the rest of the call)
/// that the collective writes instead of allocating one, so that a loop that owns its buffers allocates nothing. It
/// must not be the input's memory. P == 1 still returns `view` itself and leaves `into` untouched.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_to_all(const ExecSpace& space, const ViewType& view,
                                                                 int gather_dim, int scatter_dim, const Mesh& mesh,
                                                                 const std::string& name = "all_to_all",
                                                                 const collective_result_t<ViewType>& into = {}) {
  const detail::EntryGuard entry(mesh, "mlacp::launch_all_to_all '" + name + "'");
  auto p =
      detail::prologue<ExecSpace>(detail::CollectiveKind::all_to_all, view, gather_dim, scatter_dim, mesh, name, into);
  if (p.done) return std::move(*p.done);
  return detail::all_to_all_even(space, view, gather_dim, scatter_dim, mesh, name, into, p.call);
}

/// The uneven all-to-all (MPI_Ialltoallv; NCCL: grouped ncclSend/ncclRecv; nothing padded): `scatter` splits
/// `scatter_dim` (view.extent(scatter_dim) == scatter.total()) and block j, rows scatter.offset(j) ..
/// scatter.offset(j) + scatter.count(j) - 1, goes to rank j; `gather` describes the gathered dimension
/// (view.extent(gather_dim) == gather.count(rank)) and rank j's block lands at rows gather.offset(j) .. of the result.
/// The result has extent(gather_dim) = gather.total() and extent(scatter_dim) = scatter.count(rank). On [B, s_r, H,
/// d] with tokens split by `seq` and heads by `heads`: (1, 2, seq, heads) sends token-local to head-local, (2, 1,
/// heads, seq) the inverse. Counts may be 0. Both partitions need mesh.size() parts and must be the same on every
/// rank (checked mode verifies it, with the shapes); a View extent that does not match its partition, a partition of
/// another number of parts, or ranks passing different partitions raise InvalidArgument on every rank before
/// anything is sent. Uniform partitions take the even path. Otherwise as the even launch_all_to_all (in-place
/// send / receive, pooled buffers, `into`, P == 1 returns `view`).
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_to_all(const ExecSpace& space, const ViewType& view,
                                                                 int gather_dim, int scatter_dim,
                                                                 const Partition& gather, const Partition& scatter,
                                                                 const Mesh& mesh,
                                                                 const std::string& name = "all_to_all",
                                                                 const collective_result_t<ViewType>& into = {}) {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  const detail::EntryGuard entry(mesh, "mlacp::launch_all_to_all '" + name + "'");
  auto p = detail::prologue<ExecSpace>(detail::CollectiveKind::all_to_all, view, gather_dim, scatter_dim, mesh, name,
                                       into, &gather, &scatter);
  if (p.done) return std::move(*p.done);
  if (gather.uniform() && scatter.uniform())
    return detail::all_to_all_even(space, view, gather_dim, scatter_dim, mesh, name, into, p.call);

  compat::ScopedRegion region("mlacp::launch_all_to_all " + name);
  detail::CollectiveLaunch<T, MemSpace, Result> launch(name, p.call, detail::Operation::all_to_all);
  const detail::AroundDim scattered = detail::around_dim(view, scatter_dim);
  const auto sent = detail::scatter_send_v<T, MemSpace>(space, view, scattered, scatter, name);
  launch.result =
      detail::allocate_result(into, name, view, gather_dim, gather.total(), scatter_dim, scatter.count(mesh.rank()));
  const detail::AroundDim gathered = detail::around_dim(launch.result, gather_dim);
  const auto receive = detail::gather_receive_v<T, MemSpace>(space, launch.result, gathered, gather, name);
  launch.send_blocks = detail::peer_blocks(scatter, scattered.outer, scattered.inner);
  launch.recv_blocks = detail::peer_blocks(gather, gathered.outer, gathered.inner);
  return detail::all_to_all_start(space, view, mesh, std::move(launch), sent, receive);
}

/// launch_all_to_all with the payload moved as `codec` (wire/codecs.hpp): WireCodec::same is the plain collective;
/// another codec encodes `view` on `space` into a pooled staging buffer before the launch, moves the wire values, and
/// decodes them into the result (`into`, or a View it allocates) at wait(), on `space`. The handle keeps the staging
/// buffers; the recorded launch, wait and completion are the collective's own. P == 1 returns `view` (nothing
/// encoded). Beyond the plain collective's errors, InvalidArgument before anything is encoded or launched: a value
/// type the codec does not carry (bf16 and fp8_e4m3 carry float), and for a row-scaled codec (fp8_e4m3) a gathered
/// or scattered dimension that is the innermost one.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_to_all(const ExecSpace& space, const ViewType& view,
                                                                 int gather_dim, int scatter_dim, const Mesh& mesh,
                                                                 const std::string& name,
                                                                 const collective_result_t<ViewType>& into,
                                                                 WireCodec codec) {
  return detail::launch_coded<detail::CodecUse::move>(
      space, mesh, view, into, name, gather_dim, scatter_dim, codec, [&](const auto& v, const auto& r) {
        return launch_all_to_all(space, v, gather_dim, scatter_dim, mesh, name, r);
      });
}

/// The uneven launch_all_to_all with the payload moved as `codec` (as the even form's).
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_to_all(const ExecSpace& space, const ViewType& view,
                                                                 int gather_dim, int scatter_dim,
                                                                 const Partition& gather, const Partition& scatter,
                                                                 const Mesh& mesh, const std::string& name,
                                                                 const collective_result_t<ViewType>& into,
                                                                 WireCodec codec) {
  return detail::launch_coded<detail::CodecUse::move>(
      space, mesh, view, into, name, gather_dim, scatter_dim, codec, [&](const auto& v, const auto& r) {
        return launch_all_to_all(space, v, gather_dim, scatter_dim, gather, scatter, mesh, name, r);
      });
}

}  // namespace mlacp
