// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The latent KV linear piece (latent strategy): expands the rank's heads from the all-gathered latent payload; its
// backward overlaps the SUM reduce-scatter of the payload gradient with the selected rows' weight gradient.
#pragma once

#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/detail/timeline.hpp>
#include <mlacp/mla/kernels/detail/kv_layout.hpp>
#include <mlacp/mla/kernels/detail/linear.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/partition.hpp>
#include <mlacp/reduce_scatter.hpp>
#include <mlacp/view_types.hpp>

#include <optional>
#include <utility>

namespace mlacp {

namespace detail {

/// The KV up-projection of a latent block, the one place its math is written (LatentKVLinear for the flat layer, the
/// ring's latent source for each chunk): kv [B*n, h*(dn+dv)] = latent [B*n, R] w_sel^T (+ b_sel).
/// (The callers record their own compute phases.)
template <class ExecSpace, class Latent, class Weight, class Bias, class Kv>
void kv_up_forward(const ExecSpace& space, const Latent& latent2, const Weight& w_sel, const Bias& b_sel,
                   const Kv& kv2) {
  linear_forward(space, latent2, w_sel, b_sel, kv2);
}

/// Its data gradient: d(latent) = d(kv) w_sel into `grad_latent` [B, n, R], joined with the shared key's gradient
/// `grad_shared` [B, n, dr] into `grad_payload` [B, n, R+dr] (in T, or in the accumulation type for the ring's
/// travelling accumulator).
template <class ExecSpace, class Grad, class Weight, class Tensor, class Shared, class Payload>
void kv_up_dgrad(const ExecSpace& space, const Grad& grad_kv2, const Weight& w_sel, const Tensor& grad_latent,
                 const Shared& grad_shared, const Payload& grad_payload) {
  using T = typename Tensor::non_const_value_type;
  const auto B = static_cast<std::int64_t>(grad_latent.extent(0)), n = static_cast<std::int64_t>(grad_latent.extent(1));
  const auto R = static_cast<std::int64_t>(grad_latent.extent(2));
  linear_dgrad(space, grad_kv2, w_sel, T(0), as_matrix(grad_latent, B * n, R));
  join_columns(space, grad_latent, grad_shared, grad_payload);
}

/// Its weight gradients: dw_sel += d(kv)^T latent, db_sel += column sums of d(kv) (each skipped when empty), each in
/// its own compute phase when `phases` (the flat layer's w_kvb wgrad and b_kvb grad; the ring records one phase for
/// the chunk's whole fold).
template <class ExecSpace, class Grad, class Latent, class WeightGrad, class BiasGrad>
void kv_up_wgrad(const ExecSpace& space, const Grad& grad_kv2, const Latent& latent2, const WeightGrad& dw_sel,
                 const BiasGrad& db_sel, bool phases = false) {
  if (dw_sel.data() != nullptr) {
    std::optional<ComputePhase<ExecSpace>> phase;
    if (phases) phase.emplace(space, names::w_kvb_wgrad);
    linear_wgrad(space, grad_kv2, latent2, dw_sel);
  }
  if (db_sel.data() != nullptr) {
    std::optional<ComputePhase<ExecSpace>> phase;
    if (phases) phase.emplace(space, names::b_kvb_grad);
    bias_grad(space, grad_kv2, db_sel);
  }
}

}  // namespace detail

template <class T, class ExecSpace>
class LatentKVLinear {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using tensor3 = detail::Tensor3<T, memory_space>;
  using matrix = detail::Matrix<T, memory_space>;
  using vector = detail::Vector<T, memory_space>;
  /// The rank's head rows of w_kvb (or of its gradient), and of b_kvb: windows on the layer's Views.
  using weight_rows = detail::Matrix<T, memory_space, detail::Unmanaged>;
  using bias_part = detail::Vector<T, memory_space, detail::Unmanaged>;
  /// The same windows on the weight gradients, in T's accumulation type (float for bf16: the layer's float gradients).
  using gradient_rows = detail::Matrix<compat::accumulation_t<T>, memory_space, detail::Unmanaged>;
  using gradient_part = detail::Vector<compat::accumulation_t<T>, memory_space, detail::Unmanaged>;

