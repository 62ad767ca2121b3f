// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sequence all-gather: every rank gets the concatenation of all ranks' shards.
#pragma once

#include <mlacp/impl/launch.hpp>

namespace mlacp {

/// Launches an all-gather (MPI_Iallgather, or ncclAllGather) that concatenates the ranks' Views along `dim` in rank
/// order: the result's extent(dim) is P times the input's. The input is copied into a buffer the handle owns, so the
/// caller may reuse it at once. Requirements and errors as launch_all_to_all (without the divisibility check). P == 1
/// returns `view`. `into`: an optional destination of the result's shape, as for launch_all_to_all.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_gather(const ExecSpace& space, const ViewType& view, int dim,
                                                                 const Mesh& mesh,
                                                                 const std::string& name = "all_gather",
                                                                 const collective_result_t<ViewType>& into = {}) {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  auto p = impl::prologue<ExecSpace>(detail::CollectiveKind::all_gather, view, dim, -1, mesh, name, into);
  if (p.done) return std::move(*p.done);

  compat::ScopedRegion region("mlacp::launch_all_gather " + name);
  const int parts = mesh.size();
  impl::CollectiveLaunch<T, MemSpace, Result> launch(name, p.call, detail::Operation::all_gather);
  const auto send = detail::allocate_buffer<T, MemSpace>(space, name + " send", view.size());
  Kokkos::deep_copy(space, send.view,
                    Kokkos::View<T*, Kokkos::LayoutRight, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                        view.data(), view.size()));
  launch.result = impl::allocate_result(into, name, view, dim,
                                        static_cast<std::int64_t>(view.extent(static_cast<unsigned>(dim))) * parts);
  const auto receive =
      impl::gather_receive<T, MemSpace>(space, launch.result, detail::around_dim(view, dim), parts, name);
  launch.send = send.view;
  launch.recv = receive.buffer;
  launch.count = view.size();
  launch.finish = receive.unpack;
  launch.extend_lifetime(send);
  launch.extend_lifetime(receive.owner);
  return impl::start(space, mesh, std::move(launch));
}

}  // namespace mlacp
