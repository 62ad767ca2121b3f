// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the MLA layer tests (test_mla_layer, test_mla_packed, test_mla_uneven) share: a rank's token shard of a full
// tensor, and the layer's checks against its references: the distributed layer on the rank shards against the same
// layer on one rank over the full sequence (y and dx gathered by the partition, weight gradients summed over the
// ranks), and that one-rank layer against the plain-loop host reference of docs/spec.md and against finite differences.
#pragma once

#include "mla_test_data.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/partition.hpp>
#include <mlacp/testing/reference_forward.hpp>
#include <mlacp/token_map.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mlacp::test {

using LayerSpace = Kokkos::DefaultExecutionSpace;
using LayerMem = LayerSpace::memory_space;
/// A [B, S, D] (or [B, s, D]) activation of the layer.
template <class T>
using LayerTensor = Kokkos::View<T***, Kokkos::LayoutRight, LayerMem>;

/// Rank `rank`'s rows [part.offset(rank), part.offset(rank) + part.count(rank)) of a full [B, S, D] tensor.
template <class T>
LayerTensor<T> shard(const LayerTensor<T>& full, const Partition& part, int rank) {
  const auto begin = static_cast<std::size_t>(part.offset(rank));
  const auto count = static_cast<std::size_t>(part.count(rank));
  LayerTensor<T> local("shard", full.extent(0), count, full.extent(2));
  Kokkos::deep_copy(local, Kokkos::subview(full, Kokkos::ALL(), std::make_pair(begin, begin + count), Kokkos::ALL()));
  return local;
}

/// The ring sizes C > 1 that divide P (none at P = 1): the two-level meshes Mesh(world, C) of P ranks.
inline std::vector<int> ring_sizes(int P) {
  std::vector<int> out;
  for (int c = 2; c <= P; ++c)
    if (P % c == 0) out.push_back(c);
  return out;
}

/// This rank's rows of a full [B, S, D] tensor: its TokenMap ranges (TokenMap::ranges), concatenated.
template <class T>
LayerTensor<T> rows_of(const LayerTensor<T>& full, const std::vector<TokenRange>& ranges) {
  std::size_t n = 0;
  for (const auto& r : ranges) n += static_cast<std::size_t>(r.count);
  LayerTensor<T> local("token shard", full.extent(0), n, full.extent(2));
  std::size_t row = 0;
  for (const auto& r : ranges) {
    const auto b = static_cast<std::size_t>(r.begin), c = static_cast<std::size_t>(r.count);
    Kokkos::deep_copy(Kokkos::subview(local, Kokkos::ALL(), std::make_pair(row, row + c), Kokkos::ALL()),
                      Kokkos::subview(full, Kokkos::ALL(), std::make_pair(b, b + c), Kokkos::ALL()));
    row += c;
  }
  return local;
}

/// `to` (same extents) gets `from`'s values converted: bf16 and float widen to double exactly (the bf16 and bf16-wire
/// tests run the float64 layer on the very values the narrower layer holds).
template <class From, class To>
void convert_into(const From& from, const To& to) {
  using V = typename To::non_const_value_type;
  auto h_from = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), from);
  auto h_to = Kokkos::create_mirror_view(to);
  for (std::size_t i = 0; i < h_from.size(); ++i)
    h_to.data()[i] = static_cast<V>(static_cast<double>(h_from.data()[i]));
  Kokkos::deep_copy(to, h_to);
}
/// Double weights with exactly `w`'s values.
template <class T>
MlaWeights<double, LayerMem> to_double(const MlaConfig& c, const MlaWeights<T, LayerMem>& w) {
  auto out = MlaWeights<double, LayerMem>::allocate(c);
  for_each_parameter(
      [&](const ParameterInfo& info, const auto& from, const auto& to) {
        if (info.present(c)) convert_into(from, to);
      },
      w, out);
  return out;
}
/// A double tensor with exactly `v`'s values.
template <class T>
LayerTensor<double> to_double(const LayerTensor<T>& v) {
  LayerTensor<double> out("double", v.extent(0), v.extent(1), v.extent(2));
  convert_into(v, out);
  return out;
}

