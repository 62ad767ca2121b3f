// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MLA layer's memory, owned by the layer per configuration the way an FFT plan owns its buffers: after the first
// iteration forward and backward allocate no View of their own.
//
// Two kinds of memory:
// - what one forward pass saves for its backward (activations, the pieces' saved state): a ForwardWorkspace, one per
//   forward pending at a time, borrowed from the layer's pool by forward() and given back when the Forward is consumed
//   by backward() or destroyed, so that forward, forward, backward, backward (gradient accumulation) works and the
//   steady state allocates nothing;
// - scratch that lives only inside one forward() or backward() call (temporaries, the backward's gradients of the
//   activations, send buffers of collectives waited inside the call): one LayerScratch per layer, reused by every call.
// Buffers are allocated on first use with the shape the configuration gives, so paths that a gradient flag skips never
// allocate. Reuse is ordered when the calls of a layer run on the same execution-space instance (or are fenced
// between); a layer is used from one host thread at a time (its collectives must be issued in the same order on every
// rank anyway).
#pragma once

#include <mlacp/mla/document_layout.hpp>
#include <mlacp/mla/input_a2a.hpp>
#include <mlacp/mla/kv_layout.hpp>
#include <mlacp/mla/latent_kv_linear.hpp>
#include <mlacp/mla/output_projection.hpp>
#include <mlacp/mla/rope.hpp>
#include <mlacp/view_types.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::detail {

/// `view` itself when it already has extents `n...`, else a new uninitialised View of them (assigned to `view`): the
/// first use allocates, every later one reuses.
template <class ViewType, class... Extents>
const ViewType& ensure(ViewType& view, const char* label, Extents... n) {
  const std::size_t want[] = {static_cast<std::size_t>(n)...};
  bool same = view.data() != nullptr;
  for (std::size_t d = 0; same && d < sizeof...(n); ++d) same = view.extent(d) == want[d];
  if (!same)
    view =
        ViewType(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), static_cast<std::size_t>(n)...);
  return view;
}

/// The packed documents of one forward pass (MlaAttention::forward's cu_seqlens, or the configuration's) and this
/// rank's RoPE positions and table for them: kept with the pass so that its backward uses the same layout, and reused
/// (rebuilt in place, no allocation within MlaConfig::max_documents) when the next pass in the workspace brings
/// another. `stale`: the layout changed since the table was built.
template <class MemSpace>
struct ForwardDocuments {
  DocumentLayout layout;
  Kokkos::View<std::int64_t*, MemSpace> positions;  ///< [s], position of each local token within its document
  RopeTable<MemSpace> table;                        ///< built from `positions` (packed documents only)
  bool stale = true;
};

/// What one forward pass keeps for its backward. Buffers are owned and reused; `saved` Views may alias them or hold
/// collective results, and are dropped (with the pieces' state) when the pass is consumed.
template <class T, class ExecSpace>
struct ForwardWorkspace {
  using memory_space = typename ExecSpace::memory_space;
  using tensor3 = Tensor3<T, memory_space>;
  using tensor4 = Tensor4<T, memory_space>;

  // Owned buffers, allocated on first use.
  tensor3 y;                     ///< [B, s, D], the output
  tensor3 kv_a;                  ///< [B, s, R+dr], x w_kva^T
  Vector<T, memory_space> rstd;  ///< [B*s]
  tensor3 c;                     ///< [B, s, R] (expanded) normalised latent
  tensor3 latent;                ///< [B, S, R] (latent) gathered latent
  tensor4 q_local;               ///< [B, s, H, dqk] (the head-local q when P = 1)
  tensor4 k_local, v_local;      ///< (expanded) token-local k, v
  tensor4 k, v;                  ///< (latent) head-local k, v
  tensor4 o;                     ///< [B, S, h, dv]
  // Destinations of the forward collectives whose results backward reads (P > 1; at P == 1 a collective returns its
  // input): the head-local q (and k, v in the expanded strategy) and the token-local attention output.
  tensor4 q_heads, k_heads, v_heads;         ///< [B, S, h, d]
  tensor4 o_tokens;                          ///< [B, s, H, dv]
  Tensor3<T, memory_space> lse;              ///< [B, h, S]
  ForwardDocuments<memory_space> documents;  ///< this pass's packed documents and RoPE table

  // Saved for backward: head-local q, k, v (buffers above or collective results), and the pieces' state.
  tensor4 q_saved, k_saved, v_saved;
  OutputProjection<T, ExecSpace> out_proj;
  LatentKVLinear<T, ExecSpace> latent_kv;
  InputA2APair<T, ExecSpace> q_pair, k_pair, v_pair;

  /// Drops everything a consumed pass referenced outside the owned buffers (collective results, the pieces' state).
  void release() {
    q_saved = k_saved = v_saved = tensor4();
    out_proj = OutputProjection<T, ExecSpace>();
    latent_kv = LatentKVLinear<T, ExecSpace>();
    q_pair = InputA2APair<T, ExecSpace>();
    k_pair = InputA2APair<T, ExecSpace>();
    v_pair = InputA2APair<T, ExecSpace>();
  }
};

