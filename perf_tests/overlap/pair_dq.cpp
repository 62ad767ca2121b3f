// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap, pair (2): the dQ inverse all-to-all with the KV backward, run as the latent schedule's
// backward steps (LatentSchedule::Backward) over a synthetic O(n) attention core.
#include <mlacp/mesh.hpp>
#include <mlacp/mla/detail/input_checks.hpp>
#include <mlacp/mla/detail/latent_schedule.hpp>
#include <mlacp/mla/detail/schedule_context.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/weights.hpp>
#include <mlacp/progress.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <optional>
#include <stdexcept>

#include "pair.hpp"

namespace mlacp::perf::overlap {

// dst = scale * src over dst's extents (rank 4, any layout), asynchronously on `space`; nothing when dst is empty (a
// gradient that is not needed). (A free function: a device lambda may not be defined in a private member.)
template <class ExecSpace, class Src, class Dst>
void scaled_copy(const ExecSpace& space, const Src& src, const Dst& dst, double scale, const char* label) {
  if (dst.data() == nullptr || dst.size() == 0) return;
  using value = typename Dst::non_const_value_type;
  const value a = static_cast<value>(scale);
  using policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>, Kokkos::IndexType<std::int64_t>>;
  const auto e = [&](int d) { return static_cast<std::int64_t>(dst.extent(d)); };
  Kokkos::parallel_for(
      label, policy(space, {0, 0, 0, 0}, {e(0), e(1), e(2), e(3)}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j, const std::int64_t l, const std::int64_t m) {
        dst(i, j, l, m) = a * static_cast<value>(src(i, j, l, m));
      });
}

// The attention core of the dQ pair (LatentSchedule's Core parameter, the interface of attention_problem.hpp with no
// capabilities: square problems of one document): deterministic outputs of the right shapes in O(n) per call, o = v,
// lse = 0, dq = q / 2, dk = k / 2, dv = dO. Synthetic on purpose: the pair measures the dQ all-to-all against the KV
// path's backward, and the core runs only in its untimed prepare (the schedule's forward and attention() step), where
// the causal core's O(S^2) at S = 8192 would cost more than every timed body of the pair together.
struct SyntheticCore {
  template <class ExecSpace, class Problem>
  void forward(const ExecSpace& space, const Problem& pb) const {
    scaled_copy(space, pb.v, pb.o, 1.0, "mlacp-perf-overlap: synthetic o");
    if (pb.lse.data() != nullptr) Kokkos::deep_copy(space, pb.lse, typename decltype(pb.lse)::non_const_value_type(0));
  }
  template <class ExecSpace, class Problem>
  void backward(const ExecSpace& space, const Problem& pb) const {
    scaled_copy(space, pb.q, pb.dq, 0.5, "mlacp-perf-overlap: synthetic dq");
    scaled_copy(space, pb.k, pb.dk, 0.5, "mlacp-perf-overlap: synthetic dk");
    scaled_copy(space, pb.d_o, pb.dv, 1.0, "mlacp-perf-overlap: synthetic dv");
  }
};

// (2) dQ inverse all-to-all (head-local -> token-local, InputA2APair "Q": received as the P head blocks
// [P, 1, s, h, dqk] that the Q branch consumes without an unpack) with the KV backward of the latent strategy, run by
// the library's own schedule: a ScheduleContext and a LatentSchedule over an MlaConfig of the pair's shape, whose
// backward steps (LatentSchedule::Backward) the pair calls in the order Backward::run() calls them. Untimed before
// each round (prepare): the schedule's forward and the Backward's attention() step (the dO all-to-all beside the w_o
// wgrad, the attention core's backward). Timed (piece): launch_dq() (the dQ all-to-all launched), kv() (disassemble
// dK/dV, LatentKVLinear::launch_backward: w_kvb dgrad, the latent reduce-scatter launched, w_kvb wgrad while it is in
// flight) and wait_dq(): after kv() with overlap on, right after the launch with overlap off. Untimed after each round
// (finish): q_branch() (the Q branch's backward on dQ's head blocks, while the reduce-scatter is still in flight) and
// payload() (the reduce-scatter waited, the payload's RoPE and RMSNorm backward, w_kva wgrad and dgrad). The compute
// alone is kv(). The attention core is SyntheticCore (O(n) per call, not the causal attention). The latent
// reduce-scatter shares the link with the dQ all-to-all in flight: R + dr = 40 makes it 31% of the dQ all-to-all's
// bytes (DeepSeek-V3, R + dr = 576 against dQ's 192 H / P per token: 5% at P = 2, 19% at P = 8, 37% at P = 16). The
// free dimension is dv: it scales the w_kvb GEMMs and moves neither collective.
PairSpec pair_dq(const mlacp::Mesh& mesh, int rows, bool uneven) {
  const int P = mesh.size();
  const int dn = 8, dr = 8, dqk = dn + dr, R = 32, D = 512;
  const int S = rows + static_cast<int>(uneven_extra(uneven, P)), H = 8 * P + static_cast<int>(uneven_extra(uneven, P));
  return {
      spec_name("dQ a2a + kv backward", uneven, S, H), 64, [&mesh, S, H, P, dn, dr, dqk, R, D](int dv) {
        const Space space;
        const Split split(S, H, mesh);
        const int s = split.s(), h = split.h(), width = h * (dn + dv);
        mlacp::MlaConfig config;
        config.batch = 1;
        config.seq = S;
        config.hidden = D;
        config.heads = H;
        config.nope = dn;
        config.rope = dr;
        config.vdim = dv;
        config.latent = R;
        config.bias = false;
        config.strategy = mlacp::MlaStrategy::latent;
        config.overlap = true;
        const std::string config_error = config.error(P);
        if (!config_error.empty()) throw std::invalid_argument("mlacp-perf-overlap: dQ pair: " + config_error);
        using Schedule = mlacp::detail::LatentSchedule<T, Space, SyntheticCore>;
        // What the layer owns (MlaAttention: configuration, weights, core, documents, then the context and the
        // schedule that refer to them), the pass's input and output gradient, and the round's workspace and
        // Backward. Not movable: the context refers to the members.
        struct State {
          State(const mlacp::MlaConfig& c, const mlacp::Mesh& m, Split sp)
              : split(std::move(sp)),
                config(c),
                weights(mlacp::testing::synthetic::weights<T, Mem>(config, 20)),
                ctx(config, weights, m, core, documents),
                schedule(ctx) {}
          State(const State&) = delete;
          State& operator=(const State&) = delete;
          Split split;
          mlacp::MlaConfig config;
          mlacp::MlaWeights<T, Mem> weights;
          SyntheticCore core;
          mlacp::DocumentLayout documents;  // empty: one document, as the layer's for a configuration without one
          Schedule::context_type ctx;
          Schedule schedule;
          mlacp::MlaRequiresGrad flags;  // every gradient
          Tensor3 x, dy;                 // [1, s, D]
          mlacp::MlaGradients<T, Mem> grads;
          // The round's forward workspace (from the schedule's pool) and its backward's steps.
          std::shared_ptr<Schedule::workspace_type> ws;
          std::optional<Schedule::Backward> backward;
          bool dq_launched = false;
          // The collective alone: its own dQ [1, S, h, dqk] and destination, of the shapes launch_dq() sends and
          // receives into (as before the pair ran the schedule: the collective alone runs with no prepare, so no
          // Backward and, before the first round, no dQ of the schedule's).
          Tensor4 dq;
          Tensor5 dq_blocks;  // [P, 1, s, h, dqk] ([1, 1, s, H, dqk] uneven heads; empty at P == 1)
        };
        auto st = std::make_shared<State>(config, mesh, split);
        st->x = Tensor3("x", 1, s, D);
        st->dy = Tensor3("dy", 1, s, D);
        mlacp::testing::synthetic::fill(st->x, 26, 1.0);
        mlacp::testing::synthetic::fill(st->dy, 21, 1.0);
        mlacp::detail::allocate_missing(st->ctx, st->grads, st->flags);
        st->dq = Tensor4("dq", 1, S, h, dqk);
        st->dq_blocks = split.even_heads() ? destination<Tensor5>(mesh, "dQ blocks", P, 1, s, h, dqk)
                                           : destination<Tensor5>(mesh, "dQ", 1, 1, s, H, dqk);
        mlacp::testing::synthetic::fill(st->dq, 22, 1.0);
        // The steps the rounds run between prepare and finish, each followed by `mark` (the breakdown's fence and
        // clock, the polled variants' mlacp::progress()).
        using Mark = std::function<void(const std::string&)>;
        const std::string launch_step = std::string("launch_dq: ") + mlacp::names::dq_a2a + " launched";
        const std::string kv_step = std::string("kv: ") + mlacp::names::kv_backward + " (disassemble_kv_grad, " +
                                    mlacp::names::w_kvb_dgrad + ", " + mlacp::names::latent_reduce_scatter +
                                    " launched, " + mlacp::names::w_kvb_wgrad + ")";
        const std::string wait_step = std::string("wait_dq: ") + mlacp::names::dq_a2a + " wait";
        const std::string q_step = std::string("q_branch: ") + mlacp::names::q_backward;
        const std::string payload_step =
            std::string("payload: ") + mlacp::names::latent_reduce_scatter + " wait, " + mlacp::names::payload_backward;
        auto piece = [st, launch_step, kv_step, wait_step](bool overlap, const Mark& mark) {
          st->backward->launch_dq();
          st->dq_launched = true;
          mark(launch_step);
          if (!overlap) {
            st->backward->wait_dq();
            mark(wait_step);
          }
          st->backward->kv();
          mark(kv_step);
          if (overlap) {
            st->backward->wait_dq();
            mark(wait_step);
          }
        };
        const Mark no_mark = [](const std::string&) {};
        const Mark poll = [](const std::string&) { mlacp::progress(); };
        Pair p;
        p.compute_name = mlacp::names::kv_backward;
        p.comm_name = mlacp::names::dq_a2a;
        p.panel_rows = S;
        p.prepare = [space, st]() {
          st->ws = st->schedule.pool().acquire();
          st->schedule.forward(space, {st->x, st->flags, *st->ws});
          st->backward.emplace(st->schedule, space, Schedule::pass_type{st->x, st->flags, *st->ws}, st->dy, st->grads);
          st->backward->attention();
          st->dq_launched = false;
        };
        // The rest of the backward, then the workspace given back as the layer's Forward gives it back. A round
        // that launched no dQ (the compute alone) has no Q branch to run: it would wait a dQ never sent.
        auto finish = [st](const Mark& mark, const std::string& q_name, const std::string& payload_name) {
          if (st->dq_launched) {
            st->backward->q_branch();
            mark(q_name);
          }
          st->backward->payload();
          mark(payload_name);
          st->backward.reset();
          st->ws->release();
          st->ws.reset();
        };
        p.finish = [finish, no_mark]() { finish(no_mark, "", ""); };
        p.compute = [st]() { st->backward->kv(); };
        p.collective = [space, st, &mesh, P]() {
          // As InputA2APair::launch_backward launches it: the P head blocks gathered, or the heads (uneven).
          const Tensor5 whole(st->dq.data(), 1, 1, st->dq.extent(1), st->dq.extent(2), st->dq.extent(3));
          (st->split.even_heads() ? mlacp::launch_all_to_all(space, whole, 0, 2, mlacp::Partition(P, P), st->split.seq,
                                                             mesh, mlacp::names::dq_a2a, st->dq_blocks)
                                  : mlacp::launch_all_to_all(space, whole, 3, 2, st->split.heads, st->split.seq, mesh,
                                                             mlacp::names::dq_a2a, st->dq_blocks))
              .wait();
        };
        p.piece = [piece, no_mark](bool overlap) { piece(overlap, no_mark); };
        // mlacp::progress() after each step (the library polls inside kv()'s panelled GEMMs only).
        p.compute_polled = [st, poll, kv_step]() {
          st->backward->kv();
          poll(kv_step);
        };
        p.piece_polled = [piece, poll]() { piece(true, poll); };
        p.breakdown = [space, st, &mesh, piece, finish, q_step, payload_step, pr = p.prepare]() {
          // One overlapped round with a fence after each step, max over ranks: how long each step runs, and
          // (with the dQ all-to-all in flight during kv()) what its wait still costs.
          JsonObject o;
          std::vector<std::pair<std::string, double>> steps;
          pr();
          Kokkos::fence();
          double last = now();
          const Mark step = [&](const std::string& name) {
            space.fence();
            const double t = now();
            steps.emplace_back(name, t - last);
            last = t;
          };
          piece(true, step);
          finish(step, q_step, payload_step);
          for (auto& [name, t] : steps) {
            MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, mesh.comm());
            o.num(name, t);
          }
          return o;
        };
        if (split.seq.uniform() && split.heads.uniform()) p.launch_raw = raw_launcher(st->dq.size(), mesh.comm(), P);
        p.sizes = [=]() {
          return split.counts_json()
              .num("dn", dn)
              .num("dr", dr)
              .num("dv", dv)
              .num("R", R)
              .num("D", D)
              .num("comm_bytes_per_rank", 8.0 * S * h * dqk)
              .num("comm_bytes_leaving_rank", 8.0 * (S - s) * h * dqk)
              .num("latent_reduce_scatter_bytes_per_rank", 8.0 * S * (R + dr))
              .num("latent_reduce_scatter_over_dq_bytes", static_cast<double>(R + dr) / (h * dqk))
              .num("gemm_flops", 4.0 * S * width * R + 4.0 * s * (R + dr) * D);
        };
        return p;
      }};
}

}  // namespace mlacp::perf::overlap
