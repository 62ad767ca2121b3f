// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The memory both MLA schedules share, owned per configuration the way an FFT plan owns its buffers: after the first
// iteration forward and backward allocate no View of their own. Each schedule extends it with its own buffers
// (latent_schedule.hpp: LatentForwardWorkspace, LatentScratch; expanded_schedule.hpp: ExpandedForwardWorkspace,
// ExpandedScratch) and owns a pool of its workspaces and one scratch.
//
// Two kinds of memory:
// - what one forward pass saves for its backward (activations, the pieces' saved state): a forward workspace, one per
//   forward pending at a time, borrowed from the schedule's pool by forward() and given back when the Forward is
//   consumed by backward() or destroyed, so that forward, forward, backward, backward (gradient accumulation) works
//   and the steady state allocates nothing;
// - scratch that lives only inside one forward() or backward() call (temporaries, the backward's gradients of the
//   activations, send buffers of collectives waited inside the call): one per layer, reused by every call.
// Buffers (detail::Buffer) are allocated on first use, sized by the largest pass seen and reused by smaller ones, so
// that calls of any shape allocate nothing once the largest has run (the output y alone is exactly its pass's shape:
// the caller may keep it), and paths that a gradient flag skips never allocate. Reuse is ordered when the calls of a
// layer run on the same execution-space instance (or are fenced between); a layer is used from one host thread at a
// time (detail::EntryGuard refuses concurrent entry).
#pragma once

#include <mlacp/compat.hpp>
#include <mlacp/detail/buffer.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/mla/kernels/rope.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/mla/pieces/input_a2a.hpp>
#include <mlacp/mla/pieces/output_projection.hpp>
#include <mlacp/view_types.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::detail {

/// `view` itself when it already has extents `n...`, else a new uninitialised View of exactly them (assigned to
/// `view`): for what leaves the layer (the output y, which the caller may keep), never laid over a Buffer.
template <class ViewType, class... Extents>
const ViewType& ensure_exact(ViewType& view, const char* label, Extents... n) {
  const std::size_t want[] = {static_cast<std::size_t>(n)...};
  bool same = view.data() != nullptr;
  for (std::size_t d = 0; same && d < sizeof...(n); ++d) same = view.extent(d) == want[d];
  if (!same)
    view =
        ViewType(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), static_cast<std::size_t>(n)...);
  return view;
}

/// A RoPE table (kernels/rope.hpp) laid over Buffers: rebuilt in place for any number of rows, allocating only when
/// a pass has more rows than any before.
template <class MemSpace>
struct RopeTableBuffers {
  RopeTable<MemSpace> table;
  Buffer<Matrix<double, MemSpace>> cos, sin;

  /// `table` laid out for `tokens` rows of this width and these frequencies, not yet filled (rope_fill_table or
  /// refill_rope_table fill it).
  RopeTable<MemSpace>& lay_out(std::int64_t tokens, int width, const RopeFrequencies& frequencies) {
    table = RopeTable<MemSpace>();
    table.cos = cos.ensure("mlacp::rope cos", tokens, width / 2);
    table.sin = sin.ensure("mlacp::rope sin", tokens, width / 2);
    table.width = width;
    table.frequencies = frequencies;
    return table;
  }
  std::size_t bytes() const { return bytes_of(cos, sin); }
};

/// The packed documents of one forward pass (MlaAttention::forward's cu_seqlens, or the configuration's) and this
/// rank's RoPE positions and table for them: kept with the pass so that its backward uses the same layout, and reused
/// (rebuilt in place, no allocation within MlaConfig::max_documents) when the next pass in the workspace brings
/// another. `stale`: the layout or S changed since the table was built.
template <class MemSpace>
struct ForwardDocuments {
  DocumentLayout layout;
  Buffer<Kokkos::View<std::int64_t*, MemSpace>> positions;  ///< [s], position of each local token in its document
  RopeTableBuffers<MemSpace> table;                         ///< built from `positions` (packed documents only)
  int seq = -1;                                             ///< the S of the pass that assigned the layout last
  bool stale = true;
};

