// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sequence reduce-scatter: the adjoint of the all-gather.
#pragma once

#include <mlacp/impl/launch.hpp>

#include <cstddef>

namespace mlacp {

/// Launches a SUM reduce-scatter along `dim`: the ranks' Views are summed and rank r receives block r of the sum,
/// extent(dim) / P wide. It is the adjoint of launch_all_gather along the same `dim`. Over MPI the algorithm is the
/// mesh's reduce_scatter_algorithm(): pairwise (default: the blocks exchanged with MPI_Ialltoallv, this rank's own
/// not copied, then the P blocks summed in rank order at wait()) or mpi (MPI_Ireduce_scatter_block); over NCCL,
/// ncclReduceScatter. As for launch_all_to_all, `view` must not be written until wait() (where its blocks are
/// contiguous MPI reads it directly). Requirements and errors as launch_all_to_all (extent(dim) must be divisible by
/// P). P == 1 returns `view`. `into`: an optional destination of the result's shape, as for launch_all_to_all.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_reduce_scatter(const ExecSpace& space, const ViewType& view,
                                                                     int dim, const Mesh& mesh,
                                                                     const std::string& name = "reduce_scatter",
                                                                     const collective_result_t<ViewType>& into = {}) {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  auto p = impl::prologue<ExecSpace>(detail::CollectiveKind::reduce_scatter, view, dim, -1, mesh, name, into);
  if (p.done) return std::move(*p.done);

  compat::ScopedRegion region("mlacp::launch_reduce_scatter " + name);
  const int parts = mesh.size();
  impl::CollectiveLaunch<T, MemSpace, Result> launch(name, p.call, detail::Operation::reduce_scatter_sum);
  const auto sent = impl::scatter_send<T, MemSpace>(space, view, detail::around_dim(view, dim), parts, name);
  launch.result = impl::allocate_result(into, name, view, dim,
                                        static_cast<std::int64_t>(view.extent(static_cast<unsigned>(dim))) / parts);
  const std::size_t count = view.size() / static_cast<std::size_t>(parts);
  launch.send = sent.buffer;
  launch.count = count;
  launch.extend_lifetime(view);  // read in place by the transport, or by the pack kernel queued on `space`
  launch.extend_lifetime(sent.owner);
  // The result is LayoutRight and contiguous: the backend's reduce-scatter writes it directly, or the block sum does.
  const detail::Buffer<T, MemSpace> result_buffer(launch.result.data(), count);
  if (detail::TransportFor<ExecSpace>::reduces_natively(mesh)) {
    launch.recv = result_buffer;
    return impl::start(space, mesh, std::move(launch));
  }
  // Pairwise: every block but this rank's own travels; the sum reads the own block where it is sent from.
  launch.operation = detail::Operation::exchange_blocks;
  const auto received = detail::allocate_buffer<T, MemSpace>(space, name + " recv", view.size());
  launch.recv = received.view;
  launch.extend_lifetime(received);
  const int me = mesh.rank();
  const T* own = sent.buffer.data() + static_cast<std::ptrdiff_t>(me) * static_cast<std::ptrdiff_t>(count);
  const T* blocks = received.view.data();
  T* out = result_buffer.data();
  launch.finish = [space, blocks, own, me, out, count, parts, name]() {
    detail::sum_blocks(space, blocks, own, me, out, static_cast<std::int64_t>(count), parts, name + " sum");
  };
  return impl::start(space, mesh, std::move(launch));
}

}  // namespace mlacp
