// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The compute steps both MLA schedules run (latent_schedule.hpp, expanded_schedule.hpp): the q projection, the kv_a
// projection with its RMSNorm, attention + output projection, the output and attention backward, the Q branch's
// backward and the kv_a projection's backward. Each takes the schedule's context, the pass and (where it needs one)
// the schedule's scratch; where a result goes is the schedule's to say (its own layout: the payload of the latent
// strategy, c and k_pe of the expanded one), so no step switches on the strategy.
#pragma once

#include <mlacp/mla/detail/forward_workspace.hpp>
#include <mlacp/mla/detail/schedule_context.hpp>
#include <mlacp/mla/kernels/detail/linear.hpp>
#include <mlacp/mla/kernels/rms_norm.hpp>
#include <mlacp/mla/kernels/rope.hpp>
#include <mlacp/mla/kernels/view_utils.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/panelled_gemm.hpp>

#include <cstdint>
#include <utility>

namespace mlacp::detail {

// ---- forward ----

/// Multiplies q's values by `factor` (the configured softmax scale over 1/sqrt(dqk), scale_factor below).
template <class ExecSpace, class View>
void scale_values(const ExecSpace& space, const View& v, double factor) {
  using V = typename View::non_const_value_type;
  using A = compat::accumulation_t<V>;
  auto* data = v.data();
  const auto f = static_cast<A>(factor);
  Kokkos::parallel_for(
      "mlacp::scale q",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, static_cast<std::int64_t>(v.span())),
      KOKKOS_LAMBDA(const std::int64_t i) { data[i] = static_cast<V>(static_cast<A>(data[i]) * f); });
}

/// What the configured softmax scale (MlaConfig::attention_scale) is over the 1/sqrt(dqk) every attention core
/// applies: the layer folds it into q (forward: q *= factor after RoPE; backward: dq *= factor before the RoPE
/// transpose), so that every core, the library's and a user's, computes softmax(q k^T * scale) without a scale
/// argument. 1 (nothing to do) by default.
inline double scale_factor(const MlaConfig& c) {
  return c.attention_scale() * compat::math::sqrt(static_cast<double>(c.qk_dim()));
}
inline bool scales_q(const MlaConfig& c) { return c.softmax_scale > 0 && scale_factor(c) != 1.0; }

/// q = RoPE(x w_q^T + b_q) [B, s, H, dqk], in the workspace; with q-LoRA (MlaConfig::q_lora_rank > 0),
/// q = RoPE(cq w_qb^T + b_q) with cq = RMSNorm(x w_qa^T) * g_q, both kept in the workspace for the backward. With a
/// configured softmax scale, q is multiplied by scale_factor().
template <class Context>
typename Context::tensor4 project_q(const Context& ctx, const typename Context::execution_space& space,
                                    const typename Context::pass_type& p) {
  const MlaConfig& c = ctx.config();
  const int B = c.batch, s = ctx.local_seq(), D = c.hidden, H = c.heads, dqk = c.qk_dim();
  const auto& q = ensure(p.w.q_local, "mlacp::q", B, s, H, dqk);
  ComputePhase<typename Context::execution_space> phase(space, names::w_q_fprop);
  const auto& w = ctx.weights();
  if (c.q_lora()) {
    const int Rq = c.q_lora_rank;
    const auto& q_a = ensure(p.w.q_a, "mlacp::q_a", B, s, Rq);
    const auto& cq = ensure(p.w.cq, "mlacp::cq", B, s, Rq);
    linear_forward(space, as_matrix(p.x, B * s, D), w.w_qa, typename Context::vector_part(), as_matrix(q_a, B * s, Rq));
    rms_norm_forward(space, q_a, w.g_q, cq, ensure(p.w.rstd_q, "mlacp::rstd q", B * s), c.rms_eps);
    linear_forward(space, as_matrix(cq, B * s, Rq), w.w_qb, w.b_q, as_matrix(q, B * s, H * dqk));
  } else {
    linear_forward(space, as_matrix(p.x, B * s, D), w.w_q, w.b_q, as_matrix(q, B * s, H * dqk));
  }
  rope_forward(space, q, c.nope, q, c.nope, ctx.rope_table(space, p));
  if (scales_q(c)) scale_values(space, q, scale_factor(c));
  return q;
}

