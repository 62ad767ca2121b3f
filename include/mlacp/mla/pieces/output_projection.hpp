// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The output projection piece: head-to-token all-to-all of the attention output, then o_proj; its backward overlaps
// the token-to-head all-to-all of the output gradient with the o_proj weight gradient.
#pragma once

#include <mlacp/all_to_all.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/detail/wire.hpp>
#include <mlacp/mla/kernels/detail/linear.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/partition.hpp>
#include <mlacp/view_types.hpp>

namespace mlacp {

/// One forward invocation of the output projection and its backward (the reference's _OutputProjection).
template <class T, class ExecSpace>
class OutputProjection {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using tensor3 = detail::Tensor3<T, memory_space>;
  using tensor4 = detail::Tensor4<T, memory_space>;
  using tensor5 = detail::Tensor5<T, memory_space>;
  using matrix = detail::Matrix<T, memory_space>;
  using vector = detail::Vector<T, memory_space>;
  /// The bf16 buffers of a collective on the wire (MlaConfig::wire_dtype; wire.hpp), owned by the caller.
  using wire4 = detail::WireSlot<tensor4>;
  using wire5 = detail::WireSlot<tensor5>;
  /// The weight gradients' Views: in T's accumulation type (float for bf16: the layer's float gradients).
  using gradient_matrix = detail::Matrix<compat::accumulation_t<T>, memory_space>;
  using gradient_vector = detail::Vector<compat::accumulation_t<T>, memory_space>;

  /// attention_output [B, S, h, dv] (head-local) -> y [B, s, D]: launches the head-to-token all-to-all (tokens split by
  /// `seq`, heads by `heads`; both outlive the invocation: the layer's), waits, flattens
  /// the heads and applies w_o [D, H*dv] (+ b_o, when not empty). Saves what backward needs. `y_out` [B, s, D]: where
  /// y is written (a layer's workspace); empty: allocated. `local_out` [B, s, H, dv]: where the all-to-all's result
  /// (kept for the w_o gradient) goes; empty: allocated. `wire` (float only): the all-to-all moves bf16 through these
  /// buffers, widened into `local_out` at the wait (wire.hpp); null: it moves T.
  tensor3 forward(const ExecSpace& space, const tensor4& attention_output, const matrix& w_o, const vector& b_o,
                  const Mesh& mesh, const Partition& seq, const Partition& heads, tensor3 y_out = {},
                  const tensor4& local_out = {}, wire4* wire = nullptr) {
    return forward_impl(space, attention_output, w_o, b_o, mesh, &seq, &heads, std::move(y_out), local_out, wire);
  }
  /// The even split (S and H divisible by the group size).
  tensor3 forward(const ExecSpace& space, const tensor4& attention_output, const matrix& w_o, const vector& b_o,
                  const Mesh& mesh, tensor3 y_out = {}, const tensor4& local_out = {}, wire4* wire = nullptr) {
    return forward_impl(space, attention_output, w_o, b_o, mesh, nullptr, nullptr, std::move(y_out), local_out, wire);
  }