  /// gathered [B, S, R+dr] (a completed all-gather of [c, k_pe]), w_sel [h*(dn+dv), R] and b_sel (the rank's head
  /// rows of w_kvb / b_kvb; b_sel may be empty) -> kv_out [B, S, h*(dn+dv)] and the shared key kpe_out [B, S, dr]
  /// (empty: not copied, e.g. when the caller reads it from `gathered`'s last dr columns). `latent_storage` [B, S, R]:
  /// where the latent saved for backward is kept (a layer's workspace); empty: allocated. `seq`: how the tokens are
  /// split over the ranks (the reduce-scatter's partition; it outlives the invocation: the layer's).
  void forward(const ExecSpace& space, const tensor3& gathered, const weight_rows& w_sel, const bias_part& b_sel,
               const Mesh& mesh, const Partition& seq, const tensor3& kv_out, const tensor3& kpe_out,
               tensor3 latent_storage = {}) {
    forward_impl(space, gathered, w_sel, b_sel, mesh, &seq, kv_out, kpe_out, std::move(latent_storage));
  }
  /// The even split (S divisible by the group size).
  void forward(const ExecSpace& space, const tensor3& gathered, const weight_rows& w_sel, const bias_part& b_sel,
               const Mesh& mesh, const tensor3& kv_out, const tensor3& kpe_out, tensor3 latent_storage = {}) {
    forward_impl(space, gathered, w_sel, b_sel, mesh, nullptr, kv_out, kpe_out, std::move(latent_storage));
  }

