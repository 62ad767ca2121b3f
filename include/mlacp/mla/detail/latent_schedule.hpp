// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The latent strategy's schedule (MlaStrategy::latent): the compressed payload [c, k_pe] is all-gathered and every
// rank expands only its own heads; backward reduce-scatters the payload gradient. It owns its memory (its forward
// workspaces and scratch) and exposes its backward as named steps (LatentSchedule::Backward), which backward() runs in
// order and perf_tests time one by one.
#pragma once

#include <mlacp/all_gather.hpp>
#include <mlacp/mla/detail/forward_workspace.hpp>
#include <mlacp/mla/detail/ring_attention.hpp>
#include <mlacp/mla/detail/schedule_context.hpp>
#include <mlacp/mla/detail/shared_steps.hpp>
#include <mlacp/mla/kernels/detail/kv_layout.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/pieces/input_a2a.hpp>
#include <mlacp/mla/pieces/latent_kv_linear.hpp>

namespace mlacp::detail {

/// What a latent forward keeps for its backward beyond the shared part.
template <class T, class ExecSpace>
struct LatentForwardWorkspace : ForwardWorkspace<T, ExecSpace> {
  using typename ForwardWorkspace<T, ExecSpace>::tensor3;
  using typename ForwardWorkspace<T, ExecSpace>::tensor4;
  tensor3 latent;                          ///< [B, S, R], the gathered normalised latent
  tensor4 k, v;                            ///< [B, S, h, dqk], [B, S, h, dv]: head-local k, v expanded from it
  LatentKVLinear<T, ExecSpace> latent_kv;  ///< its backward (w_kvb's gradients, the latent reduce-scatter)
  tensor3 ring_payload;                    ///< ring: [B, Sg, R+dr], the own chunk's payload (the ring's first chunk)

  std::size_t owned_bytes() const override {
    return ForwardWorkspace<T, ExecSpace>::owned_bytes() + bytes_of(latent, k, v, ring_payload);
  }
  void release() override {
    ForwardWorkspace<T, ExecSpace>::release();
    latent_kv = LatentKVLinear<T, ExecSpace>();
  }
};

/// The latent schedule's per-call scratch beyond the shared part.
template <class T, class ExecSpace>
struct LatentScratch : SharedScratch<T, ExecSpace> {
  using tensor3 = Tensor3<T, typename ExecSpace::memory_space>;
  // forward
  tensor3 payload;   ///< [B, s, R+dr], the all-gather's input: [RMSNorm(c), RoPE(k_pe)]
  tensor3 gathered;  ///< [B, S, R+dr], the all-gather's result (P > 1)
  tensor3 kv;        ///< [B, S, h*(dn+dv)], the rank's heads of the expansion
  // backward
  tensor3 dkv;           ///< [B, S, h*(dn+dv)]
  tensor3 dkpe;          ///< [B, S, dr]
  tensor3 grad_payload;  ///< [B, S, R+dr], the reduce-scatter's input
  tensor3 grad_latent;   ///< [B, S, R]
  tensor3 d_payload;     ///< [B, s, R+dr], the reduce-scatter's result (P > 1)
  // bf16 on the wire (wire.hpp): the payload all-gather's buffers, and the reduce-scatter's (wire_dtype bf16_all)
  WireSlot<tensor3> payload_wire, reduce_wire;
};

/// Forward: each exchange leaves as soon as its input exists: the payload is projected first and its all-gather runs
/// beside the Q projection, then Q's all-to-all runs beside the KV expansion (the rank's w_kvb rows on the gathered
/// payload), and the O exchange is consumed per source block (OutputProjection). Overlap off: each collective is waited
/// right after its launch. Backward (Backward's steps in the order run() takes them): the inverse all-to-all of dQ
/// is launched first and the KV path's backward (the w_kvb dgrad, the latent reduce-scatter launched and the w_kvb
/// weight gradient while it is in flight) runs while dQ is in flight; then dQ is waited and the Q branch's backward
/// runs while the reduce-scatter is still in flight; then the reduce-scatter is waited and the payload's backward
/// (RoPE, RMSNorm, w_kva) runs. The reduce-scatter is launched after dQ and leaves on the same links behind it, so it
/// is waited last, after the compute that needs neither (on one FIFO link, waiting it before the Q branch stalled the
/// KV backward until dQ had crossed).
template <class T, class ExecSpace, class Core>
class LatentSchedule {
 public:
  using context_type = ScheduleContext<T, ExecSpace, Core>;
  using tensor3 = typename context_type::tensor3;
  using tensor4 = typename context_type::tensor4;
  using tensor5 = typename context_type::tensor5;
  using gradients_type = typename context_type::gradients_type;
  using workspace_type = LatentForwardWorkspace<T, ExecSpace>;
  using scratch_type = LatentScratch<T, ExecSpace>;
  using pool_type = ForwardWorkspacePool<workspace_type>;
  using pass_type = ForwardPass<T, ExecSpace, workspace_type>;

