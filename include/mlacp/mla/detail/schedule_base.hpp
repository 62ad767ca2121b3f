// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the two schedules (latent_schedule.hpp, expanded_schedule.hpp) share: their types, their context, and the
// memory they own (the per-forward workspaces, the per-call scratch and the ring driver's buffers). A schedule adds
// its Forward and Backward, the executors of its timeline (timeline.hpp).
#pragma once

#include <mlacp/diagnostics.hpp>
#include <mlacp/mla/detail/forward_workspace.hpp>
#include <mlacp/mla/detail/ring_attention.hpp>
#include <mlacp/mla/detail/schedule_context.hpp>

#include <any>
#include <memory>
#include <vector>

namespace mlacp::detail {

template <class T, class ExecSpace, class Core, class Workspace, class Scratch>
class ScheduleBase {
 public:
  using context_type = ScheduleContext<T, ExecSpace, Core>;
  using tensor3 = typename context_type::tensor3;
  using tensor4 = typename context_type::tensor4;
  using tensor5 = typename context_type::tensor5;
  using gradients_type = typename context_type::gradients_type;
  using workspace_type = Workspace;
  using scratch_type = Scratch;
  using pool_type = ForwardWorkspacePool<workspace_type>;
  using pass_type = ForwardPass<T, ExecSpace, workspace_type>;

  explicit ScheduleBase(const context_type& ctx) : ctx_(&ctx) {}

  const context_type& context() const { return *ctx_; }
  /// The schedule's per-forward workspaces and its per-call scratch: a cache of the configuration, written by the
  /// const operations (as an FFT plan's buffers are).
  pool_type& pool() const { return pool_; }
  scratch_type& scratch() const { return scratch_; }

  /// After a pass failed with collectives parked or pending on a broken mesh (requests that may never complete; a
  /// pending one, held by a workspace or the ring, parks when the layer is destroyed): keeps every buffer of this
  /// schedule's (its workspaces, scratch and ring buffers) allocated for the life of the process, as the parked handles
  /// are. A launch may read or write a schedule buffer it does not own (an in-place send from a workspace View, an
  /// unmanaged block of one), and MPI may still touch it after the layer is gone: a peer's progress reading a freed
  /// send buffer would crash that peer.
  void keep_memory_of_parked_requests() const noexcept {
    try {
      diagnostics::detail::keep_until_exit(new Kept{pool_.all(), scratch_, ring_.buffers()});
    } catch (...) {
      // Out of memory for the copies: nothing more can be done here; the parked handles keep what they own.
    }
  }

 protected:
  /// The timeline's facts of this rank for a pass with `flags`.
  timeline::Facts facts(const MlaRequiresGrad& flags) const {
    return timeline::facts_of(ctx_->config(), ctx_->mesh().size(), ctx_->ring_size(), ctx_->local_heads() > 0, flags,
                              ctx_->core_attends_blocks());
  }

  /// What keep_memory_of_parked_requests() keeps.
  struct Kept {
    std::vector<std::shared_ptr<workspace_type>> workspaces;
    scratch_type scratch;
    std::vector<std::any> ring;
  };

  const context_type* ctx_;
  mutable pool_type pool_;
  mutable scratch_type scratch_;
  mutable RingAttention<T, ExecSpace, Core> ring_;  // the ring driver's buffers (two-level meshes only)
};

}  // namespace mlacp::detail
