// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The layer's timeline, written once: the order of every compute step, collective launch and collective wait of a
// rank's forward and backward, for both strategies, flat or on a ring, overlapped or not. The layer runs it (each
// schedule's executor does the step's work: latent_schedule.hpp, expanded_schedule.hpp, and the pieces and the ring
// driver run their own parts of it: output_projection.hpp, latent_kv_linear.hpp, ring_attention.hpp) and the
// performance model costs the same sequence (src/model/layer_model.cpp). Nothing else states the order, and
// unit_tests/mla/detail/test_timeline_drift.cpp checks, rank by rank, that the collectives the layer launches and
// waits are the ones these functions name, in this order.
//
// An executor `ex` provides
//   ex.compute(Step, i)   a compute step (i: the ring step or the peer's offset, where the step repeats),
//   ex.launch(Comm, i)    a collective's launch (i: the repetition: a ring step, a peer offset, a data stream),
//   ex.wait(Comm, i)      its wait (each launched collective is waited exactly once),
//   ex.part(Part)         a part whose own order is one of the functions below (output_forward, ...): the layer's
//                         executor hands it to the piece or the ring driver, which runs that function; the model's
//                         executor runs the same function with itself.
// Everything here depends only on Facts (no sizes, no data), so the model can walk it for a rank it never runs.
#pragma once

#include <mlacp/mla/mla_config.hpp>
#include <mlacp/mla/names.hpp>

#include <utility>

namespace mlacp::detail {

/// Which gradients of the pass need which part of the backward (the pass's flags: those of parameters the configuration
/// lacks are cleared, flags_for in weights.hpp).
inline bool needs_q(const MlaRequiresGrad& r) { return r.x || r.w_q || r.b_q || r.w_qa || r.g_q || r.w_qb; }
inline bool needs_payload(const MlaRequiresGrad& r) { return r.x || r.w_kva || r.g_kv; }
inline bool needs_kv(const MlaRequiresGrad& r) { return needs_payload(r) || r.w_kvb || r.b_kvb; }
inline bool needs_attention(const MlaRequiresGrad& r) { return needs_q(r) || needs_kv(r); }
/// Whether a backward computes anything at all (the output projection's gradients included).
inline bool needs_backward(const MlaRequiresGrad& r) { return needs_attention(r) || r.w_o || r.b_o; }

}  // namespace mlacp::detail

namespace mlacp::detail::timeline {

/// What the order of one rank's pass depends on.
struct Facts {
  MlaStrategy strategy = MlaStrategy::latent;
  bool overlap = true;  ///< MlaConfig::overlap: off, every collective is waited right after its launch
  int group = 1;        ///< the Ulysses group's size (the all-to-alls', all-gather's and reduce-scatter's P)
  int ring = 1;         ///< C, the ring's chunks (1: flat Ulysses)
  bool heads = true;    ///< this rank's Ulysses position holds heads (false: the ring has nothing to do)
  /// Flat, group > 1: the attention runs as one block per owner rank's query rows (the core computes positioned
  /// problems), each block's O leaving for its owner while the next is computed (output_forward). False: the
  /// attention runs whole (Step::attention) before any of O is sent.
  bool o_blocks = false;
  // What the backward computes (MlaRequiresGrad, schedule_context.hpp's needs_*):
  bool attention = true;  ///< anything upstream of the attention (the dO exchange and the attention backward)
  bool q = true;          ///< the Q branch (dQ's inverse all-to-all)
  bool kv = true;         ///< the KV path (dK, dV; w_kvb's gradients)
  bool payload = true;    ///< the payload's gradient (the latent reduce-scatter; dx, w_kva, g_kv)