  explicit LatentSchedule(const context_type& ctx) : ctx_(&ctx) {}

  const context_type& context() const { return *ctx_; }
  /// The schedule's per-forward workspaces and its per-call scratch: a cache of the configuration, written by the
  /// const operations (as an FFT plan's buffers are).
  pool_type& pool() const { return pool_; }
  scratch_type& scratch() const { return scratch_; }

  /// The pass's output y [B, s, D]; what backward needs stays in the pass's workspace.
  tensor3 forward(const ExecSpace& space, const pass_type& p) const {
    const context_type& ctx = *ctx_;
    const MlaConfig& c = ctx.config();
    const int B = c.batch, S = ctx.attention_seq(), s = ctx.local_seq(), h = ctx.local_heads(), dn = c.nope;
    const int dv = c.vdim, dr = c.rope, R = c.latent;
    auto& w = p.w;
    const bool overlap = c.overlap;
    // The payload [RMSNorm(c), RoPE(k_pe)]: both written straight into the all-gather's input, no copies. On a ring
    // the gathered chunk is kept in the workspace (the backward passes it round the ring again).
    const bool ring = ctx.ring(), grouped = ctx.mesh().size() > 1;
    const tensor3& payload = ring && !grouped ? ensure(w.ring_payload, "mlacp::ring payload", B, s, R + dr)
                                              : ensure(scratch_.payload, "mlacp::payload", B, s, R + dr);
    const tensor3& kv_a = project_kv_a(ctx, space, p, payload);
    rope_forward(space, as_rank4(kv_a), R, as_rank4(payload), R, ctx.rope_table(space, p));
    const tensor3 gathered_into = ring ? ctx.into(w.ring_payload, "mlacp::ring payload", B, S, R + dr)
                                       : ctx.into(scratch_.gathered, "mlacp::gathered payload", B, S, R + dr);
    // The all-gather leaves first, as soon as its input exists: the Q projection (two GEMMs and an RMSNorm with
    // q-LoRA) runs while it is in flight.
    auto gather = launch_wire(space, payload, gathered_into, ctx.wire(scratch_.payload_wire), names::payload_all_gather,
                              [&](const auto& view, const auto& into) {
                                return launch_all_gather(space, view, 1, ctx.seq_partition(), ctx.mesh(),
                                                         names::payload_all_gather, into);
                              });
    tensor3 gathered;
    if (!overlap) gathered = gather.wait();
    tensor4 q = project_q(ctx, space, p);
    // Q's all-to-all leaves next; the KV expansion (the rank's w_kvb rows on the gathered payload) runs while it is in
    // flight.
    w.q_pair = InputA2APair<T, ExecSpace>(ctx.mesh(), names::q, ctx.seq_partition(), ctx.head_partition());
    w.q_pair.launch_forward(space, q, needs_q(p.flags), ctx.into(w.q_heads, "mlacp::q heads", B, S, h, dn + dr),
                            ctx.wire(scratch_.q_wire));
    if (!overlap) w.q_saved = w.q_pair.wait_forward();
    if (gather.pending()) gathered = gather.wait();
    if (ring) {
      // Ring attention: each chunk (this one first) is expanded for the rank's heads as it comes round.
      if (overlap) w.q_saved = w.q_pair.wait_forward();
      return attend_and_project(ctx, scratch_, space, p,
                                [&] { ring_.forward_latent(space, ctx, p, w.q_saved, w.ring_payload, w.o, w.lse); });
    }
    const tensor3& kv = ensure(scratch_.kv, "mlacp::kv", B, S, h * (dn + dv));
    // The shared key is read from the gathered payload by assemble_kv: no k_pe copy.
    w.latent_kv.forward(space, gathered, ctx.rows_of(ctx.weights().w_kvb), ctx.part_of(ctx.weights().b_kvb), ctx.mesh(),
                        ctx.seq_partition(), kv, tensor3(), ensure(w.latent, "mlacp::latent", B, S, R));
    if (overlap) w.q_saved = w.q_pair.wait_forward();
    assemble_kv(space, tensor4(kv.data(), B, S, h, dn + dv), gathered, ensure(w.k, "mlacp::k", B, S, h, dn + dr),
                ensure(w.v, "mlacp::v", B, S, h, dv), dn, R);
    w.k_saved = w.k;
    w.v_saved = w.v;
    return attend_and_project(ctx, scratch_, space, p);
  }

