// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The Ulysses layout exchange: sequence-sharded <-> head-sharded.
#pragma once

#include <mlacp/detail/block_layout.hpp>
#include <mlacp/detail/launch.hpp>

namespace mlacp {

/// Launches an all-to-all that gathers `gather_dim` (its extent grows by P) and scatters `scatter_dim` (its extent
/// shrinks by P), with the semantics of hyper_parallel's async_ulysses_seq_to_head_launch: `scatter_dim` is split into
/// P contiguous blocks, block j goes to rank j, and the received blocks are concatenated along `gather_dim` in rank
/// order. On [B, S, H, d]: (1, 2) sends token-local to head-local, (2, 1) the inverse.
///
/// `view`: rank 3..5, LayoutRight, float or double, accessible from `space`. Pack and unpack run as kernels on the
/// instance `space`, which is fenced before MPI reads the send buffer; the result is ready in `space`'s order after
/// wait(). Like an MPI send buffer, `view` must not be written until wait(): where its blocks are contiguous (nothing
/// before `scatter_dim`, e.g. batch 1 with tokens scattered) MPI reads it directly, without a pack, and the handle
/// keeps it alive; likewise, where the received blocks are the result's layout (nothing before `gather_dim`), MPI
/// receives into the result without an unpack. P == 1 returns `view` itself (same allocation) without communication.
/// Errors (InvalidArgument, before anything is sent): a dimension out of range, gather_dim == scatter_dim,
/// extent(scatter_dim) not divisible by P, and, in checked mode, ranks passing different shapes.
template <class ExecSpace, class ViewType>
AsyncCollective<collective_result_t<ViewType>> launch_all_to_all(const ExecSpace& space, const ViewType& view,
                                                                 int gather_dim, int scatter_dim, const Mesh& mesh,
                                                                 const std::string& name = "all_to_all") {
  using T = typename ViewType::non_const_value_type;
  using MemSpace = typename ViewType::memory_space;
  using Result = collective_result_t<ViewType>;
  detail::check_collective_types<ExecSpace, ViewType>();
  const detail::CollectiveCall call =
      detail::describe(detail::CollectiveKind::all_to_all, view, gather_dim, scatter_dim);
  detail::validate_collective(mesh, call, name);
  const int parts = mesh.size();
  if (parts == 1) return AsyncCollective<Result>(name, nullptr, Result(view), {});

  compat::ScopedRegion region("mlacp::launch_all_to_all " + name);
  const auto n = static_cast<std::int64_t>(view.size());
  const auto sent =
      detail::scatter_send<T, MemSpace>(space, view.data(), detail::around_dim(view, scatter_dim), parts, name);
  Result result =
      detail::allocate_result(name, view, gather_dim, static_cast<std::int64_t>(view.extent(gather_dim)) * parts,
                              scatter_dim, static_cast<std::int64_t>(view.extent(scatter_dim)) / parts);
  detail::AroundDim received = detail::around_dim(result, gather_dim);
  received.mid /= parts;
  const auto receive = detail::gather_receive<T, MemSpace>(result, received, parts, name);
  const int count = static_cast<int>(n / parts);
  const MPI_Comm comm = mesh.comm();
  auto start = [count, comm](const T* s, T* r, MPI_Request* request) {
    return MPI_Ialltoall(s, count, mpi::datatype<T>(), r, count, mpi::datatype<T>(), comm, request);
  };
  auto unpack = detail::gather_unpack<ExecSpace, T, MemSpace>(space, result, received, parts, name, receive.in_place);
  return detail::launch_transport(
      space, mesh, call, name, sent.buffer, receive.buffer, [sent, receive, view] {}, static_cast<std::size_t>(count),
      result, start, unpack);
}

}  // namespace mlacp
