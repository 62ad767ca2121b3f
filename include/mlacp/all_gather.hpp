// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sequence all-gather: every rank gets the concatenation of all ranks' shards.
#pragma once

#include <mlacp/detail/launch.hpp>
#include <mlacp/wire/coded_collective.hpp>

namespace mlacp {

namespace detail {
/// The even all-gather after its prologue (also the uneven one's, when its partition is uniform).
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> all_gather_even(const ExecSpace& space, const ViewType& view, int dim,
                                                               const Mesh& mesh, const std::string& name,
                                                               const collective_result_t<ViewType>& into,
                                                               const detail::CollectiveCall& call) {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  compat::ScopedRegion region("mlacp::launch_all_gather " + name);
  const int parts = mesh.size();
  detail::CollectiveLaunch<T, MemSpace, Result> launch(name, call, detail::Operation::all_gather);
  const auto send = detail::allocate_buffer<T, MemSpace>(space, name + " send", view.size());
  Kokkos::deep_copy(space, send.view, detail::Vector<T, MemSpace, detail::Unmanaged>(view.data(), view.size()));
  launch.result = detail::allocate_result(into, name, view, dim,
                                          static_cast<std::int64_t>(view.extent(static_cast<unsigned>(dim))) * parts);
  const auto receive =
      detail::gather_receive<T, MemSpace>(space, launch.result, detail::around_dim(view, dim), parts, name);
  launch.send = send.view;
  launch.recv = receive.buffer;
  launch.count = view.size();
  launch.finish = receive.unpack;
  launch.extend_lifetime(send);
  launch.extend_lifetime(receive.owner);
  return detail::start(space, mesh, std::move(launch));
}

}  // namespace detail

/// Launches an all-gather (MPI_Iallgather, or ncclAllGather) that concatenates the ranks' Views along `dim` in rank
/// order: the result's extent(dim) is P times the input's. The input is copied into a buffer the handle owns, so the
/// caller may reuse it at once. Requirements and errors as launch_all_to_all (without the divisibility check). P == 1
/// returns `view`. `into`: an optional destination of the result's shape, as for launch_all_to_all.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_gather(const ExecSpace& space, const ViewType& view, int dim,
                                                                 const Mesh& mesh,
                                                                 const std::string& name = "all_gather",
                                                                 const collective_result_t<ViewType>& into = {}) {
  const detail::EntryGuard entry(mesh, "mlacp::launch_all_gather '" + name + "'");
  auto p = detail::prologue<ExecSpace>(detail::CollectiveKind::all_gather, view, dim, -1, mesh, name, into);
  if (p.done) return std::move(*p.done);
  return detail::all_gather_even(space, view, dim, mesh, name, into, p.call);
}

/// The uneven all-gather (MPI_Iallgatherv; NCCL: one ncclBroadcast per root in a group; nothing padded): rank r
/// passes view.extent(dim) == part.count(r), and the result, extent(dim) = part.total(), holds rank j's View at rows
/// part.offset(j) .. part.offset(j) + part.count(j) - 1. Counts may be 0. The partition needs mesh.size() parts and
/// must be the same on every rank; the errors of launch_all_to_all's uneven form apply. A uniform partition takes the
/// even path. P == 1 returns `view`; `into` as for launch_all_to_all. It is the adjoint of the uneven
/// launch_reduce_scatter with the same partition.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_gather(const ExecSpace& space, const ViewType& view, int dim,
                                                                 const Partition& part, const Mesh& mesh,
                                                                 const std::string& name = "all_gather",
                                                                 const collective_result_t<ViewType>& into = {}) {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  const detail::EntryGuard entry(mesh, "mlacp::launch_all_gather '" + name + "'");
  auto p = detail::prologue<ExecSpace>(detail::CollectiveKind::all_gather, view, dim, -1, mesh, name, into, &part);
  if (p.done) return std::move(*p.done);
  if (part.uniform()) return detail::all_gather_even(space, view, dim, mesh, name, into, p.call);

  compat::ScopedRegion region("mlacp::launch_all_gather " + name);
  detail::CollectiveLaunch<T, MemSpace, Result> launch(name, p.call, detail::Operation::all_gather);
  const auto send = detail::allocate_buffer<T, MemSpace>(space, name + " send", view.size());
  Kokkos::deep_copy(space, send.view, detail::Vector<T, MemSpace, detail::Unmanaged>(view.data(), view.size()));
  launch.result = detail::allocate_result(into, name, view, dim, part.total());
  const detail::AroundDim gathered = detail::around_dim(launch.result, dim);
  const auto receive = detail::gather_receive_v<T, MemSpace>(space, launch.result, gathered, part, name);
  launch.send = send.view;
  launch.recv = receive.buffer;
  launch.recv_blocks = detail::peer_blocks(part, gathered.outer, gathered.inner);
  launch.finish = receive.unpack;
  launch.extend_lifetime(send);
  launch.extend_lifetime(receive.owner);
  return detail::start(space, mesh, std::move(launch));
}

/// launch_all_gather with the payload moved as `codec` (wire/codecs.hpp; as launch_all_to_all's codec form: encoded
/// into a pooled buffer before the launch, decoded into the result at wait(); a row-scaled codec refuses `dim` being
/// the innermost dimension).
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_gather(const ExecSpace& space, const ViewType& view, int dim,
                                                                 const Mesh& mesh, const std::string& name,
                                                                 const collective_result_t<ViewType>& into,
                                                                 WireCodec codec) {
  return detail::launch_coded<detail::CodecUse::move>(
      space, mesh, view, into, name, dim, -1, codec,
      [&](const auto& v, const auto& r) { return launch_all_gather(space, v, dim, mesh, name, r); });
}

/// The uneven launch_all_gather with the payload moved as `codec`.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_gather(const ExecSpace& space, const ViewType& view, int dim,
                                                                 const Partition& part, const Mesh& mesh,
                                                                 const std::string& name,
                                                                 const collective_result_t<ViewType>& into,
                                                                 WireCodec codec) {
  return detail::launch_coded<detail::CodecUse::move>(
      space, mesh, view, into, name, dim, -1, codec,
      [&](const auto& v, const auto& r) { return launch_all_gather(space, v, dim, part, mesh, name, r); });
}

}  // namespace mlacp
