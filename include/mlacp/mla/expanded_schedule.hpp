// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The expanded strategy's schedule (MlaStrategy::expanded): every rank expands k and v for its own tokens and all
// heads, and Q, K, V each take a token-to-head all-to-all. The pieces it shares with the latent strategy are in
// schedule_pieces.hpp.
#pragma once

#include <mlacp/mla/input_a2a.hpp>
#include <mlacp/mla/kv_layout.hpp>
#include <mlacp/mla/linear.hpp>
#include <mlacp/mla/schedule_pieces.hpp>

#include <cstdint>

namespace mlacp::detail {

/// Forward: V, then K, then Q are launched as each is ready, all three waited in Q, K, V order. Backward: the three
/// inverse all-to-alls are launched at once; dQ is waited first and the Q branch runs while dK and dV are in flight,
/// then the K and V branches read dK and dV where they arrived, then w_kvb's gradients and the payload's.
template <class T, class ExecSpace, class Core>
class ExpandedSchedule {
 public:
  using pieces_type = SchedulePieces<T, ExecSpace, Core>;
  using tensor3 = typename pieces_type::tensor3;
  using tensor4 = typename pieces_type::tensor4;
  using tensor5 = typename pieces_type::tensor5;
  using gradients_type = typename pieces_type::gradients_type;
  using pass_type = ForwardPass<T, ExecSpace>;

  explicit ExpandedSchedule(const pieces_type& pieces) : pieces_(&pieces) {}

  /// The pass's output y [B, s, D]; what backward needs stays in the pass's workspace.
  tensor3 forward(const ExecSpace& space, const pass_type& p) const {
    const pieces_type& k = *pieces_;
    const MlaConfig& cfg = k.config();
    const int B = cfg.batch, s = k.local_seq(), H = cfg.heads, dn = cfg.nope, dv = cfg.vdim;
    const int dr = cfg.rope, R = cfg.latent;
    auto& scratch = k.scratch();
    auto& w = p.w;
    const tensor3& c = ensure(w.c, "mlacp::c", B, s, R);
    const tensor3& kpe = ensure(scratch.kpe, "mlacp::k_pe", B, s, dr);
    k.project_kv_a(space, p, c, kpe, 0);
    const tensor3& kv = ensure(scratch.kv, "mlacp::kv", B, s, H * (dn + dv));
    {
      ComputePhase<ExecSpace> phase(space, "w_kvb fprop");
      linear_forward(space, as_matrix(c, B * s, R), k.weights().w_kvb, k.weights().b_kvb,
                     as_matrix(kv, B * s, H * (dn + dv)));
    }
    const tensor4& key = ensure(w.k_local, "mlacp::k local", B, s, H, dn + dr);
    const tensor4& value = ensure(w.v_local, "mlacp::v local", B, s, H, dv);
    assemble_kv(space, tensor4(kv.data(), B, s, H, dn + dv), kpe, key, value, dn);
    // V, then K, then Q are launched as each is ready; all three are waited in Q, K, V order.
    const bool kv_grad = needs_kv(p.flags);
    w.v_pair = InputA2APair<T, ExecSpace>(k.mesh(), "V", k.seq_partition(), k.head_partition());
    w.k_pair = InputA2APair<T, ExecSpace>(k.mesh(), "K", k.seq_partition(), k.head_partition());
    w.q_pair = InputA2APair<T, ExecSpace>(k.mesh(), "Q", k.seq_partition(), k.head_partition());
    const int S = cfg.seq, h = k.local_heads();
    w.v_pair.launch_forward(space, value, kv_grad, k.into(w.v_heads, "mlacp::v heads", B, S, h, dv));
    w.k_pair.launch_forward(space, key, kv_grad, k.into(w.k_heads, "mlacp::k heads", B, S, h, dn + dr));
    tensor4 q = k.project_q(space, p);
    w.q_pair.launch_forward(space, q, needs_q(p.flags), k.into(w.q_heads, "mlacp::q heads", B, S, h, dn + dr));
    w.q_saved = w.q_pair.wait_forward();
    w.k_saved = w.k_pair.wait_forward();
    w.v_saved = w.v_pair.wait_forward();
    return k.attend_and_project(space, p);
  }

