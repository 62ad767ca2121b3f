// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The parameter table (parameter_table.hpp): its rows are docs/spec.md's "Weights" table, and everything that lists
// parameters agrees with it (allocate, weights_error, the backward's gradient checks and allocation, the flag word).
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mla/parameter_table.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Tensor3 = Kokkos::View<double***, Kokkos::LayoutRight, Mem>;
using Weights = mlacp::MlaWeights<double, Mem>;
using Grads = mlacp::MlaGradients<double, Mem>;
using mlacp::ParameterInfo;
using mlacp::ParameterShape;

// D = 16, H = 3, dn = 4, dr = 2, dv = 5, R = 6: every product distinct.
// q_lora: Rq (7, distinct too) or 0 (dense w_q).
mlacp::MlaConfig sample(bool bias, int P = 1, int q_lora = 0) {
  auto c = mlacp::test::make_config(2, 4 * P, 16, 3, 4, 2, 5, 6, bias, mlacp::MlaStrategy::latent);
  c.q_lora_rank = q_lora;
  return c;
}

struct SpecRow {
  std::string name;
  ParameterShape shape;
  bool present;
};

// docs/spec.md's "Weights" table written out for sample(): H*dqk = 18, H*(dn+dv) = 27, R + dr = 8, H*dv = 15; q-LoRA's
// rows (Rq = q_lora) last.
std::vector<SpecRow> spec_rows(bool bias, int q_lora) {
  const auto rq = static_cast<std::size_t>(q_lora);
  const bool lora = q_lora > 0;
  return {{"w_q", {2, {18, 16}}, !lora}, {"b_q", {1, {18, 0}}, bias},   {"w_kva", {2, {8, 16}}, true},
          {"g_kv", {1, {6, 0}}, true},   {"w_kvb", {2, {27, 6}}, true}, {"b_kvb", {1, {27, 0}}, bias},
          {"w_o", {2, {16, 15}}, true},  {"b_o", {1, {16, 0}}, bias},   {"w_qa", {2, {rq, 16}}, lora},
          {"g_q", {1, {rq, 0}}, lora},   {"w_qb", {2, {18, rq}}, lora}};
}

TEST(ParameterTable, RowsAreTheSpecsWeightsTable) {
  for (const bool bias : {false, true})
    for (const int q_lora : {0, 7}) {
      const auto c = sample(bias, 1, q_lora);
      const auto rows = spec_rows(bias, q_lora);
      ASSERT_EQ(mlacp::parameter_table().size(), rows.size());
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const ParameterInfo& info = mlacp::parameter_table()[i];
        EXPECT_EQ(info.name, rows[i].name);
        EXPECT_EQ(info.shape(c), rows[i].shape) << info.name << " " << info.shape(c).str();
        EXPECT_EQ(info.rank, rows[i].shape.rank) << info.name;
        EXPECT_EQ(info.present(c), rows[i].present) << info.name << " bias " << bias;
        EXPECT_EQ(info.kind == mlacp::ParameterKind::bias, info.name[0] == 'b') << info.name;
        EXPECT_EQ(info.kind == mlacp::ParameterKind::norm_gain, info.name[0] == 'g') << info.name;
        EXPECT_EQ(info.gradient, mlacp::GradientType::accumulation_type) << info.name;
        EXPECT_EQ(mlacp::find_parameter(info.name), &info);
      }
    }
  EXPECT_EQ(mlacp::find_parameter("w_qc"), nullptr);
}

