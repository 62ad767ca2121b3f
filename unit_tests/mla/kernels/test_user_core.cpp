// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// A user attention core (issue 32): the one interface of attention_problem.hpp implemented with plain loops, as a user
// writes one, run by the MLA layer at 1 and 2 ranks (both strategies, one document and packed documents): the layer's
// output and every gradient match the layer with its default core (FlashAttentionCore) to rounding. Also the
// capabilities: a core without the member gets the defaults.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/mla/kernels/attention_problem.hpp>
#include <mlacp/mla/kernels/flash_attention.hpp>
#include <mlacp/mla/mla_attention.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
template <class T>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

/// The example user core: square problems with packed documents, one thread per (batch, row, head), two passes over
/// the keys a query sees (the maximum, then the normalised sum), everything in double. It ignores `first` and the
/// positions: without the blocks capability it is only given square problems that overwrite.
struct PlainLoopCore {
  static constexpr mlacp::AttentionCoreCapabilities capabilities = [] {
    mlacp::AttentionCoreCapabilities c;
    c.documents = true;
    return c;
  }();

  template <class ExecSpace, class Problem>
  void forward(const ExecSpace& space, const Problem& pb) const {
    const auto q = pb.q;
    const auto k = pb.k;
    const auto v = pb.v;
    const auto o = pb.o;
    const auto lse = pb.lse;
    using O = typename decltype(pb.o)::non_const_value_type;
    using L = typename decltype(pb.lse)::non_const_value_type;
    const auto docs = pb.documents().template offsets_for<ExecSpace>(pb.seq, "PlainLoopCore::forward");
    const std::int64_t n_s = pb.seq, n_h = static_cast<std::int64_t>(q.extent(2));
    const std::int64_t d_qk = static_cast<std::int64_t>(q.extent(3)), d_v = static_cast<std::int64_t>(v.extent(3));
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_qk));
    Kokkos::parallel_for(
        "PlainLoopCore::forward", Kokkos::RangePolicy<ExecSpace>(space, 0, q.extent(0) * n_s * n_h),
        KOKKOS_LAMBDA(const std::size_t idx) {
          const std::int64_t hd = static_cast<std::int64_t>(idx) % n_h;
          const std::int64_t i = (static_cast<std::int64_t>(idx) / n_h) % n_s;
          const std::int64_t b = static_cast<std::int64_t>(idx) / (n_h * n_s);
          auto score = [&](std::int64_t j) {
            double dot = 0;
            for (std::int64_t c = 0; c < d_qk; ++c)
              dot += static_cast<double>(q(b, i, hd, c)) * static_cast<double>(k(b, j, hd, c));
            return dot * scale;
          };
          double m = score(i);
          for (std::int64_t j = docs.start_of(i); j < i; ++j) m = mlacp::compat::math::fmax(m, score(j));
          double l = 0;
          for (std::int64_t j = docs.start_of(i); j <= i; ++j) l += mlacp::compat::math::exp(score(j) - m);
          for (std::int64_t c = 0; c < d_v; ++c) {
            double acc = 0;
            for (std::int64_t j = docs.start_of(i); j <= i; ++j)
              acc += mlacp::compat::math::exp(score(j) - m) / l * static_cast<double>(v(b, j, hd, c));
            o(b, i, hd, c) = static_cast<O>(acc);
          }
          lse(b, hd, i) = static_cast<L>(m + mlacp::compat::math::log(l));
        });
  }

  template <class ExecSpace, class Problem>
  void backward(const ExecSpace& space, const Problem& pb) const {
    const auto q = pb.q;
    const auto k = pb.k;
    const auto v = pb.v;
    const auto o = pb.o;
    const auto lse = pb.lse;
    const auto d_o = pb.d_o;
    const auto dq = pb.dq;
    const auto dk = pb.dk;
    const auto dv = pb.dv;
    const bool do_dq = pb.needs_dq(), do_dk = pb.needs_dk(), do_dv = pb.needs_dv();
    using DQ = typename decltype(pb.dq)::non_const_value_type;
    using DK = typename decltype(pb.dk)::non_const_value_type;
    using DV = typename decltype(pb.dv)::non_const_value_type;
    const auto docs = pb.documents().template offsets_for<ExecSpace>(pb.seq, "PlainLoopCore::backward");
    const std::int64_t n_s = pb.seq, n_h = static_cast<std::int64_t>(q.extent(2));
    const std::int64_t d_qk = static_cast<std::int64_t>(q.extent(3)), d_v = static_cast<std::int64_t>(v.extent(3));
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_qk));
    // P_ij and dS_ij = P_ij (dO_i . v_j - dO_i . o_i) of query i and key j.
    auto p_ds = KOKKOS_LAMBDA(std::int64_t b, std::int64_t i, std::int64_t j, std::int64_t hd, double& p, double& ds) {
      double dot = 0, dp = 0, d_i = 0;
      for (std::int64_t c = 0; c < d_qk; ++c)
        dot += static_cast<double>(q(b, i, hd, c)) * static_cast<double>(k(b, j, hd, c));
      for (std::int64_t c = 0; c < d_v; ++c) {
        dp += static_cast<double>(d_o(b, i, hd, c)) * static_cast<double>(v(b, j, hd, c));
        d_i += static_cast<double>(d_o(b, i, hd, c)) * static_cast<double>(o(b, i, hd, c));
      }
      p = mlacp::compat::math::exp(dot * scale - static_cast<double>(lse(b, hd, i)));
      ds = p * (dp - d_i);
    };
    const std::size_t rows = q.extent(0) * n_s * n_h;
    Kokkos::parallel_for(
        "PlainLoopCore::backward", Kokkos::RangePolicy<ExecSpace>(space, 0, rows),
        KOKKOS_LAMBDA(const std::size_t idx) {
          const std::int64_t hd = static_cast<std::int64_t>(idx) % n_h;
          const std::int64_t t = (static_cast<std::int64_t>(idx) / n_h) % n_s;
          const std::int64_t b = static_cast<std::int64_t>(idx) / (n_h * n_s);
          double p = 0, ds = 0;
          if (do_dq) {  // t as the query
            for (std::int64_t c = 0; c < d_qk; ++c) {
              double acc = 0;
              for (std::int64_t j = docs.start_of(t); j <= t; ++j) {
                p_ds(b, t, j, hd, p, ds);
                acc += scale * ds * static_cast<double>(k(b, j, hd, c));
              }
              dq(b, t, hd, c) = static_cast<DQ>(acc);
            }
          }
          if (do_dk) {  // t as the key
            for (std::int64_t c = 0; c < d_qk; ++c) {
              double acc = 0;
              for (std::int64_t i = t; i < docs.end_of(t); ++i) {
                p_ds(b, i, t, hd, p, ds);
                acc += scale * ds * static_cast<double>(q(b, i, hd, c));
              }
              dk(b, t, hd, c) = static_cast<DK>(acc);
            }
          }
          if (do_dv) {
            for (std::int64_t c = 0; c < d_v; ++c) {
              double acc = 0;
              for (std::int64_t i = t; i < docs.end_of(t); ++i) {
                p_ds(b, i, t, hd, p, ds);
                acc += p * static_cast<double>(d_o(b, i, hd, c));
              }
              dv(b, t, hd, c) = static_cast<DV>(acc);
            }
          }
        });
  }
};

