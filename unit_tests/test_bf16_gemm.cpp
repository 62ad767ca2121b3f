// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the bf16 GEMM (bf16_gemm.hpp): every backend this build has, against a double-precision reference of the
// same bf16 inputs, for the four transpose combinations, beta 0 and 1, alpha other than 1, odd shapes, row-strided
// windows, float and bf16 C; zero extents (empty C untouched, k = 0 giving beta*C); float accumulation (a sum that a
// bf16 running sum could not reach); the per-shape choice made once and kept; the backend override and its refusals.
#include "scoped_environment.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/bf16_gemm.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using mlacp::bf16;
using mlacp::Bf16GemmBackend;
using Plan = mlacp::Bf16GemmPlan<ExecSpace>;
template <class T>
using Mat = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;

/// Host values (already bf16-representable where they feed A and B).
struct HostMat {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> v;
  double operator()(std::int64_t i, std::int64_t j) const { return v[static_cast<std::size_t>(i * cols + j)]; }
};

HostMat random_bf16_values(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  HostMat m{rows, cols, std::vector<double>(static_cast<std::size_t>(rows * cols))};
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& x : m.v) x = static_cast<float>(mlacp::compat::to_bf16(dist(gen)));
  return m;
}

template <class T>
Mat<T> to_device(const HostMat& m, const std::string& label) {
  Mat<T> d(label, static_cast<std::size_t>(m.rows), static_cast<std::size_t>(m.cols));
  auto h = Kokkos::create_mirror_view(d);
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t j = 0; j < m.cols; ++j) h(i, j) = static_cast<T>(static_cast<float>(m(i, j)));
  Kokkos::deep_copy(d, h);
  return d;
}

template <class V>
HostMat to_host(const V& d) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  HostMat m{static_cast<std::int64_t>(d.extent(0)), static_cast<std::int64_t>(d.extent(1)), {}};
  m.v.resize(static_cast<std::size_t>(m.rows * m.cols));
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t j = 0; j < m.cols; ++j)
      m.v[static_cast<std::size_t>(i * m.cols + j)] = static_cast<double>(static_cast<float>(h(i, j)));
  return m;
}

struct Case {
  bool ta, tb;
  std::int64_t m, n, k;
  float alpha, beta;
};

std::string describe(Bf16GemmBackend b, const Case& c, bool c_bf16) {
  return std::string(mlacp::bf16_gemm_backend_name(b)) + (c.ta ? " T" : " N") + (c.tb ? "T" : "N") +
         " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta) + (c_bf16 ? " C bf16" : " C float");
}

