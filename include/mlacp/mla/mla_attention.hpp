// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MLA attention layer under Ulysses context parallelism, with the backward-overlap schedule of
// shared/reference/mla_backward_overlap.py re-created from its pieces (OutputProjection, InputA2APair,
// LatentKVLinear). The numbers are MLA_SPEC's.
#pragma once

#include <mlacp/all_gather.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/detail/finite_check.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/config.hpp>
#include <mlacp/mla/flash_attention.hpp>
#include <mlacp/mla/input_a2a.hpp>
#include <mlacp/mla/kv_layout.hpp>
#include <mlacp/mla/latent_kv_linear.hpp>
#include <mlacp/mla/linear.hpp>
#include <mlacp/mla/mla_workspace.hpp>
#include <mlacp/mla/output_projection.hpp>
#include <mlacp/mla/rms_norm.hpp>
#include <mlacp/mla/rope.hpp>
#include <mlacp/mla/view_utils.hpp>
#include <mlacp/mla/weights.hpp>

#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp {

/// Multi-head Latent Attention on a Ulysses group. Every rank holds all weights and its token shard
/// x [B, s, D], s = S / P, rank r owning global tokens [r*s, (r+1)*s).
///
/// forward() returns a Forward: the output y [B, s, D] and what backward needs (saved operands and the paired
/// collective state). backward() consumes it exactly once and overlaps: the dO all-to-all with the w_o weight
/// gradient; the inverse all-to-all of dQ with the KV path's backward (latent) or dK/dV with the Q branch (expanded);
/// the latent reduce-scatter with the w_kvb weight gradient. Weight gradients are this rank's partial sums
/// (MLA_SPEC); sum them over the ranks as a data-parallel reduction would.
///
/// Core: the attention core on head-local q [B,S,h,dqk], k [B,S,h,dqk], v [B,S,h,dv] -> o [B,S,h,dv] with a saved
/// lse [B,h,S]; the default is the tiled FlashAttentionCore; see attention_core.hpp for the interface a user-supplied
/// core provides (CausalAttentionCore there is the simple reference core).
///
/// Memory: the layer owns its activations and scratch per configuration (mla_workspace.hpp). A Forward borrows a
/// per-forward workspace from the layer's pool and gives it back when backward consumes it or when it is destroyed;
/// several Forwards may be pending at once (gradient accumulation). After the first iteration of a loop, forward and
/// backward into caller-provided gradients allocate no View of the layer's (at P > 1 the collectives still allocate
/// their results: they take no destination). y stays valid for as long as the caller holds it: a workspace whose output
/// is still referenced is not reused. A layer is used from one host thread at a time.
///
/// Errors (InvalidArgument / UsageError), raised before any collective is launched and, on a checked mesh, on every
/// rank: configuration (heads or seq not divisible by P, ...), weights whose shapes disagree with it, x or dy of the
/// wrong shape or differing across ranks, backward before forward, a second backward of the same forward.
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace, class Core = FlashAttentionCore>
class MlaAttention {
 public:
  using value_type = T;
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using tensor3 = detail::Tensor3<T, memory_space>;
  using tensor4 = detail::Tensor4<T, memory_space>;
  using tensor5 = detail::Tensor5<T, memory_space>;
  using weights_type = MlaWeights<T, memory_space>;
  using gradients_type = MlaGradients<T, memory_space>;

  /// The state of one forward pass: move-only, consumed by exactly one backward.
  class Forward {
   public:
    Forward() = default;
    Forward(const Forward&) = delete;
    Forward& operator=(const Forward&) = delete;

    Forward(Forward&& other) noexcept = default;
    Forward& operator=(Forward&& other) noexcept {
      if (this != &other) {
        give_back();
        owner_ = other.owner_;
        backward_done_ = other.backward_done_;
        flags_ = other.flags_;
        y_ = std::move(other.y_);
        x_ = std::move(other.x_);
        ws_ = std::move(other.ws_);
      }
      return *this;
    }
    ~Forward() { give_back(); }

    /// The layer's output y [B, s, D] (valid as long as it is held, also after backward).
    const tensor3& output() const { return y_; }
    bool backward_done() const { return backward_done_; }
    /// Whether this Forward still holds a workspace of its layer (from forward until backward consumes it).
    bool holds_workspace() const { return ws_ != nullptr; }

   private:
    friend class MlaAttention;
    // Gives the workspace back to the layer's pool, dropping what it references beyond its own buffers.
    void give_back() noexcept {
      if (ws_) ws_->release();
      ws_.reset();
      x_ = tensor3();
    }

    const MlaAttention* owner_ = nullptr;
    bool backward_done_ = false;
    MlaRequiresGrad flags_;
    tensor3 y_, x_;
    std::shared_ptr<detail::ForwardWorkspace<T, ExecSpace>> ws_;
  };

