// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MLACP_* settings (settings.hpp): one table, one reader, typed values that name the variable and its value when
// they do not parse, and a Mesh that refuses a malformed or disagreeing setting on every rank before anything runs.
#include "mpi_test_harness.hpp"
#include "scoped_environment.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/diagnostics.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/settings.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using mlacp::test::ScopedEnvironment;

std::string invalid_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const mlacp::InvalidArgument& e) {
    return e.what();
  }
  return "no InvalidArgument";
}

TEST(Settings, TheTableNamesEachVariableOnce) {
  std::set<std::string> names;
  for (const auto& s : mlacp::setting_table) {
    EXPECT_EQ(std::string(s.variable).rfind("MLACP_", 0), 0u) << s.variable;
    EXPECT_NE(std::string(s.expected), "") << s.variable;
    EXPECT_TRUE(names.insert(s.variable).second) << s.variable << " twice";
  }
}

TEST(Settings, DefaultsWhereUnset) {
  std::vector<std::unique_ptr<ScopedEnvironment>> unset;
  for (const auto& s : mlacp::setting_table) unset.push_back(std::make_unique<ScopedEnvironment>(s.variable, nullptr));
  const auto settings = mlacp::Settings::from_environment();
  EXPECT_TRUE(settings.checked());
  EXPECT_FALSE(settings.check_finite());
  EXPECT_EQ(settings.reduce_scatter(), "");
  EXPECT_EQ(settings.attention_tiles(), (std::array<int, 2>{0, 0}));
  EXPECT_EQ(settings.bf16_gemm(), "");
  EXPECT_EQ(settings.bf16_compute(), "");
  EXPECT_EQ(settings.wgrad_panels(), 0);
  EXPECT_EQ(settings.trace(), "");
  EXPECT_EQ(settings.wait_timeout_s(42.0), 42.0);
  EXPECT_EQ(settings.first_malformed(), -1);
  EXPECT_EQ(settings.error(), "");
}

TEST(Settings, TypedValues) {
  ScopedEnvironment checked("MLACP_CHECKED", "0"), finite("MLACP_CHECK_FINITE", "1"),
      tiles("MLACP_ATTENTION_TILES", "48x96"), panels("MLACP_WGRAD_PANELS", "7"),
      timeout("MLACP_WAIT_TIMEOUT_S", "2.5"), gemm("MLACP_BF16_GEMM", "float_blas"),
      compute("MLACP_BF16_COMPUTE", "float");
  const auto settings = mlacp::Settings::from_environment();
  EXPECT_FALSE(settings.checked());
  EXPECT_TRUE(settings.check_finite());
  EXPECT_EQ(settings.attention_tiles(), (std::array<int, 2>{48, 96}));
  EXPECT_EQ(settings.wgrad_panels(), 7);
  EXPECT_EQ(settings.wait_timeout_s(1.0), 2.5);
  EXPECT_EQ(settings.bf16_gemm(), "float_blas");
  EXPECT_EQ(settings.bf16_compute(), "float");
  EXPECT_EQ(settings.error(), "");
}

TEST(Settings, AValueThatDoesNotParseIsNamedWithWhatWasExpected) {
  {
    ScopedEnvironment panels("MLACP_WGRAD_PANELS", "-3");
    const auto settings = mlacp::Settings::from_environment();
    EXPECT_NE(invalid_message([&] { settings.wgrad_panels(); }).find("MLACP_WGRAD_PANELS='-3'; expected a positive"),
              std::string::npos);
    EXPECT_EQ(std::string(mlacp::setting_table[static_cast<std::size_t>(settings.first_malformed())].variable),
              "MLACP_WGRAD_PANELS");
  }
  for (const char* bad : {"48", "0x8", "8x", "x8", "8x8x8", "-4x8", "abc", "128X128"}) {
    ScopedEnvironment tiles("MLACP_ATTENTION_TILES", bad);
    EXPECT_EQ(
        mlacp::Settings::from_environment().error(),
        std::string("MLACP_ATTENTION_TILES='") + bad + "'; expected QxK with two positive integers, e.g. 128x256");
  }
  for (const char* bad : {"soon", "-1", "1e999", "3s"}) {
    ScopedEnvironment timeout("MLACP_WAIT_TIMEOUT_S", bad);
    const auto settings = mlacp::Settings::from_environment();
    EXPECT_EQ(settings.wait_timeout_s(9.0), 9.0) << bad << ": read where nothing may throw, so the default stays";
    EXPECT_NE(settings.error().find(std::string("MLACP_WAIT_TIMEOUT_S='") + bad + "'"), std::string::npos) << bad;
  }
  ScopedEnvironment gemm("MLACP_BF16_GEMM", "mkl");
  EXPECT_EQ(mlacp::Settings::from_environment().error(),
            "MLACP_BF16_GEMM='mkl'; expected auto, onednn, float_blas, kokkos_kernels or cublas");
  ScopedEnvironment fine_gemm("MLACP_BF16_GEMM", "auto");
  ScopedEnvironment compute("MLACP_BF16_COMPUTE", "fast");
  EXPECT_EQ(mlacp::Settings::from_environment().error(), "MLACP_BF16_COMPUTE='fast'; expected auto, bf16 or float");
}

