// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The layer's performance model: the schedules' steps in the order they run (latent_schedule.hpp,
// expanded_schedule.hpp, ring_attention.hpp, shared_steps.hpp), simulated on one compute stream and one network queue
// for the critical rank (the most heads, the most tokens, the ring step's largest block).
#include <mlacp/error.hpp>
#include <mlacp/mla/detail/timeline.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/wire_policy.hpp>
#include <mlacp/model/collective_cost.hpp>
#include <mlacp/model/layer_model.hpp>
#include <mlacp/token_map.hpp>
#include <mlacp/wire/codecs.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <type_traits>

namespace mlacp::model {

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
  } else if (config.seq < C) {
    s << "ring C=" << C << ": the sequence of " << config.seq << " tokens has fewer tokens than chunks";
  } else {
    const std::string e = config.error(U);
    if (!e.empty()) s << e;
  }
  return s.str();
}

namespace {

double ceil_div(double a, double b) { return std::ceil(a / b); }

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
double codec_element_bytes(WireCodec codec, double e, double width) {
  return mlacp::detail::visit_codec(codec, [&](auto tag) {
    using Codec = typename decltype(tag)::type;
    if constexpr (std::is_same_v<Codec, mlacp::detail::SameCodec>) {
      return e;
    } else {
      const auto n = static_cast<std::int64_t>(width);
      return n <= 0 ? 0.0
                    : static_cast<double>(Codec::wire_width(n) *
                                          static_cast<std::int64_t>(sizeof(typename Codec::template wire_t<float>))) /
                          width;
    }
  });
}

Shape shape_of(const MlaConfig& c, Dtype dtype, const Choice& choice, const Cluster& cluster, int q_lora,
               const TokenMap& map) {
  Shape x{};
  x.B = c.batch;
  x.S = c.seq;
  x.D = c.hidden;
  x.H = c.heads;
  x.dn = c.nope;
  x.dr = c.rope;
  x.dv = c.vdim;
  x.R = c.latent;
  x.Rq = q_lora;
  x.dqk = x.dn + x.dr;
  x.P = cluster.ranks();
  x.U = choice.ulysses;
  x.C = choice.ring;
  x.G = cluster.ranks_per_node;
  x.nodes = cluster.nodes;
  x.h = ceil_div(x.H, x.U);
  x.s = static_cast<double>(map.max_count());
  x.Sa = static_cast<double>(map.max_chunk_size());
  x.e = bytes_of(dtype);
  x.acc = dtype == Dtype::bfloat16 ? 4 : x.e;
  // The wire (mla/wire_policy.hpp) is a float layer's, on the Ulysses group's collectives (the ring's hops keep the
  // type): each kind of exchange in its codec.
  x.wire = x.U > 1 && dtype == Dtype::float32 && c.wire_dtype != WireDtype::same;
  x.wire_dtype = c.wire_dtype;
  x.w = x.wire ? codec_element_bytes(wire_codec(c.wire_dtype, WireExchange::backward), x.e, 1) : x.e;
  x.wr = x.wire ? codec_element_bytes(wire_codec(c.wire_dtype, WireExchange::reduce), x.e, 1) : x.e;
  x.bias = c.bias;
  return x;
}

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
};

RingSteps ring_steps(const MlaConfig& c, const TokenMap& map) {
  RingSteps r;
  const int C = map.ring_size();
  if (C == 1) {
    r.flat_pairs = visible_pairs({TokenRange{0, c.seq}}, {TokenRange{0, c.seq}}, c.cu_seqlens, c.seq);
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

}  // namespace

MemoryEstimate predict_memory(const MlaConfig& c, Dtype dtype, const Choice& choice, const Cluster& cluster) {
  const int q_lora = c.q_lora_rank;
  const std::string why = choice_error(c, choice, cluster);
  if (!why.empty()) throw InvalidArgument("mlacp::model::predict_memory: " + why);
  const TokenMap map(c.seq, choice.ulysses, choice.ring, choice.layout);
  const Shape x = shape_of(c, dtype, choice, cluster, q_lora, map);
  const bool latent = choice.strategy == MlaStrategy::latent, ring = choice.ring > 1, grouped = x.U > 1;
  const bool bf16 = dtype == Dtype::bfloat16;
  // The bf16 wire (wire.hpp): shape_of's bytes per element of the Ulysses collectives say where it applies.
  const bool wire = x.w < x.e, wire_all = x.wr < x.e;
  const double B = x.B, s = x.s, Sa = x.Sa, H = x.H, h = x.h, D = x.D, R = x.R, dr = x.dr, dn = x.dn, dv = x.dv;
  const double dqk = x.dqk, e = x.e, acc = x.acc, Rq = x.Rq, U = x.U;
  const double Hu = U * h;  // the heads of the rank's blocks [U, B, s, h, *] (>= H when U does not divide H)
  const double w = x.w;     // bytes per element of what the Ulysses collectives move
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
  const double tq = std::min(128.0, Sa), tk = std::min(128.0, Sa);
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

}  // namespace mlacp::model
