// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Deterministic test data for the MLA layer tests: the same weights and full-sequence tensors on every rank.
#pragma once

#include <mlacp/mla/weights.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

#if __has_include(<gtest/gtest.h>)
#include <gtest/gtest.h>
#define MLACP_TEST_DUMP_HAS_GTEST 1
#endif

namespace mlacp::test {

using testing::synthetic::fill;
inline std::vector<double> pseudo_random(std::size_t n, std::uint64_t seed, double scale) {
  return testing::synthetic::uniform(n, seed, scale);
}
template <class T, class MemSpace>
MlaWeights<T, MemSpace> make_weights(const MlaConfig& c, std::uint64_t seed) {
  return testing::synthetic::weights<T, MemSpace>(c, seed);
}

/// An MLA configuration in docs/spec.md's order of names.
inline MlaConfig make_config(int batch, int seq, int hidden, int heads, int nope, int rope, int vdim, int latent,
                             bool bias = false, MlaStrategy strategy = MlaStrategy::latent) {
  MlaConfig c;
  c.batch = batch;
  c.seq = seq;
  c.hidden = hidden;
  c.heads = heads;
  c.nope = nope;
  c.rope = rope;
  c.vdim = vdim;
  c.latent = latent;
  c.bias = bias;
  c.strategy = strategy;
  return c;
}

/// With MLACP_TEST_DUMP_DIR set, every tensor a test reads back through host_values() is appended to
/// <dir>/values.<world size>.<world rank>.<pid>.bin, keyed by the running test's name and the read's index within it,
/// so that two builds' runs of the suite can be compared value by value (scripts/compare_test_dumps.py: bit-identity
/// checks of refactors). Off (the default) it costs one getenv per read.
inline void dump_test_values(const std::vector<double>& values) {
  static const char* dir = std::getenv("MLACP_TEST_DUMP_DIR");
  if (dir == nullptr || *dir == '\0') return;
  std::string test = "unknown";
#ifdef MLACP_TEST_DUMP_HAS_GTEST
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
    test = std::string(info->test_suite_name()) + "." + info->name();
#endif
  static std::string last_test;
  static long index = 0;
  if (test != last_test) {
    last_test = test;
    index = 0;
  }
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string file = std::string(dir) + "/values." + (size ? size : "1") + "." + (rank ? rank : "0") + "." +
                           std::to_string(static_cast<long>(::getpid())) + ".bin";
  if (std::FILE* f = std::fopen(file.c_str(), "ab")) {
    const std::string key = test + "#" + std::to_string(index++);
    const std::uint64_t key_len = key.size(), n = values.size();
    std::fwrite(&key_len, sizeof key_len, 1, f);
    std::fwrite(key.data(), 1, key.size(), f);
    std::fwrite(&n, sizeof n, 1, f);
    if (n > 0) std::fwrite(values.data(), sizeof(double), values.size(), f);
    std::fclose(f);
  }
}

/// A copy of `v` as doubles, on the host (every element type the tests use converts to double exactly).
template <class ViewType>
std::vector<double> host_values(const ViewType& v) {
  std::vector<double> out;
  if (v.data() == nullptr) return out;
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  out.reserve(host.size());
  // Explicitly: Kokkos' native bhalf_t (mlacp::bf16 on CUDA) converts to double only explicitly.
  for (std::size_t i = 0; i < host.size(); ++i) out.push_back(static_cast<double>(host.data()[i]));
  dump_test_values(out);
  return out;
}

/// ||v||, Frobenius.
inline double frobenius_norm(const std::vector<double>& v) {
  double sum = 0;
  for (const double e : v) sum += e * e;
  return std::sqrt(sum);
}

/// ||a - b|| / max(||b||, floor), Frobenius; infinite when the sizes differ. `floor` > 0 measures a `b` smaller than
/// it (e.g. one that is zero in exact arithmetic, rounding noise in both runs) against the floor instead.
inline double relative_error(const std::vector<double>& a, const std::vector<double>& b, double floor = 1e-300) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return std::sqrt(num) / std::max({std::sqrt(den), floor, 1e-300});
}

}  // namespace mlacp::test