  /// One backward of a pass as its named steps. run() takes them in the schedule's order; a caller that instruments
  /// the schedule (perf_overlap's dQ pair) may call them one by one in that order, which is what run() does.
  class Backward {
   public:
    Backward(const LatentSchedule& schedule, const ExecSpace& space, const pass_type& p, const tensor3& dy,
             gradients_type& g)
        : schedule_(&schedule), space_(space), p_(p), dy_(dy), g_(&g) {}

    /// The output projection's backward (dO all-to-all beside the w_o wgrad) and the attention backward: dq, dk, dv.
    /// False when nothing upstream of the attention needs a gradient (then no other step has anything to do).
    bool attention() {
      if (!ctx().ring()) {
        active_ = output_and_attention_backward(ctx(), schedule_->scratch_, space_, p_, dy_, *g_, grads_);
        return active_;
      }
      // Ring: the attention backward passes the chunks round the ring again, expanding each, and sends the payload
      // gradient's partial sums home behind them; w_kvb's gradients accumulate chunk by chunk.
      const context_type& x = ctx();
      const MlaConfig& c = x.config();
      const MlaRequiresGrad& r = p_.flags;
      active_ =
          output_and_attention_backward(x, schedule_->scratch_, space_, p_, dy_, *g_, grads_, [&](const auto& d_o) {
            const bool payload = needs_payload(r);
            schedule_->ring_.backward_latent(
                space_, x, p_, p_.w.q_saved, p_.w.ring_payload, p_.w.o, p_.w.lse, d_o, grads_.dq,
                payload ? ensure(schedule_->scratch_.grad_payload, "mlacp::d payload", c.batch, x.attention_seq(),
                                 c.latent + c.rope)
                        : tensor3(),
                r.w_kvb ? x.rows_of(g_->w_kvb) : typename context_type::gradient_rows(),
                r.b_kvb && c.bias ? x.part_of(g_->b_kvb) : typename context_type::gradient_part());
            ring_pending_ = true;
          });
      return active_;
    }
    /// The inverse all-to-all of dQ is launched (when the Q branch needs dQ).
    void launch_dq() {
      if (!active_) return;
      const MlaConfig& c = ctx().config();
      p_.w.q_pair.launch_backward(space_, grads_.dq,
                                  ctx().blocks_into(schedule_->scratch_.dq_blocks, "mlacp::dQ blocks", c.qk_dim()),
                                  ctx().wire(schedule_->scratch_.dq_wire));
    }
    /// dQ's head blocks are waited (when launched).
    void wait_dq() {
      if (active_ && needs_q(p_.flags) && !dq_waited_) {
        dq_blocks_ = p_.w.q_pair.wait_backward_blocks();
        dq_waited_ = true;
      }
    }
    /// The KV path's backward: dK and dV disassembled into d(kv) and the shared key's gradient, then
    /// LatentKVLinear::launch_backward: the w_kvb dgrad, the latent reduce-scatter launched, the w_kvb weight gradient
    /// while it is in flight. The reduce-scatter is still in flight when it returns.
    void kv() {
      if (!active_ || !needs_kv(p_.flags)) return;
      if (ctx().ring()) return ring_kv();
      const context_type& x = ctx();
      const MlaConfig& c = x.config();
      const MlaRequiresGrad& r = p_.flags;
      const int B = c.batch, S = x.attention_seq(), h = x.local_heads(), dn = c.nope, dv = c.vdim, dr = c.rope,
                R = c.latent;
      scratch_type& scratch = schedule_->scratch_;
      const bool payload = needs_payload(r);
      ComputePhase<ExecSpace> phase(space_, names::kv_backward);
      const tensor3& dkv = ensure(scratch.dkv, "mlacp::d kv", B, S, h * (dn + dv));
      const tensor3& dkpe = ensure(scratch.dkpe, "mlacp::d k_pe", B, S, dr);
      disassemble_kv_grad(space_, grads_.dk, grads_.dv, tensor4(dkv.data(), B, S, h, dn + dv), dkpe, dn);
      p_.w.latent_kv.launch_backward(
          space_, dkv, dkpe, payload, r.w_kvb ? x.rows_of(g_->w_kvb) : typename context_type::gradient_rows(),
          r.b_kvb && c.bias ? x.part_of(g_->b_kvb) : typename context_type::gradient_part(), c.overlap,
          payload ? ensure(scratch.grad_payload, "mlacp::d payload", B, S, R + dr) : tensor3(),
          payload ? ensure(scratch.grad_latent, "mlacp::d latent", B, S, R) : tensor3(),
          payload ? x.into(scratch.d_payload, "mlacp::d payload local", B, x.local_seq(), R + dr) : tensor3(),
          x.wire_reduce(scratch.reduce_wire));
      kv_launched_ = true;
    }
    /// The Q branch's backward on dQ's head blocks (waits them if wait_dq() has not).
    void q_branch() {
      if (!active_ || !needs_q(p_.flags)) return;
      wait_dq();
      q_branch_backward(ctx(), schedule_->scratch_, space_, p_, dq_blocks_, *g_);
    }
    /// The latent reduce-scatter is waited and the local payload's backward runs: the RoPE transpose of the shared
    /// key's gradient (payload columns [R, R+dr)) and kv_a_backward (RMSNorm, w_kva).
    void payload() {
      if (!kv_launched_) return;
      kv_launched_ = false;
      const tensor3 d_payload = !ctx().ring()       ? p_.w.latent_kv.wait_backward()
                                : reduce_.pending() ? reduce_.wait()
                                                    : std::exchange(reduced_, tensor3());
      if (!needs_payload(p_.flags)) return;
      const int R = ctx().config().latent;
      ComputePhase<ExecSpace> phase(space_, names::payload_backward);
      const tensor3& d_kv_a = detail::d_kv_a(ctx(), schedule_->scratch_);
      rope_backward(space_, as_rank4(d_payload), R, as_rank4(d_kv_a), R, ctx().rope_table(space_, p_));
      kv_a_backward(ctx(), space_, p_, d_payload, d_kv_a, *g_);
    }