/// Scratch used inside one forward() or backward() call only.
template <class T, class ExecSpace>
struct LayerScratch {
  using memory_space = typename ExecSpace::memory_space;
  using tensor3 = Tensor3<T, memory_space>;
  using tensor4 = Tensor4<T, memory_space>;
  using tensor5 = Tensor5<T, memory_space>;

  // forward
  tensor3 payload;   ///< (latent) [B, s, R+dr], the all-gather's input
  tensor3 kv;        ///< (latent) [B, S, h*(dn+dv)]; (expanded, as [B, s, H*(dn+dv)])
  tensor3 kpe;       ///< (expanded) [B, s, dr], the rotated shared key
  tensor3 gathered;  ///< (latent, P > 1) [B, S, R+dr], the all-gather's result
  // backward
  tensor5 d_o_blocks;    ///< [P, B, s, h, dv], the dO all-to-all's input
  tensor4 dq, dk, dv;    ///< [B, S, h, *], the attention core's gradients
  tensor3 dkv;           ///< [B, S, h*(dn+dv)] (latent) or [B, s, H*(dn+dv)] (expanded)
  tensor3 dkpe;          ///< [B, S, dr] (latent) or [B, s, dr] (expanded)
  tensor3 grad_payload;  ///< (latent) [B, S, R+dr], the reduce-scatter's input
  tensor3 grad_latent;   ///< (latent) [B, S, R]
  tensor3 dc;            ///< (expanded) [B, s, R]
  tensor3 d_kv_a;        ///< [B, s, R+dr]
  // Destinations of the backward collectives (P > 1), read within the backward call.
  tensor5 d_o_heads;                        ///< [1, B, S, h, dv], the dO all-to-all's result
  tensor5 dq_blocks, dk_blocks, dv_blocks;  ///< [P, B, s, h, d], the inverse all-to-alls' results
  tensor3 d_payload;                        ///< (latent) [B, s, R+dr], the reduce-scatter's result
  RopeTable<memory_space> rope;             ///< this rank's token positions in one document, built once
};

/// Bytes of the buffers a workspace owns (its y included while it still references it).
template <class T, class ExecSpace>
std::size_t owned_bytes(const ForwardWorkspace<T, ExecSpace>& w) {
  std::size_t n = 0;
  auto add = [&n](const auto& view) { n += view.span() * sizeof(typename std::decay_t<decltype(view)>::value_type); };
  add(w.y);
  add(w.kv_a);
  add(w.rstd);
  add(w.c);
  add(w.latent);
  add(w.q_local);
  add(w.k_local);
  add(w.v_local);
  add(w.k);
  add(w.v);
  add(w.o);
  add(w.q_heads);
  add(w.k_heads);
  add(w.v_heads);
  add(w.o_tokens);
  add(w.lse);
  add(w.documents.positions);
  add(w.documents.table.cos);
  add(w.documents.table.sin);
  return n;
}

/// The layer's per-forward workspaces. A workspace is free when no Forward holds it. A caller's output View does not
/// pin it: when a free workspace whose y the caller still holds is taken again, it lets that y go (the caller's View
/// keeps only its own allocation) and writes a new one, so held outputs cost their own bytes and nothing more.
/// At most max_free() free workspaces are kept (default kDefaultMaxFree; the others are released when a workspace is
/// taken, or by trim()): a loop with at most that many forwards pending at once allocates nothing after its first
/// iteration, and memory after a burst of pending forwards (gradient accumulation) comes back down to that bound.
template <class T, class ExecSpace>
class ForwardWorkspacePool {
 public:
  using workspace_type = ForwardWorkspace<T, ExecSpace>;
  static constexpr std::size_t kDefaultMaxFree = 2;

  /// A free workspace, or a new one when all are in use. Free workspaces beyond max_free() are released.
  std::shared_ptr<workspace_type> acquire() {
    std::shared_ptr<workspace_type> taken;
    for (const auto& w : workspaces_)
      if (w.use_count() == 1) {
        taken = w;
        break;
      }
    if (!taken) {
      workspaces_.push_back(std::make_shared<workspace_type>());
      taken = workspaces_.back();
    }
    // The caller still holds the y this workspace wrote last: it keeps it, the workspace writes a new one.
    if (taken->y.data() != nullptr && taken->y.use_count() > 1) taken->y = typename workspace_type::tensor3();
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
  /// Workspaces held by a Forward (its backward has not run yet).
  std::size_t in_use() const {
    std::size_t n = 0;
    for (const auto& w : workspaces_) n += w.use_count() == 1 ? 0 : 1;
    return n;
  }
  /// Bytes of the buffers the workspaces own.
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& w : workspaces_) n += owned_bytes(*w);
    return n;
  }

 private:
  std::vector<std::shared_ptr<workspace_type>> workspaces_;
  std::size_t max_free_ = kDefaultMaxFree;
};

}  // namespace mlacp::detail