/// What one forward pass keeps for its backward, the part both schedules have. Buffers are owned and reused; `saved`
/// Views may alias them or hold collective results, and are dropped (with the pieces' state) when the pass is
/// consumed. A schedule's workspace derives from it and adds its own buffers (and lists them in for_each_buffer).
template <class T, class ExecSpace>
struct ForwardWorkspace {
  using memory_space = typename ExecSpace::memory_space;
  using tensor3 = Tensor3<T, memory_space>;
  using tensor4 = Tensor4<T, memory_space>;
  /// Statistics (RMSNorm's rstd, the softmax's log-sum-exp) are kept in the accumulation type: float for bf16.
  using statistic_type = compat::accumulation_t<T>;

  ForwardWorkspace() = default;
  ForwardWorkspace(const ForwardWorkspace&) = delete;
  ForwardWorkspace& operator=(const ForwardWorkspace&) = delete;
  virtual ~ForwardWorkspace() = default;

  // Owned buffers, allocated on first use.
  tensor3 y;                                            ///< [B, s, D], the output (exactly its shape: the caller's)
  Buffer<tensor3> kv_a;                                 ///< [B, s, R+dr], x w_kva^T
  Buffer<Vector<statistic_type, memory_space>> rstd;    ///< [B*s]
  Buffer<tensor4> q_local;                              ///< [B, s, H, dqk] (the head-local q when P = 1)
  Buffer<tensor3> q_a;                                  ///< q-LoRA: [B, s, Rq], x w_qa^T (the query RMSNorm's input)
  Buffer<tensor3> cq;                                   ///< q-LoRA: [B, s, Rq], its RMSNorm (w_qb's input)
  Buffer<Vector<statistic_type, memory_space>> rstd_q;  ///< q-LoRA: [B*s], the query RMSNorm's rstd
  Buffer<tensor4> o;                                    ///< [B, S, h, dv]
  // Destinations of the forward collectives whose results backward reads (P > 1; at P == 1 a collective returns its
  // input): the head-local q and the token-local attention output.
  Buffer<tensor4> q_heads;                            ///< [B, S, h, dqk]
  Buffer<tensor4> o_tokens;                           ///< [B, s, H, dv]
  Buffer<Tensor3<statistic_type, memory_space>> lse;  ///< [B, h, S]
  ForwardDocuments<memory_space> documents;           ///< this pass's packed documents and RoPE table

  // Saved for backward: head-local q, k, v (buffers or collective results), and the pieces' state.
  tensor4 q_saved, k_saved, v_saved;
  OutputProjection<T, ExecSpace> out_proj;
  InputA2APair<T, ExecSpace> q_pair;

  /// Bytes of the buffers this workspace owns (its y included while it still references it); a schedule's workspace
  /// adds its own.
  virtual std::size_t owned_bytes() const {
    return bytes_of(y, kv_a, rstd, q_local, q_a, cq, rstd_q, o, q_heads, o_tokens, lse, documents.positions) +
           documents.table.bytes();
  }

  /// Drops everything a consumed pass referenced outside the owned buffers (collective results, the pieces' state).
  virtual void release() {
    q_saved = k_saved = v_saved = tensor4();
    out_proj = OutputProjection<T, ExecSpace>();
    q_pair = InputA2APair<T, ExecSpace>();
  }
};

/// Scratch both schedules use inside one forward() or backward() call; a schedule's scratch derives from it.
template <class T, class ExecSpace>
struct SharedScratch {
  using memory_space = typename ExecSpace::memory_space;
  Buffer<Tensor5<T, memory_space>> d_o_blocks;  ///< [P, B, s, h, dv], the dO all-to-all's input
  Buffer<Tensor5<T, memory_space>> d_o_heads;   ///< [1, B, S, h, dv], the dO all-to-all's result (P > 1)
  Buffer<Tensor4<T, memory_space>> dq, dk, dv;  ///< [B, S, h, *], the attention core's gradients
  Buffer<Tensor5<T, memory_space>> dq_blocks;   ///< [P, B, s, h, dqk], the dQ inverse all-to-all's result (P > 1)
  Buffer<Tensor3<T, memory_space>> d_kv_a;      ///< [B, s, R+dr], the payload's gradient before the RMSNorm backward
  Buffer<Tensor3<T, memory_space>> d_cq, d_qa;  ///< q-LoRA: [B, s, Rq], the gradients of w_qb's input and x w_qa^T
  OutputExchangeBuffers<T, memory_space> o_exchange;  ///< forward: the O exchange's blocks in T (P > 1)
};

