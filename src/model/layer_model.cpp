// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The layer's performance model: the schedules' steps in the order they run (latent_schedule.hpp,
// expanded_schedule.hpp, ring_attention.hpp, shared_steps.hpp), simulated on one compute stream and one network queue
// for the critical rank (the most heads, the most tokens, the ring step's largest block). Its dimensions are
// layer_shape.hpp's; the memory model is memory_model.cpp.
#include "layer_shape.hpp"

#include <mlacp/error.hpp>
#include <mlacp/mla/detail/timeline.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/wire_policy.hpp>
#include <mlacp/model/collective_cost.hpp>
#include <mlacp/model/layer_model.hpp>
#include <mlacp/token_map.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>

namespace mlacp::model {

using internal::ceil_div;
using internal::codec_element_bytes;
using internal::Shape;
using internal::shape_of;

std::string Choice::describe() const {
  std::ostringstream s;
  s << to_string(strategy) << " U=" << ulysses << " C=" << ring;
  if (ring > 1) s << " " << to_string(layout);
  return s.str();
}

std::string choice_error(const MlaConfig& config, const Choice& choice, const Cluster& cluster) {
  std::ostringstream s;
  const int P = cluster.ranks(), G = cluster.ranks_per_node, U = choice.ulysses, C = choice.ring;
  if (cluster.nodes < 1 || G < 1) {
    s << "cluster " << cluster.nodes << " nodes x " << G << " ranks per node: expected at least 1 of each";
  } else if (U < 1 || C < 1 || static_cast<std::int64_t>(U) * C != P) {
    s << "mesh U=" << U << " x C=" << C << ": expected U x C = " << P << " ranks (" << cluster.nodes << " nodes x " << G
      << ")";
  } else if (U % G != 0 && G % U != 0) {
    s << "mesh U=" << U << " on " << G << " ranks per node: a Ulysses group must sit inside a node or span whole "
      << "nodes (U divides " << G << " or " << G << " divides U)";
  } else if (!config.shape_error().empty()) {
    s << config.shape_error();
  } else if (config.seq < C) {
    s << "ring C=" << C << ": the sequence of " << config.seq << " tokens has fewer tokens than chunks";
  } else {
    const std::string e = config.error(U);
    if (!e.empty()) s << e;
  }
  return s.str();
}

namespace {

/// Visible (query, key) pairs between global query tokens [qa, qb) and key tokens [ka, kb) under causal attention
/// (key <= query); the caller has clipped both ranges to one document.
double pairs_in(std::int64_t qa, std::int64_t qb, std::int64_t ka, std::int64_t kb) {
  // For each query i in [qa, qb): keys in [ka, min(kb, i + 1)).
  double total = 0;
  const std::int64_t lo = std::max(qa, ka);  // queries before ka see nothing
  if (lo >= qb) return 0;
  // Queries i in [lo, min(qb, kb)): i + 1 - ka keys; queries i in [kb, qb): kb - ka keys.
  const std::int64_t mid = std::min(qb, kb);
  if (mid > lo) {
    const double n = static_cast<double>(mid - lo);
    const double first = static_cast<double>(lo + 1 - ka), last = static_cast<double>(mid - ka);
    total += n * (first + last) / 2;
  }
  if (qb > std::max(kb, lo)) total += static_cast<double>(qb - std::max(kb, lo)) * static_cast<double>(kb - ka);
  return total;
}

/// Visible pairs between two sets of global token ranges, with packed documents (cu_seqlens; empty: one document).
double visible_pairs(const std::vector<TokenRange>& queries, const std::vector<TokenRange>& keys,
                     const std::vector<std::int64_t>& cu_seqlens, std::int64_t seq) {
  std::vector<std::int64_t> docs = cu_seqlens;
  if (docs.empty()) docs = {0, seq};
  double total = 0;
  for (const TokenRange& q : queries)
    for (const TokenRange& k : keys)
      for (std::size_t d = 0; d + 1 < docs.size(); ++d) {
        const std::int64_t qa = std::max(q.begin, docs[d]), qb = std::min(q.end(), docs[d + 1]);
        const std::int64_t ka = std::max(k.begin, docs[d]), kb = std::min(k.end(), docs[d + 1]);
        if (qa < qb && ka < kb) total += pairs_in(qa, qb, ka, kb);
      }
  return total;
}

/// One rank's schedule as a simulation: compute steps advance the compute stream; a collective takes the network
/// queue (FIFO: it starts when both it is launched and the previous one is done) and a wait stalls the compute stream
/// until it is done. A collective in flight while the compute runs progresses at overlap_efficiency of its rate.
class Simulation {
 public:
  struct Handle {
    double start = 0, cost = 0, end = 0;
    bool live = false;
  };