struct NoCapabilities {};

TEST(UserCore, CapabilitiesAndDefaults) {
  constexpr auto flash = mlacp::core_capabilities_v<mlacp::FlashAttentionCore>;
  static_assert(flash.blocks && flash.documents && flash.reports_bf16 && flash.resolves_settings &&
                flash.reports_blocks);
  constexpr auto plain = mlacp::core_capabilities_v<PlainLoopCore>;
  static_assert(plain.documents && !plain.blocks && !plain.reports_bf16 && !plain.resolves_settings);
  constexpr auto none = mlacp::core_capabilities_v<NoCapabilities>;
  static_assert(!none.blocks && !none.documents && !none.reports_bf16 && !none.resolves_settings &&
                !none.reports_blocks);
  EXPECT_FALSE((mlacp::detail::core_computes_blocks<PlainLoopCore, Space>(PlainLoopCore{})));
  EXPECT_FALSE((mlacp::detail::core_computes_bf16<PlainLoopCore, Space>(PlainLoopCore{})));
}

/// The layer with PlainLoopCore against the layer with its default core: y and every gradient, on this run's ranks.
void expect_matches_default_core(mlacp::MlaStrategy strategy, const std::vector<std::int64_t>& cu_seqlens) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  auto config = mlacp::test::make_config(2, 16, 32, 4, 8, 4, 6, 12, true, strategy);
  config.cu_seqlens = cu_seqlens;
  const std::string what = std::string(mlacp::to_string(strategy)) + (cu_seqlens.empty() ? "" : " packed") +
                           " at P = " + std::to_string(mesh.size());
  const auto weights = mlacp::test::make_weights<double, Mem>(config, 5);
  const int local = config.seq / mesh.size();
  Tensor3<double> x("x", config.batch, local, config.hidden), dy("dy", config.batch, local, config.hidden);
  mlacp::test::fill(x, 11 + static_cast<unsigned>(mesh.rank()), 1.0);
  mlacp::test::fill(dy, 23 + static_cast<unsigned>(mesh.rank()), 1.0);
  mlacp::MlaAttention<double> reference(config, weights, mesh);
  mlacp::MlaAttention<double, Space, PlainLoopCore> layer(config, weights, mesh);
  auto ref_forward = reference.forward(Space(), x);
  auto forward = layer.forward(Space(), x);
  const double tol = 1e-12;
  EXPECT_LE(mlacp::test::relative_error(mlacp::test::host_values(forward.output()),
                                        mlacp::test::host_values(ref_forward.output())),
            tol)
      << "y, " << what;
  mlacp::MlaGradients<double, Mem> ref_grads, grads;
  reference.backward(Space(), ref_forward, dy, ref_grads);
  layer.backward(Space(), forward, dy, grads);
  EXPECT_LE(mlacp::test::relative_error(mlacp::test::host_values(grads.dx), mlacp::test::host_values(ref_grads.dx)),
            tol)
      << "dx, " << what;
  EXPECT_LE(mlacp::test::relative_error(mlacp::test::host_values(grads.w_o), mlacp::test::host_values(ref_grads.w_o)),
            tol)
      << "dw_o, " << what;
  EXPECT_LE(
      mlacp::test::relative_error(mlacp::test::host_values(grads.w_kvb), mlacp::test::host_values(ref_grads.w_kvb)),
      tol)
      << "dw_kvb, " << what;
  EXPECT_LE(mlacp::test::relative_error(mlacp::test::host_values(grads.w_q), mlacp::test::host_values(ref_grads.w_q)),
            tol)
      << "dw_q, " << what;
}

TEST(UserCore, LayerMatchesDefaultCore) {
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    expect_matches_default_core(strategy, {});
    expect_matches_default_core(strategy, {0, 3, 4, 11, 16});
  }
}

}  // namespace
