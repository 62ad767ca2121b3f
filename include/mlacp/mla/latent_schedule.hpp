// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The latent strategy's schedule (MlaStrategy::latent): the compressed payload [c, k_pe] is all-gathered and every
// rank expands only its own heads; backward reduce-scatters the payload gradient. The pieces it shares with the
// expanded strategy are in schedule_pieces.hpp.
#pragma once

#include <mlacp/all_gather.hpp>
#include <mlacp/mla/input_a2a.hpp>
#include <mlacp/mla/kv_layout.hpp>
#include <mlacp/mla/schedule_pieces.hpp>

namespace mlacp::detail {

/// Forward: the Q all-to-all is launched before the independent KV expansion (payload all-gather, the rank's w_kvb
/// rows) and waited after it. Backward: the inverse all-to-all of dQ is launched first and the KV path's backward (the
/// w_kvb dgrad, the latent reduce-scatter launched and the w_kvb weight gradient while it is in flight) runs while dQ
/// is in flight; then dQ is waited and the Q branch's backward runs while the reduce-scatter is still in flight; then
/// the reduce-scatter is waited and the payload's backward (RoPE, RMSNorm, w_kva) runs. The reduce-scatter is
/// launched after dQ and leaves on the same links behind it, so it is waited last, after the compute that needs
/// neither (on one FIFO link, waiting it before the Q branch stalled the KV backward until dQ had crossed).
template <class T, class ExecSpace, class Core>
class LatentSchedule {
 public:
  using pieces_type = SchedulePieces<T, ExecSpace, Core>;
  using tensor3 = typename pieces_type::tensor3;
  using tensor4 = typename pieces_type::tensor4;
  using tensor5 = typename pieces_type::tensor5;
  using gradients_type = typename pieces_type::gradients_type;
  using pass_type = ForwardPass<T, ExecSpace>;

  explicit LatentSchedule(const pieces_type& pieces) : pieces_(&pieces) {}

  /// The pass's output y [B, s, D]; what backward needs stays in the pass's workspace.
  tensor3 forward(const ExecSpace& space, const pass_type& p) const {
    const pieces_type& k = *pieces_;
    const MlaConfig& c = k.config();
    const int B = c.batch, S = c.seq, s = k.local_seq(), h = k.local_heads(), dn = c.nope;
    const int dv = c.vdim, dr = c.rope, R = c.latent;
    auto& scratch = k.scratch();
    auto& w = p.w;
    tensor4 q = k.project_q(space, p);
    // The Q all-to-all is launched before the independent KV expansion and waited after it.
    w.q_pair = InputA2APair<T, ExecSpace>(k.mesh(), "Q", k.seq_partition(), k.head_partition());
    w.q_pair.launch_forward(space, q, needs_q(p.flags), k.into(w.q_heads, "mlacp::q heads", B, S, h, dn + dr));
    const tensor3& payload = ensure(scratch.payload, "mlacp::payload", B, s, R + dr);
    k.project_kv_a(space, p, payload, payload, R);
    tensor3 gathered = launch_all_gather(space, payload, 1, k.seq_partition(), k.mesh(), "payload all-gather",
                                         k.into(scratch.gathered, "mlacp::gathered payload", B, S, R + dr))
                           .wait();
    const tensor3& kv = ensure(scratch.kv, "mlacp::kv", B, S, h * (dn + dv));
    // The shared key is read from the gathered payload by assemble_kv: no k_pe copy.
    w.latent_kv.forward(space, gathered, k.rows_of(k.weights().w_kvb), k.part_of(k.weights().b_kvb), k.mesh(),
                        k.seq_partition(), kv, tensor3(), ensure(w.latent, "mlacp::latent", B, S, R));
    w.q_saved = w.q_pair.wait_forward();
    assemble_kv(space, tensor4(kv.data(), B, S, h, dn + dv), gathered, ensure(w.k, "mlacp::k", B, S, h, dn + dr),
                ensure(w.v, "mlacp::v", B, S, h, dv), dn, R);
    w.k_saved = w.k;
    w.v_saved = w.v;
    return k.attend_and_project(space, p);
  }

  /// Accumulates the pass's gradients into `g` (allocated where needed).
  void backward(const ExecSpace& space, const pass_type& p, const tensor3& dy, gradients_type& g) const {
    const pieces_type& k = *pieces_;
    const MlaConfig& c = k.config();
    const int B = c.batch, S = c.seq, h = k.local_heads(), dn = c.nope, dv = c.vdim;
    const int dr = c.rope, R = c.latent;
    const MlaRequiresGrad& r = p.flags;
    auto& scratch = k.scratch();
    auto& w = p.w;
    tensor4 dq, dk, dvv;
    if (!k.output_and_attention_backward(space, p, dy, g, dq, dk, dvv)) return;
    // The inverse all-to-all of dQ is launched first; the KV path's backward runs while it is in flight.
    w.q_pair.launch_backward(space, dq, k.blocks_into(scratch.dq_blocks, "mlacp::dQ blocks", c.qk_dim()));
    tensor5 dq_local;
    if (!c.overlap && needs_q(r)) dq_local = w.q_pair.wait_backward_blocks();
    const bool payload = needs_kv(r) && needs_payload(r);
    if (needs_kv(r)) {
      ComputePhase<ExecSpace> phase(space, "kv backward");
      const tensor3& dkv = ensure(scratch.dkv, "mlacp::d kv", B, S, h * (dn + dv));
      const tensor3& dkpe = ensure(scratch.dkpe, "mlacp::d k_pe", B, S, dr);
      disassemble_kv_grad(space, dk, dvv, tensor4(dkv.data(), B, S, h, dn + dv), dkpe, dn);
      w.latent_kv.launch_backward(
          space, dkv, dkpe, payload, r.w_kvb ? k.rows_of(g.w_kvb) : typename pieces_type::matrix_rows(),
          r.b_kvb && c.bias ? k.part_of(g.b_kvb) : typename pieces_type::vector_part(), c.overlap,
          payload ? ensure(scratch.grad_payload, "mlacp::d payload", B, S, R + dr) : tensor3(),
          payload ? ensure(scratch.grad_latent, "mlacp::d latent", B, S, R) : tensor3(),
          payload ? k.into(scratch.d_payload, "mlacp::d payload local", B, k.local_seq(), R + dr) : tensor3());
    }
    if (needs_q(r)) k.q_branch_backward(space, p, c.overlap ? w.q_pair.wait_backward_blocks() : dq_local, g);
    if (needs_kv(r)) {
      const tensor3 d_payload = w.latent_kv.wait_backward();
      if (payload) {
        ComputePhase<ExecSpace> phase(space, "payload backward");
        k.payload_backward(space, p, d_payload, d_payload, R, g);
      }
    }
  }

 private:
  const pieces_type* pieces_;
};

}  // namespace mlacp::detail
