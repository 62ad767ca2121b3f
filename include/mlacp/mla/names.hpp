// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The names the MLA layer gives its collectives and compute phases: what an EventRecorder records, what Kokkos Tools
// show as regions, what perf_tests report and what the tests look for. One place, so that a renamed phase cannot
// leave a test or a report looking for the old name (Python: mlacp.names, the same constants).
#pragma once

#include <string>

namespace mlacp::names {

// ---- tensors an input all-to-all pair moves (InputA2APair's name) ----
inline constexpr const char* q = "Q";
inline constexpr const char* k = "K";
inline constexpr const char* v = "V";

/// The collective names an InputA2APair named `tensor` gives its all-to-alls: "<tensor> a2a" forward, "d<tensor> a2a"
/// backward (its inverse, the gradient's).
inline std::string forward_a2a(const std::string& tensor) { return tensor + " a2a"; }
inline std::string backward_a2a(const std::string& tensor) { return "d" + tensor + " a2a"; }

// ---- collectives ----
inline constexpr const char* q_a2a = "Q a2a";    ///< forward_a2a(q)
inline constexpr const char* k_a2a = "K a2a";    ///< forward_a2a(k), expanded strategy
inline constexpr const char* v_a2a = "V a2a";    ///< forward_a2a(v), expanded strategy
inline constexpr const char* dq_a2a = "dQ a2a";  ///< backward_a2a(q)
inline constexpr const char* dk_a2a = "dK a2a";  ///< backward_a2a(k), expanded strategy
inline constexpr const char* dv_a2a = "dV a2a";  ///< backward_a2a(v), expanded strategy
inline constexpr const char* o_a2a = "O a2a";    ///< the attention output, head-local -> token-local
inline constexpr const char* do_a2a = "dO a2a";  ///< its gradient, token-local -> head-local
inline constexpr const char* payload_all_gather = "payload all-gather";        ///< latent strategy
inline constexpr const char* latent_reduce_scatter = "latent reduce-scatter";  ///< latent strategy
/// forward: every rank's B and token count, gathered before anything else of a call, from which the call's S (the
/// sum) is derived and every rank's shard checked against the token map of that S (P > 1).
inline constexpr const char* call_shape = "call shape";
// The ring of a two-level mesh (ring_attention.hpp): each step's exchange with the ring's neighbours.
inline constexpr const char* ring_payload = "ring payload";      ///< latent strategy: the latent payload chunk
inline constexpr const char* ring_k = "ring K";                  ///< expanded strategy: the K chunk
inline constexpr const char* ring_v = "ring V";                  ///< expanded strategy: the V chunk
inline constexpr const char* ring_d_payload = "ring d-payload";  ///< latent: the chunk's payload-gradient accumulator
inline constexpr const char* ring_dk = "ring dK";                ///< expanded: the chunk's dK accumulator
inline constexpr const char* ring_dv = "ring dV";                ///< expanded: the chunk's dV accumulator

// ---- compute phases (ComputePhase: one Kokkos Tools region and one recorded event each) ----
inline constexpr const char* w_q_fprop = "w_q fprop";
inline constexpr const char* w_kva_fprop = "w_kva fprop";
inline constexpr const char* w_kvb_fprop = "w_kvb fprop";
inline constexpr const char* attention_fprop = "attention fprop";
inline constexpr const char* w_o_fprop = "w_o fprop";
inline constexpr const char* w_o_dgrad = "w_o dgrad";
inline constexpr const char* w_o_wgrad = "w_o wgrad";
inline constexpr const char* b_o_grad = "b_o grad";
inline constexpr const char* attention_bprop = "attention bprop";
inline constexpr const char* kv_backward = "kv backward";
inline constexpr const char* w_kvb_dgrad = "w_kvb dgrad";
inline constexpr const char* w_kvb_wgrad = "w_kvb wgrad";
inline constexpr const char* b_kvb_grad = "b_kvb grad";
inline constexpr const char* q_backward = "q backward";
inline constexpr const char* k_backward = "k backward";
inline constexpr const char* v_backward = "v backward";
inline constexpr const char* payload_backward = "payload backward";
inline constexpr const char* ring_expand = "ring w_kvb expand";      ///< latent ring: a received chunk's K and V
inline constexpr const char* ring_kv_backward = "ring kv backward";  ///< latent ring: a chunk's w_kvb dgrad and wgrad

}  // namespace mlacp::names
