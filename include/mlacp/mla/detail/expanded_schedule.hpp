// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The expanded strategy's schedule (MlaStrategy::expanded): every rank expands k and v for its own tokens and all
// heads, and Q, K, V each take a token-to-head all-to-all. It owns its memory (its forward workspaces and scratch) and
// exposes its backward as named steps (ExpandedSchedule::Backward), which backward() runs in order.
#pragma once

#include <mlacp/mla/detail/forward_workspace.hpp>
#include <mlacp/mla/detail/ring_attention.hpp>
#include <mlacp/mla/detail/schedule_context.hpp>
#include <mlacp/mla/detail/shared_steps.hpp>
#include <mlacp/mla/kernels/detail/kv_layout.hpp>
#include <mlacp/mla/kernels/detail/linear.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/pieces/input_a2a.hpp>

#include <cstdint>

namespace mlacp::detail {

/// What an expanded forward keeps for its backward beyond the shared part.
template <class T, class ExecSpace>
struct ExpandedForwardWorkspace : ForwardWorkspace<T, ExecSpace> {
  using typename ForwardWorkspace<T, ExecSpace>::tensor3;
  using typename ForwardWorkspace<T, ExecSpace>::tensor4;
  tensor3 c;                 ///< [B, s, R], the normalised latent (w_kvb's wgrad reads it)
  tensor4 k_local, v_local;  ///< [B, s, H, dqk], [B, s, H, dv]: token-local k, v, the K and V all-to-alls' inputs
  tensor4 k_heads, v_heads;  ///< [B, S, h, *]: their results (P > 1)
  InputA2APair<T, ExecSpace> k_pair, v_pair;

  std::size_t owned_bytes() const override {
    return ForwardWorkspace<T, ExecSpace>::owned_bytes() + bytes_of(c, k_local, v_local, k_heads, v_heads);
  }
  void release() override {
    ForwardWorkspace<T, ExecSpace>::release();
    k_pair = InputA2APair<T, ExecSpace>();
    v_pair = InputA2APair<T, ExecSpace>();
  }
};

/// The expanded schedule's per-call scratch beyond the shared part.
template <class T, class ExecSpace>
struct ExpandedScratch : SharedScratch<T, ExecSpace> {
  using tensor3 = Tensor3<T, typename ExecSpace::memory_space>;
  using tensor5 = Tensor5<T, typename ExecSpace::memory_space>;
  // forward
  tensor3 kpe;  ///< [B, s, dr], the rotated shared key
  tensor3 kv;   ///< [B, s, H*(dn+dv)], the expansion of every head for the rank's tokens
  // backward
  tensor5 dk_blocks, dv_blocks;  ///< [P, B, s, h, *], the dK and dV inverse all-to-alls' results (P > 1)
  tensor3 dkv;                   ///< [B, s, H*(dn+dv)]
  tensor3 dkpe;                  ///< [B, s, dr]
  tensor3 dc;                    ///< [B, s, R]
  // bf16 on the wire (wire.hpp): the K and V all-to-alls' buffers, and their inverses'
  WireSlot<Tensor4<T, typename ExecSpace::memory_space>> k_wire, v_wire;
  WireSlot<tensor5> dk_wire, dv_wire;
};

/// Forward: V, then K, then Q are launched as each is ready (the Q projection beside V and K), all three waited in
/// launch order; the O exchange is consumed per source block (OutputProjection). Backward (Backward's
/// steps in the order run() takes them): the three inverse all-to-alls are launched at once; dQ is waited first and
/// the Q branch runs while dK and dV are in flight, then the K and V branches read dK and dV where they arrived, then
/// w_kvb's gradients and the payload's.
template <class T, class ExecSpace, class Core>
class ExpandedSchedule {
 public:
  using context_type = ScheduleContext<T, ExecSpace, Core>;
  using tensor3 = typename context_type::tensor3;
  using tensor4 = typename context_type::tensor4;
  using tensor5 = typename context_type::tensor5;
  using gradients_type = typename context_type::gradients_type;
  using workspace_type = ExpandedForwardWorkspace<T, ExecSpace>;
  using scratch_type = ExpandedScratch<T, ExecSpace>;
  using pool_type = ForwardWorkspacePool<workspace_type>;
  using pass_type = ForwardPass<T, ExecSpace, workspace_type>;

