// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The memory model (model::predict_memory) against the real layer: the layer runs forward + backward as
// mlacp-mla-block times it (the previous iteration's output and gradients held while the next runs, the collectives'
// pooled buffers warm after the first iteration), its peak Kokkos bytes counted from before the weights as the tool
// counts them (diagnostics::view_peak_bytes), and the prediction must be at least 95% of that peak (a planner that
// trusts it must not run out of memory) and at most 1.5 times it (nor refuse what fits). Configurations: both
// strategies, flat and ring C = 2 (both layouts) at 2 ranks, q-LoRA, float, bf16 (its bf16 path, its float path,
// and auto: timed, whose first forward holds both, and on this machine), float with the bf16 wire, batch 2. On a miss
// the test prints the live allocations at the peak by label, largest first: what the model does not count.
#include "mpi_test_harness.hpp"
#include "scoped_environment.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include <mlacp/bfloat16.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/detail/buffer_pool.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/model/layer_model.hpp>
#include <mlacp/model/mesh_plan.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

namespace model = mlacp::model;
namespace tools = mlacp::compat::tools;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// Live allocations by label, and a copy of them whenever the live bytes reach a new high: what was held at the peak.
// Installed before diagnostics' counter, which chains to it.
struct LabelTracker {
  std::mutex mutex;
  std::unordered_map<const void*, std::pair<std::string, std::uint64_t>> live;
  std::uint64_t live_bytes = 0, peak_bytes = 0;
  std::map<std::string, std::uint64_t> at_peak;
  bool on = false;

  static LabelTracker& get() {
    static LabelTracker t;
    return t;
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mutex);
    peak_bytes = live_bytes;
    snapshot();
  }
  void snapshot() {
    at_peak.clear();
    for (const auto& [p, entry] : live) at_peak[entry.first] += entry.second;
  }
  static void allocate(const tools::space_handle, const char* label, const void* p, const std::uint64_t bytes) {
    LabelTracker& t = get();
    std::lock_guard<std::mutex> lock(t.mutex);
    auto& entry = t.live[p];
    t.live_bytes += bytes - entry.second;
    entry = {label != nullptr ? label : "", bytes};
    if (t.live_bytes > t.peak_bytes) {
      t.peak_bytes = t.live_bytes;
      t.snapshot();
    }
  }
  static void deallocate(const tools::space_handle, const char*, const void* p, const std::uint64_t) {
    LabelTracker& t = get();
    std::lock_guard<std::mutex> lock(t.mutex);
    if (const auto it = t.live.find(p); it != t.live.end()) {
      t.live_bytes -= it->second.second;
      t.live.erase(it);
    }
  }
  static void install() {
    if (get().on) return;
    tools::set_allocate_data_callback(&allocate);
    tools::set_deallocate_data_callback(&deallocate);
    get().on = true;
  }
  std::string report(std::uint64_t base) {
    std::lock_guard<std::mutex> lock(mutex);
    std::vector<std::pair<std::uint64_t, std::string>> rows;
    for (const auto& [label, bytes] : at_peak) rows.emplace_back(bytes, label);
    std::sort(rows.rbegin(), rows.rend());
    std::ostringstream out;
    out << "live at the peak (" << peak_bytes - base << " bytes above the base):\n";
    for (const auto& [bytes, label] : rows) out << "  " << bytes << "  " << label << "\n";
    return out.str();
  }
};

struct Case {
  const char* name;
  mlacp::MlaStrategy strategy;
  int ring;  // C (U = P / C)
  mlacp::RingLayout layout;
  model::Dtype dtype;
  mlacp::WireDtype wire;
  int q_lora;
  bool deepseek;  // the DeepSeek-like head dimensions (else perf_block's)
  int batch = 1;
  // A bf16 layer's path; `automatic` runs with MLACP_BF16_COMPUTE=auto (the suite pins bf16): the first forward
  // times both paths, or takes bf16 untimed on bf16 matrix hardware (AMX), which MLACP_BF16_GEMM=float_blas rules out.
  std::optional<mlacp::Bf16Compute> bf16_compute = std::nullopt;
  const char* bf16_gemm = nullptr;  // MLACP_BF16_GEMM for the case (nullptr: as the run has it)
};

mlacp::MlaConfig config_of(const Case& k) {
  mlacp::MlaConfig c;
  c.batch = k.batch;
  c.seq = 256;
  c.hidden = 256;
  c.heads = 4;
  if (k.deepseek) {
    c.nope = 64;
    c.rope = 32;
    c.vdim = 64;
    c.latent = 128;
  } else {
    c.nope = 16;
    c.rope = 16;
    c.vdim = 32;
    c.latent = 128;
  }
  c.q_lora_rank = k.q_lora;
  c.strategy = k.strategy;
  c.ring_layout = k.layout;
  c.wire_dtype = k.wire;
  if (k.bf16_compute) c.bf16_compute = *k.bf16_compute;
  return c;
}