 private:
  void forward_impl(const ExecSpace& space, const tensor3& gathered, const weight_rows& w_sel, const bias_part& b_sel,
                    const Mesh& mesh, const Partition* seq, const tensor3& kv_out, const tensor3& kpe_out,
                    tensor3 latent_storage) {
    if (forwarded_) throw UsageError("mlacp::LatentKVLinear: forward called twice on the same invocation");
    const auto B = static_cast<std::int64_t>(gathered.extent(0)), S = static_cast<std::int64_t>(gathered.extent(1));
    const auto R = static_cast<int>(w_sel.extent(1));
    const auto dr = static_cast<int>(gathered.extent(2)) - R;
    latent_ = latent_storage.data() != nullptr
                  ? latent_storage
                  : tensor3(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::latent"), B, S, R);
    detail::copy_columns(space, gathered, 0, latent_, 0, R);
    if (kpe_out.data() != nullptr) detail::copy_columns(space, gathered, R, kpe_out, 0, dr);
    {
      detail::ComputePhase<ExecSpace> phase(space, names::w_kvb_fprop);
      detail::kv_up_forward(space, detail::as_matrix(latent_, B * S, R), w_sel, b_sel,
                            detail::as_matrix(kv_out, B * S, static_cast<std::int64_t>(w_sel.extent(0))));
    }
    w_sel_ = w_sel;
    mesh_ = &mesh;
    seq_ = seq;
    forwarded_ = true;
  }

 public:
  /// grad_kv [B, S, h*(dn+dv)] and grad_shared [B, S, dr] -> this rank's payload gradient [B, s, R+dr] (empty when
  /// not `needs_payload_grad`): launch_backward, then wait_backward.
  tensor3 backward(const ExecSpace& space, const tensor3& grad_kv, const tensor3& grad_shared, bool needs_payload_grad,
                   const gradient_rows& dw_sel, const gradient_part& db_sel, bool overlap = true,
                   tensor3 grad_payload = {}, tensor3 grad_latent = {}, const tensor3& reduced = {}) {
    launch_backward(space, grad_kv, grad_shared, needs_payload_grad, dw_sel, db_sel, overlap, std::move(grad_payload),
                    std::move(grad_latent), reduced);
    return wait_backward();
  }

  /// The backward up to the reduce-scatter's wait: dgrad of the latent (grad_kv w_sel), concatenated with grad_shared
  /// and launched as a SUM reduce-scatter along the sequence ("latent reduce-scatter") when `needs_payload_grad`;
  /// dw_sel += grad_kv^T latent and db_sel while it is in flight (empty: skipped). The reduce-scatter stays in flight
  /// for the caller's next independent work (the layer runs the Q branch's backward); wait_backward ends it.
  /// `overlap` false: waited right after the launch. `grad_payload` [B, S, R+dr] (the reduce-scatter's input, read
  /// until the wait) and `grad_latent` [B, S, R]: scratch (a layer's workspace); empty: allocated. `reduced`
  /// [B, s, R+dr]: where the reduce-scatter's result goes; empty: allocated. `codec`: what the partial sums travel
  /// as (wire/codecs.hpp: same, or bf16, summed in float by the collective and decoded into `reduced` at the wait).
  void launch_backward(const ExecSpace& space, const tensor3& grad_kv, const tensor3& grad_shared,
                       bool needs_payload_grad, const gradient_rows& dw_sel, const gradient_part& db_sel,
                       bool overlap = true, tensor3 grad_payload = {}, tensor3 grad_latent = {},
                       const tensor3& reduced = {}, WireCodec codec = WireCodec::same) {
    if (!forwarded_) throw UsageError("mlacp::LatentKVLinear: backward before forward");
    if (backwarded_) throw UsageError("mlacp::LatentKVLinear: a second backward of the same forward");
    backwarded_ = true;
    const auto B = static_cast<std::int64_t>(grad_kv.extent(0)), S = static_cast<std::int64_t>(grad_kv.extent(1));
    const auto R = static_cast<std::int64_t>(latent_.extent(2)), dr = static_cast<std::int64_t>(grad_shared.extent(2));
    const auto width = static_cast<std::int64_t>(grad_kv.extent(2));
    const auto g2 = detail::as_matrix(grad_kv, B * S, width);
    // The order (timeline.hpp, latent_kv_backward): the dgrad, the reduce-scatter launched, w_kvb's gradients while
    // it is in flight; wait_backward() waits it.
    auto steps = detail::timeline::steps(
        [&](detail::timeline::Step step, int) {
          if (step == detail::timeline::Step::w_kvb_dgrad) {
            if (grad_payload.data() == nullptr)
              grad_payload = tensor3(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::d payload"), B, S, R + dr);
            detail::ComputePhase<ExecSpace> phase(space, names::w_kvb_dgrad);
            if (grad_latent.data() == nullptr)
              grad_latent = tensor3(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::d latent"), B, S, R);
            detail::kv_up_dgrad(space, g2, w_sel_, grad_latent, grad_shared, grad_payload);
          } else if (step == detail::timeline::Step::w_kvb_wgrad) {
            detail::kv_up_wgrad(space, g2, detail::as_matrix(latent_, B * S, R), dw_sel, db_sel, true);
          }
        },
        [&](detail::timeline::Comm, int) {
          reduce_ = seq_ == nullptr ? launch_reduce_scatter(space, grad_payload, 1, *mesh_,
                                                            names::latent_reduce_scatter, reduced, codec)
                                    : launch_reduce_scatter(space, grad_payload, 1, *seq_, *mesh_,
                                                            names::latent_reduce_scatter, reduced, codec);
        },
        [&](detail::timeline::Comm, int) { result_ = reduce_.wait(); });
    detail::timeline::latent_kv_backward(
        steps, detail::timeline::part_facts(mesh_->size(), overlap, true, needs_payload_grad));
    latent_ = tensor3();
  }

  /// Waits for the reduce-scatter launch_backward started (exactly once) and returns this rank's payload gradient
  /// [B, s, R+dr]; an empty View when it was not needed.
  tensor3 wait_backward() {
    if (!backwarded_) throw UsageError("mlacp::LatentKVLinear: wait_backward before launch_backward");
    if (waited_) throw UsageError("mlacp::LatentKVLinear: wait_backward called twice");
    waited_ = true;
    if (reduce_.pending()) result_ = reduce_.wait();
    return std::exchange(result_, tensor3());
  }

 private:
  tensor3 latent_;
  weight_rows w_sel_;
  const Mesh* mesh_ = nullptr;
  const Partition* seq_ = nullptr;
  AsyncCollective<tensor3> reduce_;  // the latent reduce-scatter, from launch_backward to wait_backward
  tensor3 result_;
  bool forwarded_ = false;
  bool backwarded_ = false;
  bool waited_ = false;
};

}  // namespace mlacp