  explicit ExpandedSchedule(const context_type& ctx) : ctx_(&ctx) {}

  const context_type& context() const { return *ctx_; }
  /// The schedule's per-forward workspaces and its per-call scratch: a cache of the configuration, written by the
  /// const operations (as an FFT plan's buffers are).
  pool_type& pool() const { return pool_; }
  scratch_type& scratch() const { return scratch_; }

  /// The pass's output y [B, s, D]; what backward needs stays in the pass's workspace.
  tensor3 forward(const ExecSpace& space, const pass_type& p) const {
    const context_type& ctx = *ctx_;
    const MlaConfig& cfg = ctx.config();
    const int B = cfg.batch, s = ctx.local_seq(), H = cfg.heads, dn = cfg.nope, dv = cfg.vdim;
    const int dr = cfg.rope, R = cfg.latent;
    auto& w = p.w;
    // c = RMSNorm(latent) and k_pe = RoPE(shared key), each written where the expansion reads it.
    const tensor3& c = ensure(w.c, "mlacp::c", B, s, R);
    const tensor3& kpe = ensure(scratch_.kpe, "mlacp::k_pe", B, s, dr);
    const tensor3& kv_a = project_kv_a(ctx, space, p, c);
    rope_forward(space, as_rank4(kv_a), R, as_rank4(kpe), 0, ctx.rope_table(space, p));
    const tensor3& kv = ensure(scratch_.kv, "mlacp::kv", B, s, H * (dn + dv));
    {
      ComputePhase<ExecSpace> phase(space, names::w_kvb_fprop);
      linear_forward(space, as_matrix(c, B * s, R), ctx.weights().w_kvb, ctx.weights().b_kvb,
                     as_matrix(kv, B * s, H * (dn + dv)));
    }
    const tensor4& key = ensure(w.k_local, "mlacp::k local", B, s, H, dn + dr);
    const tensor4& value = ensure(w.v_local, "mlacp::v local", B, s, H, dv);
    assemble_kv(space, tensor4(kv.data(), B, s, H, dn + dv), kpe, key, value, dn);
    // V, then K are launched as each is ready and the Q projection runs while they are in flight; then Q is launched.
    // The attention core needs all three, so nothing independent is left to run beside Q's exchange: they are waited
    // in launch order (on a FIFO link V and K arrive before Q). Overlap off: each is waited right after its launch.
    const bool kv_grad = needs_kv(p.flags), overlap = cfg.overlap;
    w.v_pair = InputA2APair<T, ExecSpace>(ctx.mesh(), names::v, ctx.seq_partition(), ctx.head_partition());
    w.k_pair = InputA2APair<T, ExecSpace>(ctx.mesh(), names::k, ctx.seq_partition(), ctx.head_partition());
    w.q_pair = InputA2APair<T, ExecSpace>(ctx.mesh(), names::q, ctx.seq_partition(), ctx.head_partition());
    const int S = ctx.attention_seq(), h = ctx.local_heads();
    w.v_pair.launch_forward(space, value, kv_grad, ctx.into(w.v_heads, "mlacp::v heads", B, S, h, dv),
                            ctx.wire(scratch_.v_wire));
    if (!overlap) w.v_saved = w.v_pair.wait_forward();
    w.k_pair.launch_forward(space, key, kv_grad, ctx.into(w.k_heads, "mlacp::k heads", B, S, h, dn + dr),
                            ctx.wire(scratch_.k_wire));
    if (!overlap) w.k_saved = w.k_pair.wait_forward();
    tensor4 q = project_q(ctx, space, p);
    w.q_pair.launch_forward(space, q, needs_q(p.flags), ctx.into(w.q_heads, "mlacp::q heads", B, S, h, dn + dr),
                            ctx.wire(scratch_.q_wire));
    if (overlap) {
      w.v_saved = w.v_pair.wait_forward();
      w.k_saved = w.k_pair.wait_forward();
    }
    w.q_saved = w.q_pair.wait_forward();
    if (ctx.ring()) {
      // Ring attention: K and V of the rank's heads travel round the ring, chunk by chunk.
      return attend_and_project(ctx, scratch_, space, p, [&] {
        ring_.forward_expanded(space, ctx, p, w.q_saved, w.k_saved, w.v_saved, w.o, w.lse);
      });
    }
    return attend_and_project(ctx, scratch_, space, p);
  }