/// kv_a = x w_kva^T [B, s, R+dr] (saved for the RMSNorm backward), and RMSNorm of its latent columns into columns
/// [0, R) of `latent_out` [B, s, >= R], where the schedule uses it. Returns kv_a: the schedule rotates its shared key
/// (columns [R, R+dr)) into its own layout.
template <class Context>
const typename Context::tensor3& project_kv_a(const Context& ctx, const typename Context::execution_space& space,
                                              const typename Context::pass_type& p,
                                              const typename Context::tensor3& latent_out) {
  const MlaConfig& c = ctx.config();
  const int B = c.batch, s = ctx.local_seq(), D = c.hidden, R = c.latent, dr = c.rope;
  ComputePhase<typename Context::execution_space> phase(space, names::w_kva_fprop);
  const auto& kv_a = ensure(p.w.kv_a, "mlacp::kv_a", B, s, R + dr);
  const auto& w = ctx.weights();
  linear_forward(space, as_matrix(p.x, B * s, D), w.w_kva, typename Context::vector_part(),
                 as_matrix(kv_a, B * s, R + dr));
  rms_norm_forward(space, kv_a, w.g_kv, latent_out, ensure(p.w.rstd, "mlacp::rstd", B * s), c.rms_eps);
  return kv_a;
}

/// The attention output o [B, S, h, dv] and its log-sum-exp lse [B, h, S] in the pass's workspace, before the core
/// (or the ring) writes them.
template <class Context>
void attention_output(const Context& ctx, const typename Context::pass_type& p) {
  const MlaConfig& c = ctx.config();
  const int B = c.batch, S = ctx.attention_seq(), h = ctx.local_heads();
  ensure(p.w.o, "mlacp::o", B, S, h, c.vdim);
  ensure(p.w.lse, "mlacp::lse", B, h, S);
}

/// The attention core on the saved head-local q, k, v (flat): o and lse.
template <class Context>
void attention_forward(const Context& ctx, const typename Context::execution_space& space,
                       const typename Context::pass_type& p) {
  attention_output(ctx, p);
  ComputePhase<typename Context::execution_space> phase(space, names::attention_fprop);
  ctx.core_forward(space, p, p.w.q_saved, p.w.k_saved, p.w.v_saved, p.w.o.view(), p.w.lse.view());
}

/// The attention core on the query rows of rank `owner`'s tokens (the Ulysses group's token partition) against their
/// causal prefix (flat, ScheduleContext::core_attends_blocks): those rows of o and lse.
template <class Context>
void attention_rows_forward(const Context& ctx, const typename Context::execution_space& space,
                            const typename Context::pass_type& p, int owner) {
  ComputePhase<typename Context::execution_space> phase(space, names::attention_fprop);
  const Partition& seq = ctx.seq_partition();
  ctx.core_forward_rows(space, p, p.w.q_saved, p.w.k_saved, p.w.v_saved, p.w.o.view(), p.w.lse.view(),
                        seq.offset(owner), seq.count(owner));
}

/// The output projection (OutputProjection: its exchange, in the forward's wire codec, and w_o, in the timeline's
/// output_forward order): y. Where the core attends in blocks (the timeline's o_blocks), the attention runs here too,
/// one owner's query rows at a time, each block leaving as soon as it is computed (forward_as_computed).
template <class Context, class Scratch>
typename Context::tensor3 project_output(const Context& ctx, Scratch& scratch,
                                         const typename Context::execution_space& space,
                                         const typename Context::pass_type& p) {
  const MlaConfig& c = ctx.config();
  const int B = c.batch, s = ctx.local_seq();
  auto& w = p.w;
  const auto y = ensure_exact(w.y, "mlacp::y", B, s, c.hidden);
  const auto o_tokens = ctx.into(w.o_tokens, "mlacp::o tokens", B, s, c.heads, c.vdim);
  if (ctx.core_attends_blocks()) {
    attention_output(ctx, p);
    return w.out_proj.forward_as_computed(
        space, [&](int owner) { attention_rows_forward(ctx, space, p, owner); }, w.o.view(), ctx.weights().w_o,
        ctx.weights().b_o, ctx.mesh(), ctx.seq_partition(), ctx.head_partition(), y, o_tokens,
        ctx.codec(WireExchange::forward), &scratch.o_exchange, c.overlap);
  }
  return w.out_proj.forward(space, w.o.view(), ctx.weights().w_o, ctx.weights().b_o, ctx.mesh(), ctx.seq_partition(),
                            ctx.head_partition(), y, o_tokens, ctx.codec(WireExchange::forward), &scratch.o_exchange,
                            c.overlap);
}

// ---- backward ----

/// The attention core's gradients of the head-local q, k, v [B, S, h, *]: dq when the Q branch needs it, dk and dv
/// when the KV path needs them (empty otherwise).
template <class Tensor4View>
struct AttentionGradients {
  Tensor4View dq, dk, dv;
};

