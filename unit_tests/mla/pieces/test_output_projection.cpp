// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// OutputProjection::forward_as_computed (O produced block by block as it leaves, what the flat layer runs with its
// attention as the producer): each owner's rows are produced once, peers in send order (rank + 1, rank + 2, ...) and
// this rank last, each peer's block before its send is launched and after the previous peer's; y is bit for bit
// forward() on the finished attention output. B = 1 (blocks sent where they lie) and B = 2 (packed per destination),
// an uneven token split, overlapped and blocking.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/pieces/output_projection.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Projection = mlacp::OutputProjection<double, Space>;
using Tensor4 = Projection::tensor4;
using Matrix = Projection::matrix;
using Vector = Projection::vector;
using mlacp::test::host_values;

constexpr int dv = 3, D = 5;

// The launches of the O exchange recorded so far.
int o_launches() {
  int n = 0;
  for (const mlacp::Event& e : mlacp::events::snapshot())
    n += e.kind == mlacp::EventKind::launch && e.name == mlacp::names::o_a2a;
  return n;
}

TEST(OutputProjection, ForwardAsComputedProducesEachBlockBeforeItLeavesAndSumsAsForward) {
  const mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int P = mesh.size(), me = mesh.rank();
  const Space space;
  // S = 3P + 1 tokens (the first ranks hold one more), H = 2P heads.
  const mlacp::Partition seq(3 * P + 1, P), heads(2 * P, P);
  const auto S = seq.total();
  const int h = static_cast<int>(heads.count(me));
  Matrix w_o("w_o", D, heads.total() * dv);
  Vector b_o("b_o", D);
  mlacp::test::fill(w_o, 2, 0.5);
  mlacp::test::fill(b_o, 3, 1.0);
  for (const int B : {1, 2}) {
    for (const bool overlap : {true, false}) {
      const std::string where = "B = " + std::to_string(B) + (overlap ? ", overlapped" : ", blocking");
      Tensor4 finished("finished", B, S, h, dv);
      mlacp::test::fill(finished, 10 + me, 1.0);
      const auto expected = host_values(Projection().forward(space, finished, w_o, b_o, mesh, seq, heads));
      // The producer copies an owner's rows of the finished output into one that starts as garbage.
      Tensor4 o("o", B, S, h, dv);
      Kokkos::deep_copy(o, 42.0);
      std::vector<int> owners, launches_before;
      const auto produce = [&](int owner) {
        owners.push_back(owner);
        launches_before.push_back(o_launches());
        const auto rows = std::make_pair(seq.offset(owner), seq.offset(owner) + seq.count(owner));
        Kokkos::deep_copy(space, Kokkos::subview(o, Kokkos::ALL(), rows, Kokkos::ALL(), Kokkos::ALL()),
                          Kokkos::subview(finished, Kokkos::ALL(), rows, Kokkos::ALL(), Kokkos::ALL()));
      };
      mlacp::events::clear();
      mlacp::events::enable(true);
      Projection projection;
      const auto y = projection.forward_as_computed(space, produce, o, w_o, b_o, mesh, seq, heads, {}, {},
                                                    mlacp::WireCodec::same, nullptr, overlap);
      mlacp::events::enable(false);
      EXPECT_EQ(host_values(y), expected) << where << ": y is forward()'s on the finished output, bit for bit";
      std::vector<int> order;
      for (int k = 1; k < P; ++k) order.push_back((me + k) % P);
      order.push_back(me);
      EXPECT_EQ(owners, order) << where << ": peers in send order, this rank last, each once";
      // At P == 1 nothing is sent; at P > 1 peer k's block is produced after k - 1 sends and before its own.
      std::vector<int> sends(static_cast<std::size_t>(P), 0);
      for (int k = 1; k < P; ++k) sends[static_cast<std::size_t>(k - 1)] = k - 1;
      sends[static_cast<std::size_t>(P - 1)] = P - 1;
      EXPECT_EQ(launches_before, sends) << where << ": each block is produced right before its send";
    }
  }
}

}  // namespace