  /// `enabled` false: a walk of the order alone (collective_order), nothing costed.
  Simulation(const MachineParams& machine, Dtype dtype, Prediction& out, bool enabled = true)
      : machine_(machine), dtype_(dtype), out_(out), enabled_(enabled) {}

  bool enabled() const { return enabled_; }

  void set_backward(bool b) { backward_ = b; }
  double now() const { return t_; }

  void gemm(const char* name, double m, double n, double k) { compute(name, machine_.gemm_time(dtype_, m, n, k)); }
  /// Element-wise arithmetic (RMSNorm, RoPE, the wire's rounding and widening): `bytes` read and written at the
  /// machine's element-wise rate for the layer's dtype (bf16's converts every element: ~8x below a copy here).
  void stream(const char* name, double bytes) {
    const double rate = machine_.elementwise_rate(dtype_);
    if (rate > 0) compute(name, bytes / rate);
  }
  /// Data movement (assembling K and V, scattering their gradients, adding an arriving block): `bytes` read and
  /// written at the memory bandwidth, whatever the dtype (measured: the bf16 ring's expansion, GEMM included, took
  /// 0.96 ms where the element-wise rate alone gave its assembly 1.0).
  void move(const char* name, double bytes) {
    if (machine_.memory_bandwidth > 0) compute(name, bytes / machine_.memory_bandwidth);
  }
  /// The attention core's `flops` at its rate for heads of width dqk + dv = `width`.
  void attention(const char* name, double flops, bool forward, double width) {
    const double rate =
        forward ? machine_.attention_forward_rate(dtype_, width) : machine_.attention_backward_rate(dtype_, width);
    compute(name, rate > 0 ? flops / rate : 0);
  }
  void compute(const char* name, double seconds) {
    if (seconds <= 0) return;
    add(name, ScheduleEvent::Kind::compute, t_, t_ + seconds);
    t_ += seconds;
    out_.compute_s += seconds;
  }

  Handle launch(const char* name, const CollectiveCost& cost) {
    out_.bytes.intra += cost.intra_bytes;
    out_.bytes.inter += cost.inter_bytes;
    Handle h;
    if (cost.seconds <= 0) return h;
    h.start = std::max(t_, net_free_);
    // Every collective synchronises its group: it also carries the lag of the group's slowest rank.
    h.cost = cost.seconds + machine_.sync_s;
    h.end = h.start + h.cost;
    h.live = true;
    net_free_ = h.end;
    out_.communication_s += h.cost;
    add(name, ScheduleEvent::Kind::collective, h.start, h.end);
    return h;
  }
  void wait(const char* name, Handle& h) {
    if (!h.live) return;
    h.live = false;
    // The time the collective and the compute overlapped costs (1 - overlap_efficiency) of itself on top of
    // whichever finishes last (the CPU's share of moving the data: copies, polls, a network stack on the same
    // cores): a loop of T with a collective of c in flight takes max(T, c) + (1 - e) min(T, c), as calibrated.
    const double busy = std::clamp(t_ - h.start, 0.0, h.cost);
    const double end = std::max(t_, h.end) + (1 - std::clamp(machine_.overlap_efficiency, 0.0, 1.0)) * busy;
    if (end > t_) {
      add(name, ScheduleEvent::Kind::wait, t_, end);
      out_.exposed_s += end - t_;
      t_ = end;
    }
  }

