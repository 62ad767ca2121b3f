// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Failure scenarios that cannot run inside a GoogleTest process, each checked by ctest from its output and exit code:
//   attention-throws    the attention core throws in backward (or forward, with a second argument "forward") on the
//                       last rank only, between collectives (a last argument "ring": inside ring attention on a mesh
//                       of rings of 2); the layer reports the failure on the mesh and every rank
//                       raises CommunicationError naming the failed rank (no abort, no hang: the tests run with the
//                       watchdog off), a further call on the mesh raises at once, abandoned handles do not block
//   fails-after         every rank completes a forward and backward; then the last rank fails outside mlacp and
//                       reports it (Mesh::report_failure): the others' next agreement raises, naming it
//   skipped-collective  the last rank never enters an all-to-all that the others launched and wait for (and reports
//                       nothing): the watchdog reports the collective and aborts the job
//   after-finalize      mlacp calls after MPI_Finalize raise UsageError instead of crashing
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <Kokkos_Core.hpp>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// The default core, except that backward (or forward) throws on one rank: an injected fault in the middle of a
// backward (forward), between its collectives; on a two-level mesh the ring's positioned problems go through the same
// two calls, so the fault strikes in the middle of the ring, while the other ranks wait in its exchanges.
struct FaultyCore : mlacp::CausalAttentionCore {
  int faulty_rank = -1;
  int rank = -1;
  bool in_forward = false;
  template <class... Args>
  void forward(const Args&... args) const {
    if (in_forward && rank == faulty_rank)
      throw std::runtime_error("injected fault in the attention core's forward on rank " + std::to_string(rank));
    mlacp::CausalAttentionCore::forward(args...);
  }
  template <class... Args>
  void backward(const Args&... args) const {
    if (!in_forward && rank == faulty_rank)
      throw std::runtime_error("injected fault in the attention core on rank " + std::to_string(rank));
    mlacp::CausalAttentionCore::backward(args...);
  }
};

mlacp::MlaConfig small_config(int P) {
  mlacp::MlaConfig c;
  c.batch = 1;
  c.seq = 8 * P;
  c.hidden = 16;
  c.heads = 2 * P;
  c.nope = 4;
  c.rope = 2;
  c.vdim = 4;
  c.latent = 8;
  return c;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// After a failure: a further call on the mesh raises CommunicationError at once, naming the failed rank. Returns 0
// when it did.
template <class Layer, class X>
int further_call_raises(const mlacp::Mesh& mesh, const Layer& layer, const X& x) {
  const auto start = std::chrono::steady_clock::now();
  try {
    auto again = layer.forward(Space(), x);
    std::printf("rank %d: a forward on the broken mesh did not raise\n", mesh.rank());
    return 1;
  } catch (const mlacp::CommunicationError& e) {
    const double took = seconds_since(start);
    std::printf("rank %d: further call raised in %.3f s: %s\n", mesh.rank(), took, e.what());
    if (took > 1.0) return 1;
  }
  return mesh.broken() ? 0 : 1;
}

// Every rank raises CommunicationError (the failing rank its own error) naming the failing rank, then a further
// call raises at once; each rank prints "rank r: propagation OK" when all of that held.
int attention_throws(const mlacp::Mesh& mesh, bool in_forward) {
  const auto c = small_config(mesh.size());
  FaultyCore core;
  core.faulty_rank = mesh.size() - 1;
  core.rank = mesh.rank();
  core.in_forward = in_forward;
  mlacp::MlaAttention<double, Space, FaultyCore> layer(c, mlacp::testing::synthetic::weights<double, Mem>(c, 1), mesh,
                                                       core);
  Kokkos::View<double***, Kokkos::LayoutRight, Mem> x("x", c.batch, layer.local_seq(), c.hidden);
  mlacp::testing::synthetic::fill(x, 2, 1.0);
  const std::string expected = "rank " + std::to_string(core.faulty_rank);
  int code = 1;
  try {
    auto forward = layer.forward(Space(), x);
    layer.backward(Space(), forward, x);
    std::printf("rank %d: backward completed\n", mesh.rank());
  } catch (const mlacp::CommunicationError& e) {
    // A healthy rank: the failure of the faulty rank reached it.
    std::fprintf(stderr, "rank %d: backward failed: %s\n", mesh.rank(), e.what());
    code = std::string(e.what()).find(expected + " failed: ") != std::string::npos && mesh.rank() != core.faulty_rank
               ? 0
               : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: backward failed: %s\n", mesh.rank(), e.what());
    code = mesh.rank() == core.faulty_rank ? 0 : 1;
  }
  std::fflush(stderr);
  if (code == 0) code = further_call_raises(mesh, layer, x);
  std::printf("rank %d: %s, parked handles %llu\n", mesh.rank(), code == 0 ? "propagation OK" : "propagation FAILED",
              static_cast<unsigned long long>(mlacp::diagnostics::parked_handles()));
  std::fflush(stdout);
  MPI_Barrier(MPI_COMM_WORLD);
  return code;
}

// The last rank fails after every rank finished its collectives (outside mlacp, say writing a checkpoint) and reports
// it; the others' next call (its agreement) raises, naming it.
int fails_after(const mlacp::Mesh& mesh) {
  const auto c = small_config(mesh.size());
  mlacp::MlaAttention<double, Space, mlacp::CausalAttentionCore> layer(
      c, mlacp::testing::synthetic::weights<double, Mem>(c, 1), mesh);
  Kokkos::View<double***, Kokkos::LayoutRight, Mem> x("x", c.batch, c.seq / mesh.size(), c.hidden);
  mlacp::testing::synthetic::fill(x, 2, 1.0);
  {
    auto forward = layer.forward(Space(), x);
    layer.backward(Space(), forward, x);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every rank finished its collectives (a rank's last wait may otherwise see the report)
  const int failing = mesh.size() - 1;
  int code = 1;
  if (mesh.rank() == failing) {
    mesh.report_failure("checkpoint write failed on rank " + std::to_string(failing));
    code = further_call_raises(mesh, layer, x);
  } else {
    try {
      auto forward = layer.forward(Space(), x);  // its agreement waits for a rank that will never come
      std::printf("rank %d: the next forward did not raise\n", mesh.rank());
    } catch (const mlacp::CommunicationError& e) {
      std::printf("rank %d: next forward raised: %s\n", mesh.rank(), e.what());
      code = std::string(e.what()).find("rank " + std::to_string(failing) + " failed: checkpoint write failed") !=
                     std::string::npos
                 ? 0
                 : 1;
    }
    if (code == 0) code = further_call_raises(mesh, layer, x);
  }
  std::printf("rank %d: %s\n", mesh.rank(), code == 0 ? "next agreement OK" : "next agreement FAILED");
  std::fflush(stdout);
  MPI_Barrier(MPI_COMM_WORLD);
  return code;
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
    // "attention-throws ... ring": the same on a two-level mesh of rings of 2 (the fault inside ring attention).
    const bool ring = std::string(argv[argc - 1]) == "ring";
    mlacp::Mesh mesh(MPI_COMM_WORLD, ring ? 2 : 1);
    if (scenario == "attention-throws")
      code = attention_throws(mesh, argc > 2 && std::string(argv[2]) == "forward");
    else if (scenario == "fails-after")
      code = fails_after(mesh);
    else if (scenario == "skipped-collective")
      code = skipped_collective(mesh);
    else
      std::fprintf(
          stderr,
          "usage: fault_scenarios attention-throws [forward] [ring]|fails-after|skipped-collective|after-finalize\n");
  }
  MPI_Finalize();
  return code;
}
