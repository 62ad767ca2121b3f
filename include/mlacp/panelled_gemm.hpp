// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Progress infrastructure for compute that overlaps a collective: the overlap policy, named compute phases (Kokkos
// Tools regions and the event recorder), and the panelled GEMM that calls mlacp::progress() between panels while a
// collective is pending (progress.hpp says why MPI needs it).
#pragma once

#include <mlacp/backend.hpp>
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/progress.hpp>
#include <mlacp/view_types.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace mlacp {

/// How mlacp's GEMMs make pending collectives progress on host execution spaces (MPI implementations such as Open MPI
/// move a nonblocking collective only inside MPI calls): while a collective worth polling is pending, a GEMM is split
/// into at most `panels` panels of at least `min_panel_rows` rows, with mlacp::progress() between them. Only where the
/// execution space's Backend polls (backend.hpp: host spaces; NCCL progresses on its own).
///
/// Polling costs the compute beside it (the panels run below one call's rate, and each test takes MPI's time), so it
/// is paid only where it hides something (detail::worth_polling, decided per collective at its launch):
/// - a collective that moves through shared memory (Mesh::shared_memory(): its ranks on one node, MPI's shared-memory
///   transport on) is not polled unless `poll_shared_memory`: its copies are work of this node's own cores, which
///   polling moves into the compute instead of hiding (the latent layer at the DeepSeek-like shape on one node:
///   1.03x its blocking time panelled, 1.00x unpanelled);
/// - any other (across nodes, or over a network transport inside one) is polled when this rank sends at least
///   `min_poll_bytes`: below that it is in flight for less than the panels cost.
/// A GEMM beside only collectives not worth polling is one call, as in the blocking schedule; their wait completes
/// them.
struct OverlapPolicy {
  int panels = 32;
  std::int64_t min_panel_rows = 128;
  /// Bytes a rank must send in a collective for it to be polled.
  std::int64_t min_poll_bytes = 256 * 1024;
  /// Poll collectives that move through shared memory as well (off: see above).
  bool poll_shared_memory = false;
  /// overlap_policy_for(machine)'s rule: a collective is worth polling once the model hides at least this much of it.
  double min_hidden_s = 200e-6;
};

/// The process-wide policy (defaults above; MLACP_WGRAD_PANELS overrides `panels`, 1 disables panelling).
OverlapPolicy& overlap_policy();

namespace model {
struct MachineParams;
}

/// `base` with `min_poll_bytes` from the performance model of `machine` (model/machine.hpp; mlacp-plan --calibrate
/// measures one): the smallest message of which the model hides at least `base.min_hidden_s` on the network link, that
/// is overlap_efficiency * (alpha_s + bytes * beta_s_per_byte) >= min_hidden_s with the machine's `inter` link where it
/// has one (a per-byte cost), else its `intra` one (a calibration whose ranks were all on one node); never (no
/// collective is polled) when the machine hides nothing (overlap_efficiency 0). The other fields are base's.
OverlapPolicy overlap_policy_for(const model::MachineParams& machine, OverlapPolicy base = overlap_policy());

