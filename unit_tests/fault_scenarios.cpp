// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Failure scenarios that cannot run inside a GoogleTest process, each checked by ctest from its output and exit code:
//   attention-throws    the attention core throws in backward on the last rank only; with MLACP_WAIT_TIMEOUT_S set
//                       the healthy ranks' watchdog reports the collective they wait for and aborts the job
//   skipped-collective  the last rank never enters an all-to-all that the others launched and wait for
//   after-finalize      mlacp calls after MPI_Finalize raise UsageError instead of crashing
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// The default core, except that backward throws on one rank: an injected fault in the middle of a backward.
struct FaultyCore : mlacp::CausalAttentionCore {
  int faulty_rank = -1;
  int rank = -1;
  template <class... Args>
  void backward(const Args&... args) const {
    if (rank == faulty_rank)
      throw std::runtime_error("injected fault in the attention core on rank " + std::to_string(rank));
    mlacp::CausalAttentionCore::backward(args...);
  }
};

int attention_throws(const mlacp::Mesh& mesh) {
  mlacp::MlaConfig c;
  c.batch = 1;
  c.seq = 8 * mesh.size();
  c.hidden = 16;
  c.heads = 2 * mesh.size();
  c.nope = 4;
  c.rope = 2;
  c.vdim = 4;
  c.latent = 8;
  FaultyCore core;
  core.faulty_rank = mesh.size() - 1;
  core.rank = mesh.rank();
  mlacp::MlaAttention<double, Space, FaultyCore> layer(c, mlacp::testing::synthetic::weights<double, Mem>(c, 1), mesh,
                                                       core);
  Kokkos::View<double***, Kokkos::LayoutRight, Mem> x("x", c.batch, c.seq / mesh.size(), c.hidden);
  mlacp::testing::synthetic::fill(x, 2, 1.0);
  auto forward = layer.forward(Space(), x);
  try {
    layer.backward(Space(), forward, x);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: backward failed: %s\n", mesh.rank(), e.what());
    std::fflush(stderr);
    // A real application would abort here; this rank waits instead, to show that the healthy ranks do not hang.
    MPI_Barrier(MPI_COMM_WORLD);
    return 1;
  }
  std::printf("rank %d: backward completed\n", mesh.rank());
  return 0;
}

int skipped_collective(const mlacp::Mesh& mesh) {
  Kokkos::View<double****, Kokkos::LayoutRight, Mem> x("x", 1, 4, 2 * mesh.size(), 3);
  if (mesh.rank() == mesh.size() - 1) {
    std::fprintf(stderr, "rank %d: skipping the all-to-all the others launched\n", mesh.rank());
    MPI_Barrier(MPI_COMM_WORLD);
    return 1;
  }
  auto handle = mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "dO a2a");
  handle.wait();
  return 0;
}

int after_finalize() {
  int code = 0;
  {
    mlacp::Mesh mesh(MPI_COMM_WORLD);
    Kokkos::View<double****, Kokkos::LayoutRight, Mem> x("x", 1, 4, 2 * mesh.size(), 3);
    MPI_Finalize();
    try {
      mlacp::launch_all_to_all(Space(), x, 1, 2, mesh).wait();
      std::printf("launch after MPI_Finalize did not throw\n");
      code = 1;
    } catch (const mlacp::UsageError& e) {
      std::printf("caught: %s\n", e.what());
    }
    try {
      mlacp::Mesh late(MPI_COMM_WORLD);
      std::printf("Mesh after MPI_Finalize did not throw\n");
      code = 1;
    } catch (const mlacp::UsageError& e) {
      std::printf("caught: %s\n", e.what());
    }
  }  // the mesh is destroyed after MPI_Finalize: it must not call MPI
  std::printf("after-finalize %s\n", code == 0 ? "OK" : "FAILED");
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  MPI_Init(&argc, &argv);
  int code = 2;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    if (scenario == "after-finalize") return after_finalize();
    mlacp::Mesh mesh(MPI_COMM_WORLD);
    if (scenario == "attention-throws")
      code = attention_throws(mesh);
    else if (scenario == "skipped-collective")
      code = skipped_collective(mesh);
    else
      std::fprintf(stderr, "usage: fault_scenarios attention-throws|skipped-collective|after-finalize\n");
  }
  MPI_Finalize();
  return code;
}