/// Runs one case through `backend` (automatic: plan.gemm) and checks every element against the double reference:
/// |c - ref| <= 1e-5 * (|alpha| sum |a b| + |beta c0|) (float accumulation), plus bf16's half ulp of |ref| for a bf16
/// C.
template <class TC>
void check_case(Plan& plan, Bf16GemmBackend backend, const Case& cs, std::uint32_t seed, std::int64_t pad = 0) {
  const HostMat a = random_bf16_values(cs.ta ? cs.k : cs.m, (cs.ta ? cs.m : cs.k) + pad, seed);
  const HostMat b = random_bf16_values(cs.tb ? cs.n : cs.k, (cs.tb ? cs.k : cs.n) + pad, seed + 1);
  const HostMat c0 = random_bf16_values(cs.m, cs.n, seed + 2);
  const auto da_full = to_device<bf16>(a, "a");
  const auto db_full = to_device<bf16>(b, "b");
  const auto dc = to_device<TC>(c0, "c");
  // With pad > 0, A and B are windows whose rows are further apart than their length (lda > columns).
  const auto da = Kokkos::subview(da_full, Kokkos::ALL(), std::make_pair<std::size_t, std::size_t>(0, a.cols - pad));
  const auto db = Kokkos::subview(db_full, Kokkos::ALL(), std::make_pair<std::size_t, std::size_t>(0, b.cols - pad));
  const ExecSpace space;
  const char* ta = cs.ta ? "T" : "N";
  const char* tb = cs.tb ? "T" : "N";
  if (backend == Bf16GemmBackend::automatic)
    plan.gemm(space, ta, tb, cs.alpha, da, db, cs.beta, dc);
  else
    plan.gemm_with(backend, space, ta, tb, cs.alpha, da, db, cs.beta, dc);
  space.fence();
  const HostMat c = to_host(dc);
  const bool c_bf16 = std::is_same_v<TC, bf16>;
  double worst = 0;
  for (std::int64_t i = 0; i < cs.m; ++i)
    for (std::int64_t j = 0; j < cs.n; ++j) {
      double sum = 0, sum_abs = 0;
      for (std::int64_t l = 0; l < cs.k; ++l) {
        const double x = cs.ta ? a(l, i) : a(i, l), y = cs.tb ? b(j, l) : b(l, j);
        sum += x * y;
        sum_abs += std::fabs(x * y);
      }
      const double ref = (cs.beta == 0.0f ? 0.0 : cs.beta * c0(i, j)) + double(cs.alpha) * sum;
      const double bound = 1e-5 * (std::fabs(cs.alpha) * sum_abs + std::fabs(cs.beta * c0(i, j))) +
                           (c_bf16 ? std::ldexp(std::fabs(ref), -8) : 0.0) + 1e-30;
      const double err = std::fabs(c(i, j) - ref);
      worst = std::max(worst, err / bound);
      if (!(err <= bound)) {
        ADD_FAILURE() << describe(backend, cs, c_bf16) << ": C(" << i << ", " << j << ") = " << c(i, j)
                      << ", reference " << ref << ", error " << err << " > " << bound;
        return;
      }
    }
}

std::vector<Bf16GemmBackend> backends_to_test() {
  auto b = Plan::available_backends();
  b.push_back(Bf16GemmBackend::automatic);
  return b;
}

class Bf16Gemm : public ::testing::Test {
 protected:
  // No override from the environment the tests run in: the tests choose (and the run's own value comes back after).
  mlacp::test::ScopedEnvironment environment_{mlacp::bf16_gemm_env_var, nullptr};
};

TEST_F(Bf16Gemm, FloatBlasIsAlwaysAvailableAndKokkosKernelsOnlyWhereItTakesBf16) {
  EXPECT_TRUE(Plan::available(Bf16GemmBackend::float_blas));
  EXPECT_EQ(Plan::available(Bf16GemmBackend::kokkos_kernels), mlacp::detail::kokkos_kernels_gemm_takes_bf16);
  EXPECT_EQ(Plan::available(Bf16GemmBackend::onednn), MLACP_HAVE_ONEDNN && mlacp::detail::host_space<ExecSpace>);
  EXPECT_EQ(Plan::available(Bf16GemmBackend::cublas), MLACP_HAVE_CUBLAS && !mlacp::detail::host_space<ExecSpace>);
  std::string names;
  for (auto b : Plan::available_backends()) names += std::string(" ") + mlacp::bf16_gemm_backend_name(b);
  std::cout << "bf16 GEMM backends in this build:" << names << "; oneDNN ISA: " << mlacp::onednn_cpu_isa() << '\n';
}

TEST_F(Bf16Gemm, EveryBackendMatchesTheDoubleReferenceForAllTransposesAndBetas) {
  const std::vector<std::array<std::int64_t, 3>> shapes = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 48, 130}};
  std::uint32_t seed = 1;
  for (const auto backend : backends_to_test()) {
    Plan plan(Bf16GemmBackend::automatic);
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const float beta : {0.0f, 1.0f})
          for (const auto& s : shapes) {
            check_case<float>(plan, backend, Case{ta, tb, s[0], s[1], s[2], 1.0f, beta}, seed += 3);
            check_case<bf16>(plan, backend, Case{ta, tb, s[0], s[1], s[2], 1.0f, beta}, seed += 3);
          }
  }
}

