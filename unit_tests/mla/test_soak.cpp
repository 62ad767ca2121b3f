// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Soak: many forward + backward iterations; resident memory must not grow after warm-up, and nothing may be left open.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <mlacp/diagnostics.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/progress.hpp>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// Resident set size of this process in bytes (/proc/self/statm, second field, in pages).
long resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

mlacp::MlaConfig soak_config(int P, mlacp::MlaStrategy strategy) {
  return mlacp::test::make_config(2, 16 * P, 32, 2 * P, 8, 4, 8, 16, true, strategy);
}

TEST(Soak, ThousandIterationsWithoutGrowthOrLeftovers) {
  const int iterations = std::getenv("MLACP_SOAK_ITERATIONS") ? std::atoi(std::getenv("MLACP_SOAK_ITERATIONS")) : 1000;
  const int warmup = 50;
  const auto communicators_before = mlacp::diagnostics::open_communicators();
  const auto unwaited_before = mlacp::diagnostics::unwaited_handles();
  long rss_after_warmup = 0, rss_end = 0;
  {
    mlacp::Mesh mesh(MPI_COMM_WORLD);
    for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
      const auto c = soak_config(mesh.size(), strategy);
      mlacp::MlaAttention<float> layer(c, mlacp::test::make_weights<float, Mem>(c, 5), mesh);
      Kokkos::View<float***, Kokkos::LayoutRight, Mem> x("x", c.batch, c.seq / mesh.size(), c.hidden);
      mlacp::test::fill(x, 6, 1.0);
      for (int i = 0; i < warmup; ++i) {
        auto forward = layer.forward(Space(), x);
        layer.backward(Space(), forward, x);
      }
    }
    rss_after_warmup = resident_bytes();
    std::optional<mlacp::MlaWeights<float, Mem>> weights;
    for (int i = 0; i < iterations; ++i) {
      const auto c = soak_config(mesh.size(), i % 2 == 0 ? mlacp::MlaStrategy::latent : mlacp::MlaStrategy::expanded);
      if (!weights) weights = mlacp::test::make_weights<float, Mem>(c, 5);
      // A new layer every iteration (as a model rebuilt per step would): construction must not leak either.
      mlacp::MlaAttention<float> layer(c, *weights, mesh);
      Kokkos::View<float***, Kokkos::LayoutRight, Mem> x("x", c.batch, c.seq / mesh.size(), c.hidden);
      auto forward = layer.forward(Space(), x);
      layer.backward(Space(), forward, x);
    }
    // Gradient accumulation as a training loop does it (two forwards pending, then their backwards, into the
    // caller's gradient Views): the layer's pool stays at two workspaces, and no View is allocated.
    {
      mlacp::diagnostics::count_view_allocations();
      const auto c = soak_config(mesh.size(), mlacp::MlaStrategy::latent);
      mlacp::MlaAttention<float> layer(c, mlacp::test::make_weights<float, Mem>(c, 5), mesh);
      Kokkos::View<float***, Kokkos::LayoutRight, Mem> x("x", c.batch, c.seq / mesh.size(), c.hidden);
      mlacp::test::fill(x, 7, 1.0);
      mlacp::MlaGradients<float, Mem> grads;
      static_cast<mlacp::MlaParameters<float, Mem>&>(grads) = mlacp::MlaParameters<float, Mem>::allocate(c);
      grads.dx = decltype(grads.dx)("dx", x.extent(0), x.extent(1), x.extent(2));
      auto accumulate = [&] {
        auto first = layer.forward(Space(), x);
        auto second = layer.forward(Space(), x);
        layer.backward(Space(), second, x, grads);
        layer.backward(Space(), first, x, grads);
      };
      accumulate();
      const auto views_before = mlacp::diagnostics::view_allocations();
      const int steps = iterations / 10;
      for (int i = 0; i < steps; ++i) accumulate();
      // The collectives' results live in the workspaces (forward) and the layer's scratch (backward) too.
      EXPECT_EQ(mlacp::diagnostics::view_allocations() - views_before, 0u)
          << "gradient accumulation allocated Views in its steady state";
      EXPECT_EQ(layer.forward_workspaces(), 2u) << "the workspace pool grew";
    }
    rss_end = resident_bytes();
    EXPECT_EQ(mlacp::pending_collectives(), 0u);
  }
  const long growth = rss_end - rss_after_warmup;
  if (mlacp::test::world_rank() == 0)
    std::cout << "soak: " << iterations << " iterations, resident memory after warm-up " << rss_after_warmup / 1024
              << " KiB, at the end " << rss_end / 1024 << " KiB, growth " << growth / 1024 << " KiB\n";
  EXPECT_LT(growth, 1 << 20) << "resident memory grew by " << growth << " bytes after warm-up";
  EXPECT_EQ(mlacp::diagnostics::open_communicators(), communicators_before) << "a duplicated communicator is left open";
  EXPECT_EQ(mlacp::diagnostics::unwaited_handles(), unwaited_before);
}

}  // namespace