  /// Collective over the mesh (checks the configuration and weights on every rank). The mesh must outlive the layer;
  /// the weights are shared Views (updates by the caller are seen by the layer).
  MlaAttention(const MlaConfig& config, weights_type weights, const Mesh& mesh, Core core = {})
      : config_(config), weights_(std::move(weights)), mesh_(&mesh), core_(std::move(core)) {
    std::string error = config_.error(mesh.size());
    if (error.empty()) error = detail::weights_error(config_, weights_, "weight");
    detail::agree_or_throw(mesh, "mlacp::MlaAttention", error, config_fields(), config_.describe());
  }

  /// Not copyable or movable: a pending Forward refers to its layer (and to the workspace the layer owns), so the
  /// layer stays where it was built while any Forward of it may still run its backward.
  MlaAttention(const MlaAttention&) = delete;
  MlaAttention& operator=(const MlaAttention&) = delete;
  MlaAttention(MlaAttention&&) = delete;
  MlaAttention& operator=(MlaAttention&&) = delete;
  ~MlaAttention() = default;

  const MlaConfig& config() const { return config_; }
  const weights_type& weights() const { return weights_; }
  const Mesh& mesh() const { return *mesh_; }
  int local_seq() const { return config_.seq / mesh_->size(); }
  int local_heads() const { return config_.heads / mesh_->size(); }

  /// Per-forward workspaces the layer owns, and how many of them a pending Forward (or a held output) uses.
  std::size_t forward_workspaces() const { return memory_.pool.size(); }
  std::size_t forward_workspaces_in_use() const { return memory_.pool.in_use(); }

  /// x [B, s, D] -> Forward (y and saved state). `requires_grad` says which gradients backward will produce; it must
  /// be the same on every rank.
  Forward forward(const ExecSpace& space, const tensor3& x, const MlaRequiresGrad& requires_grad = {}) const {
    check_input(space, "forward", "x", x, requires_grad, "", "");
    compat::ScopedRegion region("mlacp::MlaAttention::forward");
    Forward f;
    f.owner_ = this;
    f.flags_ = requires_grad;
    f.x_ = x;
    f.ws_ = memory_.pool.acquire();
    if (config_.strategy == MlaStrategy::latent)
      forward_latent(space, f, *f.ws_);
    else
      forward_expanded(space, f, *f.ws_);
    return f;
  }

  /// Fresh gradients (zero-initialised, then accumulated) for every flag set at forward; dx in `dx`.
  gradients_type backward(const ExecSpace& space, Forward& f, const tensor3& dy) const {
    gradients_type g;
    backward(space, f, dy, g);
    return g;
  }

  /// Accumulates (+=) the gradients into `grads`; a View that is empty and needed is allocated (zeroed) first. Views
  /// the caller provides are used as they are (no temporary of a weight's size): with all of them provided, a steady
  /// loop allocates nothing.
  void backward(const ExecSpace& space, Forward& f, const tensor3& dy, gradients_type& grads) const {
    // Misuse and dy's shape are checked together, so that every rank takes part in the same agreement (checked mode)
    // and raises the same error, whichever rank misused the layer.
    std::string state_error;
    if (f.owner_ == nullptr)
      state_error = "mlacp::MlaAttention::backward: backward before forward (this Forward holds no forward pass)";
    else if (f.owner_ != this)
      state_error = "mlacp::MlaAttention::backward: the Forward was produced by another MlaAttention layer";
    else if (f.backward_done_)
      state_error =
          "mlacp::MlaAttention::backward: a second backward of the same forward (each Forward is consumed once)";
    // The caller's gradient Views are checked before the agreement too: a bad one on one rank raises the same error
    // on every rank, before any collective, instead of a hang or a write out of bounds.
    check_input(space, "backward", "dy", dy, f.flags_, state_error, gradients_error(grads));
    f.backward_done_ = true;
    compat::ScopedRegion region("mlacp::MlaAttention::backward");
    allocate_missing(grads, f.flags_);
    if (config_.strategy == MlaStrategy::latent)
      backward_latent(space, f, *f.ws_, dy, grads);
    else
      backward_expanded(space, f, *f.ws_, dy, grads);
    f.give_back();
  }

 private:
  using matrix_rows = Kokkos::View<T**, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using vector_part = Kokkos::View<T*, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  static bool needs_q(const MlaRequiresGrad& r) { return r.x || r.w_q || r.b_q; }
  static bool needs_payload(const MlaRequiresGrad& r) { return r.x || r.w_kva || r.g_kv; }
  static bool needs_kv(const MlaRequiresGrad& r) { return needs_payload(r) || r.w_kvb || r.b_kvb; }
  static bool needs_attention(const MlaRequiresGrad& r) { return needs_q(r) || needs_kv(r); }

