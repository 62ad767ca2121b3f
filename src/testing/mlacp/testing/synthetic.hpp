// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Test and tool support (not installed): deterministic synthetic weights and tensors for checks and benchmarks: the
// same values on every rank and machine for the same seed, so that each rank can build the full-sequence reference and
// its own shard without communication.
#pragma once

#include <mlacp/mla/weights.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace mlacp::testing::synthetic {

/// `n` values uniform in [-scale, scale) from a seeded 64-bit LCG.
inline std::vector<double> uniform(std::size_t n, std::uint64_t seed, double scale) {
  std::vector<double> v(n);
  std::uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (auto& x : v) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    x = scale * (static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return v;
}

/// Fills a contiguous View with uniform(view.size(), seed, scale) + offset (through a host mirror).
template <class ViewType>
void fill(const ViewType& view, std::uint64_t seed, double scale, double offset = 0.0) {
  if (view.data() == nullptr) return;
  using T = typename ViewType::non_const_value_type;
  const auto values = uniform(view.size(), seed, scale);
  auto host = Kokkos::create_mirror_view(view);
  T* data = host.data();
  for (std::size_t i = 0; i < values.size(); ++i) data[i] = static_cast<T>(values[i] + offset);
  Kokkos::deep_copy(view, host);
}

/// Weights of `config`'s shapes, scaled like a default nn.Linear initialisation (gains near 1): the table's entry i
/// (parameter_table.hpp) from seed + i + 1, a weight uniform in +-1/sqrt(fan in), a bias in +-0.1, an RMSNorm gain in
/// 1 +- 0.2.
template <class T, class MemSpace>
MlaWeights<T, MemSpace> weights(const MlaConfig& c, std::uint64_t seed) {
  auto w = MlaWeights<T, MemSpace>::allocate(c);
  std::uint64_t index = 0;
  for_each_parameter(
      [&](const ParameterInfo& info, const auto& view) {
        const std::uint64_t entry_seed = seed + ++index;
        switch (info.kind) {
          case ParameterKind::weight:
            fill(view, entry_seed, 1.0 / std::sqrt(static_cast<double>(info.shape(c)[1])));
            break;
          case ParameterKind::bias:
            fill(view, entry_seed, 0.1);
            break;
          case ParameterKind::norm_gain:
            fill(view, entry_seed, 0.2, 1.0);
            break;
        }
      },
      w);
  return w;
}

}  // namespace mlacp::testing::synthetic