 private:
  void add(const char* name, ScheduleEvent::Kind kind, double start, double end) {
    ScheduleEvent e;
    e.name = name;
    e.kind = kind;
    e.backward = backward_;
    e.start_s = start;
    e.end_s = end;
    out_.events.push_back(std::move(e));
  }

  const MachineParams& machine_;
  Dtype dtype_;
  Prediction& out_;
  double t_ = 0, net_free_ = 0;
  bool backward_ = false;
  bool enabled_ = true;
};

/// The forward's query projection: w_q, or with q-LoRA w_qa, its RMSNorm and w_qb; then RoPE.
void q_projection(Simulation& sim, const Shape& x) {
  const double N = x.B * x.s;
  if (x.Rq > 0) {
    sim.gemm(names::w_q_fprop, N, x.Rq, x.D);
    sim.stream(names::w_q_fprop, 2 * N * x.Rq * x.e);
    sim.gemm(names::w_q_fprop, N, x.H * x.dqk, x.Rq);
  } else {
    sim.gemm(names::w_q_fprop, N, x.H * x.dqk, x.D);
  }
  sim.stream(names::w_q_fprop, 2 * N * x.H * x.dqk * x.e);  // RoPE in place
}

/// kv_a = x w_kva^T, RMSNorm of its latent, RoPE of its shared key.
void kv_a_projection(Simulation& sim, const Shape& x) {
  const double N = x.B * x.s;
  sim.gemm(names::w_kva_fprop, N, x.R + x.dr, x.D);
  sim.stream(names::w_kva_fprop, 3 * N * (x.R + x.dr) * x.e);
}

/// The Q branch's backward on dQ's head blocks: RoPE transpose, w_q's gradient and dx += dq w_q (q-LoRA: through
/// w_qb, the RMSNorm and w_qa).
void q_branch_backward(Simulation& sim, const Shape& x) {
  const double N = x.B * x.s;
  sim.stream(names::q_backward, 2 * N * x.H * x.dqk * x.e);
  if (x.Rq > 0) {
    sim.gemm(names::q_backward, x.H * x.dqk, x.Rq, N);
    sim.gemm(names::q_backward, N, x.Rq, x.H * x.dqk);
    sim.stream(names::q_backward, 3 * N * x.Rq * x.e);
    sim.gemm(names::q_backward, x.Rq, x.D, N);
    sim.gemm(names::q_backward, N, x.D, x.Rq);
  } else {
    sim.gemm(names::q_backward, x.H * x.dqk, x.D, N);
    sim.gemm(names::q_backward, N, x.D, x.H * x.dqk);
  }
}

/// The payload's backward: the RoPE transpose, the RMSNorm backward, w_kva's gradient and dx += d(kv_a) w_kva.
void kv_a_backward(Simulation& sim, const Shape& x) {
  const double N = x.B * x.s;
  sim.stream(names::payload_backward, 4 * N * (x.R + x.dr) * x.e);
  sim.gemm(names::payload_backward, x.R + x.dr, x.D, N);
  sim.gemm(names::payload_backward, N, x.D, x.R + x.dr);
}

/// Everything about the ring that the steps need: the chunk pairs' visible work per step (the largest over the
/// ring's ranks, who wait for each other at every exchange) and where the ring's hops go.
struct RingSteps {
  std::vector<double> pairs;  // per step t: the most visible pairs of any rank's queries against chunk (g - t)
  double flat_pairs = 0;      // flat: the visible pairs of the whole sequence
  // flat, per peer offset i (the timeline's attention_block): rank 0's block, the visible pairs of rank i's query rows
  // against their causal prefix (they sum to flat_pairs)
  std::vector<double> block_pairs;
};

RingSteps ring_steps(const MlaConfig& c, const TokenMap& map) {
  RingSteps r;
  const int C = map.ring_size();
  if (C == 1) {
    r.flat_pairs = visible_pairs({TokenRange{0, c.seq}}, {TokenRange{0, c.seq}}, c.cu_seqlens, c.seq);
    const Partition tokens(c.seq, map.ulysses_size());
    for (int i = 0; i < tokens.parts(); ++i)
      r.block_pairs.push_back(visible_pairs({TokenRange{tokens.offset(i), tokens.count(i)}},
                                            {TokenRange{0, tokens.offset(i) + tokens.count(i)}}, c.cu_seqlens, c.seq));
    return r;
  }
  r.pairs.assign(static_cast<std::size_t>(C), 0.0);
  for (int t = 0; t < C; ++t)
    for (int g = 0; g < C; ++g) {
      const int chunk = (g - t + C) % C;
      r.pairs[static_cast<std::size_t>(t)] = std::max(
          r.pairs[static_cast<std::size_t>(t)], visible_pairs(map.chunk(g), map.chunk(chunk), c.cu_seqlens, c.seq));
    }
  return r;
}

/// The attention FLOPs of `pairs` visible (query, key) pairs over h heads (flop_count.hpp's counting).
double attention_flops(const Shape& x, double pairs, bool forward) {
  return 2 * x.B * x.h * pairs * (forward ? (x.dqk + x.dv) : (3 * x.dqk + 2 * x.dv));
}

}  // namespace

std::vector<double> ring_step_pairs(const MlaConfig& config, const Choice& choice) {
  const TokenMap map(config.seq, choice.ulysses, choice.ring, choice.layout);
  const RingSteps steps = ring_steps(config, map);
  return choice.ring > 1 ? steps.pairs : std::vector<double>{steps.flat_pairs};
}

namespace {

namespace tl = mlacp::detail::timeline;

/// The model's executor of the layer's timeline (mla/detail/timeline.hpp): each compute step costs its GEMMs and
/// element-wise passes on the simulation's compute stream, each collective its modelled time on the network queue;
/// the parts (output projection, latent KV backward, ring) are walked with the same executor. `order`, when given,
/// lists every launch and wait in the order walked ("launch <name>", "wait <name>").
class TimelineCost {
 public:
  TimelineCost(Simulation& sim, const Shape& x, const RingSteps& steps, const MachineParams& machine,
               const Placement& group, const Placement& ring, const tl::Facts& facts,
               std::vector<std::string>* order = nullptr)
      : sim_(sim), x_(x), steps_(steps), machine_(machine), group_(group), ring_(ring), f_(facts), order_(order) {}

