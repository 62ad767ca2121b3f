// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The drift test of the layer's timeline (include/mlacp/mla/detail/timeline.hpp): on every rank, the collectives the
// layer launches and waits in a forward and a backward (read from the event recorder, as the transports record them)
// are exactly those the performance model walks for that rank (mlacp::model::collective_order), in the same order.
// Cases: both strategies x flat and every ring that divides the ranks (both layouts) x overlap on/off, each with a
// rotation of q-LoRA, value type (double, float, bf16), wire (same, bf16, bf16_all), even, uneven and packed splits,
// a rank without heads, and the gradient flags that switch parts of the backward off.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/model/layer_model.hpp>
#include <mlacp/token_map.hpp>

#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
template <class T>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

// The names of the collectives the timeline orders (the mesh's agreements are not among them).
const std::set<std::string>& timeline_names() {
  namespace n = mlacp::names;
  static const std::set<std::string> names{n::payload_all_gather,
                                           n::q_a2a,
                                           n::k_a2a,
                                           n::v_a2a,
                                           n::o_a2a,
                                           n::do_a2a,
                                           n::dq_a2a,
                                           n::dk_a2a,
                                           n::dv_a2a,
                                           n::latent_reduce_scatter,
                                           n::ring_payload,
                                           n::ring_k,
                                           n::ring_v,
                                           n::ring_d_payload,
                                           n::ring_dk,
                                           n::ring_dv};
  return names;
}