  // Every setting that changes which collective runs or which numbers come out; the doubles as their bit patterns
  // (equal settings have equal bits, and the message names the setting).
  detail::AgreementFields config_fields() const {
    auto bits = [](double v) {
      std::int64_t b = 0;
      std::memcpy(&b, &v, sizeof b);
      return b;
    };
    return {{"batch", config_.batch},
            {"seq", config_.seq},
            {"hidden", config_.hidden},
            {"heads", config_.heads},
            {"nope", config_.nope},
            {"rope", config_.rope},
            {"vdim", config_.vdim},
            {"latent", config_.latent},
            {"bias", config_.bias},
            {"strategy", static_cast<int>(config_.strategy)},
            {"overlap", config_.overlap},
            {"rope_base (bit pattern of the double)", bits(config_.rope_base)},
            {"rms_eps (bit pattern of the double)", bits(config_.rms_eps)}};
  }

  // The caller's gradient Views that are provided (allocated) must have exactly their weight's shape (dx: x's), else
  // a message naming the first that does not; "" when all fit. Empty Views are allocated later where needed.
  std::string gradients_error(const gradients_type& g) const {
    const auto H = static_cast<std::size_t>(config_.heads), D = static_cast<std::size_t>(config_.hidden);
    const auto qk = static_cast<std::size_t>(config_.qk_dim()),
               kv = static_cast<std::size_t>(config_.nope + config_.vdim);
    const auto R = static_cast<std::size_t>(config_.latent), dr = static_cast<std::size_t>(config_.rope);
    const auto dv = static_cast<std::size_t>(config_.vdim);
    std::string error;
    // The View's extents against `expected` (its rank's std::array), in attention_core.hpp's shape notation.
    auto check = [&](const char* name, const auto& view, const auto& expected) {
      if (!error.empty() || view.data() == nullptr) return;
      auto got = expected;
      for (std::size_t d = 0; d < got.size(); ++d) got[d] = view.extent(d);
      if (got == expected) return;
      error = std::string("mlacp::MlaAttention::backward: gradient ") + name + " has shape " +
              detail::extents_string(got) + "; expected " + detail::extents_string(expected) + " on rank " +
              std::to_string(mesh_->rank());
    };
    using shape1 = std::array<std::size_t, 1>;
    using shape2 = std::array<std::size_t, 2>;
    check("w_q", g.w_q, shape2{H * qk, D});
    check("b_q", g.b_q, shape1{H * qk});
    check("w_kva", g.w_kva, shape2{R + dr, D});
    check("g_kv", g.g_kv, shape1{R});
    check("w_kvb", g.w_kvb, shape2{H * kv, R});
    check("b_kvb", g.b_kvb, shape1{H * kv});
    check("w_o", g.w_o, shape2{D, H * dv});
    check("b_o", g.b_o, shape1{D});
    check(
        "dx", g.dx,
        std::array<std::size_t, 3>{static_cast<std::size_t>(config_.batch), static_cast<std::size_t>(local_seq()), D});
    return error;
  }

  // Checks t's shape and agrees with the other ranks on it and on the flags; `usage_error` (misuse found by the
  // caller) takes precedence and is raised as UsageError, then t's shape, then `other_error` (e.g. the gradients'),
  // then the finite check (on the caller's instance `space`, which orders it after whatever wrote t).
  void check_input(const ExecSpace& space, const char* where, const char* name, const tensor3& t,
                   const MlaRequiresGrad& r, const std::string& usage_error, const std::string& other_error) const {
    const auto B = static_cast<std::size_t>(config_.batch), s = static_cast<std::size_t>(local_seq());
    const auto D = static_cast<std::size_t>(config_.hidden);
    std::string error = usage_error;
    if (error.empty() &&
        (t.extent(0) != B || t.extent(1) != s || t.extent(2) != D || (t.data() == nullptr && t.size() != 0)))
      error = std::string("mlacp::MlaAttention::") + where + ": " + name + " has shape [" +
              std::to_string(t.extent(0)) + ", " + std::to_string(t.extent(1)) + ", " + std::to_string(t.extent(2)) +
              "]" + (t.data() == nullptr ? " (unallocated)" : "") + "; expected [B, S/P, D] = [" + std::to_string(B) +
              ", " + std::to_string(s) + ", " + std::to_string(D) +
              "] on a group of P = " + std::to_string(mesh_->size());
    if (error.empty()) error = other_error;
    if (error.empty() && mesh_->check_finite()) {
      const auto bad = detail::count_non_finite(space, t);
      if (bad > 0)
        error = std::string("mlacp::MlaAttention::") + where + ": " + name + " holds " + std::to_string(bad) +
                " non-finite value(s) (NaN or Inf) on rank " + std::to_string(mesh_->rank()) + " (finite check on)";
    }
    const int flags = r.x | r.w_q << 1 | r.b_q << 2 | r.w_kva << 3 | r.g_kv << 4 | r.w_kvb << 5 | r.b_kvb << 6 |
                      r.w_o << 7 | r.b_o << 8;
    detail::agree_or_throw(*mesh_, std::string("mlacp::MlaAttention::") + where, error,
                           {{std::string(name) + ".extent(0)", static_cast<std::int64_t>(t.extent(0))},
                            {std::string(name) + ".extent(1)", static_cast<std::int64_t>(t.extent(1))},
                            {std::string(name) + ".extent(2)", static_cast<std::int64_t>(t.extent(2))},
                            {"the gradient flags (MlaRequiresGrad)", flags}},
                           std::string(name) + " [" + std::to_string(t.extent(0)) + ", " + std::to_string(t.extent(1)) +
                               ", " + std::to_string(t.extent(2)) + "]",
                           !usage_error.empty());
  }