TEST_F(Bf16Gemm, AlphaBetaOtherThanOneAndRowStridedWindows) {
  for (const auto backend : backends_to_test()) {
    Plan plan(Bf16GemmBackend::automatic);
    std::uint32_t seed = 100;
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        check_case<float>(plan, backend, Case{ta, tb, 19, 23, 29, 0.5f, -2.0f}, seed += 3);
        check_case<bf16>(plan, backend, Case{ta, tb, 19, 23, 29, -1.5f, 0.25f}, seed += 3);
        check_case<float>(plan, backend, Case{ta, tb, 21, 13, 37, 1.0f, 1.0f}, seed += 3, /*pad=*/5);
      }
  }
}

TEST_F(Bf16Gemm, EmptyExtentsAndZeroInnerDimension) {
  const ExecSpace space;
  for (const auto backend : backends_to_test()) {
    SCOPED_TRACE(mlacp::bf16_gemm_backend_name(backend));
    Plan plan(Bf16GemmBackend::automatic);
    auto run = [&](const char* ta, const char* tb, const auto& a, const auto& b, float beta, const auto& c) {
      if (backend == Bf16GemmBackend::automatic)
        plan.gemm(space, ta, tb, 1.0f, a, b, beta, c);
      else
        plan.gemm_with(backend, space, ta, tb, 1.0f, a, b, beta, c);
      space.fence();
    };
    // k = 0: C = beta*C; beta = 0 gives 0 without reading C (NaN there is overwritten).
    Mat<bf16> a0("a0", 4, 0), b0("b0", 0, 3);
    Mat<float> c("c", 4, 3);
    Kokkos::deep_copy(c, 2.0f);
    run("N", "N", a0, b0, 0.5f, c);
    for (double x : to_host(c).v) EXPECT_EQ(x, 1.0);
    Kokkos::deep_copy(c, std::numeric_limits<float>::quiet_NaN());
    run("N", "N", a0, b0, 0.0f, c);
    for (double x : to_host(c).v) EXPECT_EQ(x, 0.0);
    Mat<bf16> cb("cb", 4, 3);
    Kokkos::deep_copy(cb, bf16(3.0f));
    Mat<bf16> a0t("a0t", 0, 4), b0t("b0t", 3, 0);
    run("T", "T", a0t, b0t, 1.0f, cb);
    for (double x : to_host(cb).v) EXPECT_EQ(x, 3.0);
    // m = 0 or n = 0: nothing to do (and no error).
    Mat<bf16> a_m0("a_m0", 0, 5), b5("b5", 5, 3), a5("a5", 4, 5), b_n0("b_n0", 5, 0);
    Mat<float> c_m0("c_m0", 0, 3), c_n0("c_n0", 4, 0);
    run("N", "N", a_m0, b5, 1.0f, c_m0);
    run("N", "N", a5, b_n0, 1.0f, c_n0);
  }
}