// Returns the pool's free buffers to Kokkos: each case starts, as the tool's process does, with an empty pool (a
// buffer pooled by an earlier case and reused would not count in this one's peak).
template <class MemSpace>
void empty_pool() {
  auto& pool = mlacp::detail::BufferPool<MemSpace>::instance();
  const std::uint64_t kept = pool.trim_after();
  pool.set_trim_after(0);
  pool.acquire(1, "empty the pool", mlacp::detail::buffer_user(Kokkos::DefaultHostExecutionSpace()));
  pool.set_trim_after(kept);
}

// The peak Kokkos bytes of the layer's run above what was live before the weights, as mlacp-mla-block counts them
// (max over ranks).
template <class T>
std::uint64_t measured_peak(const mlacp::MlaConfig& c, const mlacp::Mesh& mesh, std::uint64_t& base_out) {
  using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
  const Space space;
  empty_pool<Mem>();
  if constexpr (!std::is_same_v<Mem, Kokkos::HostSpace>) empty_pool<Kokkos::HostSpace>();
  LabelTracker::install();
  mlacp::diagnostics::count_view_allocations();
  Kokkos::fence();
  const std::uint64_t base = mlacp::diagnostics::view_live_bytes();
  mlacp::diagnostics::reset_view_peak_bytes();
  LabelTracker::get().reset();
  base_out = LabelTracker::get().live_bytes;
  std::uint64_t peak = 0;
  {
    auto weights = mlacp::testing::synthetic::weights<T, Mem>(c, 7);
    mlacp::MlaAttention<T> layer(c, weights, mesh);
    const int s = layer.local_seq();
    Tensor3 x("x", c.batch, s, c.hidden), dy("dy", c.batch, s, c.hidden), y;
    mlacp::testing::synthetic::fill(x, 100 + mesh.rank(), 1.0);
    mlacp::testing::synthetic::fill(dy, 200 + mesh.rank(), 1.0);
    typename mlacp::MlaAttention<T>::gradients_type grads;
    for (int it = 0; it < 3; ++it) {
      auto forward = layer.forward(space, x);
      grads = layer.backward(space, forward, dy);
      Kokkos::fence();
      y = forward.output();
    }
    peak = mlacp::diagnostics::view_peak_bytes() - base;
  }
  std::uint64_t max_peak = 0;
  MPI_Allreduce(&peak, &max_peak, 1, MPI_UINT64_T, MPI_MAX, mesh.comm());
  return max_peak;
}

void check(const Case& k) {
  const int P = mlacp::test::world_size();
  if (P % k.ring != 0 || (k.ring > 1 && P < 2)) GTEST_SKIP() << k.name << ": needs ranks divisible by C";
  const mlacp::MlaConfig c = config_of(k);
  // The suite pins MLACP_BF16_COMPUTE=bf16; an automatic case runs the layer and the model under auto.
  std::optional<mlacp::test::ScopedEnvironment> scoped;
  if (k.bf16_compute == mlacp::Bf16Compute::automatic) scoped.emplace("MLACP_BF16_COMPUTE", "auto");
  std::optional<mlacp::test::ScopedEnvironment> gemm;
  if (k.bf16_gemm != nullptr) gemm.emplace("MLACP_BF16_GEMM", k.bf16_gemm);
  mlacp::Mesh mesh(MPI_COMM_WORLD, k.ring);
  std::uint64_t base = 0;
  const std::uint64_t measured = k.dtype == model::Dtype::bfloat16 ? measured_peak<mlacp::bf16>(c, mesh, base)
                                                                   : measured_peak<float>(c, mesh, base);
  const model::Choice choice{k.strategy, mesh.ulysses_size(), mesh.ring_size(), k.layout};
  const model::MemoryEstimate m = model::predict_memory(c, k.dtype, choice, model::cluster_of(MPI_COMM_WORLD));
  const double predicted = m.total(), ratio = predicted / static_cast<double>(measured);
  std::ostringstream what;
  what << k.name << " (" << choice.describe() << ", P=" << P << "): predicted " << predicted << " bytes (weights "
       << m.weights << ", gradients " << m.gradients << ", activations " << m.activations << ", scratch " << m.scratch
       << ", inputs " << m.inputs << ", communication " << m.communication << ", held " << m.held << "), measured peak "
       << measured << " bytes, ratio " << ratio;
  if (mlacp::test::world_rank() == 0) std::printf("%s\n", what.str().c_str());
  EXPECT_GE(ratio, 0.95) << what.str() << "\n" << LabelTracker::get().report(base);
  EXPECT_LE(ratio, 1.5) << what.str() << "\n" << LabelTracker::get().report(base);
}

