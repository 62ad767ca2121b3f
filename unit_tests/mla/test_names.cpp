// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The names of mla/names.hpp are the names the layer records: an InputA2APair's collectives are derived from its
// tensor's name, and every event a forward + backward of either strategy records carries a name from the header.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mla/names.hpp>

#include <set>
#include <string>

namespace {

namespace names = mlacp::names;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

TEST(Names, PairNamesDeriveFromTheTensor) {
  EXPECT_EQ(names::forward_a2a(names::q), names::q_a2a);
  EXPECT_EQ(names::forward_a2a(names::k), names::k_a2a);
  EXPECT_EQ(names::forward_a2a(names::v), names::v_a2a);
  EXPECT_EQ(names::backward_a2a(names::q), names::dq_a2a);
  EXPECT_EQ(names::backward_a2a(names::k), names::dk_a2a);
  EXPECT_EQ(names::backward_a2a(names::v), names::dv_a2a);
}

TEST(Names, EveryRecordedEventOfTheLayerIsNamedByTheHeader) {
  const std::set<std::string> known = {names::q_a2a,
                                       names::k_a2a,
                                       names::v_a2a,
                                       names::dq_a2a,
                                       names::dk_a2a,
                                       names::dv_a2a,
                                       names::o_a2a,
                                       names::do_a2a,
                                       names::payload_all_gather,
                                       names::latent_reduce_scatter,
                                       names::call_shape,
                                       names::w_q_fprop,
                                       names::w_kva_fprop,
                                       names::w_kvb_fprop,
                                       names::attention_fprop,
                                       names::w_o_fprop,
                                       names::w_o_dgrad,
                                       names::w_o_wgrad,
                                       names::b_o_grad,
                                       names::attention_bprop,
                                       names::kv_backward,
                                       names::w_kvb_dgrad,
                                       names::w_kvb_wgrad,
                                       names::b_kvb_grad,
                                       names::q_backward,
                                       names::k_backward,
                                       names::v_backward,
                                       names::payload_backward,
                                       names::ring_payload,
                                       names::ring_k,
                                       names::ring_v,
                                       names::ring_d_payload,
                                       names::ring_dk,
                                       names::ring_dv,
                                       names::ring_expand,
                                       names::ring_kv_backward};
  // Flat, and (P > 1) a ring of P: the ring's exchanges and phases are named by the header too.
  for (const int ring : {1, mlacp::test::world_size()})
    for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
      mlacp::Mesh mesh(MPI_COMM_WORLD, ring);
      const auto config = mlacp::test::make_config(1, 4 * mesh.size(), 8, 2 * mesh.size(), 4, 2, 3, 5, true, strategy);
      mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 5), mesh);
      mlacp::detail::Tensor3<double, Mem> x("x", 1, layer.local_seq(), 8), dy("dy", 1, layer.local_seq(), 8);
      mlacp::test::fill(x, 3, 1.0);
      mlacp::test::fill(dy, 4, 1.0);
      mlacp::events::clear();
      mlacp::events::enable(true);
      auto f = layer.forward(Space(), x);
      layer.backward(Space(), f, dy);
      mlacp::events::enable(false);
      const auto events = mlacp::events::snapshot();
      ASSERT_FALSE(events.empty());
      // Checked mode also records each agreement, named by the call or collective it guards.
      const std::string agreement = " (checked-mode agreement)";
      for (const auto& e : events) {
        const bool is_agreement = e.name.size() > agreement.size() &&
                                  e.name.compare(e.name.size() - agreement.size(), agreement.size(), agreement) == 0;
        if (is_agreement) continue;
        EXPECT_TRUE(known.count(e.name)) << "'" << e.name << "' is not in mla/names.hpp";
      }
    }
}

}  // namespace