// Float accumulation: k = 4096 products of ones sum to exactly 4096 in float. A bf16 running sum stalls at 256
// (256 + 1 rounds back to 256 with 8 significant bits), and 1 plus 4095 terms of 2^-9 (exact in float) would stay at 1
// in bf16 (2^-9 is a quarter of bf16's ulp at 1).
TEST_F(Bf16Gemm, AccumulatesInFloat) {
  const ExecSpace space;
  const std::int64_t k = 4096;
  for (const auto backend : backends_to_test()) {
    SCOPED_TRACE(mlacp::bf16_gemm_backend_name(backend));
    Plan plan(Bf16GemmBackend::automatic);
    Mat<bf16> a("a", 3, k), b("b", k, 2);
    auto ha = Kokkos::create_mirror_view(a);
    auto hb = Kokkos::create_mirror_view(b);
    for (std::int64_t l = 0; l < k; ++l) {
      ha(0, l) = bf16(1.0f);
      ha(1, l) = bf16(l == 0 ? 1.0f : std::ldexp(1.0f, -9));
      ha(2, l) = bf16(l % 2 == 0 ? 1.0f : -1.0f);
      hb(l, 0) = bf16(1.0f);
      hb(l, 1) = bf16(l == 0 ? 0.0f : 1.0f);
    }
    Kokkos::deep_copy(a, ha);
    Kokkos::deep_copy(b, hb);
    Mat<float> c("c", 3, 2);
    Mat<bf16> cb("cb", 3, 2);
    if (backend == Bf16GemmBackend::automatic) {
      plan.gemm(space, "N", "N", 1.0f, a, b, 0.0f, c);
      plan.gemm(space, "N", "N", 1.0f, a, b, 0.0f, cb);
    } else {
      plan.gemm_with(backend, space, "N", "N", 1.0f, a, b, 0.0f, c);
      plan.gemm_with(backend, space, "N", "N", 1.0f, a, b, 0.0f, cb);
    }
    space.fence();
    const HostMat hc = to_host(c), hcb = to_host(cb);
    // Row 1: 1 + 4095 * 2^-9 (column 0) and 4095 * 2^-9 (column 1); row 2: +1, -1, ... (0, and -1 without l = 0).
    const double expect[3][2] = {{4096.0, 4095.0}, {1.0 + 4095.0 / 512.0, 4095.0 / 512.0}, {0.0, -1.0}};
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) {
        const double e = expect[i][j];
        EXPECT_EQ(hc(i, j), e) << "float C(" << i << ", " << j << ")";
        // A bf16 C is the float sum rounded once.
        EXPECT_EQ(hcb(i, j), static_cast<double>(static_cast<float>(mlacp::compat::to_bf16(static_cast<float>(e)))))
            << "bf16 C(" << i << ", " << j << ")";
      }
  }
}

TEST_F(Bf16Gemm, AutoChoosesOncePerShapeAndKeepsTheChoice) {
  const ExecSpace space;
  Plan plan(Bf16GemmBackend::automatic);
  EXPECT_EQ(plan.requested(), Bf16GemmBackend::automatic);
  const HostMat ha = random_bf16_values(40, 24, 7), hb = random_bf16_values(24, 16, 8);
  const auto a = to_device<bf16>(ha, "a");
  const auto b = to_device<bf16>(hb, "b");
  Mat<float> c("c", 40, 16);
  for (int rep = 0; rep < 3; ++rep) plan.gemm(space, "N", "N", 1.0f, a, b, 0.0f, c);
  plan.gemm(space, "N", "N", 1.0f, a, b, 1.0f, c);  // beta != 0: another shape
  ASSERT_EQ(plan.choices().size(), 2u);
  // oneDNN is a candidate where it has an implementation on this CPU (not under ONEDNN_MAX_CPU_ISA=AVX2).
  const bool onednn_runs =
      Plan::available(Bf16GemmBackend::onednn) && !plan.onednn_impl("N", "N", 1.0f, a, b, 0.0f, c).empty();
  const std::size_t candidates =
      Plan::available_backends().size() - (Plan::available(Bf16GemmBackend::onednn) && !onednn_runs ? 1 : 0);
  for (const auto& [shape, choice] : plan.choices()) {
    EXPECT_TRUE(Plan::available(choice.backend));
    EXPECT_NE(choice.backend, Bf16GemmBackend::automatic);
    EXPECT_EQ(choice.timings.size(), candidates > 1 ? candidates : 0u);
    for (const auto& [backend, seconds] : choice.timings) EXPECT_GE(seconds, 0.0) << int(backend);
  }
  // The result: 4 * A B (three overwrites, then one accumulation) = 2 * A B.
  const HostMat hc = to_host(c);
  for (std::int64_t i = 0; i < 40; ++i)
    for (std::int64_t j = 0; j < 16; ++j) {
      double ref = 0;
      for (std::int64_t l = 0; l < 24; ++l) ref += ha(i, l) * hb(l, j);
      EXPECT_NEAR(hc(i, j), 2 * ref, 1e-4);
    }
  EXPECT_EQ(plan.onednn_primitives(), onednn_runs ? 2u : 0u);  // one per shape, made once, shared by timing and call
}

