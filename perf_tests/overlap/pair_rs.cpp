// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap, pair (3): the latent reduce-scatter with the w_kvb weight gradient (LatentKVLinear::backward).
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/pieces/latent_kv_linear.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <optional>

#include "pair.hpp"

namespace mlacp::perf::overlap {

using LatentKVLinear = mlacp::LatentKVLinear<T, Space>;
using WeightRows = LatentKVLinear::weight_rows;
using BiasPart = Kokkos::View<T*, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// The latent KV linear's operands as the layer's workspace holds them (pair 3): the gathered payload, the rank's
// head rows of w_kvb and of its gradient [width, R], the forward's outputs and the backward's scratch.
struct LatentKVOperands {
  Tensor3 gathered;                   // [1, S, R+dr]: the forward's input
  Matrix w_rows, dw_rows;             // [width, R]
  Tensor3 kv, latent;                 // [1, S, width], [1, S, R]
  Tensor3 grad_kv, grad_shared;       // [1, S, width], [1, S, dr]
  Tensor3 grad_payload, grad_latent;  // [1, S, R+dr], [1, S, R]
  Tensor3 reduced;                    // [1, s, R+dr] (empty at P == 1)
  LatentKVOperands(const mlacp::Mesh& mesh, int S, int s, int width, int R, int dr)
      : gathered("gathered payload", 1, S, R + dr),
        w_rows("w_kvb rows", width, R),
        dw_rows("dw_kvb rows", width, R),
        kv("kv", 1, S, width),
        latent("latent", 1, S, R),
        grad_kv("d kv", 1, S, width),
        grad_shared("d k_pe", 1, S, dr),
        grad_payload("d payload", 1, S, R + dr),
        grad_latent("d latent", 1, S, R),
        reduced(destination<Tensor3>(mesh, "d payload local", 1, s, R + dr)) {}
  WeightRows rows() const { return WeightRows(w_rows.data(), w_rows.extent(0), w_rows.extent(1)); }
  WeightRows d_rows() const { return WeightRows(dw_rows.data(), dw_rows.extent(0), dw_rows.extent(1)); }
};

// (3) LatentKVLinear::backward: the w_kvb dgrad joined with the shared key's gradient into the payload gradient
// [1, S, R+dr], its SUM reduce-scatter along the sequence launched, dw_sel[W, R] += grad_kv[S, W]^T latent[S, R]
// while it is in flight, W = h*(dn+dv) (calibrated).
PairSpec pair_rs(const mlacp::Mesh& mesh, int rows, bool uneven) {
  const int P = mesh.size();
  const int R = 120, dr = 8;
  const int S = rows + static_cast<int>(uneven_extra(uneven, P));
  return {spec_name("latent reduce-scatter + w_kvb wgrad", uneven, S, -1), 192, [&mesh, S, P, R, dr](int W) {
            const Space space;
            const Split split(S, P, mesh);  // the heads do not enter this pair (W stands for the rank's head rows)
            const int s = split.s();
            struct State {
              State(Split sp, LatentKVOperands operands) : split(std::move(sp)), kvl(std::move(operands)) {}
              Split split;
              LatentKVOperands kvl;  // width = W
              std::optional<LatentKVLinear> invocation;
            };
            auto st = std::make_shared<State>(split, LatentKVOperands(mesh, S, s, W, R, dr));
            mlacp::testing::synthetic::fill(st->kvl.gathered, 31, 1.0);
            mlacp::testing::synthetic::fill(st->kvl.grad_kv, 32, 1.0);
            mlacp::testing::synthetic::fill(st->kvl.grad_shared, 33, 1.0);
            mlacp::testing::synthetic::fill(st->kvl.w_rows, 34, 0.1);
            Pair p;
            p.compute_name = mlacp::names::w_kvb_wgrad;
            p.comm_name = mlacp::names::latent_reduce_scatter;
            p.panel_rows = S;
            p.prepare = [space, st, &mesh]() {
              st->invocation.emplace();
              st->invocation->forward(space, st->kvl.gathered, st->kvl.rows(), BiasPart(), mesh, st->split.seq,
                                      st->kvl.kv, Tensor3(), st->kvl.latent);
            };
            p.compute = [space, st]() {
              st->invocation->backward(space, st->kvl.grad_kv, st->kvl.grad_shared, false, st->kvl.d_rows(), BiasPart(),
                                       true, st->kvl.grad_payload, st->kvl.grad_latent, st->kvl.reduced);
            };
            p.collective = [space, st, &mesh]() {
              mlacp::launch_reduce_scatter(space, st->kvl.grad_payload, 1, st->split.seq, mesh,
                                           mlacp::names::latent_reduce_scatter, st->kvl.reduced)
                  .wait();
            };
            p.piece = [space, st](bool overlap) {
              st->invocation->backward(space, st->kvl.grad_kv, st->kvl.grad_shared, true, st->kvl.d_rows(), BiasPart(),
                                       overlap, st->kvl.grad_payload, st->kvl.grad_latent, st->kvl.reduced);
            };
            if (split.seq.uniform()) p.launch_raw = raw_launcher(st->kvl.grad_payload.size(), mesh.comm(), P);
            p.sizes = [=]() {
              return split.json()
                  .num("S", S)
                  .num("s", s)
                  .num("R", R)
                  .num("dr", dr)
                  .num("W_h_dn_dv", W)
                  .num("comm_bytes_per_rank", 8.0 * S * (R + dr))
                  .num("comm_bytes_leaving_rank", 8.0 * (S - s) * (R + dr))
                  .num("gemm_flops", 2.0 * S * W * R)
                  .num("dgrad_before_launch_flops", 2.0 * S * W * R)
                  .str("gemm", "dw_sel[W, R] += grad_kv[S, W]^T latent[S, R]");
            };
            return p;
          }};
}

}  // namespace mlacp::perf::overlap
