// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MLA attention layer under Ulysses context parallelism, with the backward-overlap schedule of
// shared/reference/mla_backward_overlap.py re-created from its pieces (OutputProjection, InputA2APair,
// LatentKVLinear). The numbers are MLA_SPEC's.
#pragma once

#include <mlacp/all_gather.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/detail/finite_check.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/flash_attention.hpp>
#include <mlacp/mla/config.hpp>
#include <mlacp/mla/input_a2a.hpp>
#include <mlacp/mla/kv_layout.hpp>
#include <mlacp/mla/latent_kv_linear.hpp>
#include <mlacp/mla/linear.hpp>
#include <mlacp/mla/output_projection.hpp>
#include <mlacp/mla/rms_norm.hpp>
#include <mlacp/mla/rope.hpp>
#include <mlacp/mla/view_utils.hpp>
#include <mlacp/mla/weights.hpp>

#include <memory>
#include <optional>
#include <string>

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
    Forward(Forward&&) noexcept = default;
    Forward& operator=(Forward&&) noexcept = default;
    Forward(const Forward&) = delete;
    Forward& operator=(const Forward&) = delete;

    /// The layer's output y [B, s, D].
    const tensor3& output() const { return y_; }
    bool has_forward() const { return owner_ != nullptr; }
    bool backward_done() const { return backward_done_; }

   private:
    friend class MlaAttention;
    const MlaAttention* owner_ = nullptr;
    bool backward_done_ = false;
    MlaRequiresGrad flags_;
    tensor3 y_, x_, kv_a_, c_;
    Kokkos::View<T*, Kokkos::LayoutRight, memory_space> rstd_;
    tensor4 q_, k_, v_, o_;
    Kokkos::View<T***, Kokkos::LayoutRight, memory_space> lse_;
    std::unique_ptr<OutputProjection<T, ExecSpace>> out_proj_;
    std::unique_ptr<LatentKVLinear<T, ExecSpace>> latent_kv_;
    std::unique_ptr<InputA2APair<T, ExecSpace>> q_pair_, k_pair_, v_pair_;
  };

  /// Collective over the mesh (checks the configuration and weights on every rank). The mesh must outlive the layer;
  /// the weights are shared Views (updates by the caller are seen by the layer).
  MlaAttention(const MlaConfig& config, weights_type weights, const Mesh& mesh, Core core = {})
      : config_(config), weights_(std::move(weights)), mesh_(&mesh), core_(std::move(core)) {
    std::string error = config_.error(mesh.size());
    if (error.empty()) error = detail::weights_error(config_, weights_, "weight");
    detail::agree_or_throw(mesh, "mlacp::MlaAttention", error, config_fields(), config_.describe());
  }

  const MlaConfig& config() const { return config_; }
  const weights_type& weights() const { return weights_; }
  const Mesh& mesh() const { return *mesh_; }
  int local_seq() const { return config_.seq / mesh_->size(); }
  int local_heads() const { return config_.heads / mesh_->size(); }

  /// x [B, s, D] -> Forward (y and saved state). `requires_grad` says which gradients backward will produce; it must
  /// be the same on every rank.
  Forward forward(const ExecSpace& space, const tensor3& x, const MlaRequiresGrad& requires_grad = {}) const {
    check_input("forward", "x", x, requires_grad, "");
    compat::ScopedRegion region("mlacp::MlaAttention::forward");
    Forward f;
    f.owner_ = this;
    f.flags_ = requires_grad;
    f.x_ = x;
    if (config_.strategy == MlaStrategy::latent)
      forward_latent(space, f);
    else
      forward_expanded(space, f);
    return f;
  }

  /// Fresh gradients (zero-initialised, then accumulated) for every flag set at forward; dx in `dx`.
  gradients_type backward(const ExecSpace& space, Forward& f, const tensor3& dy) const {
    gradients_type g;
    backward(space, f, dy, g);
    return g;
  }

  /// Accumulates (+=) the gradients into `grads`; a View that is empty and needed is allocated (zeroed) first.
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
    check_input("backward", "dy", dy, f.flags_, state_error);
    f.backward_done_ = true;
    compat::ScopedRegion region("mlacp::MlaAttention::backward");
    allocate_missing(grads, f.flags_);
    if (config_.strategy == MlaStrategy::latent)
      backward_latent(space, f, dy, grads);
    else
      backward_expanded(space, f, dy, grads);
    release(f);
  }

 private:
  using matrix_rows = Kokkos::View<T**, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using vector_part = Kokkos::View<T*, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  static bool needs_q(const MlaRequiresGrad& r) { return r.x || r.w_q || r.b_q; }
  static bool needs_payload(const MlaRequiresGrad& r) { return r.x || r.w_kva || r.g_kv; }
  static bool needs_kv(const MlaRequiresGrad& r) { return needs_payload(r) || r.w_kvb || r.b_kvb; }
  static bool needs_attention(const MlaRequiresGrad& r) { return needs_q(r) || needs_kv(r); }

  detail::AgreementFields config_fields() const {
    return {{"batch", config_.batch},   {"seq", config_.seq},
            {"hidden", config_.hidden}, {"heads", config_.heads},
            {"nope", config_.nope},     {"rope", config_.rope},
            {"vdim", config_.vdim},     {"latent", config_.latent},
            {"bias", config_.bias},     {"strategy", static_cast<int>(config_.strategy)}};
  }

  // Checks t's shape and agrees with the other ranks on it and on the flags; `usage_error` (misuse found by the
  // caller) takes precedence and is raised as UsageError.
  void check_input(const char* where, const char* name, const tensor3& t, const MlaRequiresGrad& r,
                   const std::string& usage_error) const {
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
    if (error.empty() && mesh_->check_finite()) {
      const auto bad = detail::count_non_finite(ExecSpace(), t);
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

  // Shared by both strategies: q = RoPE(x w_q^T + b_q) [B, s, H, dqk]; kv_a = x w_kva^T [B, s, R+dr];
  // payload = [RMSNorm(c), RoPE(k_pe)] [B, s, R+dr].
  tensor4 project_q(const ExecSpace& space, Forward& f) const {
    const int B = config_.batch, s = local_seq(), D = config_.hidden, H = config_.heads, dqk = config_.qk_dim();
    tensor4 q(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::q"), B, s, H, dqk);
    detail::ComputePhase<ExecSpace> phase(space, "w_q fprop");
    detail::linear_forward(space, detail::as_matrix(f.x_, B * s, D), weights_.w_q, weights_.b_q,
                           detail::as_matrix(q, B * s, H * dqk));
    rope_forward(space, q, config_.nope, config_.rope, position_offset(), config_.rope_base);
    return q;
  }

  tensor3 project_payload(const ExecSpace& space, Forward& f) const {
    const int B = config_.batch, s = local_seq(), D = config_.hidden, R = config_.latent, dr = config_.rope;
    detail::ComputePhase<ExecSpace> phase(space, "w_kva fprop");
    f.kv_a_ = tensor3(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::kv_a"), B, s, R + dr);
    detail::linear_forward(space, detail::as_matrix(f.x_, B * s, D), weights_.w_kva, vector_part(),
                           detail::as_matrix(f.kv_a_, B * s, R + dr));
    tensor3 payload(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::payload"), B, s, R + dr);
    f.rstd_ = decltype(f.rstd_)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::rstd"),
                                static_cast<std::size_t>(B) * static_cast<std::size_t>(s));
    rms_norm_forward(space, f.kv_a_, weights_.g_kv, payload, f.rstd_, config_.rms_eps);
    detail::copy_columns(space, f.kv_a_, R, payload, R, dr);
    rope_forward(space, as_rank4(payload), R, dr, position_offset(), config_.rope_base);
    return payload;
  }

  void attend_and_project(const ExecSpace& space, Forward& f) const {
    const int B = config_.batch, S = config_.seq, h = local_heads();
    f.o_ = tensor4(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::o"), B, S, h, config_.vdim);
    f.lse_ = decltype(f.lse_)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::lse"), B, h, S);
    {
      detail::ComputePhase<ExecSpace> phase(space, "attention fprop");
      core_.forward(space, f.q_, f.k_, f.v_, f.o_, f.lse_);
    }
    f.out_proj_ = std::make_unique<OutputProjection<T, ExecSpace>>();
    f.y_ = f.out_proj_->forward(space, f.o_, weights_.w_o, weights_.b_o, *mesh_);
  }

  void forward_latent(const ExecSpace& space, Forward& f) const {
    const int B = config_.batch, S = config_.seq, h = local_heads(), dn = config_.nope, dv = config_.vdim;
    const int dr = config_.rope;
    tensor4 q = project_q(space, f);
    // The Q all-to-all is launched before the independent KV expansion and waited after it.
    f.q_pair_ = std::make_unique<InputA2APair<T, ExecSpace>>(*mesh_, "Q");
    f.q_pair_->launch_forward(space, q, needs_q(f.flags_));
    tensor3 payload = project_payload(space, f);
    tensor3 gathered = launch_all_gather(space, payload, 1, *mesh_, "payload all-gather").wait();
    tensor3 kv(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::kv"), B, S, h * (dn + dv));
    tensor3 kpe(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::k_pe"), B, S, dr);
    f.latent_kv_ = std::make_unique<LatentKVLinear<T, ExecSpace>>();
    f.latent_kv_->forward(space, gathered, rows_of(weights_.w_kvb), part_of(weights_.b_kvb), *mesh_, kv, kpe);
    f.q_ = f.q_pair_->wait_forward();
    f.k_ = tensor4(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::k"), B, S, h, dn + dr);
    f.v_ = tensor4(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::v"), B, S, h, dv);
    detail::assemble_kv(space, tensor4(kv.data(), B, S, h, dn + dv), kpe, f.k_, f.v_, dn);
    attend_and_project(space, f);
  }

  void forward_expanded(const ExecSpace& space, Forward& f) const {
    const int B = config_.batch, s = local_seq(), H = config_.heads, dn = config_.nope, dv = config_.vdim;
    const int dr = config_.rope, R = config_.latent;
    tensor3 payload = project_payload(space, f);
    f.c_ = tensor3(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::c"), B, s, R);
    tensor3 kpe(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::k_pe"), B, s, dr);
    detail::copy_columns(space, payload, 0, f.c_, 0, R);
    detail::copy_columns(space, payload, R, kpe, 0, dr);
    tensor4 kv(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::kv"), B, s, H, dn + dv);
    {
      detail::ComputePhase<ExecSpace> phase(space, "w_kvb fprop");
      detail::linear_forward(space, detail::as_matrix(f.c_, B * s, R), weights_.w_kvb, weights_.b_kvb,
                             detail::as_matrix(kv, B * s, H * (dn + dv)));
    }
    tensor4 k(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::k local"), B, s, H, dn + dr);
    tensor4 v(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::v local"), B, s, H, dv);
    detail::assemble_kv(space, kv, kpe, k, v, dn);
    // V, then K, then Q are launched as each is ready; all three are waited in Q, K, V order.
    const bool kv_grad = needs_kv(f.flags_);
    f.v_pair_ = std::make_unique<InputA2APair<T, ExecSpace>>(*mesh_, "V");
    f.k_pair_ = std::make_unique<InputA2APair<T, ExecSpace>>(*mesh_, "K");
    f.q_pair_ = std::make_unique<InputA2APair<T, ExecSpace>>(*mesh_, "Q");
    f.v_pair_->launch_forward(space, v, kv_grad);
    f.k_pair_->launch_forward(space, k, kv_grad);
    tensor4 q = project_q(space, f);
    f.q_pair_->launch_forward(space, q, needs_q(f.flags_));
    f.q_ = f.q_pair_->wait_forward();
    f.k_ = f.k_pair_->wait_forward();
    f.v_ = f.v_pair_->wait_forward();
    attend_and_project(space, f);
  }

  // Shared by both strategies: the output projection's backward (dO all-to-all overlapped with the w_o wgrad), then
  // the attention backward on head-local data: dq (if the Q branch needs it), dk and dv (if the KV path needs them).
  // False when nothing upstream of the attention needs a gradient (then nothing more runs).
  bool output_and_attention_backward(const ExecSpace& space, Forward& f, const tensor3& dy, gradients_type& g,
                                     tensor4& dq, tensor4& dk, tensor4& dv) const {
    const MlaRequiresGrad& r = f.flags_;
    tensor4 d_o = f.out_proj_->backward(space, dy, needs_attention(r), r.w_o ? g.w_o : decltype(g.w_o)(),
                                        r.b_o && config_.bias ? g.b_o : decltype(g.b_o)(), config_.overlap);
    if (!needs_attention(r)) return false;
    const int B = config_.batch, S = config_.seq, h = local_heads();
    if (needs_q(f.flags_)) dq = tensor4("mlacp::dq", B, S, h, config_.qk_dim());
    if (needs_kv(f.flags_)) {
      dk = tensor4("mlacp::dk", B, S, h, config_.qk_dim());
      dv = tensor4("mlacp::dv", B, S, h, config_.vdim);
    }
    detail::ComputePhase<ExecSpace> phase(space, "attention bprop");
    core_.backward(space, f.q_, f.k_, f.v_, f.o_, f.lse_, d_o, dq, dk, dv);
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
    rope_backward(space, tensor4(dq_blocks.data(), parts * B, s, h, dqk), config_.nope, config_.rope, position_offset(),
                  config_.rope_base);
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

  // The local payload gradient [B, s, R+dr] -> g_kv / w_kva gradients and dx += d(kv_a) w_kva.
  void payload_backward(const ExecSpace& space, Forward& f, const tensor3& d_payload, gradients_type& g) const {
    const int B = config_.batch, s = local_seq(), D = config_.hidden, R = config_.latent, dr = config_.rope;
    rope_backward(space, as_rank4(d_payload), R, dr, position_offset(), config_.rope_base);
    tensor3 d_kv_a(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::d kv_a"), B, s, R + dr);
    rms_norm_backward(space, f.kv_a_, weights_.g_kv, f.rstd_, d_payload, d_kv_a,
                      f.flags_.g_kv ? g.g_kv : decltype(g.g_kv)());
    detail::copy_columns(space, d_payload, R, d_kv_a, R, dr);
    const auto da2 = detail::as_matrix(d_kv_a, B * s, R + dr);
    if (f.flags_.w_kva) detail::linear_wgrad(space, da2, detail::as_matrix(f.x_, B * s, D), g.w_kva);
    if (f.flags_.x) detail::linear_dgrad(space, da2, weights_.w_kva, T(1), detail::as_matrix(g.dx, B * s, D));
  }

  void backward_latent(const ExecSpace& space, Forward& f, const tensor3& dy, gradients_type& g) const {
    const int B = config_.batch, S = config_.seq, h = local_heads(), dn = config_.nope, dv = config_.vdim;
    const int dr = config_.rope;
    const MlaRequiresGrad& r = f.flags_;
    tensor4 dq, dk, dvv;
    if (!output_and_attention_backward(space, f, dy, g, dq, dk, dvv)) return;
    // The inverse all-to-all of dQ is launched first; the KV path's backward runs while it is in flight.
    f.q_pair_->launch_backward(space, dq);
    tensor5 dq_local;
    if (!config_.overlap && needs_q(r)) dq_local = f.q_pair_->wait_backward_blocks();
    if (needs_kv(r)) {
      detail::ComputePhase<ExecSpace> phase(space, "kv backward");
      tensor3 dkv(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::d kv"), B, S, h * (dn + dv));
      tensor3 dkpe(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::d k_pe"), B, S, dr);
      detail::disassemble_kv_grad(space, dk, dvv, tensor4(dkv.data(), B, S, h, dn + dv), dkpe, dn);
      tensor3 d_payload =
          f.latent_kv_->backward(space, dkv, dkpe, needs_payload(r), r.w_kvb ? rows_of(g.w_kvb) : matrix_rows(),
                                 r.b_kvb && config_.bias ? part_of(g.b_kvb) : vector_part(), config_.overlap);
      if (needs_payload(r)) payload_backward(space, f, d_payload, g);
    }
    if (needs_q(r)) q_branch_backward(space, f, config_.overlap ? f.q_pair_->wait_backward_blocks() : dq_local, g);
  }

  void backward_expanded(const ExecSpace& space, Forward& f, const tensor3& dy, gradients_type& g) const {
    const int B = config_.batch, s = local_seq(), H = config_.heads, dn = config_.nope, dv = config_.vdim;
    const int dr = config_.rope, R = config_.latent;
    const MlaRequiresGrad& r = f.flags_;
    tensor4 dq, dk, dvv;
    if (!output_and_attention_backward(space, f, dy, g, dq, dk, dvv)) return;
    // All three inverses are launched at once; dQ is waited first and the Q branch runs while dK, dV are in flight.
    tensor5 dq_local;
    tensor4 dk_local, dv_local;
    f.q_pair_->launch_backward(space, dq);
    if (!config_.overlap && needs_q(r)) dq_local = f.q_pair_->wait_backward_blocks();
    f.k_pair_->launch_backward(space, dk);
    if (!config_.overlap && needs_kv(r)) dk_local = f.k_pair_->wait_backward(space);
    f.v_pair_->launch_backward(space, dvv);
    if (!config_.overlap && needs_kv(r)) dv_local = f.v_pair_->wait_backward(space);
    if (needs_q(r)) q_branch_backward(space, f, config_.overlap ? f.q_pair_->wait_backward_blocks() : dq_local, g);
    if (!needs_kv(r)) return;
    tensor4 dkv(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::d kv"), B, s, H, dn + dv);
    tensor3 dkpe(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::d k_pe"), B, s, dr);
    {
      if (config_.overlap) dk_local = f.k_pair_->wait_backward(space);  // dK before the K branch
      detail::ComputePhase<ExecSpace> phase(space, "k backward");
      detail::disassemble_kv_grad(space, dk_local, tensor4(), dkv, dkpe, dn);
    }
    {
      if (config_.overlap) dv_local = f.v_pair_->wait_backward(space);  // dV before the V branch
      detail::ComputePhase<ExecSpace> phase(space, "v backward");
      detail::write_v_grad(space, dv_local, dkv, dn);
    }
    detail::ComputePhase<ExecSpace> phase(space, "kv backward");
    const auto dkv2 = detail::as_matrix(dkv, B * s, H * (dn + dv));
    if (r.w_kvb) detail::linear_wgrad(space, dkv2, detail::as_matrix(f.c_, B * s, R), g.w_kvb);
    if (r.b_kvb && config_.bias) detail::bias_grad(space, dkv2, g.b_kvb);
    if (!needs_payload(r)) return;
    tensor3 d_payload(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::d payload"), B, s, R + dr);
    tensor3 dc(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::d c"), B, s, R);
    detail::linear_dgrad(space, dkv2, weights_.w_kvb, T(0), detail::as_matrix(dc, B * s, R));
    detail::copy_columns(space, dc, 0, d_payload, 0, R);
    detail::copy_columns(space, dkpe, 0, d_payload, R, dr);
    payload_backward(space, f, d_payload, g);
  }

  void allocate_missing(gradients_type& g, const MlaRequiresGrad& r) const {
    const weights_type shapes = weights_type::allocate(config_, "mlacp::grad ");  // zeroed, only used when missing
    auto fill = [](auto& view, const auto& shape, bool needed) {
      if (needed && view.data() == nullptr) view = shape;
    };
    fill(g.w_q, shapes.w_q, r.w_q);
    fill(g.b_q, shapes.b_q, r.b_q && config_.bias);
    fill(g.w_kva, shapes.w_kva, r.w_kva);
    fill(g.g_kv, shapes.g_kv, r.g_kv);
    fill(g.w_kvb, shapes.w_kvb, r.w_kvb);
    fill(g.b_kvb, shapes.b_kvb, r.b_kvb && config_.bias);
    fill(g.w_o, shapes.w_o, r.w_o);
    fill(g.b_o, shapes.b_o, r.b_o && config_.bias);
    if (r.x && g.dx.data() == nullptr)
      g.dx = tensor3("mlacp::dx", static_cast<std::size_t>(config_.batch), static_cast<std::size_t>(local_seq()),
                     static_cast<std::size_t>(config_.hidden));
    auto check = [&](const char* name, const auto& view, const auto& shape) {
      if (view.data() != nullptr && view.size() != shape.size())
        throw InvalidArgument(std::string("mlacp::MlaAttention::backward: gradient ") + name + " has " +
                              std::to_string(view.size()) + " elements; expected " + std::to_string(shape.size()));
    };
    check("w_q", g.w_q, shapes.w_q);
    check("w_kva", g.w_kva, shapes.w_kva);
    check("g_kv", g.g_kv, shapes.g_kv);
    check("w_kvb", g.w_kvb, shapes.w_kvb);
    check("w_o", g.w_o, shapes.w_o);
  }

  static void release(Forward& f) {
    f.x_ = tensor3();
    f.kv_a_ = tensor3();
    f.c_ = tensor3();
    f.q_ = f.k_ = f.v_ = f.o_ = tensor4();
  }

  MlaConfig config_;
  weights_type weights_;
  const Mesh* mesh_;
  Core core_;
};

}  // namespace mlacp
