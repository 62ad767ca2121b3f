// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap, the forward's pair: the O exchange with the w_o GEMMs that consume its blocks as they arrive
// (OutputProjection::forward); and the O exchange's state both forward pairs share (o_exchange_state.hpp).
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/pieces/output_projection.hpp>
#include <mlacp/send_recv.hpp>
#include <mlacp/testing/synthetic.hpp>

#include "o_exchange_state.hpp"

namespace mlacp::perf::overlap {

OutputExchangeState::OutputExchangeState(const mlacp::Mesh& mesh, std::int64_t S, int H, int dv_, int D)
    : split(S, H, mesh), dv(dv_) {
  const int s = split.s(), h = split.h();
  attention_output = Tensor4("attention output", 1, S, h, dv);
  local_output = destination<Tensor4>(mesh, "local output", 1, s, H, dv);
  tokens = Tensor4("o tokens", 1, s, H, dv);
  received = Tensor4("received", 1, s, H, dv);
  y = Tensor3("y", 1, s, D);
  w_o = Matrix("w_o", D, H * dv);
  mlacp::testing::synthetic::fill(attention_output, 21, 1.0);
  mlacp::testing::synthetic::fill(tokens, 22, 1.0);
  mlacp::testing::synthetic::fill(w_o, 23, 0.1);
}

void OutputExchangeState::w_o_gemm(const Space& space) const {
  const auto s = static_cast<std::int64_t>(tokens.extent(1)), width = static_cast<std::int64_t>(w_o.extent(1));
  mlacp::detail::linear_forward(space, mlacp::detail::as_matrix(tokens, s, width), w_o, Vector(),
                                mlacp::detail::as_matrix(y, s, static_cast<std::int64_t>(w_o.extent(0))));
}

void set_output_exchange(Pair& p, const std::shared_ptr<OutputExchangeState>& st, const mlacp::Mesh& mesh) {
  const Space space;
  p.comm_name = mlacp::names::o_a2a;
  p.panel_rows = st->split.s();
  p.prepare = [st]() { st->invocation.emplace(); };
  p.collective = [space, st, &mesh]() {
    using Flat = Kokkos::View<T*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using ConstFlat = Kokkos::View<const T*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    std::vector<mlacp::AsyncCollective<Flat>> arriving;
    const int P = mesh.size(), me = mesh.rank(), s = st->split.s(), h = st->split.h(), dv = st->dv;
    const auto& seq = st->split.seq;
    const auto& heads = st->split.heads;
    for (int k = 1; k < P; ++k) {
      const int dest = (me + k) % P, source = (me + P - k) % P;
      arriving.push_back(mlacp::launch_send_recv(space,
                                                 ConstFlat(st->attention_output.data() + seq.offset(dest) * h * dv,
                                                           static_cast<std::size_t>(seq.count(dest) * h * dv)),
                                                 dest,
                                                 Flat(st->received.data() + s * heads.offset(source) * dv,
                                                      static_cast<std::size_t>(s * heads.count(source) * dv)),
                                                 source, mesh, mlacp::names::o_a2a, 41));
    }
    for (auto& a : arriving) a.wait();
  };
  p.launch_raw = raw_launcher(st->attention_output.size(), mesh.comm(), mesh.size());
}

// The forward's O exchange (head-local -> token-local, point-to-point per peer: OutputProjection::forward) with
// the w_o GEMMs that consume its blocks as they arrive: the own block's first, each received one after its wait. The
// compute alone is the same y = o_tokens w_o^T as one GEMM; the collective alone the same per-peer sends and receives
// launched and waited; the raw ceiling an MPI_Ialltoall of the same bytes. The free dimension is D.
PairSpec pair_o(const mlacp::Mesh& mesh, int rows) {
  const int P = mesh.size();
  const std::int64_t S = static_cast<std::int64_t>(rows) * P;
  const int H = 8 * P, dv = std::max(1, 128 / H);
  return {spec_name("O exchange + w_o fprop", false, S, H), 128, [&mesh, S, H, dv](int D) {
            const Space space;
            auto st = std::make_shared<OutputExchangeState>(mesh, S, H, dv, D);
            const int s = st->split.s(), h = st->split.h();
            Pair p;
            p.compute_name = mlacp::names::w_o_fprop;
            set_output_exchange(p, st, mesh);
            p.compute = [space, st]() { st->w_o_gemm(space); };
            p.piece = [space, st, &mesh](bool overlap) {
              st->invocation->forward(space, st->attention_output, st->w_o, Vector(), mesh, st->split.seq,
                                      st->split.heads, st->y, st->local_output, mlacp::WireCodec::same, &st->buffers,
                                      overlap);
            };
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
