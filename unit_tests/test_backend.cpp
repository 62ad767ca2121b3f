// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Backend<ExecSpace> (backend.hpp) is what the collectives, the bf16 GEMM, the attention core and the panelled GEMM
// ask: each check below ties one of its answers to the behaviour of the code that reads it.
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/all_to_all.hpp>
#include <mlacp/backend.hpp>
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/kernels/flash_attention.hpp>
#include <mlacp/mpi/transport.hpp>
#include <mlacp/panelled_gemm.hpp>
#include <mlacp/progress.hpp>

#include <Kokkos_Core.hpp>
#include <string>
#include <type_traits>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using HostSpace = Kokkos::DefaultHostExecutionSpace;

// Host spaces: MPI, the BLAS tiles, polling, oneDNN where built with it, never cuBLAS.
static_assert(std::is_same_v<mlacp::Backend<HostSpace>::Transport, mlacp::mpi::Transport>);
static_assert(mlacp::Backend<HostSpace>::host && mlacp::Backend<HostSpace>::attention_on_blas &&
              mlacp::Backend<HostSpace>::polls_progress);
static_assert(mlacp::Backend<HostSpace>::has_bf16_gemm(mlacp::Bf16GemmBackend::float_blas));
static_assert(mlacp::Backend<HostSpace>::has_bf16_gemm(mlacp::Bf16GemmBackend::onednn) == bool(MLACP_HAVE_ONEDNN));
static_assert(!mlacp::Backend<HostSpace>::has_bf16_gemm(mlacp::Bf16GemmBackend::cublas));
#if defined(KOKKOS_ENABLE_CUDA)
// CUDA: NCCL (or MPI), team kernels, no polling, cuBLAS where built with it, never oneDNN.
#if MLACP_HAVE_NCCL
static_assert(std::is_same_v<mlacp::Backend<Kokkos::Cuda>::Transport, mlacp::nccl::CudaTransport>);
#else
static_assert(std::is_same_v<mlacp::Backend<Kokkos::Cuda>::Transport, mlacp::mpi::Transport>);
#endif
static_assert(!mlacp::Backend<Kokkos::Cuda>::attention_on_blas && !mlacp::Backend<Kokkos::Cuda>::polls_progress);
static_assert(mlacp::Backend<Kokkos::Cuda>::has_bf16_gemm(mlacp::Bf16GemmBackend::cublas) == bool(MLACP_HAVE_CUBLAS));
static_assert(!mlacp::Backend<Kokkos::Cuda>::has_bf16_gemm(mlacp::Bf16GemmBackend::onednn));
#endif

TEST(Backend, TheBf16GemmPlanOffersWhatTheBackendHas) {
  for (const auto b :
       {mlacp::Bf16GemmBackend::automatic, mlacp::Bf16GemmBackend::onednn, mlacp::Bf16GemmBackend::float_blas,
        mlacp::Bf16GemmBackend::kokkos_kernels, mlacp::Bf16GemmBackend::cublas}) {
    EXPECT_EQ(mlacp::Bf16GemmPlan<Space>::available(b), mlacp::Backend<Space>::has_bf16_gemm(b))
        << mlacp::bf16_gemm_backend_name(b);
  }
  for (const auto b : mlacp::Bf16GemmPlan<Space>::available_backends())
    EXPECT_TRUE(mlacp::Backend<Space>::has_bf16_gemm(b)) << mlacp::bf16_gemm_backend_name(b);
}

TEST(Backend, TheAttentionCoreRunsThePathTheBackendNames) {
  EXPECT_EQ(mlacp::FlashAttentionCore::runs_blas<Space>(mlacp::FlashAttentionPath::automatic),
            mlacp::Backend<Space>::attention_on_blas);
  EXPECT_FALSE(mlacp::FlashAttentionCore::runs_blas<Space>(mlacp::FlashAttentionPath::team));
}

// With a collective pending, a GEMM of the default space polls MPI between its panels exactly where the backend says
// it polls (at P = 1 nothing is pending, and a polling space still calls progress() around the one GEMM).
TEST(Backend, TheGemmPollsPendingCollectivesWhereTheBackendPolls) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<double****, Kokkos::LayoutRight, Space::memory_space> x("x", 1, 4, 2 * p, 4);
  auto handle = mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "pending during the GEMM");
  const std::int64_t rows = 8 * mlacp::overlap_policy().min_panel_rows;
  Kokkos::View<double**, Kokkos::LayoutRight, Space::memory_space> a("a", rows, 16), b("b", 16, 16), c("c", rows, 16);
  const auto before = mlacp::progress_calls();
  mlacp::detail::gemm_with_progress(Space(), "N", "N", 1.0, a, b, 0.0, c);
  const auto polled = mlacp::progress_calls() - before;
  handle.wait();
  if (!mlacp::Backend<Space>::polls_progress || p == 1)
    EXPECT_EQ(polled, 0u);
  else
    EXPECT_GE(polled, 2u) << "a host GEMM with a collective pending polls before each panel and at the end";
}

}  // namespace