  bool latent() const { return strategy == MlaStrategy::latent; }
  bool on_ring() const { return ring > 1; }
};

/// The facts of a rank of a Ulysses group of `group` ranks on a ring of `ring` chunks whose position holds heads (or
/// not), for a pass with `flags`; `core_blocks`: the layer's attention core computes positioned problems on the
/// layer's own Views (ScheduleContext::core_attends_blocks; the model assumes the library's core, which does).
inline Facts facts_of(const MlaConfig& c, int group, int ring, bool heads, const MlaRequiresGrad& flags,
                      bool core_blocks = true) {
  Facts f;
  f.strategy = c.strategy;
  f.overlap = c.overlap;
  f.group = group;
  f.ring = ring;
  f.heads = heads;
  f.o_blocks = core_blocks && group > 1 && ring == 1;
  f.attention = needs_attention(flags);
  f.q = needs_q(flags);
  f.kv = needs_kv(flags);
  f.payload = needs_payload(flags);
  return f;
}

/// The compute steps (the names are the compute phases they record, or what they cost in the model).
enum class Step {
  // forward
  kv_a_projection,  ///< x w_kva^T, the latent's RMSNorm and the shared key's RoPE, into the strategy's layout
  kv_expansion,     ///< latent: the rank's w_kvb rows on the gathered payload; expanded: all heads on its own tokens
  assemble_kv,      ///< k = [k_nope, k_pe], v, per head (latent, flat: from the gathered payload)
  q_projection,     ///< q (dense or q-LoRA), its RoPE and scale
  attention,        ///< the core on the whole sequence (flat, not o_blocks)
  attention_block,  ///< flat, o_blocks: the core on the query rows of peer (rank + i)'s tokens (i = 0: the own)
  ring_expand,      ///< ring step i (latent): the chunk held's expansion for the rank's heads
  ring_attention,   ///< ring step i: the core on the chunk held, merged into the running output
  o_block,          ///< the output projection: the block of source (rank - i) through its w_o columns (i = 0: own)
  o_finish,         ///< the output projection: its bias and rounding after the last block
  // backward
  w_o_dgrad,                ///< dO = dy w_o, written per destination
  w_o_wgrad,                ///< w_o's and b_o's gradients
  attention_backward,       ///< the core's backward (flat)
  ring_attention_backward,  ///< ring step i: the core's backward on the chunk held
  ring_fold,                ///< ring step i (latent): the chunk's dK, dV folded into the payload's gradient
  ring_accumulate,          ///< ring step t, stream k (i = 2t + k): the contribution added to the arriving accumulator
  ring_finish,              ///< the own chunk's finished accumulators written where the backward reads them
  kv_disassemble,           ///< latent: dK, dV into d(kv) and the shared key's gradient
  w_kvb_dgrad,              ///< latent: d(latent) = d(kv) w_kvb, joined with the shared key's gradient
  w_kvb_wgrad,              ///< latent: w_kvb's and b_kvb's gradients
  q_branch,                 ///< the Q branch's backward on dQ's head blocks
  k_branch,                 ///< expanded: dK's head blocks into d(kv) and the shared key's gradient
  v_branch,                 ///< expanded: dV's head blocks into d(kv)
  kv_and_payload,           ///< expanded: w_kvb's gradients, d(c) and the payload's backward
  payload_backward,         ///< latent: the payload's backward (RoPE transpose, RMSNorm, w_kva)
};

/// The collectives.
enum class Comm {
  payload_all_gather,
  q_a2a,
  k_a2a,
  v_a2a,
  o_exchange,  ///< the attention output's head-to-token exchange: peer offset i (1..P-1), or i = 0 at P == 1
  do_a2a,
  dq_a2a,
  dk_a2a,
  dv_a2a,
  latent_reduce_scatter,
  ring_data,  ///< ring step t's data, stream k (i = 2t + k): K and V (expanded) or the payload (latent)
  ring_grad,  ///< ring step t's gradient accumulator of stream k (i = 2t + k), sent one step behind
};

/// The parts whose order is written below and run by a piece or the ring driver.
enum class Part { output_forward, output_backward, latent_kv_backward, ring_forward, ring_backward, ring_finish };

/// The index of ring step t's stream k (Comm::ring_data, Comm::ring_grad, Step::ring_accumulate).
constexpr int ring_index(int t, int stream) { return 2 * t + stream; }

/// The name a collective records (names.hpp); for the ring's, `i` (ring_index) picks the K / V or dK / dV stream.
inline const char* name_of(Comm c, MlaStrategy strategy, int i = 0) {
  const bool latent = strategy == MlaStrategy::latent;
  const int stream = i % 2;
  switch (c) {
    case Comm::payload_all_gather:
      return names::payload_all_gather;
    case Comm::q_a2a:
      return names::q_a2a;
    case Comm::k_a2a:
      return names::k_a2a;
    case Comm::v_a2a:
      return names::v_a2a;
    case Comm::o_exchange:
      return names::o_a2a;
    case Comm::do_a2a:
      return names::do_a2a;
    case Comm::dq_a2a:
      return names::dq_a2a;
    case Comm::dk_a2a:
      return names::dk_a2a;
    case Comm::dv_a2a:
      return names::dv_a2a;
    case Comm::latent_reduce_scatter:
      return names::latent_reduce_scatter;
    case Comm::ring_data:
      return latent ? names::ring_payload : (stream == 0 ? names::ring_k : names::ring_v);
    case Comm::ring_grad:
      return latent ? names::ring_d_payload : (stream == 0 ? names::ring_dk : names::ring_dv);
  }
  return "";
}

/// The ring's streams: what travels (1: the payload; 2: K and V) and its gradient accumulators (0 when nothing
/// needs them).
inline int ring_data_streams(const Facts& f) { return f.latent() ? 1 : 2; }
inline int ring_grad_streams(const Facts& f) {
  if (f.latent()) return f.payload ? 1 : 0;
  return f.kv ? 2 : 0;
}

/// An executor of three callables (a piece's or the ring driver's own steps): compute(Step, i), launch(Comm, i),
/// wait(Comm, i). A part that has no parts of its own.
template <class Compute, class Launch, class Wait>
struct Steps {
  Compute compute_;
  Launch launch_;
  Wait wait_;
  void compute(Step s, int i) { compute_(s, i); }
  void launch(Comm c, int i) { launch_(c, i); }
  void wait(Comm c, int i) { wait_(c, i); }
};
template <class Compute, class Launch, class Wait>
Steps<Compute, Launch, Wait> steps(Compute compute, Launch launch, Wait wait) {
  return {std::move(compute), std::move(launch), std::move(wait)};
}

/// The facts a piece's part needs: its group, whether it overlaps, (backward) whether the attention's and the
/// payload's gradients are needed, and (forward) whether O is computed block by block (Facts::o_blocks).
inline Facts part_facts(int group, bool overlap, bool attention = true, bool payload = true, bool o_blocks = false) {
  Facts f;
  f.group = group;
  f.overlap = overlap;
  f.attention = attention;
  f.payload = payload;
  f.o_blocks = o_blocks && group > 1;
  return f;
}

// ---- the parts ----

/// The output projection's forward (OutputProjection): at P > 1 one send/receive per peer offset i (to rank + i, from
/// rank - i), all launched first; the own block's GEMM runs while they are in flight, then each arriving block's.
/// o_blocks: the attention of peer (rank + i)'s query rows is computed right before its send leaves, so that each
/// block travels while the next is computed; the own rows last, before their GEMM.
template <class Ex>
void output_forward(Ex& ex, const Facts& f) {
  if (f.group == 1) {
    ex.launch(Comm::o_exchange, 0);
    ex.wait(Comm::o_exchange, 0);
    ex.compute(Step::o_block, 0);
    ex.compute(Step::o_finish, 0);
    return;
  }
  for (int i = 1; i < f.group; ++i) {
    if (f.o_blocks) ex.compute(Step::attention_block, i);
    ex.launch(Comm::o_exchange, i);
    if (!f.overlap) ex.wait(Comm::o_exchange, i);
  }
  if (f.o_blocks) ex.compute(Step::attention_block, 0);
  ex.compute(Step::o_block, 0);
  for (int i = 1; i < f.group; ++i) {
    if (f.overlap) ex.wait(Comm::o_exchange, i);
    ex.compute(Step::o_block, i);
  }
  ex.compute(Step::o_finish, 0);
}

/// The output projection's backward (OutputProjection): dO's all-to-all beside w_o's weight gradient.
template <class Ex>
void output_backward(Ex& ex, const Facts& f) {
  if (f.attention) {
    ex.compute(Step::w_o_dgrad, 0);
    ex.launch(Comm::do_a2a, 0);
    if (!f.overlap) ex.wait(Comm::do_a2a, 0);
  }
  ex.compute(Step::w_o_wgrad, 0);
  if (f.attention && f.overlap) ex.wait(Comm::do_a2a, 0);
}

/// The latent KV path's backward up to the reduce-scatter's wait (LatentKVLinear::launch_backward): the w_kvb dgrad,
/// the reduce-scatter launched, w_kvb's weight gradient while it is in flight.
template <class Ex>
void latent_kv_backward(Ex& ex, const Facts& f) {
  if (f.payload) {
    ex.compute(Step::w_kvb_dgrad, 0);
    ex.launch(Comm::latent_reduce_scatter, 0);
    if (!f.overlap) ex.wait(Comm::latent_reduce_scatter, 0);
  }
  ex.compute(Step::w_kvb_wgrad, 0);
}

/// The ring's forward (RingAttention): at step t the next chunk travels while the chunk held is (expanded and)
/// attended.
template <class Ex>
void ring_forward(Ex& ex, const Facts& f) {
  if (!f.heads) return;
  const int C = f.ring, streams = ring_data_streams(f);
  for (int t = 0; t < C; ++t) {
    if (t + 1 < C)
      for (int k = 0; k < streams; ++k) ex.launch(Comm::ring_data, ring_index(t, k));
    if (f.latent()) ex.compute(Step::ring_expand, t);
    ex.compute(Step::ring_attention, t);
    if (t + 1 < C)
      for (int k = 0; k < streams; ++k) ex.wait(Comm::ring_data, ring_index(t, k));
  }
}

/// The ring's backward (RingAttention): the chunks travel again; each chunk's gradient accumulators travel one step
/// behind, taking each step's contribution on the way home. The last exchange is waited by ring_finish.
template <class Ex>
void ring_backward(Ex& ex, const Facts& f) {
  if (!f.heads) return;
  const int C = f.ring, streams = ring_data_streams(f), grads = ring_grad_streams(f);
  for (int t = 0; t < C; ++t) {
    if (t + 1 < C)
      for (int k = 0; k < streams; ++k) ex.launch(Comm::ring_data, ring_index(t, k));
    if (f.latent()) ex.compute(Step::ring_expand, t);
    ex.compute(Step::ring_attention_backward, t);
    if (f.latent() && f.kv) ex.compute(Step::ring_fold, t);
    for (int k = 0; k < grads; ++k) {
      if (t > 0) {
        ex.wait(Comm::ring_grad, ring_index(t - 1, k));
        ex.compute(Step::ring_accumulate, ring_index(t, k));
      }
      ex.launch(Comm::ring_grad, ring_index(t, k));
    }
    if (t + 1 < C)
      for (int k = 0; k < streams; ++k) ex.wait(Comm::ring_data, ring_index(t, k));
  }
}

/// The ring's last exchange home, and the own chunk's accumulators written out.
template <class Ex>
void ring_finish(Ex& ex, const Facts& f) {
  if (!f.heads) return;
  for (int k = 0; k < ring_grad_streams(f); ++k) ex.wait(Comm::ring_grad, ring_index(f.ring - 1, k));
  if (ring_grad_streams(f) > 0) ex.compute(Step::ring_finish, 0);
}

/// Runs part `p`'s order with `ex` (the model's executors and the drift test's order list).
template <class Ex>
void run_part(Ex& ex, Part p, const Facts& f) {
  switch (p) {
    case Part::output_forward:
      return output_forward(ex, f);
    case Part::output_backward:
      return output_backward(ex, f);
    case Part::latent_kv_backward:
      return latent_kv_backward(ex, f);
    case Part::ring_forward:
      return ring_forward(ex, f);
    case Part::ring_backward:
      return ring_backward(ex, f);
    case Part::ring_finish:
      return ring_finish(ex, f);
  }
}

// ---- the schedules ----

/// The latent strategy's forward: each exchange leaves as soon as its input exists. The payload's all-gather runs
/// beside the Q projection, Q's all-to-all beside the KV expansion (flat) or the ring's first steps; the O exchange is
/// consumed per source block.
template <class Ex>
void latent_forward(Ex& ex, const Facts& f) {
  ex.compute(Step::kv_a_projection, 0);
  ex.launch(Comm::payload_all_gather, 0);
  if (!f.overlap) ex.wait(Comm::payload_all_gather, 0);
  ex.compute(Step::q_projection, 0);
  ex.launch(Comm::q_a2a, 0);
  if (!f.overlap) ex.wait(Comm::q_a2a, 0);
  if (f.overlap) ex.wait(Comm::payload_all_gather, 0);
  if (f.on_ring()) {
    if (f.overlap) ex.wait(Comm::q_a2a, 0);
    ex.part(Part::ring_forward);
  } else {
    ex.compute(Step::kv_expansion, 0);
    if (f.overlap) ex.wait(Comm::q_a2a, 0);
    ex.compute(Step::assemble_kv, 0);
    if (!f.o_blocks) ex.compute(Step::attention, 0);
  }
  ex.part(Part::output_forward);
}

/// The expanded strategy's forward: V, then K are launched as each is ready and the Q projection runs while they are
/// in flight; then Q is launched. The attention needs all three, so they are waited in launch order.
template <class Ex>
void expanded_forward(Ex& ex, const Facts& f) {
  ex.compute(Step::kv_a_projection, 0);
  ex.compute(Step::kv_expansion, 0);
  ex.launch(Comm::v_a2a, 0);
  if (!f.overlap) ex.wait(Comm::v_a2a, 0);
  ex.launch(Comm::k_a2a, 0);
  if (!f.overlap) ex.wait(Comm::k_a2a, 0);
  ex.compute(Step::q_projection, 0);
  ex.launch(Comm::q_a2a, 0);
  if (f.overlap) {
    ex.wait(Comm::v_a2a, 0);
    ex.wait(Comm::k_a2a, 0);
  }
  ex.wait(Comm::q_a2a, 0);
  if (f.on_ring())
    ex.part(Part::ring_forward);
  else if (!f.o_blocks)
    ex.compute(Step::attention, 0);
  ex.part(Part::output_forward);
}

/// The output projection's backward and the attention's (flat or on the ring): the start of both backwards.
template <class Ex>
void attention_backward(Ex& ex, const Facts& f) {
  ex.part(Part::output_backward);
  if (!f.attention) return;
  if (f.on_ring())
    ex.part(Part::ring_backward);
  else
    ex.compute(Step::attention_backward, 0);
}

/// The latent strategy's backward: dQ's inverse all-to-all leaves first and the KV path's backward (the w_kvb dgrad,
/// the latent reduce-scatter launched, w_kvb's weight gradient beside it) runs while dQ is in flight; then dQ is
/// waited and the Q branch runs while the reduce-scatter is still in flight; then the reduce-scatter is waited and
/// the payload's backward runs. On a ring the payload gradient comes home first (ring_finish) and the Ulysses group
/// reduce-scatters it as the flat layer does.
template <class Ex>
void latent_backward(Ex& ex, const Facts& f) {
  attention_backward(ex, f);
  if (!f.attention) return;
  if (f.q) ex.launch(Comm::dq_a2a, 0);
  if (f.q && !f.overlap) ex.wait(Comm::dq_a2a, 0);
  if (f.kv) {
    if (f.on_ring()) {
      ex.part(Part::ring_finish);
      if (f.payload) {
        ex.launch(Comm::latent_reduce_scatter, 0);
        if (!f.overlap) ex.wait(Comm::latent_reduce_scatter, 0);
      }
    } else {
      ex.compute(Step::kv_disassemble, 0);
      ex.part(Part::latent_kv_backward);
    }
  }
  if (f.q) {
    if (f.overlap) ex.wait(Comm::dq_a2a, 0);
    ex.compute(Step::q_branch, 0);
  }
  if (f.kv) {
    if (f.payload && f.overlap) ex.wait(Comm::latent_reduce_scatter, 0);
    if (f.payload) ex.compute(Step::payload_backward, 0);
  }
}

/// The expanded strategy's backward: the three inverse all-to-alls are launched at once (the ring's accumulators come
/// home before dK's); dQ is waited first and the Q branch runs while dK and dV are in flight, then the K and V
/// branches, then w_kvb's gradients and the payload's.
template <class Ex>
void expanded_backward(Ex& ex, const Facts& f) {
  attention_backward(ex, f);
  if (!f.attention) return;
  if (f.q) ex.launch(Comm::dq_a2a, 0);
  if (f.q && !f.overlap) ex.wait(Comm::dq_a2a, 0);
  if (f.kv && f.on_ring()) ex.part(Part::ring_finish);
  if (f.kv) {
    ex.launch(Comm::dk_a2a, 0);
    if (!f.overlap) ex.wait(Comm::dk_a2a, 0);
    ex.launch(Comm::dv_a2a, 0);
    if (!f.overlap) ex.wait(Comm::dv_a2a, 0);
  }
  if (f.q) {
    if (f.overlap) ex.wait(Comm::dq_a2a, 0);
    ex.compute(Step::q_branch, 0);
  }
  if (f.kv) {
    if (f.overlap) ex.wait(Comm::dk_a2a, 0);
    ex.compute(Step::k_branch, 0);
    if (f.overlap) ex.wait(Comm::dv_a2a, 0);
    ex.compute(Step::v_branch, 0);
    ex.compute(Step::kv_and_payload, 0);
  }
}

/// The strategy's forward or backward.
template <class Ex>
void forward(Ex& ex, const Facts& f) {
  if (f.latent())
    latent_forward(ex, f);
  else
    expanded_forward(ex, f);
}
template <class Ex>
void backward(Ex& ex, const Facts& f) {
  if (f.latent())
    latent_backward(ex, f);
  else
    expanded_backward(ex, f);
}

}  // namespace mlacp::detail::timeline