  void part(tl::Part p) { tl::run_part(*this, p, f_); }

  void launch(tl::Comm c, int i) {
    const char* name = tl::name_of(c, f_.strategy, i);
    if (order_ != nullptr) order_->push_back(std::string("launch ") + name);
    if (!sim_.enabled()) return;
    // On the wire the float payload is encoded into the send buffer before the launch.
    if (on_wire(c)) sim_.stream(name, wire_elements(c) * (x_.e + group_element_bytes(c)));
    handles_[key(c, i)] = sim_.launch(name, cost(c, i));
  }
  void wait(tl::Comm c, int i) {
    const char* name = tl::name_of(c, f_.strategy, i);
    if (order_ != nullptr) order_->push_back(std::string("wait ") + name);
    if (!sim_.enabled()) return;
    Simulation::Handle& h = handles_[key(c, i)];
    const bool live = h.live;
    sim_.wait(name, h);
    // The reduce-scatter's sum of the received blocks, one memory-bound pass after the last transfer.
    if (c == tl::Comm::latent_reduce_scatter && live)
      sim_.move(name, reduce_scatter_sum_bytes(group_, payload_bytes(x_.wr)));
    // ... and the result decoded into the float destination after the wait.
    if (on_wire(c) && live) sim_.stream(name, wire_elements(c) * (group_element_bytes(c) + x_.e));
  }

