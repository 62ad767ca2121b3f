// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap, the forward's pair with its producer: the attention that computes O, the O exchange and the
// w_o GEMMs, run as the flat layer runs them (OutputProjection::forward_as_computed, timeline.hpp's output_forward
// with o_blocks).
#include <mlacp/mla/kernels/attention_problem.hpp>
#include <mlacp/mla/kernels/flash_attention.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/pieces/output_projection.hpp>
#include <mlacp/testing/synthetic.hpp>

#include "o_exchange_state.hpp"

namespace mlacp::perf::overlap {

// The attention output O leaves block by block as it is computed: for each peer, FlashAttentionCore::forward of the
// peer's query rows against their causal prefix (attention_rows_problem), then that block's send; this rank's rows
// last, then the w_o GEMMs, the own block's first and each received one after its wait. Shapes: h = 8 heads per rank
// (H = 8P) of DeepSeek-V3's head dims (dqk = 192, dv = 128), D = 512, the BLAS path at its default tiles. (At 2 Gbit/s
// the compute matches the exchange near s = 200 tokens in double; 8 heads put the exchange above the link's 256 kB
// token-bucket burst there, which a smaller one would pass at memory speed.) The compute alone is the whole attention
// (the square problem) and the same y = o_tokens w_o^T as one GEMM; the collective alone the same per-peer sends and
// receives (pair_o's); the raw ceiling an MPI_Ialltoall of the same bytes. Overlapped: each block travels while the
// next is computed (the last peer's block while the own rows and the own GEMM run); blocking: each block waited right
// after its launch. The free dimension is the tokens per rank s (compute ~ s^2, comm ~ s).
PairSpec pair_o_attention(const mlacp::Mesh& mesh, bool quick) {
  const int P = mesh.size(), H = 8 * P, dqk = 192, dv = 128, D = 512;
  return {"attention + O exchange + w_o fprop", quick ? 128 : 256, [&mesh, P, H, dqk, dv, D](int s_rank) {
            const Space space;
            const std::int64_t S = static_cast<std::int64_t>(s_rank) * P;
            // The O exchange's state, and the attention's operands: q, k, v [1, S, h, *] head-local, lse [1, h, S].
            struct State {
              State(const mlacp::Mesh& m, std::int64_t S_, int H_, int dv_, int D_) : o(m, S_, H_, dv_, D_) {}
              OutputExchangeState o;
              mlacp::FlashAttentionCore core;
              Tensor4 q, k, v;
              Kokkos::View<T***, Mem> lse;
            };
            auto st = std::make_shared<State>(mesh, S, H, dv, D);
            auto ex = std::shared_ptr<OutputExchangeState>(st, &st->o);
            const int s = ex->split.s(), h = ex->split.h();
            st->q = Tensor4("q", 1, S, h, dqk);
            st->k = Tensor4("k", 1, S, h, dqk);
            st->v = Tensor4("v", 1, S, h, dv);
            st->lse = Kokkos::View<T***, Mem>("lse", 1, h, S);
            mlacp::testing::synthetic::fill(st->q, 31, 1.0);
            mlacp::testing::synthetic::fill(st->k, 32, 1.0);
            mlacp::testing::synthetic::fill(st->v, 33, 1.0);
            Pair p;
            p.compute_name = mlacp::names::attention_fprop;
            set_output_exchange(p, ex, mesh);
            p.compute = [space, st, ex]() {
              st->core.forward(space, mlacp::attention_problem(st->q, st->k, st->v, ex->attention_output, st->lse));
              ex->w_o_gemm(space);
            };
            p.piece = [space, st, ex, &mesh](bool overlap) {
              const auto produce = [&](int owner) {
                mlacp::detail::ComputePhase<Space> phase(space, mlacp::names::attention_fprop);
                st->core.forward(
                    space, mlacp::attention_rows_problem(st->q, st->k, st->v, ex->attention_output, st->lse,
                                                         ex->split.seq.offset(owner), ex->split.seq.count(owner)));
              };
              ex->invocation->forward_as_computed(space, produce, ex->attention_output, ex->w_o, Vector(), mesh,
                                                  ex->split.seq, ex->split.heads, ex->y, ex->local_output,
                                                  mlacp::WireCodec::same, &ex->buffers, overlap);
            };
            p.sizes = [=]() {
              const double pairs = static_cast<double>(S) * static_cast<double>(S + 1) / 2;
              return ex->split.counts_json()
                  .num("dqk", dqk)
                  .num("dv", dv)
                  .num("D", D)
                  .num("comm_bytes_per_rank", 8.0 * static_cast<double>(S) * h * dv)
                  .num("comm_bytes_leaving_rank", 8.0 * static_cast<double>(S - s) * h * dv)
                  .num("attention_flops", 2.0 * pairs * h * (dqk + dv))
                  .num("gemm_flops", 2.0 * s * D * H * dv)
                  .str("compute", "the attention of h heads over S (in blocks by owner in the piece), then w_o");
            };
            return p;
          }};
}

}  // namespace mlacp::perf::overlap
