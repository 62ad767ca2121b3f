// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The latent strategy's schedule (MlaStrategy::latent): the compressed payload [c, k_pe] is all-gathered and every
// rank expands only its own heads; backward reduce-scatters the payload gradient. It owns its memory (its forward
// workspaces and scratch) and exposes its backward as named steps (LatentSchedule::Backward), which backward() runs in
// order and perf_tests time one by one.
#pragma once

#include <mlacp/all_gather.hpp>
#include <mlacp/mla/detail/forward_workspace.hpp>
#include <mlacp/mla/detail/ring_attention.hpp>
#include <mlacp/mla/detail/schedule_base.hpp>
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
  Buffer<tensor3> latent;                  ///< [B, S, R], the gathered normalised latent
  Buffer<tensor4> k, v;                    ///< [B, S, h, dqk], [B, S, h, dv]: head-local k, v expanded from it
  LatentKVLinear<T, ExecSpace> latent_kv;  ///< its backward (w_kvb's gradients, the latent reduce-scatter)
  Buffer<tensor3> ring_payload;            ///< ring: [B, Sg, R+dr], the own chunk's payload (the ring's first chunk)

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
  Buffer<tensor3> payload;   ///< [B, s, R+dr], the all-gather's input: [RMSNorm(c), RoPE(k_pe)]
  Buffer<tensor3> gathered;  ///< [B, S, R+dr], the all-gather's result (P > 1)
  Buffer<tensor3> kv;        ///< [B, S, h*(dn+dv)], the rank's heads of the expansion
  // backward
  Buffer<tensor3> dkv;           ///< [B, S, h*(dn+dv)]
  Buffer<tensor3> dkpe;          ///< [B, S, dr]
  Buffer<tensor3> grad_payload;  ///< [B, S, R+dr], the reduce-scatter's input
  Buffer<tensor3> grad_latent;   ///< [B, S, R]
  Buffer<tensor3> d_payload;     ///< [B, s, R+dr], the reduce-scatter's result (P > 1)
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
class LatentSchedule
    : public ScheduleBase<T, ExecSpace, Core, LatentForwardWorkspace<T, ExecSpace>, LatentScratch<T, ExecSpace>> {
  using base = ScheduleBase<T, ExecSpace, Core, LatentForwardWorkspace<T, ExecSpace>, LatentScratch<T, ExecSpace>>;
  using base::ctx_;
  using base::ring_;
  using base::scratch_;

 public:
  using base::base;
  using typename base::context_type;
  using typename base::gradients_type;
  using typename base::pass_type;
  using typename base::scratch_type;
  using typename base::tensor3;
  using typename base::tensor4;
  using typename base::tensor5;

  /// The pass's output y [B, s, D]; what backward needs stays in the pass's workspace. The order is the timeline's
  /// (timeline.hpp, latent_forward); Forward does each of its steps.
  tensor3 forward(const ExecSpace& space, const pass_type& p) const {
    Forward run(*this, space, p);
    timeline::forward(run, this->facts(p.flags));
    return run.y;
  }

  /// The forward's steps, as the timeline names them.
  class Forward {
   public:
    Forward(const LatentSchedule& schedule, const ExecSpace& space, const pass_type& p)
        : s_(&schedule), ctx_(*schedule.ctx_), space_(space), p_(p) {}
    tensor3 y;

    void compute(timeline::Step step, int) {
      const MlaConfig& c = ctx_.config();
      const int B = c.batch, S = ctx_.attention_seq(), s = ctx_.local_seq(), h = ctx_.local_heads(), dn = c.nope;
      const int dv = c.vdim, dr = c.rope, R = c.latent;
      auto& w = p_.w;
      auto& scratch = s_->scratch_;
      switch (step) {
        case timeline::Step::kv_a_projection: {
          // The payload [RMSNorm(c), RoPE(k_pe)]: both written straight into the all-gather's input, no copies. On a
          // ring the gathered chunk is kept in the workspace (the backward passes it round the ring again).
          const bool ring = ctx_.ring(), grouped = ctx_.mesh().size() > 1;
          payload_ = ring && !grouped ? ensure(w.ring_payload, "mlacp::ring payload", B, s, R + dr)
                                      : ensure(scratch.payload, "mlacp::payload", B, s, R + dr);
          const tensor3& kv_a = project_kv_a(ctx_, space_, p_, payload_);
          rope_forward(space_, as_rank4(kv_a), R, as_rank4(payload_), R, ctx_.rope_table(space_, p_));
          return;
        }
        case timeline::Step::q_projection:
          q_ = project_q(ctx_, space_, p_);
          return;
        case timeline::Step::kv_expansion:
          // The rank's w_kvb rows on the gathered payload.
          w.latent_kv.forward(space_, gathered_, ctx_.rows_of(ctx_.weights().w_kvb), ctx_.part_of(ctx_.weights().b_kvb),
                              ctx_.mesh(), ctx_.seq_partition(), ensure(scratch.kv, "mlacp::kv", B, S, h * (dn + dv)),
                              tensor3(), ensure(w.latent, "mlacp::latent", B, S, R));
          return;
        case timeline::Step::assemble_kv:
          // The shared key is read from the gathered payload: no k_pe copy.
          assemble_kv(space_, tensor4(scratch.kv.view().data(), B, S, h, dn + dv), gathered_,
                      ensure(w.k, "mlacp::k", B, S, h, dn + dr), ensure(w.v, "mlacp::v", B, S, h, dv), dn, R);
          w.k_saved = w.k.view();
          w.v_saved = w.v.view();
          return;
        case timeline::Step::attention:
          return attention_forward(ctx_, space_, p_);
        default:
          return;
      }
    }
    void launch(timeline::Comm comm, int) {
      const MlaConfig& c = ctx_.config();
      const int B = c.batch, S = ctx_.attention_seq(), h = ctx_.local_heads(), R = c.latent, dr = c.rope;
      auto& w = p_.w;
      if (comm == timeline::Comm::payload_all_gather) {
        const tensor3 into = ctx_.ring() ? ctx_.into(w.ring_payload, "mlacp::ring payload", B, S, R + dr)
                                         : ctx_.into(s_->scratch_.gathered, "mlacp::gathered payload", B, S, R + dr);
        gather_ = launch_all_gather(space_, payload_, 1, ctx_.seq_partition(), ctx_.mesh(), names::payload_all_gather,
                                    into, ctx_.codec(WireExchange::forward));
      } else {  // Q's all-to-all
        w.q_pair = InputA2APair<T, ExecSpace>(ctx_.mesh(), names::q, ctx_.seq_partition(), ctx_.head_partition());
        w.q_pair.launch_forward(space_, q_, needs_q(p_.flags),
                                ctx_.into(w.q_heads, "mlacp::q heads", B, S, h, c.qk_dim()),
                                ctx_.codec(WireExchange::forward));
      }
    }
    void wait(timeline::Comm comm, int) {
      if (comm == timeline::Comm::payload_all_gather)
        gathered_ = gather_.wait();
      else
        p_.w.q_saved = p_.w.q_pair.wait_forward();
    }
    void part(timeline::Part part) {
      auto& w = p_.w;
      if (part == timeline::Part::ring_forward) {
        // Each chunk (this one first) is expanded for the rank's heads as it comes round.
        attention_output(ctx_, p_);
        s_->ring_.forward_latent(space_, ctx_, p_, w.q_saved, w.ring_payload.view(), w.o.view(), w.lse.view());
      } else {
        y = project_output(ctx_, s_->scratch_, space_, p_);
      }
    }

   private:
    const LatentSchedule* s_;
    const context_type& ctx_;
    ExecSpace space_;
    pass_type p_;
    tensor3 payload_, gathered_;
    tensor4 q_;
    AsyncCollective<tensor3> gather_;
  };

  /// One backward of a pass as its named steps. run() takes them in the timeline's order (timeline.hpp,
  /// latent_backward); a caller that instruments the schedule (perf_overlap's dQ pair, the schedule tests) may call
  /// the public steps one by one in another order: each waits what it needs if the caller has not.
  class Backward {
   public:
    Backward(const LatentSchedule& schedule, const ExecSpace& space, const pass_type& p, const tensor3& dy,
             gradients_type& g)
        : schedule_(&schedule), space_(space), p_(p), dy_(dy), g_(&g) {}

    /// The output projection's backward (dO all-to-all beside the w_o wgrad) and the attention backward: dq, dk, dv.
    /// False when nothing upstream of the attention needs a gradient (then no other step has anything to do).
    bool attention() {
      part(timeline::Part::output_backward);
      if (!active_) return false;
      if (ctx().ring())
        part(timeline::Part::ring_backward);
      else
        compute(timeline::Step::attention_backward, 0);
      return true;
    }
    /// The inverse all-to-all of dQ is launched (when the Q branch needs dQ).
    void launch_dq() {
      if (active_) launch(timeline::Comm::dq_a2a, 0);
    }
    /// dQ's head blocks are waited (when launched).
    void wait_dq() {
      if (active_ && needs_q(p_.flags) && !dq_waited_) wait(timeline::Comm::dq_a2a, 0);
    }
    /// The KV path's backward up to the reduce-scatter in flight: flat, dK and dV disassembled and
    /// LatentKVLinear::launch_backward (the w_kvb dgrad, the latent reduce-scatter launched, the w_kvb weight
    /// gradient while it is in flight); on a ring, the payload gradient's accumulator home and its reduce-scatter
    /// launched.
    void kv() {
      if (!active_ || !needs_kv(p_.flags)) return;
      if (ctx().ring()) {
        part(timeline::Part::ring_finish);
        if (!needs_payload(p_.flags)) return;
        launch(timeline::Comm::latent_reduce_scatter, 0);
        if (!ctx().config().overlap) wait(timeline::Comm::latent_reduce_scatter, 0);
      } else {
        compute(timeline::Step::kv_disassemble, 0);
        part(timeline::Part::latent_kv_backward);
      }
    }
    /// The Q branch's backward on dQ's head blocks (waits them if wait_dq() has not).
    void q_branch() {
      if (!active_ || !needs_q(p_.flags)) return;
      wait_dq();
      compute(timeline::Step::q_branch, 0);
    }
    /// The latent reduce-scatter is waited and the local payload's backward runs.
    void payload() {
      if (!active_ || !needs_kv(p_.flags)) return;
      if (!needs_payload(p_.flags)) return end_latent_kv();
      if (!reduced_) wait(timeline::Comm::latent_reduce_scatter, 0);
      compute(timeline::Step::payload_backward, 0);
    }

    /// Every step in the timeline's order.
    void run() {
      timeline::backward(*this, schedule_->facts(p_.flags));
      end_latent_kv();
    }

    // ---- the timeline's steps (timeline.hpp) ----

    void compute(timeline::Step step, int) {
      const context_type& x = ctx();
      const MlaConfig& c = x.config();
      scratch_type& scratch = schedule_->scratch_;
      switch (step) {
        case timeline::Step::attention_backward:
          return attention_backward(x, space_, p_, d_o_, grads_);
        case timeline::Step::kv_disassemble: {
          const int B = c.batch, S = x.attention_seq(), h = x.local_heads(), dn = c.nope, dv = c.vdim;
          ComputePhase<ExecSpace> phase(space_, names::kv_backward);
          const tensor3& dkv = ensure(scratch.dkv, "mlacp::d kv", B, S, h * (dn + dv));
          const tensor3& dkpe = ensure(scratch.dkpe, "mlacp::d k_pe", B, S, c.rope);
          disassemble_kv_grad(space_, grads_.dk, grads_.dv, tensor4(dkv.data(), B, S, h, dn + dv), dkpe, dn);
          return;
        }
        case timeline::Step::q_branch:
          return q_branch_backward(x, scratch, space_, p_, dq_blocks_, *g_);
        case timeline::Step::payload_backward: {
          if (!reduced_) {  // flat, overlap off: LatentKVLinear waited it at its launch
            d_payload_ = p_.w.latent_kv.wait_backward();
            reduced_ = true;
          }
          const int R = c.latent;
          ComputePhase<ExecSpace> phase(space_, names::payload_backward);
          const tensor3& d_kv_a = detail::d_kv_a(x, scratch);
          rope_backward(space_, as_rank4(d_payload_), R, as_rank4(d_kv_a), R, x.rope_table(space_, p_));
          return kv_a_backward(x, space_, p_, d_payload_, d_kv_a, *g_);
        }
        default:
          return;
      }
    }
    void launch(timeline::Comm comm, int) {
      const context_type& x = ctx();
      const MlaConfig& c = x.config();
      scratch_type& scratch = schedule_->scratch_;
      if (comm == timeline::Comm::dq_a2a) {
        p_.w.q_pair.launch_backward(space_, grads_.dq, x.blocks_into(scratch.dq_blocks, "mlacp::dQ blocks", c.qk_dim()),
                                    x.codec(WireExchange::backward));
        return;
      }
      // Ring: the Ulysses group reduce-scatters the payload gradient over the heads, as the flat layer does.
      reduce_ = launch_reduce_scatter(
          space_, scratch.grad_payload.view(), 1, x.seq_partition(), x.mesh(), names::latent_reduce_scatter,
          x.into(scratch.d_payload, "mlacp::d payload local", c.batch, x.local_seq(), c.latent + c.rope),
          x.codec(WireExchange::reduce));
    }
    void wait(timeline::Comm comm, int) {
      if (comm == timeline::Comm::dq_a2a) {
        dq_blocks_ = p_.w.q_pair.wait_backward_blocks();
        dq_waited_ = true;
        return;
      }
      d_payload_ = ctx().ring() ? reduce_.wait() : p_.w.latent_kv.wait_backward();
      reduced_ = true;
    }
    void part(timeline::Part part) {
      const context_type& x = ctx();
      const MlaConfig& c = x.config();
      const MlaRequiresGrad& r = p_.flags;
      scratch_type& scratch = schedule_->scratch_;
      switch (part) {
        case timeline::Part::output_backward:
          d_o_ = output_backward(x, scratch, space_, p_, dy_, *g_, grads_);
          active_ = needs_attention(r);
          return;
        case timeline::Part::ring_backward: {
          // The chunks pass round the ring again, each expanded; the payload gradient's partial sums travel home
          // behind them; w_kvb's gradients accumulate chunk by chunk.
          const bool payload = needs_payload(r);
          schedule_->ring_.backward_latent(
              space_, x, p_, p_.w.q_saved, p_.w.ring_payload.view(), p_.w.o.view(), p_.w.lse.view(), d_o_, grads_.dq,
              payload ? ensure(scratch.grad_payload, "mlacp::d payload", c.batch, x.attention_seq(), c.latent + c.rope)
                      : tensor3(),
              r.w_kvb ? x.rows_of(g_->w_kvb) : typename context_type::gradient_rows(),
              r.b_kvb && c.bias ? x.part_of(g_->b_kvb) : typename context_type::gradient_part());
          return;
        }
        case timeline::Part::ring_finish:
          return schedule_->ring_.finish_backward(space_);
        case timeline::Part::latent_kv_backward: {
          const int B = c.batch, S = x.attention_seq(), R = c.latent, dr = c.rope;
          const bool payload = needs_payload(r);
          p_.w.latent_kv.launch_backward(
              space_, scratch.dkv.view(), scratch.dkpe.view(), payload,
              r.w_kvb ? x.rows_of(g_->w_kvb) : typename context_type::gradient_rows(),
              r.b_kvb && c.bias ? x.part_of(g_->b_kvb) : typename context_type::gradient_part(), c.overlap,
              payload ? ensure(scratch.grad_payload, "mlacp::d payload", B, S, R + dr) : tensor3(),
              payload ? ensure(scratch.grad_latent, "mlacp::d latent", B, S, R) : tensor3(),
              payload ? x.into(scratch.d_payload, "mlacp::d payload local", B, x.local_seq(), R + dr) : tensor3(),
              x.codec(WireExchange::reduce));
          kv_launched_ = true;
          return;
        }
        default:
          return;
      }
    }

   private:
    const context_type& ctx() const { return *schedule_->ctx_; }
    // LatentKVLinear's backward ends with its wait even when it launched no reduce-scatter (nothing needed the
    // payload's gradient).
    void end_latent_kv() {
      if (kv_launched_ && !reduced_ && !ctx().ring()) {
        p_.w.latent_kv.wait_backward();
        reduced_ = true;
      }
    }

    const LatentSchedule* schedule_;
    ExecSpace space_;
    pass_type p_;
    const tensor3& dy_;
    gradients_type* g_;
    AttentionGradients<tensor4> grads_;
    tensor4 d_o_;
    tensor5 dq_blocks_;
    AsyncCollective<tensor3> reduce_;  // ring: the latent reduce-scatter, launched after the ring's finish
    tensor3 d_payload_;                // the reduce-scatter's result (this rank's payload gradient)
    bool active_ = false, dq_waited_ = false, kv_launched_ = false, reduced_ = false;
  };

  /// Accumulates the pass's gradients into `g` (allocated where needed).
  void backward(const ExecSpace& space, const pass_type& p, const tensor3& dy, gradients_type& g) const {
    Backward(*this, space, p, dy, g).run();
  }
};

}  // namespace mlacp::detail