  void compute(tl::Step step, int i) {
    if (!sim_.enabled()) return;
    const Shape& x = x_;
    const double N = x.B * x.s, Sa = x.Sa;
    switch (step) {
      case tl::Step::kv_a_projection:
        return kv_a_projection(sim_, x);
      case tl::Step::kv_expansion:
        if (f_.latent()) return sim_.gemm(names::w_kvb_fprop, x.B * Sa, x.h * (x.dn + x.dv), x.R);
        sim_.gemm(names::w_kvb_fprop, N, x.H * (x.dn + x.dv), x.R);
        return sim_.move(names::w_kvb_fprop, 2 * N * x.H * (x.dqk + x.dv) * x.e);  // assemble k, v
      case tl::Step::assemble_kv:
        return sim_.move(names::w_kvb_fprop, 2 * x.B * Sa * x.h * (x.dqk + x.dv) * x.e);
      case tl::Step::q_projection:
        return q_projection(sim_, x);
      case tl::Step::attention:
        return attention(names::attention_fprop, steps_.flat_pairs, true);
      case tl::Step::attention_block:
        return attention(names::attention_fprop, steps_.block_pairs.at(static_cast<std::size_t>(i)), true);
      case tl::Step::ring_expand:
        sim_.gemm(names::ring_expand, x.B * Sa, x.h * (x.dn + x.dv), x.R);
        return sim_.move(names::ring_expand, 2 * x.B * Sa * x.h * (x.dqk + x.dv) * x.e);
      case tl::Step::ring_attention:
        return attention(names::attention_fprop, pairs(i), true);
      case tl::Step::o_block:
        // The own block, then each source's: h heads' columns of w_o each (the last takes what is left).
        return sim_.gemm(names::w_o_fprop, N, x.D, (i + 1 < x.U ? x.h : x.H - (x.U - 1) * x.h) * x.dv);
      case tl::Step::o_finish:
        return;
      case tl::Step::w_o_dgrad:
        return sim_.gemm(names::w_o_dgrad, N, x.H * x.dv, x.D);
      case tl::Step::w_o_wgrad:
        return sim_.gemm(names::w_o_wgrad, x.D, x.H * x.dv, N);
      case tl::Step::attention_backward:
        return attention(names::attention_bprop, steps_.flat_pairs, false);
      case tl::Step::ring_attention_backward:
        return attention(names::attention_bprop, pairs(i), false);
      case tl::Step::ring_fold:
        sim_.move(names::ring_kv_backward, 2 * x.B * Sa * x.h * (x.dqk + x.dv) * x.acc);
        sim_.gemm(names::ring_kv_backward, x.B * Sa, x.R, x.h * (x.dn + x.dv));
        return sim_.gemm(names::ring_kv_backward, x.h * (x.dn + x.dv), x.R, x.B * Sa);
      case tl::Step::ring_accumulate:  // the contribution added to the arriving accumulator
        return sim_.move(tl::name_of(tl::Comm::ring_grad, f_.strategy, i), 3 * ring_grad_bytes(i % 2));
      case tl::Step::ring_finish:
        return;
      case tl::Step::kv_disassemble:
        return sim_.move(names::kv_backward, 2 * x.B * Sa * x.h * (x.dqk + x.dv) * x.e);
      case tl::Step::w_kvb_dgrad:
        return sim_.gemm(names::kv_backward, x.B * Sa, x.R, x.h * (x.dn + x.dv));
      case tl::Step::w_kvb_wgrad:
        return sim_.gemm(names::kv_backward, x.h * (x.dn + x.dv), x.R, x.B * Sa);
      case tl::Step::q_branch:
        return q_branch_backward(sim_, x);
      case tl::Step::k_branch:
        return sim_.move(names::kv_backward, 2 * N * x.H * x.dqk * x.e);
      case tl::Step::v_branch:
        return sim_.move(names::kv_backward, 2 * N * x.H * x.dv * x.e);
      case tl::Step::kv_and_payload:
        sim_.gemm(names::kv_backward, x.H * (x.dn + x.dv), x.R, N);
        sim_.gemm(names::kv_backward, N, x.R, x.H * (x.dn + x.dv));
        return kv_a_backward(sim_, x);
      case tl::Step::payload_backward:
        return kv_a_backward(sim_, x);
    }
  }

