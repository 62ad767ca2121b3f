// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sequence reduce-scatter: the adjoint of the all-gather.
#pragma once

#include <mlacp/detail/launch.hpp>
#include <mlacp/detail/running_block_sum.hpp>
#include <mlacp/wire/coded_collective.hpp>

#include <cstddef>
#include <memory>

namespace mlacp {

namespace detail {
/// What the even and uneven reduce-scatter share once their send side is described (launch.send's blocks: launch.count
/// even, launch.send_blocks uneven): the transport reads `sent`, and `view` when sent in place; the result (`count`
/// values, LayoutRight and contiguous) is written directly by the backend's own reduce-scatter or, pairwise, by the
/// sum of the blocks exchanged, in rank order, each run of them added as it arrives (RunningBlockSum). Pairwise, rank
/// i's block for this rank arrives at i * count (the same `count` on every rank), and this rank's own block, at
/// `own_offset` in the send buffer, is neither sent nor copied: the sum reads it where it is sent from.
template <class ExecSpace, class ViewType, class T, class MemSpace, class Result>
AsyncCollective<Result> reduce_scatter_start(const ExecSpace& space, const ViewType& view, const Mesh& mesh,
                                             CollectiveLaunch<T, MemSpace, Result>&& launch,
                                             const ScatterSend<T, MemSpace>& sent, std::size_t count,
                                             std::size_t own_offset) {
  launch.send = sent.buffer;
  launch.extend_lifetime(view);  // read in place by the transport, or by the pack kernel queued on `space`
  launch.extend_lifetime(sent.owner);
  const detail::Vector<T, MemSpace> result_buffer(launch.result.data(), count);
  if (Backend<ExecSpace>::Transport::reduces_natively(mesh)) {
    launch.recv = result_buffer;
    return detail::start(space, mesh, std::move(launch));
  }
  const int parts = mesh.size();
  const int me = mesh.rank();
  launch.operation = detail::Operation::exchange_blocks;
  const auto received =
      detail::allocate_buffer<T, MemSpace>(space, launch.name + " recv", count * static_cast<std::size_t>(parts));
  launch.recv = received.view;
  if (!launch.send_blocks.empty()) {  // uneven: the receive side as blocks too (all `count` values)
    for (int i = 0; i < parts; ++i) {
      launch.recv_blocks.counts.push_back(count);
      launch.recv_blocks.offsets.push_back(static_cast<std::size_t>(i) * count);
    }
  }
  launch.extend_lifetime(received);
  // The blocks are summed as the transport reports them (block_arrived: while this rank waits for later ones), the rest
  // by finish.
  auto sum = std::make_shared<detail::RunningBlockSum<ExecSpace, T>>(
      space, received.view.data(), sent.buffer.data() + own_offset, me, result_buffer.data(),
      static_cast<std::int64_t>(count), parts, launch.name + " sum");
  launch.block_arrived = [sum](int peer) { sum->arrived(peer); };
  launch.finish = [sum]() { sum->complete(); };
  return detail::start(space, mesh, std::move(launch));
}

/// The even reduce-scatter after its prologue (also the uneven one's, when its partition is uniform).
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> reduce_scatter_even(const ExecSpace& space, const ViewType& view,
                                                                   int dim, const Mesh& mesh, const std::string& name,
                                                                   const collective_result_t<ViewType>& into,
                                                                   const detail::CollectiveCall& call) {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  compat::ScopedRegion region("mlacp::launch_reduce_scatter " + name);
  const int parts = mesh.size();
  detail::CollectiveLaunch<T, MemSpace, Result> launch(name, call, detail::Operation::reduce_scatter_sum);
  const auto sent = detail::scatter_send<T, MemSpace>(space, view, detail::around_dim(view, dim), parts, name);
  launch.result = detail::allocate_result(into, name, view, dim,
                                          static_cast<std::int64_t>(view.extent(static_cast<unsigned>(dim))) / parts);
  const std::size_t count = view.size() / static_cast<std::size_t>(parts);
  launch.count = count;
  return reduce_scatter_start(space, view, mesh, std::move(launch), sent, count,
                              static_cast<std::size_t>(mesh.rank()) * count);
}

}  // namespace detail

/// Launches a SUM reduce-scatter along `dim`: the ranks' Views are summed and rank r receives block r of the sum,
/// extent(dim) / P wide. It is the adjoint of launch_all_gather along the same `dim`. Over MPI the algorithm is the
/// mesh's reduce_scatter_algorithm(): pairwise (default: one message per peer block, this rank's own not copied,
/// and the P blocks summed in rank order: in wait(), the blocks that are in while another is still in flight, so that
/// the sum proceeds while the rank waits, and the rest in one pass once all are in; bit for bit the same sum whatever
/// the order of arrival) or mpi
/// (MPI_Ireduce_scatter_block); over NCCL, ncclReduceScatter. bf16 is summed in float (pairwise: the blocks widened and
/// added in rank order; NCCL: widened and reduced in ncclFloat32) and rounded once; MPI has no bf16 sum, so a bf16 View
/// with the mpi algorithm raises InvalidArgument on every rank before anything is sent (at P == 1 too). As for
/// launch_all_to_all, `view` must not be written until wait() (where its blocks are contiguous MPI reads it directly).
/// Requirements and errors as launch_all_to_all (extent(dim) must be divisible by P). P == 1 returns `view`. `into`: an
/// optional destination of the result's shape, as for launch_all_to_all.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_reduce_scatter(const ExecSpace& space, const ViewType& view,
                                                                     int dim, const Mesh& mesh,
                                                                     const std::string& name = "reduce_scatter",
                                                                     const collective_result_t<ViewType>& into = {}) {
  static_assert(detail::is_summed_value_v<typename ViewType::non_const_value_type>,
                "mlacp::launch_reduce_scatter sums Views of float, double or mlacp::bf16");
  const detail::EntryGuard entry(mesh, "mlacp::launch_reduce_scatter '" + name + "'");
  auto p = detail::prologue<ExecSpace>(detail::CollectiveKind::reduce_scatter, view, dim, -1, mesh, name, into);
  if (p.done) return std::move(*p.done);
  return detail::reduce_scatter_even(space, view, dim, mesh, name, into, p.call);
}