/// The output projection's backward (OutputProjection: dO's all-to-all beside the w_o wgrad, in the timeline's
/// output_backward order), and the attention gradients' buffers in the scratch: dq when the Q branch needs it, dk and
/// dv when the KV path needs them (the core overwrites them: no zeroing). Returns dO [B, S, h, dv] (empty when
/// nothing upstream of the attention needs a gradient; then `out` stays empty).
template <class Context, class Scratch>
typename Context::tensor4 output_backward(const Context& ctx, Scratch& scratch,
                                          const typename Context::execution_space& space,
                                          const typename Context::pass_type& p, const typename Context::tensor3& dy,
                                          typename Context::gradients_type& g,
                                          AttentionGradients<typename Context::tensor4>& out) {
  using tensor5 = typename Context::tensor5;
  const MlaConfig& c = ctx.config();
  const MlaRequiresGrad& r = p.flags;
  const int B = c.batch, S = ctx.attention_seq(), h = ctx.local_heads();
  auto& w = p.w;
  const bool attention = needs_attention(r);
  auto d_o = w.out_proj.backward(
      space, dy, attention, r.w_o ? g.w_o : decltype(g.w_o)(), r.b_o && c.bias ? g.b_o : decltype(g.b_o)(), c.overlap,
      attention ? ctx.blocks(scratch.d_o_blocks, "mlacp::dO blocks", c.vdim) : tensor5(),
      attention ? ctx.into(scratch.d_o_heads, "mlacp::dO heads", 1, B, S, h, c.vdim) : tensor5(),
      ctx.codec(WireExchange::backward));
  if (!attention) return d_o;
  if (needs_q(r)) out.dq = ensure(scratch.dq, "mlacp::dq", B, S, h, c.qk_dim());
  if (needs_kv(r)) {
    out.dk = ensure(scratch.dk, "mlacp::dk", B, S, h, c.qk_dim());
    out.dv = ensure(scratch.dv, "mlacp::dv", B, S, h, c.vdim);
  }
  return d_o;
}

/// The attention core's backward (flat) from dO into `out`'s gradients.
template <class Context>
void attention_backward(const Context& ctx, const typename Context::execution_space& space,
                        const typename Context::pass_type& p, const typename Context::tensor4& d_o,
                        AttentionGradients<typename Context::tensor4>& out) {
  ComputePhase<typename Context::execution_space> phase(space, names::attention_bprop);
  ctx.core_backward(space, p, p.w.q_saved, p.w.k_saved, p.w.v_saved, p.w.o.view(), p.w.lse.view(), d_o, out.dq, out.dk,
                    out.dv);
}