// Each entry's flag is the MlaRequiresGrad member of its name, and the flag word has one bit per entry after x's.
TEST(ParameterTable, FlagsFollowTheTable) {
  const auto none = mlacp::MlaRequiresGrad::none();
  const mlacp::MlaRequiresGrad all;
  EXPECT_FALSE(none.x);
  EXPECT_EQ(mlacp::flag_word(none), 0);
  EXPECT_EQ(mlacp::flag_word(all), (std::int64_t{1} << (mlacp::parameter_count + 1)) - 1);
  const std::vector<std::pair<std::string, bool mlacp::MlaRequiresGrad::*>> named = {
      {"w_q", &mlacp::MlaRequiresGrad::w_q},     {"b_q", &mlacp::MlaRequiresGrad::b_q},
      {"w_kva", &mlacp::MlaRequiresGrad::w_kva}, {"g_kv", &mlacp::MlaRequiresGrad::g_kv},
      {"w_kvb", &mlacp::MlaRequiresGrad::w_kvb}, {"b_kvb", &mlacp::MlaRequiresGrad::b_kvb},
      {"w_o", &mlacp::MlaRequiresGrad::w_o},     {"b_o", &mlacp::MlaRequiresGrad::b_o},
      {"w_qa", &mlacp::MlaRequiresGrad::w_qa},   {"g_q", &mlacp::MlaRequiresGrad::g_q},
      {"w_qb", &mlacp::MlaRequiresGrad::w_qb}};
  ASSERT_EQ(named.size(), mlacp::parameter_count);
  for (std::size_t i = 0; i < mlacp::parameter_count; ++i) {
    const ParameterInfo& info = mlacp::parameter_table()[i];
    EXPECT_FALSE(none.*(info.flag)) << info.name;
    EXPECT_EQ(info.flag, named[i].second) << info.name;
    auto one = mlacp::MlaRequiresGrad::none();
    one.*(info.flag) = true;
    EXPECT_EQ(mlacp::flag_word(one), std::int64_t{1} << (i + 1)) << info.name;
  }
}

// allocate() gives what weights_error accepts, with and without bias, and the members for_each_parameter hands over
// are the named ones (on two different parameter types at once).
TEST(ParameterTable, AllocateAndWeightsErrorAgree) {
  for (const bool bias : {false, true}) {
    const auto c = sample(bias);
    const auto factored = sample(bias, 1, 7);
    EXPECT_EQ(mlacp::detail::weights_error(factored, Weights::allocate(factored), "weight"), "");
    const auto w = Weights::allocate(c, "t.");
    EXPECT_EQ(mlacp::detail::weights_error(c, w, "weight"), "");
    const auto host = mlacp::MlaParameters<float, Kokkos::HostSpace>::allocate(c);
    std::size_t visited = 0;
    mlacp::for_each_parameter(
        [&](const ParameterInfo& info, const auto& view, const auto& host_view) {
          ++visited;
          EXPECT_EQ(view.data() != nullptr, info.present(c)) << info.name;
          EXPECT_EQ(host_view.data() != nullptr, info.present(c)) << info.name;
          if (!info.present(c)) return;
          EXPECT_EQ(view.label(), std::string("t.") + info.name);
          EXPECT_EQ(mlacp::detail::shape_of(view), info.shape(c)) << info.name;
          EXPECT_EQ(mlacp::detail::shape_of(host_view), info.shape(c)) << info.name;
        },
        w, host);
    EXPECT_EQ(visited, mlacp::parameter_count);
    EXPECT_EQ(w.w_q.extent(0), 18u);
    EXPECT_EQ(w.w_kvb.extent(0), 27u);
    EXPECT_EQ(w.b_o.data() != nullptr, bias);
  }
  // Biases given to a configuration without them, and missing ones, are named.
  EXPECT_NE(mlacp::detail::weights_error(sample(false), Weights::allocate(sample(true)), "weight")
                .find("weight b_q has extent 18; expected none (bias = false)"),
            std::string::npos);
  EXPECT_NE(mlacp::detail::weights_error(sample(true), Weights::allocate(sample(false)), "weight")
                .find("weight b_q is missing; expected extent 18"),
            std::string::npos);
  // Dense weights given to a q-LoRA configuration, and the reverse: the first parameter that differs is named, with
  // why the configuration has it or not.
  EXPECT_NE(mlacp::detail::weights_error(sample(false, 1, 7), Weights::allocate(sample(false)), "weight")
                .find("weight w_q has shape [18, 16]; expected none (q_lora_rank > 0 factors the query"),
            std::string::npos);
  const std::string dense_error =
      mlacp::detail::weights_error(sample(false), Weights::allocate(sample(false, 1, 7)), "weight");
  EXPECT_NE(dense_error.find("weight w_q has shape [0, 0] (unallocated); expected [18, 16]"), std::string::npos)
      << dense_error;
  auto extra = Weights::allocate(sample(false));
  extra.g_q = Weights::vector_type("g_q", 7);
  EXPECT_NE(mlacp::detail::weights_error(sample(false), extra, "weight")
                .find("weight g_q has extent 7; expected none (q_lora_rank = 0: the query has one dense w_q)"),
            std::string::npos);
}