using S = mlacp::MlaStrategy;
using L = mlacp::RingLayout;
using D = model::Dtype;
using W = mlacp::WireDtype;

TEST(MemoryModel, LatentFlatFloat) {
  check({"latent flat float", S::latent, 1, L::zigzag, D::float32, W::same, 0, false});
}
TEST(MemoryModel, ExpandedFlatFloat) {
  check({"expanded flat float", S::expanded, 1, L::zigzag, D::float32, W::same, 0, false});
}
TEST(MemoryModel, LatentFlatDeepseekQLora) {
  check({"latent flat deepseek q-lora", S::latent, 1, L::zigzag, D::float32, W::same, 64, true});
}
TEST(MemoryModel, ExpandedFlatDeepseekQLora) {
  check({"expanded flat deepseek q-lora", S::expanded, 1, L::zigzag, D::float32, W::same, 64, true});
}
TEST(MemoryModel, LatentFlatBf16) {
  check({"latent flat bf16", S::latent, 1, L::zigzag, D::bfloat16, W::same, 0, true});
}
TEST(MemoryModel, ExpandedFlatBf16) {
  check({"expanded flat bf16", S::expanded, 1, L::zigzag, D::bfloat16, W::same, 0, false});
}
TEST(MemoryModel, LatentFlatBf16Wire) {
  check({"latent flat float, bf16 wire", S::latent, 1, L::zigzag, D::float32, W::bfloat16, 0, true});
}
TEST(MemoryModel, ExpandedFlatBf16AllWire) {
  check({"expanded flat float, bf16_all wire", S::expanded, 1, L::zigzag, D::float32, W::bfloat16_all, 0, false});
}
TEST(MemoryModel, LatentRingZigzag) {
  check({"latent ring zigzag", S::latent, 2, L::zigzag, D::float32, W::same, 0, true});
}
TEST(MemoryModel, ExpandedRingContiguous) {
  check({"expanded ring contiguous", S::expanded, 2, L::contiguous, D::float32, W::same, 0, false});
}
TEST(MemoryModel, LatentRingBf16QLora) {
  check({"latent ring bf16 q-lora", S::latent, 2, L::contiguous, D::bfloat16, W::same, 64, false});
}
TEST(MemoryModel, ExpandedRingBf16WireQLora) {
  check({"expanded ring zigzag, bf16 wire, q-lora", S::expanded, 2, L::zigzag, D::float32, W::bfloat16, 64, true});
}
// A bf16 layer that computes in float (detail/bf16_as_float.hpp): the float layer inside with a bf16 wire, the widened
// weights and the float edges; and one that times both paths at its first forward, which holds both at once.
using C = mlacp::Bf16Compute;
TEST(MemoryModel, LatentFlatBf16FloatPath) {
  check({"latent flat bf16, float path", S::latent, 1, L::zigzag, D::bfloat16, W::same, 0, true, 1, C::float32});
}
TEST(MemoryModel, ExpandedRingBf16FloatPathQLora) {
  check({"expanded ring bf16, float path, q-lora", S::expanded, 2, L::zigzag, D::bfloat16, W::same, 64, false, 1,
         C::float32});
}
TEST(MemoryModel, LatentFlatBf16AutoTimedHoldsBothPaths) {
  check({"latent flat bf16, auto, timed", S::latent, 1, L::zigzag, D::bfloat16, W::same, 0, false, 1, C::automatic,
         "float_blas"});
}
// On this machine's GEMMs: on AMX the bf16 path alone (untimed), elsewhere both; the model follows either way.
TEST(MemoryModel, LatentFlatBf16AutoOnThisMachine) {
  check({"latent flat bf16, auto", S::latent, 1, L::zigzag, D::bfloat16, W::same, 0, false, 1, C::automatic});
}
// Two sequences: the collectives pack both sides of their blocks (B > 1).
TEST(MemoryModel, LatentFlatBatch2Bf16Wire) {
  check({"latent flat batch 2, bf16 wire", S::latent, 1, L::zigzag, D::float32, W::bfloat16, 0, true, 2});
}
TEST(MemoryModel, ExpandedFlatBatch2) {
  check({"expanded flat batch 2", S::expanded, 1, L::zigzag, D::float32, W::same, 0, false, 2});
}
TEST(MemoryModel, LatentRingBatch2Bf16) {
  check({"latent ring batch 2 bf16", S::latent, 2, L::zigzag, D::bfloat16, W::same, 0, true, 2});
}

}  // namespace