/// The uneven SUM reduce-scatter: every rank passes view.extent(dim) == part.total(); the ranks' Views are summed and
/// rank r receives rows part.offset(r) .. part.offset(r) + part.count(r) - 1 of the sum (extent(dim) =
/// part.count(r), possibly 0). It is the adjoint of the uneven launch_all_gather with the same partition. Over MPI
/// the mesh's reduce_scatter_algorithm(): pairwise (one message per peer block, this rank's own not copied, the P
/// blocks summed in rank order as they arrive) or mpi (MPI_Ireduce_scatter with the partition's counts); over NCCL,
/// one ncclReduce per root in a group. Nothing is padded. The partition needs mesh.size() parts and must be the
/// same on every rank; the errors of launch_all_to_all's uneven form apply. A uniform partition takes the even path.
/// P == 1 returns `view`; `into` as for launch_all_to_all; bf16 as for the even form.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_reduce_scatter(const ExecSpace& space, const ViewType& view,
                                                                     int dim, const Partition& part, const Mesh& mesh,
                                                                     const std::string& name = "reduce_scatter",
                                                                     const collective_result_t<ViewType>& into = {}) {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  static_assert(detail::is_summed_value_v<typename ViewType::non_const_value_type>,
                "mlacp::launch_reduce_scatter sums Views of float, double or mlacp::bf16");
  const detail::EntryGuard entry(mesh, "mlacp::launch_reduce_scatter '" + name + "'");
  auto p = detail::prologue<ExecSpace>(detail::CollectiveKind::reduce_scatter, view, dim, -1, mesh, name, into, &part);
  if (p.done) return std::move(*p.done);
  if (part.uniform()) return detail::reduce_scatter_even(space, view, dim, mesh, name, into, p.call);

  compat::ScopedRegion region("mlacp::launch_reduce_scatter " + name);
  const int me = mesh.rank();
  detail::CollectiveLaunch<T, MemSpace, Result> launch(name, p.call, detail::Operation::reduce_scatter_sum);
  const detail::AroundDim scattered = detail::around_dim(view, dim);
  const auto sent = detail::scatter_send_v<T, MemSpace>(space, view, scattered, part, name);
  launch.result = detail::allocate_result(into, name, view, dim, part.count(me));
  launch.send_blocks = detail::peer_blocks(part, scattered.outer, scattered.inner);
  const auto count = static_cast<std::size_t>(scattered.outer * part.count(me) * scattered.inner);
  const std::size_t own_offset = launch.send_blocks.offsets[static_cast<std::size_t>(me)];
  return detail::reduce_scatter_start(space, view, mesh, std::move(launch), sent, count, own_offset);
}

/// launch_reduce_scatter with the partial sums moved as `codec` (wire/codecs.hpp): same, or bf16 (each rank's
/// partial sums rounded into bf16 before the launch, summed in float by the transport, the sum rounded into bf16 and
/// widened into the float result at wait()). A codec that cannot sum (fp8_e4m3: a scaled 8-bit format cannot be added
/// without widening at every hop) raises InvalidArgument before anything is encoded or launched.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_reduce_scatter(const ExecSpace& space, const ViewType& view,
                                                                     int dim, const Mesh& mesh, const std::string& name,
                                                                     const collective_result_t<ViewType>& into,
                                                                     WireCodec codec) {
  return detail::launch_coded<detail::CodecUse::sum>(
      space, mesh, view, into, name, dim, -1, codec,
      [&](const auto& v, const auto& r) { return launch_reduce_scatter(space, v, dim, mesh, name, r); });
}

/// The uneven launch_reduce_scatter with the partial sums moved as `codec`.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_reduce_scatter(const ExecSpace& space, const ViewType& view,
                                                                     int dim, const Partition& part, const Mesh& mesh,
                                                                     const std::string& name,
                                                                     const collective_result_t<ViewType>& into,
                                                                     WireCodec codec) {
  return detail::launch_coded<detail::CodecUse::sum>(
      space, mesh, view, into, name, dim, -1, codec,
      [&](const auto& v, const auto& r) { return launch_reduce_scatter(space, v, dim, part, mesh, name, r); });
}

}  // namespace mlacp
