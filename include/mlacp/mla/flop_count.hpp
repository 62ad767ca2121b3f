// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The floating-point operation count of one MLA block per rank, for roofline reports: how much of the machine's GEMM
// rate a measured time corresponds to. Only the matrix products are counted (2 FLOPs per multiply-add); RMSNorm,
// RoPE, softmax and the collectives are left out, as a roofline against the GEMM rate wants.
#pragma once

#include <mlacp/mla/mla_config.hpp>

namespace mlacp {

/// FLOPs per rank of one forward and one backward of the block (doubles: the counts pass 2^31 at modest sizes).
struct MlaFlops {
  // Forward projections, per rank (N = B*S/P tokens). The latent strategy expands h = H/P heads over all S tokens
  // instead of H heads over its N tokens: the same count.
  double q_proj = 0;                ///< 2*N*D*H*dqk; with q-LoRA 2*N*(D*Rq + Rq*H*dqk)
  double kv_a_proj = 0;             ///< 2*N*D*(R+dr)
  double kv_b_proj = 0;             ///< 2*N*R*H*(dn+dv)
  double o_proj = 0;                ///< 2*N*H*dv*D
  double projections_forward = 0;   ///< sum of the four above
  double projections_backward = 0;  ///< 2x forward: a dgrad and a wgrad GEMM per projection
  /// Causal attention core over E = B*h*S*(S+1)/2 score elements: QK^T and PV.
  double attention_forward = 0;  ///< 2*E*(dqk+dv)
  /// Score recompute (QK^T), dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q.
  double attention_backward = 0;  ///< 2*E*(3*dqk+2*dv)
  double forward = 0;             ///< projections_forward + attention_forward
  double backward = 0;            ///< projections_backward + attention_backward

  double total() const { return forward + backward; }
};

/// The per-rank FLOP count of `c` on a group of P ranks: the mean over the ranks (N = B*S/P tokens and h = H/P heads as
/// real numbers; when P does not divide S or H, ranks with ceil(S/P) tokens or ceil(H/P) heads do a little more).
inline MlaFlops mla_flops(const MlaConfig& c, int P) {
  const double B = c.batch, S = c.seq, D = c.hidden, H = c.heads, dn = c.nope, dr = c.rope, dv = c.vdim, R = c.latent;
  const double dqk = dn + dr, N = B * S / P, h = H / P;
  const double E = B * h * S * (S + 1) / 2;
  MlaFlops f;
  const double Rq = c.q_lora_rank;
  f.q_proj = c.q_lora() ? 2 * N * (D * Rq + Rq * H * dqk) : 2 * N * D * H * dqk;
  f.kv_a_proj = 2 * N * D * (R + dr);
  f.kv_b_proj = 2 * N * R * H * (dn + dv);
  f.o_proj = 2 * N * H * dv * D;
  f.projections_forward = f.q_proj + f.kv_a_proj + f.kv_b_proj + f.o_proj;
  f.projections_backward = 2 * f.projections_forward;
  f.attention_forward = 2 * E * (dqk + dv);
  f.attention_backward = 2 * E * (3 * dqk + 2 * dv);
  f.forward = f.projections_forward + f.attention_forward;
  f.backward = f.projections_backward + f.attention_backward;
  return f;
}

}  // namespace mlacp