 private:
  static int key(tl::Comm c, int i) { return static_cast<int>(c) * 4096 + i; }
  double pairs(int t) const { return steps_.pairs.empty() ? 0 : steps_.pairs[static_cast<std::size_t>(t)]; }
  /// The core over `pairs` visible pairs at its rate for this layer's head width dqk + dv.
  void attention(const char* name, double pairs, bool forward) {
    sim_.attention(name, attention_flops(x_, pairs, forward), forward, x_.dqk + x_.dv);
  }
  /// The latent payload [B, Sa, R + dr] at `bytes` per element.
  double payload_bytes(double bytes) const { return x_.B * x_.Sa * (x_.R + x_.dr) * bytes; }
  /// A Ulysses collective's elements per rank (the whole exchange's for the O exchange): one rank's send buffer.
  double group_elements(tl::Comm c) const {
    const Shape& x = x_;
    const double N = x.B * x.s;
    switch (c) {
      case tl::Comm::payload_all_gather:
      case tl::Comm::latent_reduce_scatter:
        return x.B * x.Sa * (x.R + x.dr);
      case tl::Comm::v_a2a:
      case tl::Comm::dv_a2a:
      case tl::Comm::do_a2a:
      case tl::Comm::o_exchange:
        return N * x.H * x.dv;
      default:
        return N * x.H * x.dqk;
    }
  }
  /// Bytes per element a Ulysses collective moves: its kind's codec under MlaConfig::wire_dtype (mla/wire_policy.hpp)
  /// for a float layer's wire, with its rows' width (fp8's scale per row), else the layer's.
  double group_element_bytes(tl::Comm c) const {
    if (c == tl::Comm::latent_reduce_scatter) return x_.wr;
    if (!x_.wire || c == tl::Comm::ring_data || c == tl::Comm::ring_grad) return x_.w;
    const Shape& x = x_;
    switch (c) {
      case tl::Comm::payload_all_gather:
        return codec_element_bytes(wire_codec(x.wire_dtype, WireExchange::forward), x.e, x.R + x.dr);
      case tl::Comm::q_a2a:
      case tl::Comm::k_a2a:
        return codec_element_bytes(wire_codec(x.wire_dtype, WireExchange::forward), x.e, x.dqk);
      case tl::Comm::v_a2a:
      case tl::Comm::o_exchange:
        return codec_element_bytes(wire_codec(x.wire_dtype, WireExchange::forward), x.e, x.dv);
      default:
        return x.w;
    }
  }
  /// Whether collective c moves a narrower codec for a float layer: encoded before its launch, decoded after its wait.
  bool on_wire(tl::Comm c) const {
    return c != tl::Comm::ring_data && c != tl::Comm::ring_grad && group_element_bytes(c) < x_.e;
  }
  /// The elements one launch of wire collective c rounds (and widens): the O exchange's are one peer's block.
  double group_bytes(tl::Comm c) const { return group_elements(c) * group_element_bytes(c); }
  double wire_elements(tl::Comm c) const {
    return group_elements(c) / (c == tl::Comm::o_exchange ? std::max(1, x_.U - 1) : 1);
  }
  double ring_grad_bytes(int stream) const {
    const Shape& x = x_;
    if (f_.latent()) return x.B * x.Sa * (x.R + x.dr) * x.acc;
    return x.B * x.Sa * x.h * (stream == 0 ? x.dqk : x.dv) * x.acc;
  }
  CollectiveCost a2a(double bytes) const { return x_.U > 1 ? all_to_all(machine_, group_, bytes) : CollectiveCost{}; }
  CollectiveCost cost(tl::Comm c, int i) const {
    const Shape& x = x_;
    switch (c) {
      case tl::Comm::payload_all_gather:
        return x.U > 1 ? all_gather(machine_, group_, group_bytes(c)) : CollectiveCost{};
      case tl::Comm::q_a2a:
      case tl::Comm::dq_a2a:
      case tl::Comm::k_a2a:
      case tl::Comm::dk_a2a:
      case tl::Comm::v_a2a:
      case tl::Comm::dv_a2a:
      case tl::Comm::do_a2a:
        return a2a(group_bytes(c));
      case tl::Comm::o_exchange: {
        // One peer's block of the all-to-all per launch: the exchange's cost shared over its P - 1 steps.
        CollectiveCost all = a2a(group_bytes(c));
        const double share = x.U > 1 ? 1.0 / (x.U - 1) : 0.0;
        all.seconds *= share;
        all.intra_bytes *= share;
        all.inter_bytes *= share;
        return all;
      }
      case tl::Comm::latent_reduce_scatter:
        return x.U > 1 ? reduce_scatter(machine_, group_, group_bytes(c)) : CollectiveCost{};
      case tl::Comm::ring_data: {
        const double bytes = f_.latent() ? payload_bytes(x.e) : x.B * x.Sa * x.h * (i % 2 == 0 ? x.dqk : x.dv) * x.e;
        return send_recv(machine_, ring_, bytes);
      }
      case tl::Comm::ring_grad:
        return send_recv(machine_, ring_, ring_grad_bytes(i % 2));
    }
    return {};
  }