// oneDNN 2.6 has no bf16 matmul below AVX512: a forced oneDNN then runs float_blas (recorded so), auto leaves it out.
// Registered a second time with ONEDNN_MAX_CPU_ISA=AVX2 (test_bf16_gemm_onednn_avx2_np1), which makes that case.
TEST_F(Bf16Gemm, OneDnnWithoutAnImplementationFallsBackToFloatBlas) {
  if (!Plan::available(Bf16GemmBackend::onednn)) GTEST_SKIP() << "no oneDNN in this build";
  const ExecSpace space;
  const HostMat ha = random_bf16_values(24, 40, 3), hb = random_bf16_values(16, 40, 4);
  const auto a = to_device<bf16>(ha, "a");
  const auto b = to_device<bf16>(hb, "b");
  Mat<float> c("c", 24, 16);
  Plan forced(Bf16GemmBackend::onednn), automatic(Bf16GemmBackend::automatic);
  const std::string impl = forced.onednn_impl("N", "T", 1.0f, a, b, 0.0f, c);
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap != nullptr && std::string(cap) == "AVX2") {
    EXPECT_EQ(impl, "") << "oneDNN 2.6 under ONEDNN_MAX_CPU_ISA=AVX2";
  }
  std::cout << "oneDNN ISA " << mlacp::onednn_cpu_isa() << ", implementation: '" << impl << "'\n";
  forced.gemm(space, "N", "T", 1.0f, a, b, 0.0f, c);
  automatic.gemm(space, "N", "T", 1.0f, a, b, 0.0f, c);
  space.fence();
  const auto forced_choice = forced.choices().begin()->second.backend;
  const auto automatic_choice = automatic.choices().begin()->second;
  if (impl.empty()) {
    EXPECT_EQ(forced_choice, Bf16GemmBackend::float_blas);
    EXPECT_EQ(forced.onednn_primitives(), 0u);
    for (const auto& [backend, seconds] : automatic_choice.timings) EXPECT_NE(backend, Bf16GemmBackend::onednn);
    EXPECT_NE(automatic_choice.backend, Bf16GemmBackend::onednn);
  } else {
    EXPECT_EQ(forced_choice, Bf16GemmBackend::onednn);
    EXPECT_EQ(forced.onednn_primitives(), 1u);
  }
  const HostMat hc = to_host(c);
  for (std::int64_t i = 0; i < 24; ++i)
    for (std::int64_t j = 0; j < 16; ++j) {
      double ref = 0;
      for (std::int64_t l = 0; l < 40; ++l) ref += ha(i, l) * hb(j, l);
      EXPECT_NEAR(hc(i, j), ref, 1e-4);
    }
}

TEST_F(Bf16Gemm, ForcedBackendIsUsedForEveryShape) {
  const ExecSpace space;
  Plan plan(Bf16GemmBackend::float_blas);
  const auto a = to_device<bf16>(random_bf16_values(8, 8, 1), "a");
  Mat<float> c("c", 8, 8);
  plan.gemm(space, "N", "T", 1.0f, a, a, 0.0f, c);
  plan.gemm(space, "T", "N", 1.0f, a, a, 1.0f, c);
  ASSERT_EQ(plan.choices().size(), 2u);
  for (const auto& [shape, choice] : plan.choices()) {
    EXPECT_EQ(choice.backend, Bf16GemmBackend::float_blas);
    EXPECT_TRUE(choice.timings.empty());
  }
  EXPECT_GT(plan.workspace_bytes(), 0u);
}