    /// Every step in the schedule's order: with overlap on, dQ is waited after the KV path's backward; off, right
    /// after its launch.
    void run() {
      if (!attention()) return;
      launch_dq();
      if (!ctx().config().overlap) wait_dq();
      kv();
      q_branch();
      payload();
    }

   private:
    const context_type& ctx() const { return *schedule_->ctx_; }

    // Ring: the payload gradient's accumulator comes home (the ring's last exchange, waited here, after dQ's launch)
    // and the Ulysses group reduce-scatters it over the heads, as the flat layer does.
    void ring_kv() {
      if (ring_pending_) schedule_->ring_.finish_backward(space_);
      ring_pending_ = false;
      kv_launched_ = true;
      if (!needs_payload(p_.flags)) return;
      const context_type& x = ctx();
      const MlaConfig& c = x.config();
      scratch_type& scratch = schedule_->scratch_;
      reduce_ = launch_wire(
          space_, scratch.grad_payload,
          x.into(scratch.d_payload, "mlacp::d payload local", c.batch, x.local_seq(), c.latent + c.rope),
          x.wire_reduce(scratch.reduce_wire), names::latent_reduce_scatter, [&](const auto& v, const auto& into) {
            return launch_reduce_scatter(space_, v, 1, x.seq_partition(), x.mesh(), names::latent_reduce_scatter, into);
          });
      if (!c.overlap) reduced_ = reduce_.wait();
    }

    const LatentSchedule* schedule_;
    ExecSpace space_;
    pass_type p_;
    const tensor3& dy_;
    gradients_type* g_;
    AttentionGradients<tensor4> grads_;
    tensor5 dq_blocks_;
    WireCollective<ExecSpace, tensor3> reduce_;  // ring: the latent reduce-scatter, from ring_kv() to payload()
    tensor3 reduced_;                            // ring, overlap off: the reduce-scatter's result, waited at its launch
    bool active_ = false, dq_waited_ = false, kv_launched_ = false, ring_pending_ = false;
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
