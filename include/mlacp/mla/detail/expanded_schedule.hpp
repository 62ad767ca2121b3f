// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The expanded strategy's schedule (MlaStrategy::expanded): every rank expands k and v for its own tokens and all
// heads, and Q, K, V each take a token-to-head all-to-all. It owns its memory (its forward workspaces and scratch) and
// exposes its backward as named steps (ExpandedSchedule::Backward), which backward() runs in order.
#pragma once

#include <mlacp/mla/detail/forward_workspace.hpp>
#include <mlacp/mla/detail/ring_attention.hpp>
#include <mlacp/mla/detail/schedule_base.hpp>
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
  Buffer<tensor3> c;                 ///< [B, s, R], the normalised latent (w_kvb's wgrad reads it)
  Buffer<tensor4> k_local, v_local;  ///< [B, s, H, dqk], [B, s, H, dv]: token-local k, v, the K and V a2as' inputs
  Buffer<tensor4> k_heads, v_heads;  ///< [B, S, h, *]: their results (P > 1)
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
  Buffer<tensor3> kpe;  ///< [B, s, dr], the rotated shared key
  Buffer<tensor3> kv;   ///< [B, s, H*(dn+dv)], the expansion of every head for the rank's tokens
  // backward
  Buffer<tensor5> dk_blocks, dv_blocks;  ///< [P, B, s, h, *], the dK and dV inverse all-to-alls' results (P > 1)
  Buffer<tensor3> dkv;                   ///< [B, s, H*(dn+dv)]
  Buffer<tensor3> dkpe;                  ///< [B, s, dr]
  Buffer<tensor3> dc;                    ///< [B, s, R]
};