/// The sum over the ranks of MPI_COMM_WORLD of a host vector (weight gradients are per-rank partial sums).
inline std::vector<double> sum_over_ranks(std::vector<double> v) {
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

/// The distributed layer (MPI_COMM_WORLD, x and dy split by Partition(S, P)) against the same layer on one rank over
/// the full sequence, `iterations` forward + backward passes of the one layer (the later ones reuse the buffers of
/// the first): the layer's partitions are the documented ones, y and dx equal the reference's rows of this rank, every
/// weight gradient summed over the ranks equals the reference's, and a gradient that `flags` (or config.bias) does not
/// ask for is not computed. Tolerance 1e-10 in double, 1e-4 in float; `what` names the case in the messages.
/// Weights (seed 42), x (seed 100) and dy (seed 200) are the same on every rank.
template <class T>
void expect_matches_single_rank_full_sequence(const MlaConfig& config, const MlaRequiresGrad& flags = {},
                                              int iterations = 1, const std::string& what = "") {
  const double tolerance = std::is_same_v<T, double> ? 1e-10 : 1e-4;
  const std::string suffix = what.empty() ? "" : " " + what;
  Mesh mesh(MPI_COMM_WORLD);
  Mesh self(MPI_COMM_SELF);
  const LayerSpace space;
  const auto weights = make_weights<T, LayerMem>(config, 42);
  LayerTensor<T> x("x", config.batch, config.seq, config.hidden), dy("dy", config.batch, config.seq, config.hidden);
  fill(x, 100, 1.0);
  fill(dy, 200, 1.0);

  MlaAttention<T> reference(config, weights, self);
  auto ref_forward = reference.forward(space, x, flags);
  const auto ref_grads = reference.backward(space, ref_forward, dy);

  // A gradient that is zero in exact arithmetic (dw_q and db_q when no token sees another, e.g. S = 1) is rounding
  // noise in both runs, whose agreement depends on the kernels' summation order: its error is measured against 1% of
  // the largest reference gradient rather than against its own (noise) size.
  double error_floor = 0;
  for (const auto* v :
       {&ref_grads.w_q, &ref_grads.w_qa, &ref_grads.w_qb, &ref_grads.w_kva, &ref_grads.w_kvb, &ref_grads.w_o})
    if (v->data() != nullptr) error_floor = std::max(error_floor, 1e-2 * frobenius_norm(host_values(*v)));

  MlaAttention<T> layer(config, weights, mesh);
  const int rank = mesh.rank();
  const Partition seq(config.seq, mesh.size()), heads(config.heads, mesh.size());
  ASSERT_EQ(layer.seq_partition(), seq) << what;
  ASSERT_EQ(layer.head_partition(), heads) << what;
  ASSERT_EQ(layer.local_seq(), seq.count(rank)) << what;
  ASSERT_EQ(layer.local_heads(), heads.count(rank)) << what;
  for (int iteration = 0; iteration < iterations; ++iteration) {
    auto forward = layer.forward(space, shard(x, seq, rank), flags);
    const auto grads = layer.backward(space, forward, shard(dy, seq, rank));
    EXPECT_LE(relative_error(host_values(forward.output()), host_values(shard(ref_forward.output(), seq, rank))),
              tolerance)
        << "y" << suffix;
    // dx is this rank's rows of the reference's; a weight gradient is this rank's part of a sum over the ranks.
    auto expect_gradient = [&](const char* name, const auto& got, const auto& want, bool wanted, bool partial_sum) {
      if (!wanted) {
        EXPECT_EQ(got.data(), nullptr) << name << " was computed although it needs no gradient" << suffix;
        return;
      }
      ASSERT_NE(got.data(), nullptr) << name << suffix;
      const auto g = partial_sum ? sum_over_ranks(host_values(got)) : host_values(got);
      EXPECT_LE(relative_error(g, host_values(want), error_floor), tolerance) << name << suffix;
    };
    if (flags.x)
      expect_gradient("dx", grads.dx, shard(ref_grads.dx, seq, rank), true, false);
    else
      expect_gradient("dx", grads.dx, ref_grads.dx, false, false);
    const bool lora = config.q_lora();
    expect_gradient("dw_q", grads.w_q, ref_grads.w_q, flags.w_q && !lora, true);
    expect_gradient("dw_qa", grads.w_qa, ref_grads.w_qa, flags.w_qa && lora, true);
    expect_gradient("dg_q", grads.g_q, ref_grads.g_q, flags.g_q && lora, true);
    expect_gradient("dw_qb", grads.w_qb, ref_grads.w_qb, flags.w_qb && lora, true);
    expect_gradient("dw_kva", grads.w_kva, ref_grads.w_kva, flags.w_kva, true);
    expect_gradient("dg_kv", grads.g_kv, ref_grads.g_kv, flags.g_kv, true);
    expect_gradient("dw_kvb", grads.w_kvb, ref_grads.w_kvb, flags.w_kvb, true);
    expect_gradient("dw_o", grads.w_o, ref_grads.w_o, flags.w_o, true);
    expect_gradient("db_q", grads.b_q, ref_grads.b_q, flags.b_q && config.bias, true);
    expect_gradient("db_kvb", grads.b_kvb, ref_grads.b_kvb, flags.b_kvb && config.bias, true);
    expect_gradient("db_o", grads.b_o, ref_grads.b_o, flags.b_o && config.bias, true);
  }
}

/// The one-rank layer's output (no gradients) equals the plain-loop host reference of docs/spec.md
/// (testing::reference::mla_forward, with config.cu_seqlens) to 1e-12, in double: weights seed 5, x seed 77.
/// `what` names the case in the message after the strategy and the bias.
inline void expect_single_rank_forward_matches_plain_loop(const MlaConfig& config, const std::string& what = "") {
  Mesh self(MPI_COMM_SELF);
  const auto w = make_weights<double, LayerMem>(config, 5);
  LayerTensor<double> x("x", config.batch, config.seq, config.hidden);
  fill(x, 77, 1.0);
  MlaAttention<double> layer(config, w, self);
  const auto y = layer.forward(LayerSpace(), x, MlaRequiresGrad::none()).output();

  namespace reference = mlacp::testing::reference;
  reference::ReferenceWeights<double> hw;
  auto host = [](const auto& v) { return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v); };
  if (config.q_lora()) {
    hw.w_qa = host(w.w_qa);
    hw.g_q = host(w.g_q);
    hw.w_qb = host(w.w_qb);
  } else {
    hw.w_q = host(w.w_q);
  }
  hw.w_kva = host(w.w_kva);
  hw.g_kv = host(w.g_kv);
  hw.w_kvb = host(w.w_kvb);
  hw.w_o = host(w.w_o);
  if (config.bias) {
    hw.b_q = host(w.b_q);
    hw.b_kvb = host(w.b_kvb);
    hw.b_o = host(w.b_o);
  }
  reference::ReferenceDims dims{config.batch, config.seq,  config.hidden, config.heads,       config.nope,
                                config.rope,  config.vdim, config.latent, config.q_lora_rank, config.softmax_scale};
  dims.rope = {config.rope_base,           config.rope_factor,          config.rope_original_max_position,
               config.rope_beta_fast,      config.rope_beta_slow,       config.rope_mscale,
               config.rope_mscale_all_dim, config.rope_attention_factor};
  reference::ReferenceWeights<double>::tensor3_type y_ref("y_ref", config.batch, config.seq, config.hidden);
  reference::mla_forward(dims, hw, host(x), y_ref, config.cu_seqlens);
  const std::vector<double> want(y_ref.data(), y_ref.data() + y_ref.size());
  EXPECT_LE(relative_error(host_values(y), want), 1e-12)
      << mlacp::to_string(config.strategy) << (config.bias ? " with" : " without") << " bias"
      << (config.q_lora() ? ", q-LoRA" : "") << (what.empty() ? "" : ", " + what);
}

