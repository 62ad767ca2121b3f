// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap, the forward's pair: the O exchange with the w_o GEMMs that consume its blocks as they arrive
// (OutputProjection::forward).
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/pieces/output_projection.hpp>
#include <mlacp/send_recv.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <optional>

#include "pair.hpp"

namespace mlacp::perf::overlap {

using OutputProjection = mlacp::OutputProjection<T, Space>;

Waiter launch_o_exchange(const Space& space, const mlacp::Mesh& mesh, const Split& split, const T* o, T* received,
                         int h, int dv) {
  using Flat = Kokkos::View<T*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using ConstFlat = Kokkos::View<const T*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  auto arriving = std::make_shared<std::vector<mlacp::AsyncCollective<Flat>>>();
  const int P = mesh.size(), me = mesh.rank(), s = split.s();
  const auto& seq = split.seq;
  const auto& heads = split.heads;
  for (int k = 1; k < P; ++k) {
    const int dest = (me + k) % P, source = (me + P - k) % P;
    arriving->push_back(mlacp::launch_send_recv(
        space, ConstFlat(o + seq.offset(dest) * h * dv, static_cast<std::size_t>(seq.count(dest) * h * dv)), dest,
        Flat(received + s * heads.offset(source) * dv, static_cast<std::size_t>(s * heads.count(source) * dv)), source,
        mesh, mlacp::names::o_a2a, 41));
  }
  return [arriving]() {
    for (auto& a : *arriving) a.wait();
  };
}

// The forward's O exchange (head-local -> token-local, point-to-point per peer: OutputProjection::forward) with
// the w_o GEMMs that consume its blocks as they arrive: the own block's first, each received one after its wait. The
// compute alone is the same y = o_tokens w_o^T as one GEMM; the collective alone the same per-peer sends and receives
// launched and waited; the raw ceiling an MPI_Ialltoall of the same bytes. The free dimension is D.
PairSpec pair_o(const mlacp::Mesh& mesh, int rows) {
  const int P = mesh.size();
  const std::int64_t S = static_cast<std::int64_t>(rows) * P;
  const int H = 8 * P, dv = std::max(1, 128 / H);
  return {spec_name("O exchange + w_o fprop", false, S, H), 128, [&mesh, S, H, dv, P](int D) {
            const Space space;
            struct State {
              explicit State(Split sp) : split(std::move(sp)) {}
              Split split;
              Tensor4 attention_output;  // [1, S, h, dv], head-local: the forward's input
              Tensor4 local_output;      // [1, s, H, dv]: the exchange's result (empty at P == 1)
              Tensor4 tokens;            // [1, s, H, dv]: the compute alone's operand
              Tensor4 received;          // [1, s, H, dv]: the collective alone's destination
              Tensor3 y;                 // [1, s, D]
              Matrix w_o;                // [D, H*dv]
              OutputProjection::buffers_type buffers;
              std::optional<OutputProjection> invocation;
            };
            auto st = std::make_shared<State>(Split(S, H, mesh));
            const int s = st->split.s(), h = st->split.h();
            st->attention_output = Tensor4("attention output", 1, S, h, dv);
            st->local_output = destination<Tensor4>(mesh, "local output", 1, s, H, dv);
            st->tokens = Tensor4("o tokens", 1, s, H, dv);
            st->received = Tensor4("received", 1, s, H, dv);
            st->y = Tensor3("y", 1, s, D);
            st->w_o = Matrix("w_o", D, H * dv);
            mlacp::testing::synthetic::fill(st->attention_output, 21, 1.0);
            mlacp::testing::synthetic::fill(st->tokens, 22, 1.0);
            mlacp::testing::synthetic::fill(st->w_o, 23, 0.1);
            Pair p;
            p.compute_name = mlacp::names::w_o_fprop;
            p.comm_name = mlacp::names::o_a2a;
            p.panel_rows = s;
            p.prepare = [st]() { st->invocation.emplace(); };
            p.compute = [space, st, s, D, H, dv]() {
              mlacp::detail::linear_forward(space, mlacp::detail::as_matrix(st->tokens, s, H * dv), st->w_o, Vector(),
                                            mlacp::detail::as_matrix(st->y, s, D));
            };
            p.collective = [space, st, &mesh, h, dv]() {
              launch_o_exchange(space, mesh, st->split, st->attention_output.data(), st->received.data(), h, dv)();
            };
            p.piece = [space, st, &mesh](bool overlap) {
              st->invocation->forward(space, st->attention_output, st->w_o, Vector(), mesh, st->split.seq,
                                      st->split.heads, st->y, st->local_output, mlacp::WireCodec::same, &st->buffers,
                                      overlap);
            };
            p.launch_raw = raw_launcher(st->attention_output.size(), mesh.comm(), P);
            p.sizes = [=]() {
              return st->split.counts_json()
                  .num("dv", dv)
                  .num("D", D)
                  .num("comm_bytes_per_rank", 8.0 * S * h * dv)
                  .num("comm_bytes_leaving_rank", 8.0 * (S - s) * h * dv)
                  .num("gemm_flops", 2.0 * s * D * H * dv)
                  .str("gemm", "y[s, D] = sum over sources r of o_r[s, h_r*dv] w_o[:, r's heads]^T");
            };
            return p;
          }};
}

}  // namespace mlacp::perf::overlap