/// Forward: V, then K, then Q are launched as each is ready (the Q projection beside V and K), all three waited in
/// launch order; the O exchange is consumed per source block (OutputProjection). Backward (Backward's
/// steps in the order run() takes them): the three inverse all-to-alls are launched at once; dQ is waited first and
/// the Q branch runs while dK and dV are in flight, then the K and V branches read dK and dV where they arrived, then
/// w_kvb's gradients and the payload's.
template <class T, class ExecSpace, class Core>
class ExpandedSchedule
    : public ScheduleBase<T, ExecSpace, Core, ExpandedForwardWorkspace<T, ExecSpace>, ExpandedScratch<T, ExecSpace>> {
  using base = ScheduleBase<T, ExecSpace, Core, ExpandedForwardWorkspace<T, ExecSpace>, ExpandedScratch<T, ExecSpace>>;
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
  /// (timeline.hpp, expanded_forward); Forward does each of its steps.
  tensor3 forward(const ExecSpace& space, const pass_type& p) const {
    Forward run(*this, space, p);
    timeline::forward(run, this->facts(p.flags));
    return run.y;
  }

  /// The forward's steps, as the timeline names them.
  class Forward {
   public:
    Forward(const ExpandedSchedule& schedule, const ExecSpace& space, const pass_type& p)
        : s_(&schedule), ctx_(*schedule.ctx_), space_(space), p_(p) {}
    tensor3 y;

    void compute(timeline::Step step, int) {
      const MlaConfig& cfg = ctx_.config();
      const int B = cfg.batch, s = ctx_.local_seq(), H = cfg.heads, dn = cfg.nope, dv = cfg.vdim;
      const int dr = cfg.rope, R = cfg.latent;
      auto& w = p_.w;
      auto& scratch = s_->scratch_;
      switch (step) {
        case timeline::Step::kv_a_projection: {
          // c = RMSNorm(latent) and k_pe = RoPE(shared key), each written where the expansion reads it.
          const tensor3& c = ensure(w.c, "mlacp::c", B, s, R);
          const tensor3& kpe = ensure(scratch.kpe, "mlacp::k_pe", B, s, dr);
          const tensor3& kv_a = project_kv_a(ctx_, space_, p_, c);
          rope_forward(space_, as_rank4(kv_a), R, as_rank4(kpe), 0, ctx_.rope_table(space_, p_));
          return;
        }
        case timeline::Step::kv_expansion: {
          // Every head's k and v for the rank's own tokens: the K and V all-to-alls' inputs.
          const tensor3& kv = ensure(scratch.kv, "mlacp::kv", B, s, H * (dn + dv));
          {
            ComputePhase<ExecSpace> phase(space_, names::w_kvb_fprop);
            linear_forward(space_, as_matrix(w.c.view(), B * s, R), ctx_.weights().w_kvb, ctx_.weights().b_kvb,
                           as_matrix(kv, B * s, H * (dn + dv)));
          }
          assemble_kv(space_, tensor4(kv.data(), B, s, H, dn + dv), scratch.kpe.view(),
                      ensure(w.k_local, "mlacp::k local", B, s, H, dn + dr),
                      ensure(w.v_local, "mlacp::v local", B, s, H, dv), dn);
          return;
        }
        case timeline::Step::q_projection:
          q_ = project_q(ctx_, space_, p_);
          return;
        case timeline::Step::attention:
          return attention_forward(ctx_, space_, p_);
        default:
          return;
      }
    }
    void launch(timeline::Comm comm, int) {
      const MlaConfig& cfg = ctx_.config();
      const int B = cfg.batch, S = ctx_.attention_seq(), h = ctx_.local_heads();
      auto& w = p_.w;
      const bool kv_grad = needs_kv(p_.flags);
      if (comm == timeline::Comm::v_a2a) {
        w.v_pair = InputA2APair<T, ExecSpace>(ctx_.mesh(), names::v, ctx_.seq_partition(), ctx_.head_partition());
        w.v_pair.launch_forward(space_, w.v_local.view(), kv_grad,
                                ctx_.into(w.v_heads, "mlacp::v heads", B, S, h, cfg.vdim),
                                ctx_.codec(WireExchange::forward));
      } else if (comm == timeline::Comm::k_a2a) {
        w.k_pair = InputA2APair<T, ExecSpace>(ctx_.mesh(), names::k, ctx_.seq_partition(), ctx_.head_partition());
        w.k_pair.launch_forward(space_, w.k_local.view(), kv_grad,
                                ctx_.into(w.k_heads, "mlacp::k heads", B, S, h, cfg.qk_dim()),
                                ctx_.codec(WireExchange::forward));
      } else {
        w.q_pair = InputA2APair<T, ExecSpace>(ctx_.mesh(), names::q, ctx_.seq_partition(), ctx_.head_partition());
        w.q_pair.launch_forward(space_, q_, needs_q(p_.flags),
                                ctx_.into(w.q_heads, "mlacp::q heads", B, S, h, cfg.qk_dim()),
                                ctx_.codec(WireExchange::forward));
      }
    }
    void wait(timeline::Comm comm, int) {
      auto& w = p_.w;
      if (comm == timeline::Comm::v_a2a)
        w.v_saved = w.v_pair.wait_forward();
      else if (comm == timeline::Comm::k_a2a)
        w.k_saved = w.k_pair.wait_forward();
      else
        w.q_saved = w.q_pair.wait_forward();
    }
    void part(timeline::Part part) {
      auto& w = p_.w;
      if (part == timeline::Part::ring_forward) {
        // K and V of the rank's heads travel round the ring, chunk by chunk.
        attention_output(ctx_, p_);
        s_->ring_.forward_expanded(space_, ctx_, p_, w.q_saved, w.k_saved, w.v_saved, w.o.view(), w.lse.view());
      } else {
        y = project_output(ctx_, s_->scratch_, space_, p_);
      }
    }

   private:
    const ExpandedSchedule* s_;
    const context_type& ctx_;
    ExecSpace space_;
    pass_type p_;
    tensor4 q_;
  };

  /// One backward of a pass as its named steps. run() takes them in the timeline's order (timeline.hpp,
  /// expanded_backward); a caller that instruments the schedule may call the public steps one by one in another
  /// order: each waits what it needs if the caller has not.
  class Backward {
   public:
    Backward(const ExpandedSchedule& schedule, const ExecSpace& space, const pass_type& p, const tensor3& dy,
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
    /// The inverse all-to-alls of dQ, dK, dV are launched (each when its input needs its gradient; the ring's own
    /// chunk's dK and dV come home before dK's).
    void launch_dq() {
      if (active_ && needs_q(p_.flags)) launch(timeline::Comm::dq_a2a, 0);
    }
    void launch_dk() {
      if (!active_ || !needs_kv(p_.flags)) return;
      if (ctx().ring()) part(timeline::Part::ring_finish);
      launch(timeline::Comm::dk_a2a, 0);
    }
    void launch_dv() {
      if (active_ && needs_kv(p_.flags)) launch(timeline::Comm::dv_a2a, 0);
    }
    /// Their head blocks are waited (each once, when launched).
    void wait_dq() {
      if (active_ && needs_q(p_.flags) && !dq_waited_) wait(timeline::Comm::dq_a2a, 0);
    }
    void wait_dk() {
      if (active_ && needs_kv(p_.flags) && !dk_waited_) wait(timeline::Comm::dk_a2a, 0);
    }
    void wait_dv() {
      if (active_ && needs_kv(p_.flags) && !dv_waited_) wait(timeline::Comm::dv_a2a, 0);
    }
    /// The Q branch's backward on dQ's head blocks.
    void q_branch() {
      if (!active_ || !needs_q(p_.flags)) return;
      wait_dq();
      compute(timeline::Step::q_branch, 0);
    }
    /// dK's head blocks (as they arrived, no unpack) into d(kv)'s key columns and the shared key's gradient.
    void k_branch() {
      if (!active_ || !needs_kv(p_.flags)) return;
      wait_dk();
      compute(timeline::Step::k_branch, 0);
    }
    /// dV's head blocks into d(kv)'s value columns.
    void v_branch() {
      if (!active_ || !needs_kv(p_.flags)) return;
      wait_dv();
      compute(timeline::Step::v_branch, 0);
    }
    /// w_kvb's gradients from d(kv), then dc = d(kv) w_kvb and the payload's backward: the RoPE transpose of the
    /// shared key's gradient and kv_a_backward (RMSNorm, w_kva).
    void kv_and_payload() {
      if (!active_ || !needs_kv(p_.flags)) return;
      compute(timeline::Step::kv_and_payload, 0);
    }

    /// Every step in the timeline's order.
    void run() { timeline::backward(*this, schedule_->facts(p_.flags)); }

    // ---- the timeline's steps (timeline.hpp) ----

    void compute(timeline::Step step, int) {
      const context_type& x = ctx();
      const MlaConfig& c = x.config();
      switch (step) {
        case timeline::Step::attention_backward:
          return attention_backward(x, space_, p_, d_o_, grads_);
        case timeline::Step::q_branch:
          return q_branch_backward(x, schedule_->scratch_, space_, p_, dq_blocks_, *g_);
        case timeline::Step::k_branch: {
          ComputePhase<ExecSpace> phase(space_, names::k_backward);
          return key_grad_from_blocks(space_, dk_blocks_.data(), static_cast<std::int64_t>(dk_blocks_.extent(0)),
                                      dkv4(), dkpe(), c.nope);
        }
        case timeline::Step::v_branch: {
          ComputePhase<ExecSpace> phase(space_, names::v_backward);
          return value_grad_from_blocks(space_, dv_blocks_.data(), static_cast<std::int64_t>(dv_blocks_.extent(0)),
                                        dkv4(), c.nope);
        }
        case timeline::Step::kv_and_payload: {
          const MlaRequiresGrad& r = p_.flags;
          const int B = c.batch, s = x.local_seq(), H = c.heads, dn = c.nope, dv = c.vdim, R = c.latent;
          ComputePhase<ExecSpace> phase(space_, names::kv_backward);
          const tensor3& dkv = dkv4_storage();
          const auto dkv2 = as_matrix(dkv, B * s, H * (dn + dv));
          if (r.w_kvb) linear_wgrad(space_, dkv2, as_matrix(p_.w.c.view(), B * s, R), g_->w_kvb);
          if (r.b_kvb && c.bias) bias_grad(space_, dkv2, g_->b_kvb);
          if (!needs_payload(r)) return;
          scratch_type& scratch = schedule_->scratch_;
          const tensor3& dc = ensure(scratch.dc, "mlacp::d c", B, s, R);
          linear_dgrad(space_, dkv2, x.weights().w_kvb, T(0), as_matrix(dc, B * s, R));
          const tensor3& d_kv_a = detail::d_kv_a(x, scratch);
          rope_backward(space_, as_rank4(dkpe()), 0, as_rank4(d_kv_a), R, x.rope_table(space_, p_));
          return kv_a_backward(x, space_, p_, dc, d_kv_a, *g_);
        }
        default:
          return;
      }
    }
    void launch(timeline::Comm comm, int) {
      scratch_type& scratch = schedule_->scratch_;
      const int qk = ctx().config().qk_dim();
      if (comm == timeline::Comm::dq_a2a)
        launch_inverse(p_.w.q_pair, grads_.dq, scratch.dq_blocks, "mlacp::dQ blocks", qk);
      else if (comm == timeline::Comm::dk_a2a)
        launch_inverse(p_.w.k_pair, grads_.dk, scratch.dk_blocks, "mlacp::dK blocks", qk);
      else
        launch_inverse(p_.w.v_pair, grads_.dv, scratch.dv_blocks, "mlacp::dV blocks", ctx().config().vdim);
    }
    void wait(timeline::Comm comm, int) {
      if (comm == timeline::Comm::dq_a2a) {
        dq_blocks_ = p_.w.q_pair.wait_backward_blocks();
        dq_waited_ = true;
      } else if (comm == timeline::Comm::dk_a2a) {
        dk_blocks_ = p_.w.k_pair.wait_backward_blocks();
        dk_waited_ = true;
      } else {
        dv_blocks_ = p_.w.v_pair.wait_backward_blocks();
        dv_waited_ = true;
      }
    }
    void part(timeline::Part part) {
      const context_type& x = ctx();
      switch (part) {
        case timeline::Part::output_backward:
          d_o_ = output_backward(x, schedule_->scratch_, space_, p_, dy_, *g_, grads_);
          active_ = needs_attention(p_.flags);
          return;
        case timeline::Part::ring_backward: {
          // K and V travel round the ring again and their gradients' accumulators home behind them; the own chunk's
          // dK and dV are complete once the last exchange is waited (ring_finish, after dQ's launch).
          const auto& w = p_.w;
          return schedule_->ring_.backward_expanded(space_, x, p_, w.q_saved, w.k_saved, w.v_saved, w.o.view(),
                                                    w.lse.view(), d_o_, grads_.dq, grads_.dk, grads_.dv);
        }
        case timeline::Part::ring_finish:
          return schedule_->ring_.finish_backward(space_);
        default:
          return;
      }
    }

   private:
    const context_type& ctx() const { return *schedule_->ctx_; }

    void launch_inverse(InputA2APair<T, ExecSpace>& pair, const tensor4& grad, Buffer<tensor5>& slot, const char* label,
                        int d) {
      pair.launch_backward(space_, grad, ctx().blocks_into(slot, label, d), ctx().codec(WireExchange::backward));
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
    tensor4 d_o_;
    tensor5 dq_blocks_, dk_blocks_, dv_blocks_;
    bool active_ = false, dq_waited_ = false, dk_waited_ = false, dv_waited_ = false;
  };

  /// Accumulates the pass's gradients into `g` (allocated where needed).
  void backward(const ExecSpace& space, const pass_type& p, const tensor3& dy, gradients_type& g) const {
    Backward(*this, space, p, dy, g).run();
  }
};

}  // namespace mlacp::detail