/// One forward pass as a schedule sees it: its input x [B, s, D], the gradients its backward will produce, and the
/// workspace it borrowed from the schedule's pool (W: the schedule's workspace type). It converts to the pass the
/// shared steps take (W = ForwardWorkspace).
template <class T, class ExecSpace, class W = ForwardWorkspace<T, ExecSpace>>
struct ForwardPass {
  const Tensor3<T, typename ExecSpace::memory_space>& x;
  const MlaRequiresGrad& flags;
  W& w;

  // Only where W is a schedule's own workspace: to its own type the conversion would never be called (nvcc warns
  // #554-D).
  template <class V = W, std::enable_if_t<!std::is_same_v<V, ForwardWorkspace<T, ExecSpace>>, int> = 0>
  operator ForwardPass<T, ExecSpace>() const {
    return {x, flags, w};
  }
};

/// A schedule's per-forward workspaces (W derives from ForwardWorkspace). A workspace is free when no Forward holds
/// it. A caller's output View does not pin it: when a free workspace whose y the caller still holds is taken again, it
/// lets that y go (the caller's View keeps only its own allocation) and writes a new one, so held outputs cost their
/// own bytes and nothing more. At most max_free() free workspaces are kept (default kDefaultMaxFree; the others are
/// released when a workspace is taken, or by trim()): a loop with at most that many forwards pending at once allocates
/// nothing after its first iteration, and memory after a burst of pending forwards (gradient accumulation) comes back
/// down to that bound.
template <class W>
class ForwardWorkspacePool {
 public:
  using workspace_type = W;
  static constexpr std::size_t kDefaultMaxFree = 2;

  /// A free workspace, or a new one when all are in use. Free workspaces beyond max_free() are released.
  std::shared_ptr<W> acquire() {
    std::shared_ptr<W> taken;
    for (const auto& w : workspaces_)
      if (w.use_count() == 1) {
        taken = w;
        break;
      }
    if (!taken) {
      workspaces_.push_back(std::make_shared<W>());
      taken = workspaces_.back();
    }
    // The caller still holds the y this workspace wrote last: it keeps it, the workspace writes a new one.
    if (taken->y.data() != nullptr && taken->y.use_count() > 1) taken->y = typename W::tensor3();
    trim(max_free_);
    return taken;
  }

  /// Releases free workspaces until at most `keep` are left (workspaces held by a Forward stay).
  void trim(std::size_t keep) {
    std::size_t free = 0;
    for (auto it = workspaces_.begin(); it != workspaces_.end();) {
      if (it->use_count() == 1 && ++free > keep) {
        it = workspaces_.erase(it);
      } else {
        ++it;
      }
    }
  }

  /// How many free workspaces are kept for reuse.
  std::size_t max_free() const { return max_free_; }
  void set_max_free(std::size_t n) {
    max_free_ = n;
    trim(max_free_);
  }

  /// Workspaces owned (free or not).
  std::size_t size() const { return workspaces_.size(); }
  /// The workspaces themselves (shared: a copy keeps them allocated).
  const std::vector<std::shared_ptr<W>>& all() const { return workspaces_; }
  /// Workspaces held by a Forward (its backward has not run yet).
  std::size_t in_use() const {
    std::size_t n = 0;
    for (const auto& w : workspaces_) n += w.use_count() == 1 ? 0 : 1;
    return n;
  }
  /// Bytes of the buffers the workspaces own.
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& w : workspaces_) n += w->owned_bytes();
    return n;
  }

 private:
  std::vector<std::shared_ptr<W>> workspaces_;
  std::size_t max_free_ = kDefaultMaxFree;
};

}  // namespace mlacp::detail