  // A collective's destination in the layer's memory (allocated once); empty at P == 1, where a collective returns
  // its input and writes nothing.
  template <class ViewType, class... Extents>
  ViewType into(ViewType& slot, const char* label, Extents... n) const {
    return mesh_->size() > 1 ? detail::ensure(slot, label, n...) : ViewType();
  }
  // The P head blocks [P, B, s, h, d] an inverse all-to-all receives.
  tensor5 blocks_into(tensor5& slot, const char* label, int d) const {
    return into(slot, label, mesh_->size(), config_.batch, local_seq(), local_heads(), d);
  }

  std::int64_t position_offset() const { return static_cast<std::int64_t>(mesh_->rank()) * local_seq(); }

  // The rank's head rows of w_kvb (and of its gradient): rows [r*h*(dn+dv), (r+1)*h*(dn+dv)).
  std::pair<std::size_t, std::size_t> selected_rows() const {
    const auto width = static_cast<std::size_t>(local_heads()) * static_cast<std::size_t>(config_.nope + config_.vdim);
    return {static_cast<std::size_t>(mesh_->rank()) * width, static_cast<std::size_t>(mesh_->rank() + 1) * width};
  }
  template <class M>
  matrix_rows rows_of(const M& m) const {
    if (m.data() == nullptr) return matrix_rows();
    const auto [begin, end] = selected_rows();
    return matrix_rows(m.data() + begin * m.extent(1), end - begin, m.extent(1));
  }
  template <class V>
  vector_part part_of(const V& v) const {
    if (v.data() == nullptr) return vector_part();
    const auto [begin, end] = selected_rows();
    return vector_part(v.data() + begin, end - begin);
  }

  using forward_workspace = detail::ForwardWorkspace<T, ExecSpace>;
  using scratch_type = detail::LayerScratch<T, ExecSpace>;

  // The RoPE table of this rank's token positions (fixed per rank and configuration): built on first use, read by
  // every rotation of q, k_pe and their gradients.
  const detail::RopeTable<memory_space>& rope_table(const ExecSpace& space) const {
    auto& table = memory_.scratch.rope;
    if (!table.matches(local_seq(), position_offset(), config_.rope, config_.rope_base))
      table = detail::make_rope_table(space, local_seq(), position_offset(), config_.rope, config_.rope_base);
    return table;
  }

  // q = RoPE(x w_q^T + b_q) [B, s, H, dqk], in the workspace.
  tensor4 project_q(const ExecSpace& space, Forward& f, forward_workspace& w) const {
    const int B = config_.batch, s = local_seq(), D = config_.hidden, H = config_.heads, dqk = config_.qk_dim();
    const tensor4& q = detail::ensure(w.q_local, "mlacp::q", B, s, H, dqk);
    detail::ComputePhase<ExecSpace> phase(space, "w_q fprop");
    detail::linear_forward(space, detail::as_matrix(f.x_, B * s, D), weights_.w_q, weights_.b_q,
                           detail::as_matrix(q, B * s, H * dqk));
    rope_forward(space, q, config_.nope, q, config_.nope, rope_table(space));
    return q;
  }

  // kv_a = x w_kva^T [B, s, R+dr] (saved for the RMSNorm backward), then RMSNorm(c) into columns [0, R) of
  // `latent_out` and RoPE(k_pe) into columns [rope_first, rope_first + dr) of `rope_out`: each kernel writes straight
  // where its result is used (the payload in the latent strategy, c and k_pe in the expanded one), no copies.
  void project_kv_a(const ExecSpace& space, Forward& f, forward_workspace& w, const tensor3& latent_out,
                    const tensor3& rope_out, int rope_first) const {
    const int B = config_.batch, s = local_seq(), D = config_.hidden, R = config_.latent, dr = config_.rope;
    detail::ComputePhase<ExecSpace> phase(space, "w_kva fprop");
    const tensor3& kv_a = detail::ensure(w.kv_a, "mlacp::kv_a", B, s, R + dr);
    detail::linear_forward(space, detail::as_matrix(f.x_, B * s, D), weights_.w_kva, vector_part(),
                           detail::as_matrix(kv_a, B * s, R + dr));
    rms_norm_forward(space, kv_a, weights_.g_kv, latent_out, detail::ensure(w.rstd, "mlacp::rstd", B * s),
                     config_.rms_eps);
    rope_forward(space, as_rank4(kv_a), R, as_rank4(rope_out), rope_first, rope_table(space));
  }