/// The token-local dq as the head blocks [P, B, s, h, dqk] the inverse all-to-all received (block r: heads
/// [r*h, (r+1)*h); one block [1, B, s, H, dqk] when the heads are split unevenly) -> the query projection's gradients
/// and dx, one GEMM per block on the weight rows of its heads (no unpack). Dense: w_q / b_q gradients and dx += dq w_q.
/// q-LoRA: w_qb / b_q gradients and d(cq) = dq w_qb, then the query RMSNorm's backward (g_q's gradient, d(x w_qa^T)
/// in the scratch), w_qa's gradient and dx += d(x w_qa^T) w_qa.
template <class Context, class Scratch>
void q_branch_backward(const Context& ctx, Scratch& scratch, const typename Context::execution_space& space,
                       const typename Context::pass_type& p, const typename Context::tensor5& dq_blocks,
                       typename Context::gradients_type& g) {
  using T = typename Context::value_type;
  const MlaConfig& c = ctx.config();
  const MlaRequiresGrad& r = p.flags;
  const int B = c.batch, s = ctx.local_seq(), D = c.hidden, dqk = c.qk_dim(), Rq = c.q_lora_rank;
  const auto parts = static_cast<std::int64_t>(dq_blocks.extent(0)), h = static_cast<std::int64_t>(dq_blocks.extent(3));
  const std::int64_t rows = static_cast<std::int64_t>(B) * s, width = h * dqk;
  ComputePhase<typename Context::execution_space> phase(space, names::q_backward);
  // RoPE acts per token and head: the blocks are P*B batches of [s, h, dqk] with the same positions.
  const typename Context::tensor4 blocks(dq_blocks.data(), parts * B, s, h, dqk);
  if (scales_q(c)) scale_values(space, blocks, scale_factor(c));
  rope_backward(space, blocks, c.nope, blocks, c.nope, ctx.rope_table(space, p));
  const auto& w = ctx.weights();
  const bool lora = c.q_lora();
  const auto x2 = as_matrix(p.x, rows, D);
  // What the blocks multiply: x and w_q (dense), or cq and w_qb (q-LoRA), whose gradient d(cq) the blocks sum into.
  const auto in2 = lora ? as_matrix(p.w.cq.view(), rows, Rq) : x2;
  const auto& weight = lora ? w.w_qb : w.w_q;
  const auto& weight_grad = lora ? g.w_qb : g.w_q;
  const bool weight_flag = lora ? r.w_qb : r.w_q;
  const bool lora_input = lora && (r.x || r.w_qa || r.g_q);
  const typename Context::tensor3 d_cq3 =
      lora_input ? ensure(scratch.d_cq, "mlacp::d cq", B, s, Rq) : typename Context::tensor3();
  const auto d_cq = lora_input ? as_matrix(d_cq3, rows, Rq) : decltype(as_matrix(d_cq3, rows, Rq))();
  for (std::int64_t part = 0; part < parts; ++part) {
    const typename Context::matrix_rows block(dq_blocks.data() + part * rows * width, static_cast<std::size_t>(rows),
                                              static_cast<std::size_t>(width));
    const auto heads =
        std::make_pair(static_cast<std::size_t>(part * width), static_cast<std::size_t>((part + 1) * width));
    if (weight_flag) linear_wgrad(space, block, in2, Kokkos::subview(weight_grad, heads, Kokkos::ALL()));
    if (r.b_q && c.bias) bias_grad(space, block, Kokkos::subview(g.b_q, heads));
    if (lora_input)
      linear_dgrad(space, block, Kokkos::subview(weight, heads, Kokkos::ALL()), T(part == 0 ? 0 : 1), d_cq);
    else if (!lora && r.x)
      linear_dgrad(space, block, Kokkos::subview(weight, heads, Kokkos::ALL()), T(1), as_matrix(g.dx, rows, D));
  }
  if (!lora_input) return;
  const bool d_qa_needed = r.x || r.w_qa;
  const typename Context::tensor3 d_qa =
      d_qa_needed ? ensure(scratch.d_qa, "mlacp::d q_a", B, s, Rq) : typename Context::tensor3();
  rms_norm_backward(space, p.w.q_a.view(), w.g_q, p.w.rstd_q.view(), d_cq3, d_qa, r.g_q ? g.g_q : decltype(g.g_q)());
  if (!d_qa_needed) return;
  const auto d_qa2 = as_matrix(d_qa, rows, Rq);
  if (r.w_qa) linear_wgrad(space, d_qa2, x2, g.w_qa);
  if (r.x) linear_dgrad(space, d_qa2, w.w_qa, T(1), as_matrix(g.dx, rows, D));
}

/// The kv_a projection's gradient buffer d(kv_a) [B, s, R+dr] in the scratch: the schedule writes the shared key's
/// gradient (the RoPE transpose) into its last dr columns, then kv_a_backward its first R and the rest.
template <class Context, class Scratch>
const typename Context::tensor3& d_kv_a(const Context& ctx, Scratch& scratch) {
  const MlaConfig& c = ctx.config();
  return ensure(scratch.d_kv_a, "mlacp::d kv_a", c.batch, ctx.local_seq(), c.latent + c.rope);
}

/// The RMSNorm backward of the latent's gradient (columns [0, R) of `d_latent` [B, s, >= R]) into d(kv_a)'s first R
/// columns and g_kv's gradient, then w_kva's gradient and dx += d(kv_a) w_kva over all of d(kv_a) (its shared key
/// columns written by the schedule before).
template <class Context>
void kv_a_backward(const Context& ctx, const typename Context::execution_space& space,
                   const typename Context::pass_type& p, const typename Context::tensor3& d_latent,
                   const typename Context::tensor3& d_kv_a, typename Context::gradients_type& g) {
  using T = typename Context::value_type;
  const MlaConfig& c = ctx.config();
  const int B = c.batch, s = ctx.local_seq(), D = c.hidden, R = c.latent, dr = c.rope;
  rms_norm_backward(space, p.w.kv_a.view(), ctx.weights().g_kv, p.w.rstd.view(), d_latent, d_kv_a,
                    p.flags.g_kv ? g.g_kv : decltype(g.g_kv)());
  const auto da2 = as_matrix(d_kv_a, B * s, R + dr);
  if (p.flags.w_kva) linear_wgrad(space, da2, as_matrix(p.x, B * s, D), g.w_kva);
  if (p.flags.x) linear_dgrad(space, da2, ctx.weights().w_kva, T(1), as_matrix(g.dx, B * s, D));
}

}  // namespace mlacp::detail
