// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sequence reduce-scatter: the adjoint of the all-gather.
#pragma once

#include <mlacp/detail/block_layout.hpp>
#include <mlacp/detail/launch.hpp>

namespace mlacp {

/// Launches a SUM reduce-scatter (MPI_Ireduce_scatter_block) along `dim`: the ranks' Views are summed and rank r
/// receives block r of the sum, extent(dim) / P wide. It is the adjoint of launch_all_gather along the same `dim`.
/// Requirements and errors as launch_all_to_all (extent(dim) must be divisible by P). P == 1 returns `view`.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_reduce_scatter(const ExecSpace& space, const ViewType& view,
                                                                     int dim, const Mesh& mesh,
                                                                     const std::string& name = "reduce_scatter") {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  detail::check_collective_types<ExecSpace, ViewType>();
  const detail::CollectiveCall call = detail::describe(detail::CollectiveKind::reduce_scatter, view, dim, -1);
  detail::validate_collective(mesh, call, name);
  const int parts = mesh.size();
  if (parts == 1) return AsyncCollective<Result>(name, nullptr, Result(view), {});

  compat::ScopedRegion region("mlacp::launch_reduce_scatter " + name);
  const auto n = static_cast<std::int64_t>(view.size());
  const auto send_buffer = detail::allocate_buffer<T, MemSpace>(name + " send", n);
  const auto send = send_buffer.view;
  Result result = detail::allocate_result(name, view, dim,
                                          static_cast<std::int64_t>(view.extent(static_cast<unsigned>(dim))) / parts);
  // The result is LayoutRight and contiguous: MPI (or the staging copy) writes it directly.
  detail::Buffer<T, MemSpace> recv(result.data(), static_cast<std::size_t>(n / parts));
  detail::pack_blocks(space, view.data(), send.data(), detail::around_dim(view, dim), parts, name + " pack");
  const int count = static_cast<int>(n / parts);
  const MPI_Comm comm = mesh.comm();
  auto start = [count, comm](const T* s, T* r, MPI_Request* request) {
    return MPI_Ireduce_scatter_block(s, r, count, mpi::datatype<T>(), MPI_SUM, comm, request);
  };
  auto unpack = [](const detail::Buffer<T, MemSpace>&) {};
  return detail::launch_transport(
      space, mesh, call, name, send, recv, [send_buffer] {}, static_cast<std::size_t>(count), result, start, unpack);
}

}  // namespace mlacp