  void attend_and_project(const ExecSpace& space, Forward& f, forward_workspace& w) const {
    const int B = config_.batch, S = config_.seq, s = local_seq(), h = local_heads();
    detail::ensure(w.o, "mlacp::o", B, S, h, config_.vdim);
    detail::ensure(w.lse, "mlacp::lse", B, h, S);
    {
      detail::ComputePhase<ExecSpace> phase(space, "attention fprop");
      core_.forward(space, w.q_saved, w.k_saved, w.v_saved, w.o, w.lse);
    }
    f.y_ = w.out_proj.forward(space, w.o, weights_.w_o, weights_.b_o, *mesh_,
                              detail::ensure(w.y, "mlacp::y", B, s, config_.hidden),
                              into(w.o_tokens, "mlacp::o tokens", B, s, config_.heads, config_.vdim));
  }

  void forward_latent(const ExecSpace& space, Forward& f, forward_workspace& w) const {
    const int B = config_.batch, S = config_.seq, s = local_seq(), h = local_heads(), dn = config_.nope;
    const int dv = config_.vdim, dr = config_.rope, R = config_.latent;
    scratch_type& scratch = memory_.scratch;
    tensor4 q = project_q(space, f, w);
    // The Q all-to-all is launched before the independent KV expansion and waited after it.
    w.q_pair = InputA2APair<T, ExecSpace>(*mesh_, "Q");
    w.q_pair.launch_forward(space, q, needs_q(f.flags_), into(w.q_heads, "mlacp::q heads", B, S, h, dn + dr));
    const tensor3& payload = detail::ensure(scratch.payload, "mlacp::payload", B, s, R + dr);
    project_kv_a(space, f, w, payload, payload, R);
    tensor3 gathered = launch_all_gather(space, payload, 1, *mesh_, "payload all-gather",
                                         into(scratch.gathered, "mlacp::gathered payload", B, S, R + dr))
                           .wait();
    const tensor3& kv = detail::ensure(scratch.kv, "mlacp::kv", B, S, h * (dn + dv));
    // The shared key is read from the gathered payload by assemble_kv: no k_pe copy.
    w.latent_kv.forward(space, gathered, rows_of(weights_.w_kvb), part_of(weights_.b_kvb), *mesh_, kv, tensor3(),
                        detail::ensure(w.latent, "mlacp::latent", B, S, R));
    w.q_saved = w.q_pair.wait_forward();
    detail::assemble_kv(space, tensor4(kv.data(), B, S, h, dn + dv), gathered,
                        detail::ensure(w.k, "mlacp::k", B, S, h, dn + dr), detail::ensure(w.v, "mlacp::v", B, S, h, dv),
                        dn, R);
    w.k_saved = w.k;
    w.v_saved = w.v;
    attend_and_project(space, f, w);
  }

  void forward_expanded(const ExecSpace& space, Forward& f, forward_workspace& w) const {
    const int B = config_.batch, s = local_seq(), H = config_.heads, dn = config_.nope, dv = config_.vdim;
    const int dr = config_.rope, R = config_.latent;
    scratch_type& scratch = memory_.scratch;
    const tensor3& c = detail::ensure(w.c, "mlacp::c", B, s, R);
    const tensor3& kpe = detail::ensure(scratch.kpe, "mlacp::k_pe", B, s, dr);
    project_kv_a(space, f, w, c, kpe, 0);
    const tensor3& kv = detail::ensure(scratch.kv, "mlacp::kv", B, s, H * (dn + dv));
    {
      detail::ComputePhase<ExecSpace> phase(space, "w_kvb fprop");
      detail::linear_forward(space, detail::as_matrix(c, B * s, R), weights_.w_kvb, weights_.b_kvb,
                             detail::as_matrix(kv, B * s, H * (dn + dv)));
    }
    const tensor4& k = detail::ensure(w.k_local, "mlacp::k local", B, s, H, dn + dr);
    const tensor4& v = detail::ensure(w.v_local, "mlacp::v local", B, s, H, dv);
    detail::assemble_kv(space, tensor4(kv.data(), B, s, H, dn + dv), kpe, k, v, dn);
    // V, then K, then Q are launched as each is ready; all three are waited in Q, K, V order.
    const bool kv_grad = needs_kv(f.flags_);
    w.v_pair = InputA2APair<T, ExecSpace>(*mesh_, "V");
    w.k_pair = InputA2APair<T, ExecSpace>(*mesh_, "K");
    w.q_pair = InputA2APair<T, ExecSpace>(*mesh_, "Q");
    const int S = config_.seq, h = local_heads();
    w.v_pair.launch_forward(space, v, kv_grad, into(w.v_heads, "mlacp::v heads", B, S, h, dv));
    w.k_pair.launch_forward(space, k, kv_grad, into(w.k_heads, "mlacp::k heads", B, S, h, dn + dr));
    tensor4 q = project_q(space, f, w);
    w.q_pair.launch_forward(space, q, needs_q(f.flags_), into(w.q_heads, "mlacp::q heads", B, S, h, dn + dr));
    w.q_saved = w.q_pair.wait_forward();
    w.k_saved = w.k_pair.wait_forward();
    w.v_saved = w.v_pair.wait_forward();
    attend_and_project(space, f, w);
  }