std::vector<std::string> recorded_collectives() {
  std::vector<std::string> out;
  for (const mlacp::Event& e : mlacp::events::snapshot()) {
    if (timeline_names().count(e.name) == 0) continue;
    if (e.kind == mlacp::EventKind::launch) out.push_back("launch " + e.name);
    if (e.kind == mlacp::EventKind::wait_begin) out.push_back("wait " + e.name);
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::ostringstream s;
  for (const auto& e : v) s << "    " << e << "\n";
  return s.str();
}

struct Variant {
  std::string what;
  int dtype = 0;  // 0 double, 1 float, 2 bf16
  mlacp::WireDtype wire = mlacp::WireDtype::same;
  bool uneven = false, packed = false, q_lora = false, one_head = false;
  mlacp::MlaRequiresGrad flags;
};

Variant variant(const char* what, int dtype, mlacp::WireDtype wire, bool uneven, bool packed, bool q_lora,
                bool one_head) {
  Variant v;
  v.what = what;
  v.dtype = dtype;
  v.wire = wire;
  v.uneven = uneven;
  v.packed = packed;
  v.q_lora = q_lora;
  v.one_head = one_head;
  return v;
}

mlacp::MlaRequiresGrad only(bool mlacp::MlaRequiresGrad::*flag) {
  auto flags = mlacp::MlaRequiresGrad::none();
  flags.*flag = true;
  return flags;
}

std::vector<Variant> variants() {
  using W = mlacp::WireDtype;
  std::vector<Variant> v;
  v.push_back(variant("double, even, every gradient", 0, W::same, false, false, false, false));
  v.push_back(variant("float, bf16 wire, uneven, q-LoRA", 1, W::bfloat16, true, false, true, false));
  v.push_back(
      variant("float, bf16_all wire, packed, only the Q branch", 1, W::bfloat16_all, false, true, false, false));
  v.back().flags = only(&mlacp::MlaRequiresGrad::w_q);
  v.push_back(variant("bf16, even, q-LoRA, only w_kvb", 2, W::same, false, false, true, false));
  v.back().flags = only(&mlacp::MlaRequiresGrad::w_kvb);
  v.push_back(variant("double, uneven, one head (ranks without heads)", 0, W::same, true, false, false, true));
  v.push_back(variant("double, only w_o (no attention gradient)", 0, W::same, false, false, false, false));
  v.back().flags = only(&mlacp::MlaRequiresGrad::w_o);
  v.push_back(variant("float, packed, only dx", 1, W::same, false, true, false, false));
  v.back().flags = only(&mlacp::MlaRequiresGrad::x);
  return v;
}

template <class T>
void expect_no_drift(mlacp::MlaConfig config, const Variant& variant, int ring, const std::string& what) {
  mlacp::Mesh mesh(MPI_COMM_WORLD, ring);
  const int U = mesh.ulysses_size(), C = mesh.ring_size();
  const mlacp::TokenMap map(config.seq, U, C, config.ring_layout);
  const int s = static_cast<int>(map.count(mesh.ring_rank(), mesh.ulysses_rank()));
  const bool heads = mlacp::Partition(config.heads, U).count(mesh.ulysses_rank()) > 0;
  mlacp::MlaAttention<T> layer(config, mlacp::test::make_weights<T, Mem>(config, 7), mesh);
  Tensor3<T> x("x", config.batch, s, config.hidden), dy("dy", config.batch, s, config.hidden);
  mlacp::test::fill(x, 1 + mesh.rank(), 1.0);
  mlacp::test::fill(dy, 11 + mesh.rank(), 1.0);

  mlacp::events::clear();
  mlacp::events::enable(true);
  auto forward = layer.forward(Space(), x, variant.flags);
  mlacp::events::enable(false);
  const auto layer_forward = recorded_collectives();
  mlacp::events::clear();
  mlacp::events::enable(true);
  layer.backward(Space(), forward, dy);
  mlacp::events::enable(false);
  const auto layer_backward = recorded_collectives();
  mlacp::events::clear();

  const auto model_forward = mlacp::model::collective_order(config, U, C, heads, variant.flags, false);
  const auto model_backward = mlacp::model::collective_order(config, U, C, heads, variant.flags, true);
  const std::string where = what + " on rank " + std::to_string(mesh.rank()) + " (U=" + std::to_string(U) +
                            " C=" + std::to_string(C) + (heads ? "" : ", no heads") + ")";
  EXPECT_EQ(layer_forward, model_forward) << "forward drifted: " << where << "\n  the layer:\n"
                                          << join(layer_forward) << "  the model:\n"
                                          << join(model_forward);
  EXPECT_EQ(layer_backward, model_backward) << "backward drifted: " << where << "\n  the layer:\n"
                                            << join(layer_backward) << "  the model:\n"
                                            << join(model_backward);
}

TEST(TimelineDrift, TheModelWalksWhatTheLayerRunsRankByRank) {
  const int P = mlacp::test::world_size();
  std::vector<int> rings{1};
  for (int c = 2; c <= P; ++c)
    if (P % c == 0) rings.push_back(c);
  int cases = 0;
  for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
    for (const int ring : rings)
      for (const auto layout : {mlacp::RingLayout::contiguous, mlacp::RingLayout::zigzag}) {
        if (ring == 1 && layout == mlacp::RingLayout::contiguous) continue;  // the layout is a ring's
        for (const bool overlap : {true, false})
          for (const Variant& v : variants()) {
            const int U = P / ring;
            const int S = v.uneven ? 8 * P + 2 * ring + 1 : 8 * P;
            const int H = v.one_head ? 1 : (v.uneven ? 2 * U + 1 : 2 * U);
            auto config = mlacp::test::make_config(2, S, 16, H, 4, 2, 3, 6, true, strategy);
            config.overlap = overlap;
            config.ring_layout = layout;
            config.wire_dtype = v.wire;
            if (v.q_lora) config.q_lora_rank = 5;
            if (v.packed) config.cu_seqlens = {0, 3, S / 2 + 1, S};
            std::ostringstream what;
            what << mlacp::to_string(strategy) << ", ring " << ring << " " << mlacp::to_string(layout) << ", overlap "
                 << (overlap ? "on" : "off") << ", " << v.what;
            if (v.dtype == 0) expect_no_drift<double>(config, v, ring, what.str());
            if (v.dtype == 1) expect_no_drift<float>(config, v, ring, what.str());
            if (v.dtype == 2) expect_no_drift<mlacp::bf16>(config, v, ring, what.str());
            ++cases;
          }
      }
  EXPECT_GE(cases, 28);
}

}  // namespace