  /// One backward of a pass as its named steps; run() takes them in the schedule's order.
  class Backward {
   public:
    Backward(const ExpandedSchedule& schedule, const ExecSpace& space, const pass_type& p, const tensor3& dy,
             gradients_type& g)
        : schedule_(&schedule), space_(space), p_(p), dy_(dy), g_(&g) {}

    /// The output projection's backward (dO all-to-all beside the w_o wgrad) and the attention backward: dq, dk, dv.
    /// False when nothing upstream of the attention needs a gradient (then no other step has anything to do).
    bool attention() {
      if (!ctx().ring()) {
        active_ = output_and_attention_backward(ctx(), schedule_->scratch_, space_, p_, dy_, *g_, grads_);
        return active_;
      }
      // Ring: K and V travel round the ring again and their gradients' accumulators home behind them; the own
      // chunk's dK and dV are complete once the last exchange is waited (launch_dk, after dQ's launch).
      active_ =
          output_and_attention_backward(ctx(), schedule_->scratch_, space_, p_, dy_, *g_, grads_, [&](const auto& d_o) {
            const auto& w = p_.w;
            schedule_->ring_.backward_expanded(space_, ctx(), p_, w.q_saved, w.k_saved, w.v_saved, w.o, w.lse, d_o,
                                               grads_.dq, grads_.dk, grads_.dv);
            ring_pending_ = true;
          });
      return active_;
    }
    /// The inverse all-to-alls of dQ, dK, dV are launched (each when its input needs its gradient).
    void launch_dq() {
      launch(p_.w.q_pair, grads_.dq, schedule_->scratch_.dq_blocks, schedule_->scratch_.dq_wire, "mlacp::dQ blocks",
             qk());
    }
    void launch_dk() {
      if (ring_pending_) schedule_->ring_.finish_backward(space_);
      ring_pending_ = false;
      launch(p_.w.k_pair, grads_.dk, schedule_->scratch_.dk_blocks, schedule_->scratch_.dk_wire, "mlacp::dK blocks",
             qk());
    }
    void launch_dv() {
      launch(p_.w.v_pair, grads_.dv, schedule_->scratch_.dv_blocks, schedule_->scratch_.dv_wire, "mlacp::dV blocks",
             ctx().config().vdim);
    }
    /// Their head blocks are waited (each once, when launched).
    void wait_dq() { wait(p_.w.q_pair, needs_q(p_.flags), dq_blocks_, dq_waited_); }
    void wait_dk() { wait(p_.w.k_pair, needs_kv(p_.flags), dk_blocks_, dk_waited_); }
    void wait_dv() { wait(p_.w.v_pair, needs_kv(p_.flags), dv_blocks_, dv_waited_); }
    /// The Q branch's backward on dQ's head blocks.
    void q_branch() {
      if (!active_ || !needs_q(p_.flags)) return;
      wait_dq();
      q_branch_backward(ctx(), schedule_->scratch_, space_, p_, dq_blocks_, *g_);
    }
    /// dK's head blocks (as they arrived, no unpack) into d(kv)'s key columns and the shared key's gradient.
    void k_branch() {
      if (!active_ || !needs_kv(p_.flags)) return;
      wait_dk();
      ComputePhase<ExecSpace> phase(space_, names::k_backward);
      key_grad_from_blocks(space_, dk_blocks_.data(), static_cast<std::int64_t>(dk_blocks_.extent(0)), dkv4(), dkpe(),
                           ctx().config().nope);
    }
    /// dV's head blocks into d(kv)'s value columns.
    void v_branch() {
      if (!active_ || !needs_kv(p_.flags)) return;
      wait_dv();
      ComputePhase<ExecSpace> phase(space_, names::v_backward);
      value_grad_from_blocks(space_, dv_blocks_.data(), static_cast<std::int64_t>(dv_blocks_.extent(0)), dkv4(),
                             ctx().config().nope);
    }
    /// w_kvb's gradients from d(kv), then dc = d(kv) w_kvb and the payload's backward: the RoPE transpose of the
    /// shared key's gradient and kv_a_backward (RMSNorm, w_kva).
    void kv_and_payload() {
      if (!active_ || !needs_kv(p_.flags)) return;
      const context_type& x = ctx();
      const MlaConfig& c = x.config();
      const MlaRequiresGrad& r = p_.flags;
      const int B = c.batch, s = x.local_seq(), H = c.heads, dn = c.nope, dv = c.vdim, R = c.latent;
      ComputePhase<ExecSpace> phase(space_, names::kv_backward);
      const tensor3& dkv = dkv4_storage();
      const auto dkv2 = as_matrix(dkv, B * s, H * (dn + dv));
      if (r.w_kvb) linear_wgrad(space_, dkv2, as_matrix(p_.w.c, B * s, R), g_->w_kvb);
      if (r.b_kvb && c.bias) bias_grad(space_, dkv2, g_->b_kvb);
      if (!needs_payload(r)) return;
      scratch_type& scratch = schedule_->scratch_;
      const tensor3& dc = ensure(scratch.dc, "mlacp::d c", B, s, R);
      linear_dgrad(space_, dkv2, x.weights().w_kvb, T(0), as_matrix(dc, B * s, R));
      const tensor3& d_kv_a = detail::d_kv_a(x, scratch);
      rope_backward(space_, as_rank4(dkpe()), 0, as_rank4(d_kv_a), R, x.rope_table(space_, p_));
      kv_a_backward(x, space_, p_, dc, d_kv_a, *g_);
    }