  // Shared by both strategies: the output projection's backward (dO all-to-all overlapped with the w_o wgrad), then
  // the attention backward on head-local data: dq (if the Q branch needs it), dk and dv (if the KV path needs them).
  // False when nothing upstream of the attention needs a gradient (then nothing more runs).
  bool output_and_attention_backward(const ExecSpace& space, Forward& f, forward_workspace& w, const tensor3& dy,
                                     gradients_type& g, tensor4& dq, tensor4& dk, tensor4& dv) const {
    const MlaRequiresGrad& r = f.flags_;
    const int B = config_.batch, S = config_.seq, s = local_seq(), h = local_heads(), P = mesh_->size();
    scratch_type& scratch = memory_.scratch;
    tensor4 d_o = w.out_proj.backward(
        space, dy, needs_attention(r), r.w_o ? g.w_o : decltype(g.w_o)(),
        r.b_o && config_.bias ? g.b_o : decltype(g.b_o)(), config_.overlap,
        needs_attention(r) ? detail::ensure(scratch.d_o_blocks, "mlacp::dO blocks", P, B, s, h, config_.vdim)
                           : tensor5(),
        needs_attention(r) ? into(scratch.d_o_heads, "mlacp::dO heads", 1, B, S, h, config_.vdim) : tensor5());
    if (!needs_attention(r)) return false;
    // The core overwrites its gradients: the scratch needs no zeroing.
    if (needs_q(r)) dq = detail::ensure(scratch.dq, "mlacp::dq", B, S, h, config_.qk_dim());
    if (needs_kv(r)) {
      dk = detail::ensure(scratch.dk, "mlacp::dk", B, S, h, config_.qk_dim());
      dv = detail::ensure(scratch.dv, "mlacp::dv", B, S, h, config_.vdim);
    }
    detail::ComputePhase<ExecSpace> phase(space, "attention bprop");
    core_.backward(space, w.q_saved, w.k_saved, w.v_saved, w.o, w.lse, d_o, dq, dk, dv);
    return true;
  }

  // The token-local dq as the P head blocks [P, B, s, h, dqk] the inverse all-to-all received (block r: heads
  // [r*h, (r+1)*h)) -> w_q / b_q gradients and dx += dq w_q, one GEMM per block on w_q's rows of its heads (no unpack).
  void q_branch_backward(const ExecSpace& space, Forward& f, const tensor5& dq_blocks, gradients_type& g) const {
    const int B = config_.batch, s = local_seq(), D = config_.hidden, dqk = config_.qk_dim();
    const auto parts = static_cast<std::int64_t>(dq_blocks.extent(0)),
               h = static_cast<std::int64_t>(dq_blocks.extent(3));
    const std::int64_t rows = static_cast<std::int64_t>(B) * s, width = h * dqk;
    detail::ComputePhase<ExecSpace> phase(space, "q backward");
    // RoPE acts per token and head: the blocks are P*B batches of [s, h, dqk] with the same positions.
    const tensor4 blocks(dq_blocks.data(), parts * B, s, h, dqk);
    rope_backward(space, blocks, config_.nope, blocks, config_.nope, rope_table(space));
    const auto x2 = detail::as_matrix(f.x_, rows, D);
    for (std::int64_t r = 0; r < parts; ++r) {
      const detail::Matrix<T, memory_space> block(dq_blocks.data() + r * rows * width, static_cast<std::size_t>(rows),
                                                  static_cast<std::size_t>(width));
      const auto heads = std::make_pair(static_cast<std::size_t>(r * width), static_cast<std::size_t>((r + 1) * width));
      if (f.flags_.w_q) detail::linear_wgrad(space, block, x2, Kokkos::subview(g.w_q, heads, Kokkos::ALL()));
      if (f.flags_.b_q && config_.bias) detail::bias_grad(space, block, Kokkos::subview(g.b_q, heads));
      if (f.flags_.x)
        detail::linear_dgrad(space, block, Kokkos::subview(weights_.w_q, heads, Kokkos::ALL()), T(1),
                             detail::as_matrix(g.dx, rows, D));
    }
  }

