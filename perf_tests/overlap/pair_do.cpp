// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap, pair (1): the dO all-to-all with the w_o weight gradient (OutputProjection::backward).
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/pieces/output_projection.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <optional>

#include "pair.hpp"

namespace mlacp::perf::overlap {

using OutputProjection = mlacp::OutputProjection<T, Space>;

// (1) OutputProjection::backward: the w_o dgrad written in per-rank head blocks [P, 1, s, h, dv] (heads split
// unevenly: one token-local block [1, 1, s, H, dv] whose heads the all-to-all scatters), the dO all-to-all
// (token-local -> head-local) launched on them, dw_o [D, H*dv] += dy[s, D]^T o[s, H*dv] while it is in flight.
PairSpec pair_do(const mlacp::Mesh& mesh, int rows, bool uneven) {
  const int P = mesh.size();
  const std::int64_t S = static_cast<std::int64_t>(rows) * P + uneven_extra(uneven, P);
  const int H = 8 * P + static_cast<int>(uneven_extra(uneven, P)), dv = std::max(1, 128 / H);
  return {spec_name("dO a2a + w_o wgrad", uneven, S, H), 128, [&mesh, S, H, dv, P](int D) {
            const Space space;
            struct State {
              explicit State(Split sp) : split(std::move(sp)) {}
              Split split;
              Tensor4 attention_output;  // [1, S, h, dv], head-local: the forward's input
              Tensor4 local_output;      // [1, s, H, dv]: the forward's all-to-all result (empty at P == 1)
              Tensor3 y, dy;             // [1, s, D]
              Matrix w_o, dw_o;          // [D, H*dv]
              Tensor5 blocks;            // [P, 1, s, h, dv] ([1, 1, s, H, dv] uneven heads): dO before it is sent
              Tensor5 received;          // [1, 1, S, h, dv]: dO after (empty at P == 1)
              std::optional<OutputProjection> invocation;
            };
            auto st = std::make_shared<State>(Split(S, H, mesh));
            const int s = st->split.s(), h = st->split.h();
            st->attention_output = Tensor4("attention output", 1, S, h, dv);
            st->local_output = destination<Tensor4>(mesh, "local output", 1, s, H, dv);
            st->y = Tensor3("y", 1, s, D);
            st->dy = Tensor3("dy", 1, s, D);
            st->w_o = Matrix("w_o", D, H * dv);
            st->dw_o = Matrix("dw_o", D, H * dv);
            st->blocks = st->split.even_heads() ? Tensor5("dO blocks", P, 1, s, h, dv) : Tensor5("dO", 1, 1, s, H, dv);
            st->received = destination<Tensor5>(mesh, "dO heads", 1, 1, S, h, dv);
            mlacp::testing::synthetic::fill(st->attention_output, 11, 1.0);
            mlacp::testing::synthetic::fill(st->dy, 12, 1.0);
            mlacp::testing::synthetic::fill(st->w_o, 13, 0.1);
            Pair p;
            p.compute_name = mlacp::names::w_o_wgrad;
            p.comm_name = mlacp::names::do_a2a;
            p.panel_rows = s;
            p.prepare = [space, st, &mesh]() {
              st->invocation.emplace();
              st->invocation->forward(space, st->attention_output, st->w_o, Vector(), mesh, st->split.seq,
                                      st->split.heads, st->y, st->local_output);
            };
            p.compute = [space, st]() {
              st->invocation->backward(space, st->dy, false, st->dw_o, Vector(), true, st->blocks, st->received);
            };
            p.collective = [space, st, &mesh, P]() {
              // As OutputProjection::backward launches it: heads gathered from the P blocks, or scattered (uneven).
              (st->split.even_heads()
                   ? mlacp::launch_all_to_all(space, st->blocks, 2, 0, st->split.seq, mlacp::Partition(P, P), mesh,
                                              mlacp::names::do_a2a, st->received)
                   : mlacp::launch_all_to_all(space, st->blocks, 2, 3, st->split.seq, st->split.heads, mesh,
                                              mlacp::names::do_a2a, st->received))
                  .wait();
            };
            p.piece = [space, st](bool overlap) {
              st->invocation->backward(space, st->dy, true, st->dw_o, Vector(), overlap, st->blocks, st->received);
            };
            if (st->split.seq.uniform() && st->split.heads.uniform())
              p.launch_raw = raw_launcher(st->blocks.size(), mesh.comm(), P);
            p.sizes = [=]() {
              return st->split.counts_json()
                  .num("dv", dv)
                  .num("D", D)
                  .num("comm_bytes_per_rank", 8.0 * s * H * dv)
                  .num("comm_bytes_leaving_rank", 8.0 * s * (H - h) * dv)
                  .num("gemm_flops", 2.0 * s * D * H * dv)
                  .num("dgrad_before_launch_flops", 2.0 * s * D * H * dv)
                  .str("gemm", "dw_o[D, H*dv] += dy[s, D]^T o[s, H*dv]");
            };
            return p;
          }};
}

}  // namespace mlacp::perf::overlap
