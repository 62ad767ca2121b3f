// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The layer's memory model (predict_memory, layer_model.hpp): every buffer the layer allocates and keeps for a
// configuration, counted from the same dimensions as the time model (layer_shape.hpp).
#include "layer_shape.hpp"

#include <mlacp/bf16_gemm.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/kernels/flash_attention_options.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/model/layer_model.hpp>
#include <mlacp/token_map.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace mlacp::model {

using internal::Shape;
using internal::shape_of;

namespace {

/// The bf16 GEMM plan's float workspace (bf16_gemm.hpp, float_blas): A, B and C of the largest of the layer's GEMMs
/// widened to float, grown to the largest and kept. A GEMM's forward, dgrad and wgrad multiply the same three
/// matrices (m x k, k x n, m x n), so each projection is one entry.
double bf16_gemm_workspace(const Shape& x, bool latent) {
  const double N = x.B * x.s, Na = x.B * x.Sa;
  auto three = [](double m, double n, double k) { return m * k + k * n + m * n; };
  double most = 0;
  auto take = [&](double m, double n, double k) { most = std::max(most, three(m, n, k)); };
  if (x.Rq > 0) {
    take(N, x.Rq, x.D);
    take(N, x.H * x.dqk, x.Rq);
  } else {
    take(N, x.H * x.dqk, x.D);
  }
  take(N, x.R + x.dr, x.D);
  if (latent)
    take(Na, x.h * (x.dn + x.dv), x.R);
  else
    take(N, x.H * (x.dn + x.dv), x.R);
  take(N, x.D, x.H * x.dv);
  return 4 * most;
}

/// The memory of a layer of `dtype` that computes in that type (a bf16 layer: its bf16 schedule).
MemoryEstimate schedule_memory(const MlaConfig& c, Dtype dtype, const Choice& choice, const Cluster& cluster) {
  const int q_lora = c.q_lora_rank;
  const TokenMap map(c.seq, choice.ulysses, choice.ring, choice.layout);
  const Shape x = shape_of(c, dtype, choice, cluster, q_lora, map);
  const bool latent = choice.strategy == MlaStrategy::latent, ring = choice.ring > 1, grouped = x.U > 1;
  const bool bf16 = dtype == Dtype::bfloat16;
  // The bf16 wire (wire.hpp): shape_of's bytes per element of the Ulysses collectives say where it applies.
  const bool wire = x.w < x.e, wire_all = x.wr < x.e;
  const double B = x.B, s = x.s, Sa = x.Sa, H = x.H, h = x.h, D = x.D, R = x.R, dr = x.dr, dn = x.dn, dv = x.dv;
  const double dqk = x.dqk, e = x.e, acc = x.acc, Rq = x.Rq, U = x.U;
  const double Hu = U * h;  // the heads of the rank's blocks [U, B, s, h, *] (>= H when U does not divide H)
  // Bytes per element of what the Ulysses collectives move: the backward's codec (wire_policy.hpp). fp8's forward
  // staging (1 + 4 / row bytes) is counted at this width too (bf16's 2): an overestimate, on the safe side.
  const double w = x.w;
  MemoryEstimate m;
  // Every buffer below is one the layer allocates for this configuration (the labels of its Views in quotes) and
  // keeps: the schedules' workspaces and scratch are allocated once and reused, and the collectives' pool keeps its
  // buffers, so after the first step the peak is their sum. The attention core's tiles are the host BLAS path's.
  const double q_params = Rq > 0 ? Rq * D + Rq + H * dqk * Rq : H * dqk * D;  // w_qa, g_q, w_qb or w_q
  const double params =
      q_params + (R + dr) * D + R + H * (dn + dv) * R + D * H * dv + (c.bias ? H * dqk + H * (dn + dv) + D : 0);
  m.weights = params * e;
  m.gradients = params * acc;
  m.inputs = 4 * B * s * D * e;  // x, dy, y, dx
  // The previous step's y, dx and weight gradients, held by a loop that assigns the new step's over them (the
  // layer's workspace writes a new y when the caller still holds the last one, forward_workspace.hpp).
  m.held = 2 * B * s * D * e + params * acc;

  // ---- the forward workspace (forward_workspace.hpp, the schedules' own): what backward reads ----
  double saved = B * s * (R + dr) * e + B * s * acc + B * s * H * dqk * e;  // "kv_a", "rstd", "q"
  saved += Rq > 0 ? 2 * B * s * Rq * e + B * s * acc : 0;                   // "q_a", "cq", "rstd q"
  saved += B * Sa * h * dv * e + B * h * Sa * acc;                          // "o", "lse"
  saved += grouped ? B * Sa * h * dqk * e + B * s * H * dv * e : 0;         // "q heads", "o tokens"
  if (latent) {
    if (ring)
      saved += B * Sa * (R + dr) * e;  // "ring payload"
    else
      saved += B * Sa * R * e + B * Sa * h * (dqk + dv) * e;  // "latent", "k", "v"
  } else {
    saved += B * s * R * e + B * s * H * (dqk + dv) * e;  // "c", "k local", "v local"
    saved += grouped ? B * Sa * h * (dqk + dv) * e : 0;   // "k heads", "v heads"
  }
  // RoPE: the cos and sin tables of the rank's positions (double), and the positions themselves where they are not
  // one range (zigzag ring chunks, packed documents).
  saved += s * dr * 8;
  if ((ring && choice.layout == RingLayout::zigzag) || !c.cu_seqlens.empty()) saved += s * 8;

  // ---- per-call scratch (SharedScratch and the schedules') ----
  double scratch = B * s * Hu * dv * e + B * Sa * h * (2 * dqk + dv) * e;  // "dO blocks", "dq", "dk", "dv"
  scratch += B * s * (R + dr) * e;                                         // "d kv_a"
  scratch += grouped ? B * Sa * h * dv * e + B * s * Hu * dqk * e : 0;     // "dO heads", "dQ blocks"
  scratch += Rq > 0 ? 2 * B * s * Rq * e : 0;                              // "d cq", "d q_a"
  if (latent) {
    if (!ring || grouped) scratch += B * s * (R + dr) * e;     // "payload"
    scratch += grouped && !ring ? B * x.S * (R + dr) * e : 0;  // "gathered payload"
    scratch += B * Sa * (R + dr) * e;                          // "d payload" (the reduce-scatter's input)
    scratch += grouped ? B * s * (R + dr) * e : 0;             // "d payload local"
    if (!ring) scratch += 2 * B * Sa * h * (dn + dv) * e + B * Sa * (dr + R) * e;  // "kv", "d kv", "d k_pe", "d latent"
  } else {
    scratch +=
        2 * B * s * H * (dn + dv) * e + 2 * B * s * dr * e + B * s * R * e;  // "kv", "d kv", "k_pe", "d k_pe", "d c"
    scratch += grouped ? B * s * Hu * (dqk + dv) * e : 0;                    // "dK blocks", "dV blocks"
  }
  if (ring) {
    // ring_attention.hpp: two slots per travelling stream ("ring chunk"), two per gradient stream ("ring gradient")
    // and its "ring contribution", in the accumulation type; the latent ring's expansion and its gradients.
    const double width = latent ? R + dr : h * (dqk + dv);
    scratch += 2 * B * Sa * width * e + 3 * B * Sa * width * acc;
    if (latent) {
      scratch += B * Sa * (h * (dqk + dv) + h * (dn + dv) + R) * e;  // "ring k", "ring v", "ring kv", "ring latent"
      scratch += B * Sa * h * (dqk + dv) * acc;                      // "ring dk", "ring dv"
      scratch += B * Sa * (h * (dn + dv) + dr + R) * e;              // "ring d kv", "ring d k_pe", "ring d latent"
      scratch += bf16 ? B * Sa * h * (dqk + dv) * e : 0;             // "ring dk (rounded)", "ring dv (rounded)"
    }
    scratch += bf16 ? B * Sa * h * (dv + dqk) * acc : 0;  // "ring o (float)", "ring dq (float)"
  }
  // The attention core's tiles (flash_attention_scratch.hpp): scores and dS in the accumulation type, the row
  // statistics and D in double; bf16 adds P and dS in bf16 and the float accumulators of O, dK, dV and dQ (one head).
  // The tiles are the BLAS path's default ones for the shape (flash_attention_options.hpp: chosen by S, dqk, bf16).
  const auto tiles = mlacp::detail::flash_default_tile_choice(true).for_problem(static_cast<std::int64_t>(x.S),
                                                                                static_cast<std::int64_t>(dqk), bf16);
  const double tq = std::min<double>(tiles.first, Sa), tk = std::min<double>(tiles.second, Sa);
  scratch += 2 * tq * tk * acc + 2 * tq * 8 + B * h * Sa * 8;
  if (bf16)
    scratch += 2 * tq * tk * 2 + (tq * dv + tk * (dqk + dv) + Sa * dqk) * acc;
  else if (ring)
    scratch += tq * dv * acc;  // "flash O accumulator" (the ring merges each step's block into the running output)
  if (bf16) scratch += bf16_gemm_workspace(x, latent);  // "mlacp::bf16_gemm float workspace"

  // ---- the Ulysses collectives' buffers: the pool's packed send and receive buffers (buffer_pool.hpp, launch.hpp:
  // a side whose blocks are not already contiguous is packed), the bf16 wire's (wire.hpp) and the output
  // projection's exchange (output_projection.hpp) ----
  double comm = 0;
  if (grouped) {
    // Forward: Q (and K, V) all-to-all's packed send; their receive is packed only with B > 1.
    const double a2a = latent ? dqk : 2 * dqk + dv;  // the widths of the forward all-to-alls' heads
    comm += B * s * H * a2a * w;
    if (B > 1) comm += B * Sa * h * a2a * w;
    // The output projection: the blocks received ("O a2a recv"), the packed send (bf16 wire, or B > 1), and a bf16
    // layer's float sum of y.
    comm += B * s * Hu * dv * w + (wire || B > 1 ? B * Sa * h * dv * w : 0) + (bf16 ? B * s * D * acc : 0);
    // Backward: the inverse all-to-alls read [U, B, s, h, *] blocks in place; with B > 1 their other side is packed.
    const double back = latent ? dqk + dv : 2 * dqk + 2 * dv;
    if (B > 1) comm += B * Sa * h * back * w;
    if (wire) {
      // Each all-to-all on the wire: a bf16 copy of its input and of its result, [U, B, s, h, *] on one side and
      // [B, S, h, *] on the other: forward Q (expanded: K, V), backward dO and dQ (expanded: dK, dV). (O's are above.)
      comm += B * (s * Hu + Sa * h) * 2 * (2 * a2a + dv);
    }
    if (latent && !ring) {
      // The payload all-gather's send copy (and its bf16 copies on the wire; receive packed with B > 1), the
      // reduce-scatter's received blocks (its partial sums in bf16 only with bf16_all, which also copies both sides).
      comm += B * s * (R + dr) * w + (wire ? B * s * (R + dr) * 2 + B * x.S * (R + dr) * 2 : 0);
      if (B > 1) comm += B * x.S * (R + dr) * w;
      const double rs = wire_all ? 2 : e;
      comm += B * x.S * (R + dr) * rs + (B > 1 ? B * x.S * (R + dr) * rs : 0);
      if (wire_all) comm += B * x.S * (R + dr) * 2 + B * s * (R + dr) * 2;
    }
  }
  m.activations = saved;
  m.scratch = scratch;
  m.communication = comm;
  return m;
}

}  // namespace