/// Every gradient of the one-rank layer (x and all weights, biases included: config.bias must be set) equals central
/// finite differences (eps 1e-5) of L = sum(y * dy) along a random direction, to 1e-6 * (|numeric| + 1), in double:
/// weights seed 9, x seed 31, dy seed 32, the directions seeds direction_seed + 1, + 2, ...
inline void expect_single_rank_gradients_match_finite_differences(const MlaConfig& config,
                                                                  std::uint64_t direction_seed) {
  Mesh self(MPI_COMM_SELF);
  const auto w = make_weights<double, LayerMem>(config, 9);
  LayerTensor<double> x("x", config.batch, config.seq, config.hidden),
      dy("dy", config.batch, config.seq, config.hidden);
  fill(x, 31, 1.0);
  fill(dy, 32, 1.0);
  MlaAttention<double> layer(config, w, self);
  auto forward = layer.forward(LayerSpace(), x);
  const auto grads = layer.backward(LayerSpace(), forward, dy);
  auto loss = [&] {
    const auto y = host_values(layer.forward(LayerSpace(), x, MlaRequiresGrad::none()).output());
    const auto d = host_values(dy);
    double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) l += y[i] * d[i];
    return l;
  };
  std::uint64_t seed = direction_seed;
  auto check = [&](const char* name, const auto& param, const auto& grad) {
    const auto base = host_values(param);
    const auto direction = pseudo_random(base.size(), ++seed, 1.0);
    const double eps = 1e-5;
    auto set = [&](double t) {
      auto h = Kokkos::create_mirror_view(param);
      for (std::size_t i = 0; i < base.size(); ++i) h.data()[i] = base[i] + t * direction[i];
      Kokkos::deep_copy(param, h);
    };
    set(eps);
    const double plus = loss();
    set(-eps);
    const double minus = loss();
    set(0);
    const double numeric = (plus - minus) / (2 * eps);
    const auto g = host_values(grad);
    double analytic = 0;
    for (std::size_t i = 0; i < g.size(); ++i) analytic += g[i] * direction[i];
    EXPECT_NEAR(analytic, numeric, 1e-6 * (std::abs(numeric) + 1.0))
        << mlacp::to_string(config.strategy) << " " << name;
  };
  check("x", x, grads.dx);
  if (config.q_lora()) {
    check("w_qa", w.w_qa, grads.w_qa);
    check("g_q", w.g_q, grads.g_q);
    check("w_qb", w.w_qb, grads.w_qb);
  } else {
    check("w_q", w.w_q, grads.w_q);
  }
  check("b_q", w.b_q, grads.b_q);
  check("w_kva", w.w_kva, grads.w_kva);
  check("g_kv", w.g_kv, grads.g_kv);
  check("w_kvb", w.w_kvb, grads.w_kvb);
  check("b_kvb", w.b_kvb, grads.b_kvb);
  check("w_o", w.w_o, grads.w_o);
  check("b_o", w.b_o, grads.b_o);
}

}  // namespace mlacp::test