  Simulation& sim_;
  const Shape& x_;
  const RingSteps& steps_;
  const MachineParams& machine_;
  Placement group_, ring_;
  tl::Facts f_;
  std::vector<std::string>* order_;
  std::map<int, Simulation::Handle> handles_;
};

}  // namespace

Prediction predict(const MlaConfig& config, Dtype dtype, const Choice& choice, const Cluster& cluster,
                   const MachineParams& machine) {
  const std::string why = choice_error(config, choice, cluster);
  if (!why.empty()) throw InvalidArgument("mlacp::model::predict: " + why);
  const std::string bad = machine.error();
  if (!bad.empty()) throw InvalidArgument("mlacp::model::predict: machine \"" + machine.name + "\": " + bad);
  const int q_lora = config.q_lora_rank;
  if (q_lora < 0)
    throw InvalidArgument("mlacp::model::predict: q_lora_rank " + std::to_string(q_lora) + ": expected >= 0");
  if (cluster.nodes > 1 && (machine.inter.alpha_s <= 0 && machine.inter.beta_s_per_byte <= 0))
    throw InvalidArgument("mlacp::model::predict: machine \"" + machine.name + "\" has no inter-node level (" +
                          machine.source + ") and the cluster has " + std::to_string(cluster.nodes) +
                          " nodes: calibrate on two nodes or write \"inter\" by hand");

  const TokenMap map(config.seq, choice.ulysses, choice.ring, choice.layout);
  const Shape x = shape_of(config, dtype, choice, cluster, q_lora, map);
  const RingSteps steps = ring_steps(config, map);
  const Placement group = ulysses_placement(cluster, choice.ulysses);
  const Placement ring = ring_placement(cluster, choice.ulysses, choice.ring);

  Prediction out;
  out.choice = choice;
  out.memory = predict_memory(config, dtype, choice, cluster);
  Simulation sim(machine, dtype, out);
  // The critical rank: the most heads (h > 0), every gradient.
  MlaConfig as_chosen = config;
  as_chosen.strategy = choice.strategy;
  const tl::Facts facts = tl::facts_of(as_chosen, choice.ulysses, choice.ring, true, MlaRequiresGrad{});
  TimelineCost ex(sim, x, steps, machine, group, ring, facts);
  tl::forward(ex, facts);
  out.forward_s = sim.now();
  sim.set_backward(true);
  const double start = sim.now();
  tl::backward(ex, facts);
  out.backward_s = sim.now() - start;
  out.hidden_fraction = out.communication_s > 0 ? std::max(0.0, 1 - out.exposed_s / out.communication_s) : 1.0;
  return out;
}

std::vector<std::string> collective_order(const MlaConfig& config, int group, int ring, bool heads,
                                          const MlaRequiresGrad& flags, bool backward) {
  Prediction none;
  MachineParams machine;
  Simulation sim(machine, Dtype::float64, none, false);
  const Shape x{};
  const RingSteps steps;
  const tl::Facts facts = tl::facts_of(config, group, ring, heads, flags);
  std::vector<std::string> order;
  TimelineCost ex(sim, x, steps, machine, Placement{}, Placement{}, facts, &order);
  if (backward)
    tl::backward(ex, facts);
  else
    tl::forward(ex, facts);
  return order;
}

}  // namespace mlacp::model
