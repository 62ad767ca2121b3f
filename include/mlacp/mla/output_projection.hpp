// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The output projection piece: head-to-token all-to-all of the attention output, then o_proj; its backward overlaps
// the token-to-head all-to-all of the output gradient with the o_proj weight gradient.
#pragma once

#include <mlacp/all_to_all.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/kv_layout.hpp>
#include <mlacp/mla/linear.hpp>

namespace mlacp {

/// One forward invocation of the output projection and its backward (the reference's _OutputProjection).
template <class T, class ExecSpace>
class OutputProjection {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using tensor3 = detail::Tensor3<T, memory_space>;
  using tensor4 = detail::Tensor4<T, memory_space>;
  using matrix = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;
  using vector = Kokkos::View<T*, Kokkos::LayoutRight, memory_space>;

  /// attention_output [B, S, h, dv] (head-local) -> y [B, s, D]: launches the head-to-token all-to-all, waits, flattens
  /// the heads and applies w_o [D, H*dv] (+ b_o, when not empty). Saves what backward needs.
  tensor3 forward(const ExecSpace& space, const tensor4& attention_output, const matrix& w_o, const vector& b_o,
                  const Mesh& mesh) {
    if (forwarded_) throw UsageError("mlacp::OutputProjection: forward called twice on the same invocation");
    auto local = launch_all_to_all(space, attention_output, 2, 1, mesh, "O a2a").wait();  // [B, s, H, dv]
    const auto B = static_cast<std::int64_t>(local.extent(0)), s = static_cast<std::int64_t>(local.extent(1));
    const auto Hdv = static_cast<std::int64_t>(local.extent(2) * local.extent(3));
    tensor3 y(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::y"), B, s, w_o.extent(0));
    {
      detail::ComputePhase<ExecSpace> phase(space, "w_o fprop");
      detail::linear_forward(space, detail::as_matrix(local, B * s, Hdv), w_o, b_o,
                             detail::as_matrix(y, B * s, static_cast<std::int64_t>(w_o.extent(0))));
    }
    local_output_ = local;
    w_o_ = w_o;
    mesh_ = &mesh;
    forwarded_ = true;
    return y;
  }

  /// dy [B, s, D] -> the head-local gradient of the attention output [B, S, h, dv] (empty when not
  /// `needs_attention_grad`). Order: dgrad (dy w_o), launch the token-to-head all-to-all of it ("dO a2a"), the weight
  /// gradient dw_o += dy^T o (progressing the all-to-all between panels, see progress.hpp) and db_o += column sums of
  /// dy while it is in flight, then wait. dw_o / db_o empty: not needed (skipped). `overlap` false: wait right after
  /// the launch.
  tensor4 backward(const ExecSpace& space, const tensor3& dy, bool needs_attention_grad, const matrix& dw_o,
                   const vector& db_o, bool overlap = true) {
    if (!forwarded_) throw UsageError("mlacp::OutputProjection: backward before forward");
    if (backwarded_) throw UsageError("mlacp::OutputProjection: a second backward of the same forward");
    backwarded_ = true;
    const auto B = static_cast<std::int64_t>(dy.extent(0)), s = static_cast<std::int64_t>(dy.extent(1));
    const auto D = static_cast<std::int64_t>(dy.extent(2));
    const auto H = static_cast<std::int64_t>(local_output_.extent(2)),
               dv = static_cast<std::int64_t>(local_output_.extent(3));
    const auto dy2 = detail::as_matrix(dy, B * s, D);
    AsyncCollective<tensor4> grad_a2a;
    if (needs_attention_grad) {
      tensor4 grad_local(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::dO local"), B, s, H, dv);
      {
        detail::ComputePhase<ExecSpace> phase(space, "w_o dgrad");
        detail::linear_dgrad(space, dy2, w_o_, T(0), detail::as_matrix(grad_local, B * s, H * dv));
      }
      grad_a2a = launch_all_to_all(space, grad_local, 1, 2, *mesh_, "dO a2a");
    }
    tensor4 result;
    if (!overlap && grad_a2a.launched()) result = grad_a2a.wait();
    if (dw_o.data() != nullptr) {
      detail::ComputePhase<ExecSpace> phase(space, "w_o wgrad");
      detail::linear_wgrad(space, dy2, detail::as_matrix(local_output_, B * s, H * dv), dw_o);
    }
    if (db_o.data() != nullptr) {
      detail::ComputePhase<ExecSpace> phase(space, "b_o grad");
      detail::bias_grad(space, dy2, db_o);
    }
    local_output_ = tensor4();  // released: the saved operand is not needed any more
    return grad_a2a.pending() ? grad_a2a.wait() : result;
  }

 private:
  tensor4 local_output_;
  matrix w_o_;
  const Mesh* mesh_ = nullptr;
  bool forwarded_ = false;
  bool backwarded_ = false;
};

}  // namespace mlacp
