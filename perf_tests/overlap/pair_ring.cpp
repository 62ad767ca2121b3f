// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap, pair (4): the ring step of ring attention (the attention on a chunk against the next chunk's
// exchange), beside its raw-MPI ceiling.
#include <mlacp/mla/kernels/flash_attention.hpp>
#include <mlacp/mla/kernels/token_segments.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/send_recv.hpp>
#include <mlacp/testing/synthetic.hpp>

#include "pair.hpp"

namespace mlacp::perf::overlap {

// (4) The ring step of ring attention (ring_attention.hpp) at P >= 2 (a ring of the P ranks; the figures of record are
// P = 2: each rank's chunk against the other's): the attention of this rank's query chunk on the key chunk it holds
// while the next chunk travels, the pieces run as RingAttention runs them. Compute: FlashAttentionCore::forward
// of a positioned problem (merged into a running o, lse: a step after the first) or backward (accumulating dq, dk, dv)
// of the n queries at positions [n, 2n) against n keys at [0, n) (fully visible: every tile pair computed, no mask), h
// heads of dqk = 192, dv = 128 (DeepSeek-V3's head dims), the BLAS path at its default tiles (mlacp::progress() once
// per (head, query tile) in the forward, per (head, key tile) in the backward). Comm: launch_send_recv of the next
// chunk's data to the successor and from the predecessor, into a buffer apart from the one computed on: the latent
// payload [1, n, R+dr] (R + dr = 576, DeepSeek-V3's), or with the expanded strategy K [1, n, h, dqk] and V
// [1, n, h, dv] as two exchanges; the backward adds the gradient accumulator of the previous step (the payload's
// gradient [1, n, R+dr], or dK and dV), in flight during the compute as RingAttention's backward has it. Overlapped:
// every exchange launched, the compute, every exchange waited; blocking: launched, waited, then the compute. The
// free dimension is the chunk length n (compute ~ n^2, comm ~ n). The transfer-only mode is the raw-MPI ceiling:
// MPI_Irecv + MPI_Isend of the same bytes per stream on pre-allocated buffers, polled (MPI_Test) by the same
// mlacp::progress() calls of the same compute.
struct RingStream {
  const char* name;
  int width;  // values per token
  int tag;
};

PairSpec pair_ring(const mlacp::Mesh& mesh, bool backward, bool expanded, int heads, bool quick) {
  const int dn = 128, dr = 64, dqk = dn + dr, dv = 128, R = 512;
  const int h = heads;
  // The data streams (tags as RingAttention's: 21.., the gradients' 31..), then (backward) the gradient streams.
  std::vector<RingStream> streams;
  if (expanded) {
    streams.push_back({mlacp::names::ring_k, h * dqk, 21});
    streams.push_back({mlacp::names::ring_v, h * dv, 22});
    if (backward) {
      streams.push_back({mlacp::names::ring_dk, h * dqk, 31});
      streams.push_back({mlacp::names::ring_dv, h * dv, 32});
    }
  } else {
    streams.push_back({mlacp::names::ring_payload, R + dr, 21});
    if (backward) streams.push_back({mlacp::names::ring_d_payload, R + dr, 31});
  }
  const std::string name = std::string("ring step ") + (backward ? "backward" : "forward") +
                           (expanded ? " (K+V chunk)" : " (latent payload)");
  return {
      name, quick ? 256 : 512, [&mesh, backward, expanded, h, dqk, dv, R, dr, streams](int n) {
        const Space space;
        const int P = mesh.size(), g = mesh.rank(), succ = (g + 1) % P, pred = (g + P - 1) % P;
        struct State {
          mlacp::FlashAttentionCore core;
          Tensor4 q, k, v, o, d_o, dq, dk, dv;
          Tensor3 lse;
          std::vector<Vector> send, recv;  // per stream
          std::vector<mlacp::AsyncCollective<Vector>> pending;
        };
        auto st = std::make_shared<State>();
        st->core.resolve<Space>();
        st->q = Tensor4("ring q", 1, n, h, dqk);
        st->k = Tensor4("ring k", 1, n, h, dqk);
        st->v = Tensor4("ring v", 1, n, h, dv);
        st->o = Tensor4("ring o", 1, n, h, dv);
        st->lse = Tensor3("ring lse", 1, h, n);
        mlacp::testing::synthetic::fill(st->q, 41, 1.0);
        mlacp::testing::synthetic::fill(st->k, 42, 1.0);
        mlacp::testing::synthetic::fill(st->v, 43, 1.0);
        const auto q_rows = mlacp::TokenSegments::contiguous(n, n), k_rows = mlacp::TokenSegments::contiguous(0, n);
        const std::int64_t seq = 2 * static_cast<std::int64_t>(n);
        // The running o, lse of the first step (the forward merges into it; the backward's o, lse).
        st->core.forward(
            space, mlacp::attention_problem(st->q, st->k, st->v, st->o, st->lse).positioned(q_rows, k_rows, seq, true));
        if (backward) {
          st->d_o = Tensor4("ring d_o", 1, n, h, dv);
          st->dq = Tensor4("ring dq", 1, n, h, dqk);
          st->dk = Tensor4("ring dk", 1, n, h, dqk);
          st->dv = Tensor4("ring dv", 1, n, h, dv);
          mlacp::testing::synthetic::fill(st->d_o, 44, 1.0);
        }
        std::size_t values = 0;
        for (const RingStream& s : streams) {
          const std::size_t count = static_cast<std::size_t>(n) * static_cast<std::size_t>(s.width);
          st->send.emplace_back(std::string(s.name) + " send", count);
          st->recv.emplace_back(std::string(s.name) + " recv", count);
          Kokkos::deep_copy(st->send.back(), 1.0);
          values += count;
        }
        Kokkos::fence();
        Pair p;
        p.compute_name = backward ? mlacp::names::attention_bprop : mlacp::names::attention_fprop;
        p.comm_name = streams.front().name;
        p.panel_rows = n;
        p.comm_values = values;
        p.compute = [space, st, backward, q_rows, k_rows, seq]() {
          if (backward)
            st->core.backward(
                space, mlacp::attention_problem(st->q, st->k, st->v, st->o, st->lse, st->d_o, st->dq, st->dk, st->dv)
                           .positioned(q_rows, k_rows, seq, false));
          else
            st->core.forward(
                space,
                mlacp::attention_problem(st->q, st->k, st->v, st->o, st->lse).positioned(q_rows, k_rows, seq, false));
        };
        auto launch = [space, st, &mesh, streams, succ, pred]() {
          st->pending.clear();
          for (std::size_t i = 0; i < streams.size(); ++i)
            st->pending.push_back(mlacp::launch_send_recv(space, st->send[i], succ, st->recv[i], pred, mesh,
                                                          streams[i].name, streams[i].tag));
        };
        auto wait = [st]() {
          for (auto& handle : st->pending) handle.wait();
          st->pending.clear();
        };
        p.collective = [launch, wait]() {
          launch();
          wait();
        };
        p.piece = [launch, wait, compute = p.compute](bool overlap) {
          launch();
          if (!overlap) wait();
          compute();
          if (overlap) wait();
        };
        p.launch_raw = [st, &mesh, streams, succ, pred]() -> Waiter {
          std::vector<MPI_Request> requests(2 * streams.size(), MPI_REQUEST_NULL);
          for (std::size_t i = 0; i < streams.size(); ++i) {
            const int count = static_cast<int>(st->recv[i].size());
            MPI_Irecv(st->recv[i].data(), count, MPI_DOUBLE, pred, streams[i].tag, mesh.comm(), &requests[2 * i + 1]);
            MPI_Isend(st->send[i].data(), count, MPI_DOUBLE, succ, streams[i].tag, mesh.comm(), &requests[2 * i]);
          }
          auto held = std::make_shared<RawRequests>(std::move(requests));
          return [held]() { held->wait(); };
        };
        p.sizes = [=]() {
          std::string list;
          for (const RingStream& s : streams) list += (list.empty() ? "" : ", ") + std::string(s.name);
          const auto [tq, tk] = st->core.tiles_for<Space>(2 * static_cast<std::int64_t>(n), dqk, false);
          const double pairs = static_cast<double>(n) * n * h;
          return JsonObject()
              .num("P", P)
              .num("n_chunk", n)
              .num("h", h)
              .num("dqk", dqk)
              .num("dv", dv)
              .num("R_plus_dr", R + dr)
              .str("strategy", expanded ? "expanded (K and V travel)" : "latent (the payload travels)")
              .str("streams", list)
              .num("comm_bytes_per_rank", 8.0 * static_cast<double>(values))
              .num("query_tile", tq)
              .num("key_tile", tk)
              .num("progress_points_per_compute",
                   static_cast<double>(h) * ((n + (backward ? tk : tq) - 1) / (backward ? tk : tq)))
              .num("attention_flops", (backward ? 2.0 * (3 * dqk + 2 * dv) : 2.0 * (dqk + dv)) * pairs);
        };
        return p;
      }};
}

}  // namespace mlacp::perf::overlap