  // The local payload gradient -> g_kv / w_kva gradients and dx += d(kv_a) w_kva. The latent's gradient is columns
  // [0, R) of `d_latent` [B, s, >= R]; the rotated key's is columns [rope_first, rope_first + dr) of `d_rope`. The
  // RoPE transpose writes straight into d(kv_a)'s last dr columns and the RMSNorm backward into its first R.
  void payload_backward(const ExecSpace& space, Forward& f, forward_workspace& w, const tensor3& d_latent,
                        const tensor3& d_rope, int rope_first, gradients_type& g) const {
    const int B = config_.batch, s = local_seq(), D = config_.hidden, R = config_.latent, dr = config_.rope;
    const tensor3& d_kv_a = detail::ensure(memory_.scratch.d_kv_a, "mlacp::d kv_a", B, s, R + dr);
    rope_backward(space, as_rank4(d_rope), rope_first, as_rank4(d_kv_a), R, rope_table(space));
    rms_norm_backward(space, w.kv_a, weights_.g_kv, w.rstd, d_latent, d_kv_a,
                      f.flags_.g_kv ? g.g_kv : decltype(g.g_kv)());
    const auto da2 = detail::as_matrix(d_kv_a, B * s, R + dr);
    if (f.flags_.w_kva) detail::linear_wgrad(space, da2, detail::as_matrix(f.x_, B * s, D), g.w_kva);
    if (f.flags_.x) detail::linear_dgrad(space, da2, weights_.w_kva, T(1), detail::as_matrix(g.dx, B * s, D));
  }

  void backward_latent(const ExecSpace& space, Forward& f, forward_workspace& w, const tensor3& dy,
                       gradients_type& g) const {
    const int B = config_.batch, S = config_.seq, h = local_heads(), dn = config_.nope, dv = config_.vdim;
    const int dr = config_.rope, R = config_.latent;
    const MlaRequiresGrad& r = f.flags_;
    scratch_type& scratch = memory_.scratch;
    tensor4 dq, dk, dvv;
    if (!output_and_attention_backward(space, f, w, dy, g, dq, dk, dvv)) return;
    // The inverse all-to-all of dQ is launched first; the KV path's backward runs while it is in flight.
    w.q_pair.launch_backward(space, dq, blocks_into(scratch.dq_blocks, "mlacp::dQ blocks", config_.qk_dim()));
    tensor5 dq_local;
    if (!config_.overlap && needs_q(r)) dq_local = w.q_pair.wait_backward_blocks();
    if (needs_kv(r)) {
      detail::ComputePhase<ExecSpace> phase(space, "kv backward");
      const tensor3& dkv = detail::ensure(scratch.dkv, "mlacp::d kv", B, S, h * (dn + dv));
      const tensor3& dkpe = detail::ensure(scratch.dkpe, "mlacp::d k_pe", B, S, dr);
      detail::disassemble_kv_grad(space, dk, dvv, tensor4(dkv.data(), B, S, h, dn + dv), dkpe, dn);
      const bool payload = needs_payload(r);
      tensor3 d_payload = w.latent_kv.backward(
          space, dkv, dkpe, payload, r.w_kvb ? rows_of(g.w_kvb) : matrix_rows(),
          r.b_kvb && config_.bias ? part_of(g.b_kvb) : vector_part(), config_.overlap,
          payload ? detail::ensure(scratch.grad_payload, "mlacp::d payload", B, S, R + dr) : tensor3(),
          payload ? detail::ensure(scratch.grad_latent, "mlacp::d latent", B, S, R) : tensor3(),
          payload ? into(scratch.d_payload, "mlacp::d payload local", B, local_seq(), R + dr) : tensor3());
      if (payload) payload_backward(space, f, w, d_payload, d_payload, R, g);
    }
    if (needs_q(r)) q_branch_backward(space, f, config_.overlap ? w.q_pair.wait_backward_blocks() : dq_local, g);
  }

