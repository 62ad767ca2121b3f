// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Deterministic test data for the MLA layer tests: the same weights and full-sequence tensors on every rank.
#pragma once

#include <mlacp/mla/weights.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace mlacp::test {

using testing::synthetic::fill;
inline std::vector<double> pseudo_random(std::size_t n, std::uint64_t seed, double scale) {
  return testing::synthetic::uniform(n, seed, scale);
}
template <class T, class MemSpace>
MlaWeights<T, MemSpace> make_weights(const MlaConfig& c, std::uint64_t seed) {
  return testing::synthetic::weights<T, MemSpace>(c, seed);
}

/// An MLA configuration in MLA_SPEC's order of names.
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

/// A copy of `v` as doubles, on the host.
template <class ViewType>
std::vector<double> host_values(const ViewType& v) {
  std::vector<double> out;
  if (v.data() == nullptr) return out;
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  out.reserve(host.size());
  // Explicitly: Kokkos' native bhalf_t (mlacp::bf16 on CUDA) converts to double only explicitly.
  for (std::size_t i = 0; i < host.size(); ++i) out.push_back(static_cast<double>(host.data()[i]));
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
