// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Steady state without churn: after the first iteration, forward + backward allocate no new communication buffers.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/diagnostics.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/progress.hpp>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

TEST(SteadyState, CommunicationBuffersAreReusedAfterTheFirstIteration) {
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    mlacp::Mesh mesh(MPI_COMM_WORLD);
    const auto c = mlacp::test::make_config(2, 8 * mesh.size(), 16, 2 * mesh.size(), 4, 2, 3, 6, true, strategy);
    mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh);
    Kokkos::View<double***, Kokkos::LayoutRight, Mem> x("x", c.batch, c.seq / mesh.size(), c.hidden);
    mlacp::test::fill(x, 4, 1.0);
    auto step = [&] {
      auto forward = layer.forward(Space(), x);
      layer.backward(Space(), forward, x);
    };
    const auto before = mlacp::diagnostics::communication_buffer_allocations();
    step();
    const auto after_first = mlacp::diagnostics::communication_buffer_allocations();
    if (mesh.size() > 1)
      EXPECT_GT(after_first, before) << "the first iteration communicates, so it allocates its buffers";
    else
      EXPECT_EQ(after_first, before) << "P = 1 sends nothing and needs no buffer";
    for (int i = 0; i < 4; ++i) step();
    EXPECT_EQ(mlacp::diagnostics::communication_buffer_allocations(), after_first)
        << mlacp::to_string(strategy) << ": iterations 2-5 allocated communication buffers";
    EXPECT_EQ(mlacp::pending_collectives(), 0u);
  }
}

}  // namespace