  void backward_expanded(const ExecSpace& space, Forward& f, forward_workspace& w, const tensor3& dy,
                         gradients_type& g) const {
    const int B = config_.batch, s = local_seq(), H = config_.heads, dn = config_.nope, dv = config_.vdim;
    const int dr = config_.rope, R = config_.latent;
    const MlaRequiresGrad& r = f.flags_;
    scratch_type& scratch = memory_.scratch;
    tensor4 dq, dk, dvv;
    if (!output_and_attention_backward(space, f, w, dy, g, dq, dk, dvv)) return;
    // All three inverses are launched at once; dQ is waited first and the Q branch runs while dK, dV are in flight.
    tensor5 dq_local, dk_blocks, dv_blocks;
    w.q_pair.launch_backward(space, dq, blocks_into(scratch.dq_blocks, "mlacp::dQ blocks", config_.qk_dim()));
    if (!config_.overlap && needs_q(r)) dq_local = w.q_pair.wait_backward_blocks();
    w.k_pair.launch_backward(space, dk, blocks_into(scratch.dk_blocks, "mlacp::dK blocks", config_.qk_dim()));
    if (!config_.overlap && needs_kv(r)) dk_blocks = w.k_pair.wait_backward_blocks();
    w.v_pair.launch_backward(space, dvv, blocks_into(scratch.dv_blocks, "mlacp::dV blocks", config_.vdim));
    if (!config_.overlap && needs_kv(r)) dv_blocks = w.v_pair.wait_backward_blocks();
    if (needs_q(r)) q_branch_backward(space, f, config_.overlap ? w.q_pair.wait_backward_blocks() : dq_local, g);
    if (!needs_kv(r)) return;
    // dK and dV are read as the head blocks they arrived in (no unpack) and written straight into d(kv).
    const tensor3& dkv = detail::ensure(scratch.dkv, "mlacp::d kv", B, s, H * (dn + dv));
    const tensor3& dkpe = detail::ensure(scratch.dkpe, "mlacp::d k_pe", B, s, dr);
    const tensor4 dkv4(dkv.data(), B, s, H, dn + dv);
    {
      if (config_.overlap) dk_blocks = w.k_pair.wait_backward_blocks();  // dK before the K branch
      detail::ComputePhase<ExecSpace> phase(space, "k backward");
      detail::key_grad_from_blocks(space, dk_blocks.data(), static_cast<std::int64_t>(dk_blocks.extent(0)), dkv4, dkpe,
                                   dn);
    }
    {
      if (config_.overlap) dv_blocks = w.v_pair.wait_backward_blocks();  // dV before the V branch
      detail::ComputePhase<ExecSpace> phase(space, "v backward");
      detail::value_grad_from_blocks(space, dv_blocks.data(), static_cast<std::int64_t>(dv_blocks.extent(0)), dkv4, dn);
    }
    detail::ComputePhase<ExecSpace> phase(space, "kv backward");
    const auto dkv2 = detail::as_matrix(dkv, B * s, H * (dn + dv));
    if (r.w_kvb) detail::linear_wgrad(space, dkv2, detail::as_matrix(w.c, B * s, R), g.w_kvb);
    if (r.b_kvb && config_.bias) detail::bias_grad(space, dkv2, g.b_kvb);
    if (!needs_payload(r)) return;
    const tensor3& dc = detail::ensure(scratch.dc, "mlacp::d c", B, s, R);
    detail::linear_dgrad(space, dkv2, weights_.w_kvb, T(0), detail::as_matrix(dc, B * s, R));
    payload_backward(space, f, w, dc, dkpe, 0, g);
  }

  // Gradient Views the caller did not provide and that are needed are allocated (zeroed) with their shapes; provided
  // ones (checked with every rank before anything ran, gradients_error) are used as they are.
  void allocate_missing(gradients_type& g, const MlaRequiresGrad& r) const {
    const auto H = static_cast<std::size_t>(config_.heads), D = static_cast<std::size_t>(config_.hidden);
    const auto qk = static_cast<std::size_t>(config_.qk_dim()),
               kv = static_cast<std::size_t>(config_.nope + config_.vdim);
    const auto R = static_cast<std::size_t>(config_.latent), dr = static_cast<std::size_t>(config_.rope);
    const auto dv = static_cast<std::size_t>(config_.vdim);
    auto matrix = [&](auto& view, const char* name, std::size_t rows, std::size_t cols, bool needed) {
      using view_type = std::remove_reference_t<decltype(view)>;
      if (needed && view.data() == nullptr) view = view_type(std::string("mlacp::grad ") + name, rows, cols);
    };
    auto vector = [&](auto& view, const char* name, std::size_t n, bool needed) {
      using view_type = std::remove_reference_t<decltype(view)>;
      if (needed && view.data() == nullptr) view = view_type(std::string("mlacp::grad ") + name, n);
    };
    matrix(g.w_q, "w_q", H * qk, D, r.w_q);
    matrix(g.w_kva, "w_kva", R + dr, D, r.w_kva);
    vector(g.g_kv, "g_kv", R, r.g_kv);
    matrix(g.w_kvb, "w_kvb", H * kv, R, r.w_kvb);
    matrix(g.w_o, "w_o", D, H * dv, r.w_o);
    vector(g.b_q, "b_q", H * qk, r.b_q && config_.bias);
    vector(g.b_kvb, "b_kvb", H * kv, r.b_kvb && config_.bias);
    vector(g.b_o, "b_o", D, r.b_o && config_.bias);
    if (r.x && g.dx.data() == nullptr)
      g.dx = tensor3("mlacp::dx", static_cast<std::size_t>(config_.batch), static_cast<std::size_t>(local_seq()), D);
  }

  // The layer's memory (mla_workspace.hpp): mutable because forward/backward are const operations of the layer whose
  // buffers are a cache of this configuration, as an FFT plan's are.
  struct Memory {
    detail::ForwardWorkspacePool<T, ExecSpace> pool;
    scratch_type scratch;
  };

  MlaConfig config_;
  weights_type weights_;
  const Mesh* mesh_;
  Core core_;
  mutable Memory memory_;
};

}  // namespace mlacp