MemoryEstimate predict_memory(const MlaConfig& c, Dtype dtype, const Choice& choice, const Cluster& cluster) {
  const std::string why = choice_error(c, choice, cluster);
  if (!why.empty()) throw InvalidArgument("mlacp::model::predict_memory: " + why);
  const MemoryEstimate own = schedule_memory(c, dtype, choice, cluster);
  if (dtype != Dtype::bfloat16) return own;
  // The path the layer will take: auto on bf16 matrix hardware takes bf16 untimed (MlaAttention's first forward). The
  // model asks this machine's host plan, as a layer on a host space would (a GPU layer's cuBLAS is not seen from here:
  // set bf16 to price that).
  const Bf16Compute path = untimed_bf16_compute(requested_bf16_compute(c.bf16_compute),
                                                Bf16GemmPlan<Kokkos::DefaultHostExecutionSpace>().on_bf16_hardware());
  if (path == Bf16Compute::bfloat16) return own;
  // The float path (mla/detail/bf16_as_float.hpp): a float layer inside, with bf16 on the wire (bf16_all where asked;
  // shape_of says where the transport cannot sum it), over float copies of the weights ("mlacp::widened ..."), with
  // float copies of x, dy and dx and the float layer's y at the edges. The caller's bf16 weights, gradients (float
  // either way), x, dy, y and dx and what a loop holds of the last step stay the bf16 layer's.
  MlaConfig f = c;
  f.wire_dtype = c.wire_dtype == WireDtype::bfloat16_all ? WireDtype::bfloat16_all : WireDtype::bfloat16;
  const MemoryEstimate inner = schedule_memory(f, Dtype::float32, choice, cluster);
  MemoryEstimate m = own;
  m.weights += inner.weights;
  m.inputs += inner.inputs;
  if (path == Bf16Compute::float32) {
    m.activations = inner.activations;
    m.scratch = inner.scratch;
    m.communication = inner.communication;
    return m;
  }
  // auto: the first forward times both paths, so both hold their workspaces until it frees the slower one's. The
  // collectives' buffers come from one pool (buffer_pool.hpp), which serves either path's by size: the larger set.
  // The two paths also share the attention core's tiles (one core, one scratch), which this counts for each: on the
  // safe side (test_memory_model: 8-9% over the measured peak at its small shape).
  m.activations += inner.activations;
  m.scratch += inner.scratch;
  m.communication = std::max(own.communication, inner.communication);
  return m;
}

}  // namespace mlacp::model
