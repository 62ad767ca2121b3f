// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the two schedules (latent_schedule.hpp, expanded_schedule.hpp) share: their types, their context, and the
// memory they own (the per-forward workspaces, the per-call scratch and the ring driver's buffers). A schedule adds
// its Forward and Backward, the executors of its timeline (timeline.hpp).
#pragma once

#include <mlacp/mla/detail/forward_workspace.hpp>
#include <mlacp/mla/detail/ring_attention.hpp>
#include <mlacp/mla/detail/schedule_context.hpp>

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

 protected:
  /// The timeline's facts of this rank for a pass with `flags`.
  timeline::Facts facts(const MlaRequiresGrad& flags) const {
    return timeline::facts_of(ctx_->config(), ctx_->mesh().size(), ctx_->ring_size(), ctx_->local_heads() > 0, flags);
  }

  const context_type* ctx_;
  mutable pool_type pool_;
  mutable scratch_type scratch_;
  mutable RingAttention<T, ExecSpace, Core> ring_;  // the ring driver's buffers (two-level meshes only)
};

}  // namespace mlacp::detail
