// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sequence reduce-scatter: the adjoint of the all-gather.
#pragma once

#include <mlacp/detail/block_layout.hpp>
#include <mlacp/detail/launch.hpp>

#include <memory>
#include <vector>

namespace mlacp {

/// Launches a SUM reduce-scatter along `dim`: the ranks' Views are summed and rank r receives block r of the sum,
/// extent(dim) / P wide. It is the adjoint of launch_all_gather along the same `dim`. Over MPI the algorithm is the
/// mesh's reduce_scatter_algorithm(): pairwise (default: the blocks exchanged with MPI_Ialltoallv, this rank's own
/// not copied, then the P blocks summed in rank order at wait()) or mpi (MPI_Ireduce_scatter_block); over NCCL,
/// ncclReduceScatter. As for launch_all_to_all, `view` must not be written until wait() (where its blocks are
/// contiguous MPI reads it directly). Requirements and errors as launch_all_to_all (extent(dim) must be divisible by
/// P). P == 1 returns `view`.
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
  const auto sent = detail::scatter_send<T, MemSpace>(space, view.data(), detail::around_dim(view, dim), parts, name);
  Result result = detail::allocate_result(name, view, dim,
                                          static_cast<std::int64_t>(view.extent(static_cast<unsigned>(dim))) / parts);
  const int count = static_cast<int>(n / parts);
  const MPI_Comm comm = mesh.comm();
  // The result is LayoutRight and contiguous: MPI, NCCL or the staging copy write it directly, or the block sum does.
  detail::Buffer<T, MemSpace> result_buffer(result.data(), static_cast<std::size_t>(count));
  if (mesh.reduce_scatter_algorithm() == ReduceScatterAlgorithm::mpi || detail::uses_nccl<ExecSpace>(mesh)) {
    auto start = [count, comm](const T* s, T* r, MPI_Request* request) {
      return MPI_Ireduce_scatter_block(s, r, count, mpi::datatype<T>(), MPI_SUM, comm, request);
    };
    auto nothing = [](const detail::Buffer<T, MemSpace>&) {};
    return detail::launch_transport(
        space, mesh, call, name, sent.buffer, result_buffer, [sent, view] {}, static_cast<std::size_t>(count), result,
        start, nothing);
  }
  // Pairwise: every block but this rank's own travels (MPI_Ialltoallv with a zero count to itself, so that MPI copies
  // nothing locally); the sum reads the own block where it is sent from. Counts and displacements are in blocks (a
  // contiguous type of `count` values), so that only the per-block count has to fit an int, as validated; the arrays
  // live until the wait.
  const int me = mesh.rank();
  auto counts = std::make_shared<std::vector<int>>(static_cast<std::size_t>(parts), 1);
  auto displacements = std::make_shared<std::vector<int>>(static_cast<std::size_t>(parts), 0);
  (*counts)[static_cast<std::size_t>(me)] = 0;
  for (int r = 0; r < parts; ++r) (*displacements)[static_cast<std::size_t>(r)] = r;
  const auto received = detail::allocate_buffer<T, MemSpace>(name + " recv", n);
  auto start = [counts, displacements, count, comm](const T* s, T* r, MPI_Request* request) {
    MPI_Datatype block = MPI_DATATYPE_NULL;
    int rc = MPI_Type_contiguous(count, mpi::datatype<T>(), &block);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&block);
    if (rc == MPI_SUCCESS)
      rc = MPI_Ialltoallv(s, counts->data(), displacements->data(), block, r, counts->data(), displacements->data(),
                          block, comm, request);
    if (block != MPI_DATATYPE_NULL) MPI_Type_free(&block);  // freed once the pending exchange no longer needs it
    return rc;
  };
  const T* own = sent.buffer.data() + static_cast<std::ptrdiff_t>(me) * count;
  auto sum = [space, result_buffer, own, me, count, parts, name](const detail::Buffer<T, MemSpace>& r) {
    detail::sum_blocks(space, r.data(), own, me, result_buffer.data(), count, parts, name + " sum");
  };
  return detail::launch_transport(
      space, mesh, call, name, sent.buffer, received.view, [sent, received, view, counts, displacements] {},
      static_cast<std::size_t>(count), result, start, sum);
}

}  // namespace mlacp