// bf16 matrix hardware (what lets a bf16 layer's auto compute skip timing): oneDNN on AMX for a host plan that may
// take oneDNN, never a plan forced onto float BLAS, never below AMX (the ONEDNN_MAX_CPU_ISA=AVX2 run), and AMX only
// where the CPU has it.
TEST_F(Bf16Gemm, Bf16HardwareIsOneDnnOnAmxOrCublas) {
  EXPECT_FALSE(Plan(Bf16GemmBackend::float_blas).on_bf16_hardware());
  const bool amx = mlacp::onednn_has_amx();
  EXPECT_EQ(amx, mlacp::onednn_cpu_isa() == "avx512_core_amx");
  if (amx) {
    std::ifstream cpuinfo("/proc/cpuinfo");
    const std::string text((std::istreambuf_iterator<char>(cpuinfo)), std::istreambuf_iterator<char>());
    if (!text.empty()) {
      EXPECT_NE(text.find("amx_bf16"), std::string::npos) << "oneDNN found AMX the CPU lacks";
    }
  }
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap != nullptr && std::string(cap) == "AVX2") {
    EXPECT_FALSE(amx);
  }
  const bool host_onednn = Plan::available(Bf16GemmBackend::onednn);
  EXPECT_EQ(Plan(Bf16GemmBackend::automatic).on_bf16_hardware(),
            Plan::available(Bf16GemmBackend::cublas) || (host_onednn && amx));
  if (host_onednn) {
    EXPECT_EQ(Plan(Bf16GemmBackend::onednn).on_bf16_hardware(), amx);
  }
  std::cout << "oneDNN ISA " << mlacp::onednn_cpu_isa() << ", bf16 matrix hardware: " << amx << "\n";
}

TEST_F(Bf16Gemm, EnvironmentOverrideIsReadAndBadValuesAreRefused) {
  setenv(mlacp::bf16_gemm_env_var, "float_blas", 1);
  EXPECT_EQ(Plan().requested(), Bf16GemmBackend::float_blas);
  setenv(mlacp::bf16_gemm_env_var, "auto", 1);
  EXPECT_EQ(Plan().requested(), Bf16GemmBackend::automatic);
  setenv(mlacp::bf16_gemm_env_var, "", 1);
  EXPECT_EQ(Plan().requested(), Bf16GemmBackend::automatic);
  setenv(mlacp::bf16_gemm_env_var, "mkl", 1);
  try {
    Plan plan;
    ADD_FAILURE() << "MLACP_BF16_GEMM=mkl was accepted";
  } catch (const mlacp::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MLACP_BF16_GEMM='mkl'"), std::string::npos) << what;
    EXPECT_NE(what.find("auto, onednn, float_blas, kokkos_kernels, cublas"), std::string::npos) << what;
  }
  EXPECT_THROW(mlacp::parse_bf16_gemm_backend("ONEDNN"), mlacp::InvalidArgument);
  for (const auto b : {Bf16GemmBackend::automatic, Bf16GemmBackend::onednn, Bf16GemmBackend::float_blas,
                       Bf16GemmBackend::kokkos_kernels, Bf16GemmBackend::cublas})
    EXPECT_EQ(mlacp::parse_bf16_gemm_backend(mlacp::bf16_gemm_backend_name(b)), b);
}

TEST_F(Bf16Gemm, UnavailableForcedBackendIsRefusedWithTheReason) {
  for (const auto b : {Bf16GemmBackend::onednn, Bf16GemmBackend::kokkos_kernels, Bf16GemmBackend::cublas}) {
    if (Plan::available(b)) continue;
    try {
      Plan plan(b);
      ADD_FAILURE() << mlacp::bf16_gemm_backend_name(b) << " was accepted";
    } catch (const mlacp::InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + mlacp::bf16_gemm_backend_name(b) + "' is not available"),
                std::string::npos)
          << what;
      // The reason: cuBLAS is CUDA's alone, or this build has none.
      if (b == Bf16GemmBackend::cublas) {
        EXPECT_NE(what.find("cuBLAS"), std::string::npos) << what;
      }
    }
  }
}

TEST_F(Bf16Gemm, MismatchedExtentsAreRefused) {
  Plan plan(Bf16GemmBackend::automatic);
  Mat<bf16> a("a", 4, 5), b("b", 6, 3);
  Mat<float> c("c", 4, 3);
  EXPECT_THROW(plan.gemm(ExecSpace(), "N", "N", 1.0f, a, b, 0.0f, c), mlacp::InvalidArgument);
}

}  // namespace
