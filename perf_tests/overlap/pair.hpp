// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap: what every pair is made of (perf_tests/overlap/). A pair (Pair) is one overlap pair of the MLA
// pass at one size of its compute, as callables on the library piece the layer runs it with; a PairSpec makes one at
// any size of its free dimension (the harness calibrates it). Each pair's factory lives in its own file: pair_do.cpp,
// pair_o.cpp, pair_o_attention.cpp, pair_dq.cpp, pair_rs.cpp, pair_ring.cpp; the harness that measures any of them in
// harness.cpp.
#pragma once

#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/detail/pending_transport.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/partition.hpp>
#include <mlacp/progress.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../perf_common.hpp"

namespace mlacp::perf::overlap {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using T = double;
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
using Tensor4 = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;
using Tensor5 = Kokkos::View<T*****, Kokkos::LayoutRight, Mem>;
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
using Vector = Kokkos::View<T*, Kokkos::LayoutRight, Mem>;
using Waiter = std::function<void()>;

// The transfer alone, as mlacp's GEMMs see it: the raw MPI requests of one launch on pre-packed contiguous buffers,
// registered in mlacp's progress registry as one pending transport (so the panelled GEMM polls them), without mlacp's
// buffer allocation, pack and unpack.
class RawRequests final : public mlacp::detail::PendingTransport {
 public:
  explicit RawRequests(std::vector<MPI_Request> requests) : requests_(std::move(requests)) {
    mlacp::detail::register_pending(this);
  }
  ~RawRequests() override { complete_noexcept(); }
  RawRequests(const RawRequests&) = delete;
  RawRequests& operator=(const RawRequests&) = delete;
  bool test() override {
    int done = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    return done != 0;
  }
  void wait() override {
    mlacp::detail::unregister_pending(this);
    MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void complete_noexcept() noexcept override {
    mlacp::detail::unregister_pending(this);
    MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void progress() noexcept override { (void)test(); }

 private:
  std::vector<MPI_Request> requests_;
};

// Pre-packed buffers of `elements` doubles per rank and a launcher of a raw MPI_Ialltoall on them (every pair's
// collective moves its bytes as an all-to-all; the reduce-scatter's is the pairwise exchange).
inline std::function<Waiter()> raw_launcher(std::size_t elements, MPI_Comm comm, int P) {
  auto send = std::make_shared<std::vector<T>>(elements, 1.0);
  auto recv = std::make_shared<std::vector<T>>(elements, 0.0);
  return [=]() -> Waiter {
    MPI_Request request = MPI_REQUEST_NULL;
    const int count = static_cast<int>(elements / static_cast<std::size_t>(P));
    MPI_Ialltoall(send->data(), count, MPI_DOUBLE, recv->data(), count, MPI_DOUBLE, comm, &request);
    auto held = std::make_shared<RawRequests>(std::vector<MPI_Request>{request});
    return [held, send, recv]() { held->wait(); };
  };
}

// A collective's destination as the layer passes it (its `into`): preallocated at P > 1; empty at P == 1, where a
// collective returns its input and writes nothing.
template <class ViewType, class... Extents>
ViewType destination(const mlacp::Mesh& mesh, const char* label, Extents... n) {
  return mesh.size() > 1 ? ViewType(std::string(label), static_cast<std::size_t>(n)...) : ViewType();
}

// How a pair's tokens and heads are split over the ranks, as the layer splits them (MlaAttention's seq_partition and
// head_partition): even, S and H divisible by P; uneven, S = P*k + P-1 and H = P*h + P-1, so that the first P-1
// ranks hold one token and one head more than the last (at P == 1 both are even).
struct Split {
  mlacp::Partition seq, heads;
  int rank = 0;
  Split(std::int64_t S, std::int64_t H, const mlacp::Mesh& mesh)
      : seq(S, mesh.size()), heads(H, mesh.size()), rank(mesh.rank()) {}
  int s() const { return static_cast<int>(seq.count(rank)); }    // this rank's tokens
  int h() const { return static_cast<int>(heads.count(rank)); }  // this rank's heads
  bool even_heads() const { return heads.uniform(); }
  // The shape of the per-rank sizes in the JSON.
  JsonObject json() const {
    return JsonObject()
        .str("seq_counts", seq.str())
        .str("head_counts", heads.str())
        .set("uneven", !(seq.uniform() && heads.uniform()));
  }
  // json() with the token and head counts every pair over heads reports: S, s, H, h.
  JsonObject counts_json() const {
    return json()
        .num("S", static_cast<double>(seq.total()))
        .num("s", s())
        .num("H", static_cast<double>(heads.total()))
        .num("h", h());
  }
};

// The extra tokens and heads of the uneven case over the even one (P-1 each: every rank but the last gets one more).
inline std::int64_t uneven_extra(bool uneven, int P) { return uneven ? P - 1 : 0; }

// The label of a pair spec: its name, and the split when uneven (H < 0: the pair has no head split).
inline std::string spec_name(const std::string& name, bool uneven, std::int64_t S, std::int64_t H) {
  if (!uneven) return name;
  return name + " [uneven S=" + std::to_string(S) + (H < 0 ? "" : " H=" + std::to_string(H)) + "]";
}

// One overlap pair at one size of its compute, as callables on one library piece.
struct Pair {
  std::string compute_name, comm_name;
  std::int64_t panel_rows = 0;  // rows of the panelled GEMM (what OverlapPolicy splits)
  // Untimed: a fresh invocation of the piece (its forward), so that the next backward may run (each runs once).
  std::function<void()> prepare;
  // Untimed, after a timed body that ran the compute (alone or in the piece): what the layer runs after the pair
  // (optional; the dQ pair runs the rest of the schedule's backward here, its latent reduce-scatter's wait included).
  std::function<void()> finish;
  // The piece's compute without its collective (after prepare).
  std::function<void()> compute;
  // The collective alone: the library call the piece launches, with the same arguments, launched and waited.
  std::function<void()> collective;
  // The piece's backward with its collective (after prepare): `overlap` true: the compute runs while the collective
  // is in flight; false: the wait comes right after the launch.
  std::function<void(bool overlap)> piece;
  std::function<Waiter()> launch_raw;  // the same bytes, raw MPI on pre-packed buffers (RawRequests)
  std::function<JsonObject()> sizes;
  std::function<JsonObject()> breakdown;  // optional: per-step times of one round, a fence after each step
  // optional: the compute, and the overlapped piece, with mlacp::progress() also called between the steps that do not
  // poll (a proposed library change)
  std::function<void()> compute_polled;
  std::function<void()> piece_polled;
  std::size_t comm_values = 0;  // optional: the values the collective sends per rank (the ring step's report)
};

struct PairSpec {
  std::string name;
  int initial_dim;
  std::function<Pair(int dim)> make;  // dim: the compute's free dimension (calibrated)
};

// The pairs, one file each. rows: the sequence rows of the pair (its collective's size); uneven: S (and H) one more
// on every rank but the last (the v-collectives).
// pair_do.cpp: (1) the dO all-to-all with the w_o weight gradient.
PairSpec pair_do(const mlacp::Mesh& mesh, int rows, bool uneven);
// pair_o.cpp: the forward's O exchange with the w_o GEMMs that consume its blocks.
PairSpec pair_o(const mlacp::Mesh& mesh, int rows);
// pair_o_attention.cpp: the same exchange with the attention that produces O, block by block, and the w_o GEMMs.
PairSpec pair_o_attention(const mlacp::Mesh& mesh, bool quick);
// pair_dq.cpp: (2) the dQ inverse all-to-all with the KV backward (the latent schedule's steps).
PairSpec pair_dq(const mlacp::Mesh& mesh, int rows, bool uneven);
// pair_rs.cpp: (3) the latent reduce-scatter with the w_kvb weight gradient.
PairSpec pair_rs(const mlacp::Mesh& mesh, int rows, bool uneven);
// pair_ring.cpp: (4) the ring step of ring attention, forward or backward, latent or expanded.
PairSpec pair_ring(const mlacp::Mesh& mesh, bool backward, bool expanded, int heads, bool quick);

}  // namespace mlacp::perf::overlap
