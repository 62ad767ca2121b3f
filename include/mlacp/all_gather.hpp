// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sequence all-gather: every rank gets the concatenation of all ranks' shards.
#pragma once

#include <mlacp/detail/block_layout.hpp>
#include <mlacp/detail/launch.hpp>

namespace mlacp {

/// Launches an all-gather (MPI_Iallgather) that concatenates the ranks' Views along `dim` in rank order: the result's
/// extent(dim) is P times the input's. The input is copied into a buffer the handle owns, so the caller may reuse it
/// at once. Requirements and errors as launch_all_to_all (without the divisibility check). P == 1 returns `view`.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_gather(const ExecSpace& space, const ViewType& view, int dim,
                                                                 const Mesh& mesh,
                                                                 const std::string& name = "all_gather") {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  detail::check_collective_types<ExecSpace, ViewType>();
  const detail::CollectiveCall call = detail::describe(detail::CollectiveKind::all_gather, view, dim, -1);
  detail::validate_collective(mesh, call, name);
  const int parts = mesh.size();
  if (parts == 1) return AsyncCollective<Result>(name, nullptr, Result(view), {});

  compat::ScopedRegion region("mlacp::launch_all_gather " + name);
  const auto n = static_cast<std::int64_t>(view.size());
  const auto send_buffer = detail::allocate_buffer<T, MemSpace>(name + " send", n);
  const auto send = send_buffer.view;
  Kokkos::deep_copy(space, send,
                    Kokkos::View<T*, Kokkos::LayoutRight, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                        view.data(), static_cast<std::size_t>(n)));
  Result result = detail::allocate_result(name, view, dim,
                                          static_cast<std::int64_t>(view.extent(static_cast<unsigned>(dim))) * parts);
  const detail::AroundDim received = detail::around_dim(view, dim);
  const auto receive = detail::gather_receive<T, MemSpace>(result, received, parts, name);
  const int count = static_cast<int>(n);
  const MPI_Comm comm = mesh.comm();
  auto start = [count, comm](const T* s, T* r, MPI_Request* request) {
    return MPI_Iallgather(s, count, mpi::datatype<T>(), r, count, mpi::datatype<T>(), comm, request);
  };
  auto unpack = detail::gather_unpack<ExecSpace, T, MemSpace>(space, result, received, parts, name, receive.in_place);
  return detail::launch_transport(
      space, mesh, call, name, send, receive.buffer, [send_buffer, receive] {}, static_cast<std::size_t>(count), result,
      start, unpack);
}

}  // namespace mlacp