 private:
  tensor3 forward_impl(const ExecSpace& space, const tensor4& attention_output, const matrix& w_o, const vector& b_o,
                       const Mesh& mesh, const Partition* seq, const Partition* heads, tensor3 y_out,
                       const tensor4& local_out, wire4* wire) {
    if (forwarded_) throw UsageError("mlacp::OutputProjection: forward called twice on the same invocation");
    auto local = detail::launch_wire(space, attention_output, local_out, wire, names::o_a2a,
                                     [&](const auto& view, const auto& result) {
                                       return seq == nullptr
                                                  ? launch_all_to_all(space, view, 2, 1, mesh, names::o_a2a, result)
                                                  : launch_all_to_all(space, view, 2, 1, *heads, *seq, mesh,
                                                                      names::o_a2a, result);
                                     })
                     .wait();  // [B, s, H, dv]
    const auto B = static_cast<std::int64_t>(local.extent(0)), s = static_cast<std::int64_t>(local.extent(1));
    const auto Hdv = static_cast<std::int64_t>(local.extent(2) * local.extent(3));
    tensor3 y = y_out.data() != nullptr
                    ? y_out
                    : tensor3(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::y"), B, s, w_o.extent(0));
    {
      detail::ComputePhase<ExecSpace> phase(space, names::w_o_fprop);
      detail::linear_forward(space, detail::as_matrix(local, B * s, Hdv), w_o, b_o,
                             detail::as_matrix(y, B * s, static_cast<std::int64_t>(w_o.extent(0))));
    }
    local_output_ = local;
    w_o_ = w_o;
    mesh_ = &mesh;
    seq_ = seq;
    heads_ = heads;
    forwarded_ = true;
    return y;
  }

 public:
  /// dy [B, s, D] -> the head-local gradient of the attention output [B, S, h, dv] (empty when not
  /// `needs_attention_grad`). Order: dgrad (dy w_o, written per destination rank), launch the token-to-head all-to-all
  /// of it ("dO a2a"), the weight gradient dw_o += dy^T o (progressing the all-to-all between panels, see progress.hpp)
  /// and db_o += column sums of dy while it is in flight, then wait. dw_o / db_o empty: not needed (skipped). `overlap`
  /// false: wait right after the launch. `blocks` [P, B, s, h, dv] ([1, B, s, H, dv] when the heads are split
  /// unevenly: dO is sent as one token-local block and the all-to-all scatters its heads): where dO is written before
  /// it is sent (a layer's workspace; read by the collective until the wait); empty: allocated. `received` [1, B, S, h,
  /// dv]: where the all-to-all's result goes; empty: allocated. `wire`: as forward's (dO is rounded from `blocks`).
  tensor4 backward(const ExecSpace& space, const tensor3& dy, bool needs_attention_grad, const gradient_matrix& dw_o,
                   const gradient_vector& db_o, bool overlap = true, tensor5 blocks = {}, const tensor5& received = {},
                   wire5* wire = nullptr) {
    if (!forwarded_) throw UsageError("mlacp::OutputProjection: backward before forward");
    if (backwarded_) throw UsageError("mlacp::OutputProjection: a second backward of the same forward");
    backwarded_ = true;
    const auto B = static_cast<std::int64_t>(dy.extent(0)), s = static_cast<std::int64_t>(dy.extent(1));
    const auto D = static_cast<std::int64_t>(dy.extent(2));
    const auto H = static_cast<std::int64_t>(local_output_.extent(2)),
               dv = static_cast<std::int64_t>(local_output_.extent(3));
    const auto dy2 = detail::as_matrix(dy, B * s, D);
    detail::WireCollective<ExecSpace, tensor5> grad_a2a;
    if (needs_attention_grad) {
      // dO is written directly in the all-to-all's send layout, [P, B, s, h, dv]: block j (rank j's heads) is the dgrad
      // through w_o's columns of those heads, so no pack runs between the dgrad and the launch. Scattering dim 0 sends
      // each block as it is; gathering the tokens (dim 2) receives in place when B == 1.
      // Uneven heads: one block of all heads, whose head dimension the all-to-all scatters by the head partition.
      const bool even = heads_ == nullptr || heads_->uniform();
      const auto P = even ? static_cast<std::int64_t>(mesh_->size()) : std::int64_t(1), h = H / P;
      if (blocks.data() == nullptr)
        blocks = tensor5(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::dO blocks"), P, B, s, h, dv);
      {
        detail::ComputePhase<ExecSpace> phase(space, names::w_o_dgrad);
        for (std::int64_t j = 0; j < P; ++j) {
          const auto columns =
              std::make_pair(static_cast<std::size_t>(j * h * dv), static_cast<std::size_t>((j + 1) * h * dv));
          detail::linear_dgrad(space, dy2, Kokkos::subview(w_o_, Kokkos::ALL(), columns), T(0),
                               detail::Matrix<T, memory_space, detail::Unmanaged>(blocks.data() + j * B * s * h * dv,
                                                                                  static_cast<std::size_t>(B * s),
                                                                                  static_cast<std::size_t>(h * dv)));
        }
      }
      grad_a2a = detail::launch_wire(space, blocks, received, wire, names::do_a2a, [&](const auto& v, const auto& r) {
        return seq_ == nullptr ? launch_all_to_all(space, v, 2, 0, *mesh_, names::do_a2a, r)
               : even ? launch_all_to_all(space, v, 2, 0, *seq_, Partition(mesh_->size(), mesh_->size()), *mesh_,
                                          names::do_a2a, r)
                      : launch_all_to_all(space, v, 2, 3, *seq_, *heads_, *mesh_, names::do_a2a, r);
      });
    }
    tensor5 result;
    if (!overlap && grad_a2a.launched()) result = grad_a2a.wait();
    if (dw_o.data() != nullptr) {
      detail::ComputePhase<ExecSpace> phase(space, names::w_o_wgrad);
      detail::linear_wgrad(space, dy2, detail::as_matrix(local_output_, B * s, H * dv), dw_o);
    }
    if (db_o.data() != nullptr) {
      detail::ComputePhase<ExecSpace> phase(space, names::b_o_grad);
      detail::bias_grad(space, dy2, db_o);
    }
    local_output_ = tensor4();  // released: the saved operand is not needed any more
    if (grad_a2a.pending()) result = grad_a2a.wait();
    // Not needed: empty. (A needed result of no element, on a rank with no head, keeps its shape [B, S, 0, dv].)
    if (!needs_attention_grad) return tensor4();
    return Kokkos::subview(result, 0, Kokkos::ALL(), Kokkos::ALL(), Kokkos::ALL(), Kokkos::ALL());  // [B, S, h, dv]
  }

 private:
  tensor4 local_output_;
  matrix w_o_;
  const Mesh* mesh_ = nullptr;
  const Partition* seq_ = nullptr;
  const Partition* heads_ = nullptr;
  bool forwarded_ = false;
  bool backwarded_ = false;
};

}  // namespace mlacp
