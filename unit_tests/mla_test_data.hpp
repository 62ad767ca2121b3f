// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Deterministic test data for the MLA layer tests: the same weights and full-sequence tensors on every rank.
#pragma once

#include <mlacp/mla/weights.hpp>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

namespace mlacp::test {

/// Uniform values in [-scale, scale) from a seeded 64-bit LCG: identical on every rank and machine.
inline std::vector<double> pseudo_random(std::size_t n, std::uint64_t seed, double scale) {
  std::vector<double> v(n);
  std::uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (auto& x : v) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    x = scale * (static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return v;
}

template <class ViewType>
void fill(const ViewType& view, std::uint64_t seed, double scale, double offset = 0.0) {
  if (view.data() == nullptr) return;
  using T = typename ViewType::non_const_value_type;
  const auto values = pseudo_random(view.size(), seed, scale);
  auto host = Kokkos::create_mirror_view(view);
  T* data = host.data();
  for (std::size_t i = 0; i < values.size(); ++i) data[i] = static_cast<T>(values[i] + offset);
  Kokkos::deep_copy(view, host);
}

template <class T, class MemSpace>
MlaWeights<T, MemSpace> make_weights(const MlaConfig& c, std::uint64_t seed) {
  auto w = MlaWeights<T, MemSpace>::allocate(c);
  fill(w.w_q, seed + 1, 1.0 / std::sqrt(c.hidden));
  fill(w.b_q, seed + 2, 0.1);
  fill(w.w_kva, seed + 3, 1.0 / std::sqrt(c.hidden));
  fill(w.g_kv, seed + 4, 0.2, 1.0);
  fill(w.w_kvb, seed + 5, 1.0 / std::sqrt(c.latent));
  fill(w.b_kvb, seed + 6, 0.1);
  fill(w.w_o, seed + 7, 1.0 / std::sqrt(c.heads * c.vdim));
  fill(w.b_o, seed + 8, 0.1);
  return w;
}

/// A copy of `v` as doubles, on the host.
template <class ViewType>
std::vector<double> host_values(const ViewType& v) {
  std::vector<double> out;
  if (v.data() == nullptr) return out;
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  out.assign(host.data(), host.data() + host.size());
  return out;
}

/// ||a - b|| / max(||b||, tiny), Frobenius.
inline double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

}  // namespace mlacp::test