  /// Accumulates the pass's gradients into `g` (allocated where needed).
  void backward(const ExecSpace& space, const pass_type& p, const tensor3& dy, gradients_type& g) const {
    const pieces_type& k = *pieces_;
    const MlaConfig& c = k.config();
    const int B = c.batch, s = k.local_seq(), H = c.heads, dn = c.nope, dv = c.vdim;
    const int dr = c.rope, R = c.latent;
    const MlaRequiresGrad& r = p.flags;
    auto& scratch = k.scratch();
    auto& w = p.w;
    tensor4 dq, dk, dvv;
    if (!k.output_and_attention_backward(space, p, dy, g, dq, dk, dvv)) return;
    // All three inverses are launched at once; dQ is waited first and the Q branch runs while dK, dV are in flight.
    tensor5 dq_local, dk_blocks, dv_blocks;
    w.q_pair.launch_backward(space, dq, k.blocks_into(scratch.dq_blocks, "mlacp::dQ blocks", c.qk_dim()));
    if (!c.overlap && needs_q(r)) dq_local = w.q_pair.wait_backward_blocks();
    w.k_pair.launch_backward(space, dk, k.blocks_into(scratch.dk_blocks, "mlacp::dK blocks", c.qk_dim()));
    if (!c.overlap && needs_kv(r)) dk_blocks = w.k_pair.wait_backward_blocks();
    w.v_pair.launch_backward(space, dvv, k.blocks_into(scratch.dv_blocks, "mlacp::dV blocks", c.vdim));
    if (!c.overlap && needs_kv(r)) dv_blocks = w.v_pair.wait_backward_blocks();
    if (needs_q(r)) k.q_branch_backward(space, p, c.overlap ? w.q_pair.wait_backward_blocks() : dq_local, g);
    if (!needs_kv(r)) return;
    // dK and dV are read as the head blocks they arrived in (no unpack) and written straight into d(kv).
    const tensor3& dkv = ensure(scratch.dkv, "mlacp::d kv", B, s, H * (dn + dv));
    const tensor3& dkpe = ensure(scratch.dkpe, "mlacp::d k_pe", B, s, dr);
    const tensor4 dkv4(dkv.data(), B, s, H, dn + dv);
    {
      if (c.overlap) dk_blocks = w.k_pair.wait_backward_blocks();  // dK before the K branch
      ComputePhase<ExecSpace> phase(space, "k backward");
      key_grad_from_blocks(space, dk_blocks.data(), static_cast<std::int64_t>(dk_blocks.extent(0)), dkv4, dkpe, dn);
    }
    {
      if (c.overlap) dv_blocks = w.v_pair.wait_backward_blocks();  // dV before the V branch
      ComputePhase<ExecSpace> phase(space, "v backward");
      value_grad_from_blocks(space, dv_blocks.data(), static_cast<std::int64_t>(dv_blocks.extent(0)), dkv4, dn);
    }
    ComputePhase<ExecSpace> phase(space, "kv backward");
    const auto dkv2 = as_matrix(dkv, B * s, H * (dn + dv));
    if (r.w_kvb) linear_wgrad(space, dkv2, as_matrix(w.c, B * s, R), g.w_kvb);
    if (r.b_kvb && c.bias) bias_grad(space, dkv2, g.b_kvb);
    if (!needs_payload(r)) return;
    const tensor3& dc = ensure(scratch.dc, "mlacp::d c", B, s, R);
    linear_dgrad(space, dkv2, k.weights().w_kvb, T(0), as_matrix(dc, B * s, R));
    k.payload_backward(space, p, dc, dkpe, 0, g);
  }

 private:
  const pieces_type* pieces_;
};

}  // namespace mlacp::detail