// A value that does not parse on one rank: every rank refuses the mesh, that rank with the value, the others naming
// the rank; the communicator is freed and nothing hangs.
TEST(Settings, TheMeshRefusesAMalformedSettingOnEveryRank) {
  const int size = mlacp::test::world_size(), last = size - 1;
  const bool on_last = mlacp::test::world_rank() == last;
  const auto communicators = mlacp::diagnostics::open_communicators();
  for (const auto& [variable, value] : std::vector<std::pair<const char*, const char*>>{
           {"MLACP_WGRAD_PANELS", "many"}, {"MLACP_WAIT_TIMEOUT_S", "soon"}, {"MLACP_ATTENTION_TILES", "big"}}) {
    ScopedEnvironment bad(variable, on_last ? value : nullptr);
    const std::string message = invalid_message([] { mlacp::Mesh mesh(MPI_COMM_WORLD); });
    if (on_last) {
      EXPECT_NE(message.find(std::string(variable) + "='" + value + "'; expected"), std::string::npos) << message;
    } else {
      EXPECT_NE(message.find(std::string(variable) + " does not parse on rank(s) " + std::to_string(last)),
                std::string::npos)
          << message;
    }
    EXPECT_NE(message.find("[the mesh was not created]"), std::string::npos) << message;
    MPI_Barrier(MPI_COMM_WORLD);
  }
  EXPECT_EQ(mlacp::diagnostics::open_communicators(), communicators) << "a refused mesh freed its communicator";
}

// The finiteness check runs a reduction over each input: ranks that disagree would run different collectives.
TEST(Settings, TheMeshRefusesRanksThatDisagreeOnTheFinitenessCheck) {
  const int size = mlacp::test::world_size();
  if (size == 1) GTEST_SKIP() << "needs two ranks";
  const int last = size - 1;
  ScopedEnvironment finite("MLACP_CHECK_FINITE", mlacp::test::world_rank() == last ? "1" : nullptr);
  const std::string message = invalid_message([] { mlacp::Mesh mesh(MPI_COMM_WORLD); });
  EXPECT_NE(message.find("disagree on the finiteness check (MLACP_CHECK_FINITE or set_check_finite)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("on on rank(s) " + std::to_string(last)), std::string::npos) << message;
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Settings, TheMeshTakesCheckedModeAndTheFinitenessCheckFromTheEnvironment) {
  ScopedEnvironment checked("MLACP_CHECKED", "0"), finite("MLACP_CHECK_FINITE", "1");
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  EXPECT_FALSE(mesh.checked());
  EXPECT_TRUE(mesh.check_finite());
}

// The library reads its MLACP_* variables in src/settings.cpp only: any other getenv("MLACP_...") in include/ or
// src/ (the tools in src/tools/ read their own) is a second reader that the table and the agreement do not know.
TEST(Settings, NoOtherReaderOfTheVariables) {
  const std::filesystem::path root = MLACP_TEST_SOURCE_ROOT;
  int read = 0;
  for (const char* dir : {"include", "src"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / dir)) {
      const auto& path = entry.path();
      const auto ext = path.extension().string();
      if (!entry.is_regular_file() || (ext != ".hpp" && ext != ".cpp")) continue;
      const std::string relative = std::filesystem::relative(path, root).generic_string();
      if (relative == "src/settings.cpp" || relative.rfind("src/tools/", 0) == 0) continue;
      std::ifstream in(path);
      std::stringstream text;
      text << in.rdbuf();
      ++read;
      EXPECT_EQ(text.str().find("getenv(\"MLACP_"), std::string::npos) << relative << " reads an MLACP_ variable";
    }
  }
  EXPECT_GT(read, 50) << "no sources found under " << root;
}

}  // namespace