    /// Every step in the schedule's order: with overlap on, each inverse is waited where its branch needs it; off,
    /// right after its launch.
    void run() {
      if (!attention()) return;
      const bool overlap = ctx().config().overlap;
      launch_dq();
      if (!overlap) wait_dq();
      launch_dk();
      if (!overlap) wait_dk();
      launch_dv();
      if (!overlap) wait_dv();
      q_branch();
      k_branch();
      v_branch();
      kv_and_payload();
    }

   private:
    const context_type& ctx() const { return *schedule_->ctx_; }
    int qk() const { return ctx().config().qk_dim(); }

    void launch(InputA2APair<T, ExecSpace>& pair, const tensor4& grad, tensor5& slot, WireSlot<tensor5>& wire,
                const char* label, int d) {
      if (active_) pair.launch_backward(space_, grad, ctx().blocks_into(slot, label, d), ctx().wire(wire));
    }
    void wait(InputA2APair<T, ExecSpace>& pair, bool needed, tensor5& blocks, bool& waited) {
      if (!active_ || !needed || waited) return;
      blocks = pair.wait_backward_blocks();
      waited = true;
    }
    // d(kv) [B, s, H*(dn+dv)] and the shared key's gradient [B, s, dr], written by the K and V branches.
    const tensor3& dkv4_storage() const {
      const MlaConfig& c = ctx().config();
      return ensure(schedule_->scratch_.dkv, "mlacp::d kv", c.batch, ctx().local_seq(), c.heads * (c.nope + c.vdim));
    }
    tensor4 dkv4() const {
      const MlaConfig& c = ctx().config();
      return tensor4(dkv4_storage().data(), c.batch, ctx().local_seq(), c.heads, c.nope + c.vdim);
    }
    const tensor3& dkpe() const {
      const MlaConfig& c = ctx().config();
      return ensure(schedule_->scratch_.dkpe, "mlacp::d k_pe", c.batch, ctx().local_seq(), c.rope);
    }

    const ExpandedSchedule* schedule_;
    ExecSpace space_;
    pass_type p_;
    const tensor3& dy_;
    gradients_type* g_;
    AttentionGradients<tensor4> grads_;
    tensor5 dq_blocks_, dk_blocks_, dv_blocks_;
    bool active_ = false, dq_waited_ = false, dk_waited_ = false, dv_waited_ = false, ring_pending_ = false;
  };

  /// Accumulates the pass's gradients into `g` (allocated where needed).
  void backward(const ExecSpace& space, const pass_type& p, const tensor3& dy, gradients_type& g) const {
    Backward(*this, space, p, dy, g).run();
  }

 private:
  const context_type* ctx_;
  mutable pool_type pool_;
  mutable scratch_type scratch_;
  mutable RingAttention<T, ExecSpace, Core> ring_;  // ring attention's buffers (two-level meshes only)
};

}  // namespace mlacp::detail