// One parameter of a wrong shape at a time: weights_error names that one (and not another), for each entry.
TEST(ParameterTable, WeightsErrorNamesEachEntry) {
  for (const int q_lora : {0, 7}) {
    const auto c = sample(true, 1, q_lora);
    for (std::size_t i = 0; i < mlacp::parameter_count; ++i) {
      auto w = Weights::allocate(c);
      std::size_t j = 0;
      std::string expected;
      mlacp::for_each_parameter(
          [&](const ParameterInfo& info, auto& view) {
            if (j++ != i) return;
            auto shape = info.shape(c);
            shape.extents[0] += 1;
            view = mlacp::detail::allocate_view<std::remove_reference_t<decltype(view)>>("wrong", shape);
            expected = std::string("weight ") + info.name +
                       (info.rank == 2 ? " has shape " + shape.str() : " has extent " + std::to_string(shape[0]));
          },
          w);
      const std::string error = mlacp::detail::weights_error(c, w, "weight");
      EXPECT_NE(error.find(expected), std::string::npos) << error;
    }
  }
}

// The backward's checks and allocation follow the table: a caller gradient of a wrong shape (on the last rank) is
// named on every rank, for every entry; with one flag set, exactly that gradient (and no other) is allocated.
TEST(ParameterTable, BackwardGradientsFollowTheTable) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  for (const int q_lora : {0, 7}) {
    const auto c = sample(true, mesh.size(), q_lora);
    mlacp::MlaAttention<double> layer(c, mlacp::test::make_weights<double, Mem>(c, 3), mesh);
    Tensor3 x("x", c.batch, layer.local_seq(), c.hidden);
    mlacp::test::fill(x, 5 + mesh.rank(), 1.0);
    for (std::size_t i = 0; i < mlacp::parameter_count; ++i) {
      const ParameterInfo& info = mlacp::parameter_table()[i];
      auto forward = layer.forward(Space(), x);
      Grads grads;
      std::size_t j = 0;
      std::string expected;
      mlacp::for_each_parameter(
          [&](const ParameterInfo& e, auto& view) {
            if (j++ != i) return;
            auto shape = e.shape(c);
            shape.extents[0] += 2;
            if (mesh.rank() == mesh.size() - 1)
              view = mlacp::detail::allocate_view<std::remove_reference_t<decltype(view)>>("wrong", shape);
            expected = std::string("gradient ") + e.name + " has shape " + shape.str() + "; expected " +
                       e.shape(c).str() + " on rank " + std::to_string(mesh.size() - 1);
          },
          static_cast<mlacp::MlaParameters<double, Mem>&>(grads));
      mlacp::test::expect_error<mlacp::InvalidArgument>([&] { layer.backward(Space(), forward, x, grads); }, expected);

      // One flag: only its gradient is made.
      auto flags = mlacp::MlaRequiresGrad::none();
      flags.*(info.flag) = true;
      auto one = layer.forward(Space(), x, flags);
      Grads made;
      layer.backward(Space(), one, x, made);
      mlacp::for_each_parameter(
          [&](const ParameterInfo& e, const auto& view) {
            // A flag of a parameter the configuration lacks makes nothing.
            EXPECT_EQ(view.data() != nullptr, &e == &info && info.present(c))
                << "flag " << info.name << ", gradient " << e.name << ", Rq " << q_lora;
            if (view.data()) {
              EXPECT_EQ(mlacp::detail::shape_of(view), e.shape(c)) << e.name;
            }
          },
          static_cast<const mlacp::MlaParameters<double, Mem>&>(made));
      EXPECT_EQ(made.dx.data(), nullptr);
    }
  }
}

}  // namespace
