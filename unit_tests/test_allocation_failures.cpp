// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Allocation failures (issue 31): an allocation that does not fit is OutOfMemory naming the View, the bytes asked for
// and what the rank had, on the rank where it happens; where the other ranks may already wait in a collective they
// raise CommunicationError naming that rank (the failure channel), and nobody waits for the watchdog. The failure is
// made real with an address-space cap on one rank (mlacp/testing/address_space_cap.hpp); skipped under
// AddressSanitizer, where such a cap cannot work.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/allocation.hpp>
#include <mlacp/collectives.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/testing/address_space_cap.hpp>

#include <chrono>
#include <string>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Tensor3 = Kokkos::View<double***, Kokkos::LayoutRight, Mem>;
using Tensor4 = Kokkos::View<double****, Kokkos::LayoutRight, Mem>;
using mlacp::testing::AddressSpaceCap;

constexpr std::int64_t kHeadroom = 48 << 20;  // what the capped rank may still allocate

#define SKIP_UNDER_ASAN() \
  if (mlacp::testing::sanitized()) GTEST_SKIP() << "an address-space cap does not work under AddressSanitizer"

// What every OutOfMemory message says.
void expect_names_the_allocation(const std::string& what, const std::string& label) {
  EXPECT_NE(what.find("could not allocate"), std::string::npos) << what;
  EXPECT_NE(what.find(" bytes)"), std::string::npos) << what;  // the exact count beside the rounded one
  EXPECT_NE(what.find(label), std::string::npos) << what;
  EXPECT_NE(what.find("available"), std::string::npos) << what;
}

