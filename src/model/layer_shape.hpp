// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The dimensions the performance model works with, for the critical rank (the most heads, the most tokens, the ring
// step's largest block), and what each of its collectives moves per element: shared by the time model
// (layer_model.cpp) and the memory model (memory_model.cpp). Internal to src/model.
#pragma once

#include <mlacp/mla/mla_config.hpp>
#include <mlacp/model/layer_model.hpp>
#include <mlacp/token_map.hpp>
#include <mlacp/wire/wire_codec.hpp>

#include <cmath>

namespace mlacp::model::internal {

inline double ceil_div(double a, double b) { return std::ceil(a / b); }

/// The dimensions one rank works with, for the critical rank.
struct Shape {
  double B, S, D, H, dn, dr, dv, R, Rq;
  double dqk;
  int P, U, C, G, nodes;
  double h;    // heads per rank in the attention: ceil(H / U)
  double s;    // tokens per rank: the most any rank holds
  double Sa;   // tokens in the attention's sequence: S (flat) or the largest chunk (ring)
  double e;    // bytes per element of the layer's type
  double acc;  // bytes per element of the accumulation type (float for bf16)
  double w;   // bytes per element the Ulysses group's backward all-to-alls move: 2 on a bf16 wire (bf16, bf16_all, fp8)
  double wr;  // bytes per element of the latent reduce-scatter's partial sums: 2 only with bf16_all
  bool wire;  // a float layer's wire (U > 1): each exchange in its codec (mla/wire_policy.hpp)
  WireDtype wire_dtype;
  bool bias;
};

/// Bytes per element that `codec` moves for rows of `width` values of `e` bytes: e (same), 2 (bf16), or the codec's
/// wire width over the row's (fp8: 1 + 4 / width).
double codec_element_bytes(WireCodec codec, double e, double width);

/// The critical rank's dimensions for `c` on `choice` over `cluster` (`map`: the choice's token map).
Shape shape_of(const MlaConfig& c, Dtype dtype, const Choice& choice, const Cluster& cluster, int q_lora,
               const TokenMap& map);

}  // namespace mlacp::model::internal