namespace detail {

/// A row-major [rows, cols] matrix over the first rows*cols elements of a contiguous View (a window: it does not keep
/// v's allocation alive).
template <class ViewType>
Matrix<typename ViewType::value_type, typename ViewType::memory_space, Unmanaged> as_matrix(const ViewType& v,
                                                                                            std::int64_t rows,
                                                                                            std::int64_t cols) {
  return Matrix<typename ViewType::value_type, typename ViewType::memory_space, Unmanaged>(
      v.data(), static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
}

/// A named compute phase: a Kokkos Tools region (compat::ScopedRegion, the one scoped-region type), and
/// compute_begin/compute_end events. When recording, the instance is fenced at the end so that the end time is the time
/// the work finished, not the time it was enqueued.
template <class ExecSpace>
class ComputePhase {
 public:
  ComputePhase(const ExecSpace& space, std::string name)
      : region_("mlacp::" + name), space_(space), name_(std::move(name)) {
    if (events::enabled()) events::record(EventKind::compute_begin, name_);
  }
  ~ComputePhase() {
    if (events::enabled()) {
      compat::fence(space_, "mlacp: end of " + name_);
      events::record(EventKind::compute_end, name_);
    }
  }
  ComputePhase(const ComputePhase&) = delete;
  ComputePhase& operator=(const ComputePhase&) = delete;

 private:
  compat::ScopedRegion region_;  // pushed first, popped last
  ExecSpace space_;
  std::string name_;
};

/// The Kokkos Tools region name of one gemm_with_progress call, "mlacp::gemm NT 4096x512x1024 float beta=0": the
/// transposes, C = op(A) op(B)'s m x n x k, A's value type and beta, what perf_tests/perf_gemm_shapes.cpp needs to time
/// the layer shape by shape and to replay each shape alone. Built only while a region callback is installed.
template <class AMat, class CMat>
std::string gemm_region_name(const char* trans_a, const char* trans_b, const AMat& a, const CMat& c, double beta) {
  using A = typename AMat::non_const_value_type;
  const char* type = std::is_same_v<A, float> ? "float" : std::is_same_v<A, double> ? "double" : "bf16";
  const bool a_transposed = trans_a[0] == 'T' || trans_a[0] == 't';
  const auto k = a_transposed ? a.extent(0) : a.extent(1);
  return std::string("mlacp::gemm ") + trans_a[0] + trans_b[0] + " " + std::to_string(c.extent(0)) + "x" +
         std::to_string(c.extent(1)) + "x" + std::to_string(k) + " " + type + " beta=" + (beta == 0 ? "0" : "1");
}

/// C = beta*C + A op(B) (trans_a "N": A [M, K], panels are row blocks of A and C) or C = beta*C + A^T op(B)
/// (trans_a "T": A [K, M], the reduction runs over A's rows, panels are row blocks of A and B accumulated into C).
/// While a collective worth polling is pending on a host execution space, the GEMM runs in panels (overlap_policy())
/// with mlacp::progress() before each panel and at the end, so that MPI advances them during the compute. Otherwise
/// (none such pending, or a device execution space, where NCCL needs no host polling) it is one GEMM call, with
/// progress() before and after it on a host space. Views of
/// bf16 (A and B; C of float or bf16) go through the installed bf16 plan (detail::gemm_values), accumulating in float.
template <class ExecSpace, class AMat, class BMat, class CMat>
void gemm_with_progress(const ExecSpace& space, const char* trans_a, const char* trans_b,
                        typename CMat::const_value_type alpha, const AMat& a, const BMat& b,
                        typename CMat::const_value_type beta, const CMat& c) {
  using T = typename CMat::non_const_value_type;
  using Scalar = compat::accumulation_t<T>;
  constexpr bool polls = Backend<ExecSpace>::polls_progress;  // MPI on host spaces needs polling; NCCL does not
  // One region per call (panels included) when a profiler listens; no name is built otherwise.
  std::optional<compat::ScopedRegion> region;
  if (compat::tools::regions_active())
    region.emplace(gemm_region_name(trans_a, trans_b, a, c, static_cast<double>(Scalar(beta))));
  const auto rows = static_cast<std::int64_t>(a.extent(0));
  const OverlapPolicy policy = overlap_policy();
  std::int64_t panels = 1;
  if (polls && polled_collectives() > 0 && policy.panels > 1)
    panels = std::clamp<std::int64_t>(rows / std::max<std::int64_t>(1, policy.min_panel_rows), 1, policy.panels);
  if (panels == 1) {
    if (polls) progress();
    gemm_values(space, trans_a, trans_b, Scalar(alpha), a, b, Scalar(beta), c);
    if (polls) progress();
    return;
  }
  const bool reduce_over_rows = trans_a[0] == 'T' || trans_a[0] == 't';
  for (std::int64_t p = 0; p < panels; ++p) {
    const auto range =
        std::make_pair(static_cast<std::size_t>(rows * p / panels), static_cast<std::size_t>(rows * (p + 1) / panels));
    progress();
    const auto a_panel = Kokkos::subview(a, range, Kokkos::ALL());
    if (reduce_over_rows)
      gemm_values(space, trans_a, trans_b, Scalar(alpha), a_panel, Kokkos::subview(b, range, Kokkos::ALL()),
                  p == 0 ? Scalar(beta) : Scalar(1), c);
    else
      gemm_values(space, trans_a, trans_b, Scalar(alpha), a_panel, b, Scalar(beta),
                  Kokkos::subview(c, range, Kokkos::ALL()));
  }
  progress();
}

}  // namespace detail
}  // namespace mlacp