// What a rank saw of `step` run with the cap armed on `failing`: the error's text (empty: none), whether it was
// OutOfMemory, and how long it took.
struct Capped {
  std::string what;
  bool out_of_memory = false;
  double seconds = 0;
};
template <class Step>
Capped run_capped(bool armed, const Step& step) {
  Capped out;
  const auto start = std::chrono::steady_clock::now();
  {
    AddressSpaceCap cap(kHeadroom, armed);
    try {
      step();
    } catch (const mlacp::OutOfMemory& e) {
      out.out_of_memory = true;
      out.what = e.what();
    } catch (const mlacp::Error& e) {
      out.what = e.what();
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

TEST(AllocationFailure, MessagesNameTheViewTheBytesAndWhatTheRankHas) {
  const auto e = mlacp::detail::out_of_memory("where", "my view", 3LL << 30, "");
  EXPECT_EQ(e.label(), "my view");
  EXPECT_EQ(e.bytes(), 3LL << 30);
  expect_names_the_allocation(e.what(), "\"my view\"");
  EXPECT_NE(std::string(e.what()).find("3.00 GiB (3221225472 bytes)"), std::string::npos) << e.what();
  // Kokkos' own failures, in the 3.x and the 4.x wording, are recognised with their label and rounded size.
  const std::runtime_error kokkos3(
      "Kokkos failed to allocate memory for label \"q\".  Allocation using MemorySpace named \"Host\" failed with "
      "the following error:  Allocation of size 2 G failed, likely due to insufficient memory.");
  const std::runtime_error kokkos4("Kokkos ERROR: Host memory space failed to allocate 2.00 GiB (label=\"q\").");
  for (const auto* kokkos : {&kokkos3, &kokkos4}) {
    const auto translated = mlacp::detail::translate_allocation_failure(*kokkos, "w");
    ASSERT_TRUE(translated.has_value()) << kokkos->what();
    EXPECT_EQ(translated->label(), "q");
    EXPECT_EQ(translated->bytes(), 2LL << 30);
  }
  EXPECT_FALSE(mlacp::detail::translate_allocation_failure(std::runtime_error("something else"), "w"));
  EXPECT_FALSE(mlacp::detail::translate_allocation_failure(mlacp::InvalidArgument("failed to allocate"), "w"));
  EXPECT_TRUE(mlacp::detail::translate_allocation_failure(std::bad_alloc(), "w"));
}

// The weights of a layer too large for the rank: OutOfMemory naming the parameter, on the rank that allocates them.
TEST(AllocationFailure, WeightsNameTheParameter) {
  SKIP_UNDER_ASAN();
  const auto config = mlacp::test::make_config(1, 8, 4096, 64, 96, 32, 64, 512);  // w_q: 8192 x 4096 doubles
  AddressSpaceCap cap(kHeadroom);
  try {
    (void)mlacp::MlaWeights<double, Mem>::allocate(config);
    ADD_FAILURE() << "no exception";
  } catch (const mlacp::OutOfMemory& e) {
    expect_names_the_allocation(e.what(), "w_");
    EXPECT_GT(e.bytes(), kHeadroom);
  }
}

// The last rank cannot hold its staging buffer of an all-to-all the others launch: it raises OutOfMemory naming the
// pool's buffer, the others' wait raises CommunicationError naming it, in seconds.
TEST(AllocationFailure, DirectLaunchOnOneRankReachesEveryRank) {
  SKIP_UNDER_ASAN();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int P = mesh.size(), failing = P - 1;
  Tensor4 big("big", 1, (96 << 20) / (8 * 2 * P), P, 2);  // 96 MiB: past the capped rank's headroom
  const auto [what, out_of_memory, seconds] = run_capped(mesh.rank() == failing, [&] {
    auto handle = mlacp::launch_all_to_all(Space(), big, 1, 2, mesh, "big a2a");
    (void)handle.wait();
  });
  if (P == 1) {
    EXPECT_TRUE(what.empty()) << "P = 1 returns the input itself, allocating nothing: " << what;
  } else if (mesh.rank() == failing) {
    EXPECT_TRUE(out_of_memory) << what;
    expect_names_the_allocation(what, "big a2a");
  } else {
    EXPECT_NE(what.find("rank " + std::to_string(failing)), std::string::npos) << what;
    EXPECT_NE(what.find("could not allocate"), std::string::npos) << what;  // the report quotes the failure
  }
  EXPECT_LT(seconds, 60.0);
}

// The last rank runs out of memory inside a forward (its workspace): OutOfMemory naming the View there, and
// CommunicationError naming it on the others, whatever collective they wait in.
TEST(AllocationFailure, LayerForwardOnOneRankReachesEveryRank) {
  SKIP_UNDER_ASAN();
  for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    mlacp::Mesh mesh(MPI_COMM_WORLD);  // a fresh one: the failure leaves the last one broken, as it should
    const int P = mesh.size(), failing = P - 1;
    // q alone is [2, 4096, H/P, 64] doubles = 32 MiB per head block; the workspace is several times that.
    const auto config = mlacp::test::make_config(2, 4096, 64, 8, 48, 16, 64, 64, false, strategy);
    mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 1), mesh);
    Tensor3 x("x", config.batch, layer.local_seq(), config.hidden);
    mlacp::test::fill(x, 5, 1.0);
    // One pass before the cap: OpenBLAS allocates its work buffer at its first GEMM, and its allocator retries for
    // ever when that fails (outside mlacp's reach); what the cap should starve is mlacp's own workspace.
    {
      const auto small = mlacp::test::make_config(1, 2 * P, 64, 8, 48, 16, 64, 64, false, strategy);
      mlacp::MlaAttention<double> warm(small, mlacp::test::make_weights<double, Mem>(small, 1), mesh);
      Tensor3 xs("xs", small.batch, warm.local_seq(), small.hidden);
      auto f = warm.forward(Space(), xs);
      (void)warm.backward(Space(), f, xs);
    }
    const auto [what, out_of_memory, seconds] = run_capped(mesh.rank() == failing, [&] {
      auto forward = layer.forward(Space(), x);
      Space().fence();
    });
    const std::string name = mlacp::to_string(strategy);
    if (mesh.rank() == failing) {
      EXPECT_TRUE(out_of_memory) << name << ": " << what;
      expect_names_the_allocation(what, "\"");
    } else {
      EXPECT_NE(what.find("rank " + std::to_string(failing)), std::string::npos) << name << ": " << what;
    }
    EXPECT_LT(seconds, 60.0) << name;
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
