// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MLA attention layer under Ulysses context parallelism, with the backward-overlap schedule of
// shared/reference/mla_backward_overlap.py re-created from its pieces (OutputProjection, InputA2APair,
// LatentKVLinear). The numbers are docs/spec.md's. The layer is the plan: it checks (detail/input_checks.hpp) and
// dispatches once to the schedule of its strategy (detail/latent_schedule.hpp, detail/expanded_schedule.hpp), which
// owns its memory; what the schedules share is in detail/schedule_context.hpp and detail/shared_steps.hpp.
#pragma once

#include <mlacp/allocation.hpp>
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/detail/expanded_schedule.hpp>
#include <mlacp/mla/detail/input_checks.hpp>
#include <mlacp/mla/detail/latent_schedule.hpp>
#include <mlacp/mla/detail/schedule_context.hpp>
#include <mlacp/mla/kernels/flash_attention.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/mla/weights.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/progress.hpp>
#include <mlacp/view_types.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace mlacp {

namespace detail {
/// to[i] = round(to[i] + from[i]) over the contiguous spans of a float gradient and one of another type, one rounding
/// per element. (A function template of its own: nvcc refuses a device lambda inside a generic lambda.)
template <class ExecSpace, class From, class To>
void add_staged_gradient(const ExecSpace& space, const From& mine, const To& theirs) {
  using D = typename To::non_const_value_type;
  const auto* from = mine.data();
  auto* to = theirs.data();
  Kokkos::parallel_for(
      "mlacp::add the staged gradients",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, static_cast<std::int64_t>(mine.size())),
      KOKKOS_LAMBDA(const std::int64_t i) { to[i] = static_cast<D>(static_cast<float>(to[i]) + from[i]); });
}

// A bf16 layer's float path (detail/bf16_as_float.hpp, included at the end: it holds an MlaAttention<float>).
template <class ExecSpace, class Core>
struct WidenedPass;
template <class ExecSpace, class Core>
class Bf16AsFloat;
}  // namespace detail

/// What a bf16 layer computes with (MlaAttention::bf16_compute_choice; MlaConfig::bf16_compute says how it is chosen).
struct Bf16ComputeChoice {
  /// The configuration's bf16_compute, or MLACP_BF16_COMPUTE's where the configuration says auto and it is set.
  Bf16Compute requested = Bf16Compute::automatic;
  /// bf16 or float; automatic until the first forward of an automatic layer has chosen.
  Bf16Compute chosen = Bf16Compute::automatic;
  /// An automatic layer whose bf16 GEMMs run on bf16 matrix hardware on every rank (Bf16GemmPlan::on_bf16_hardware:
  /// tensor cores, AMX) took bf16 at its first forward without timing (nothing of the float path was built).
  bool by_hardware = false;
  /// The times that chose it (automatic and timed only; 0 otherwise): each path's best timed pass (forward, and
  /// backward where the first call needed gradients), the slowest rank's, in seconds.
  double bf16_seconds = 0, float_seconds = 0;
};

/// Multi-head Latent Attention on a Ulysses group. Every rank holds all weights and its token shard x [B, s, D]:
/// rank r owns the s = seq_partition().count(r) global tokens from seq_partition().offset(r), where the first S mod P
/// ranks hold ceil(S/P) tokens and the others floor(S/P). In the attention it owns head_partition().count(r) heads
/// from head_partition().offset(r), by the same rule over H. Neither S nor H need be divisible by P (the all-to-alls,
/// the latent all-gather and reduce-scatter then take their uneven forms; nothing is padded). S < P or H < P leaves
/// the ranks from S (or H) on with no token (x, dy, y and dx are [B, 0, D]) or no head; such a rank still takes part
/// in every collective (it sends and receives its zero counts), and its partial weight gradients are those of what it
/// holds (zero for a rank with neither).
///
/// forward() returns a Forward: the output y [B, s, D] and what backward needs (saved operands and the paired
/// collective state). backward() consumes it exactly once and overlaps: the dO all-to-all with the w_o weight
/// gradient; the inverse all-to-all of dQ with the KV path's backward (latent) or dK/dV with the Q branch (expanded);
/// the latent reduce-scatter with the w_kvb weight gradient. Weight gradients are this rank's partial sums
/// (docs/spec.md); sum them over the ranks as a data-parallel reduction would.
///
/// Core: the attention core on head-local q [B,S,h,dqk], k [B,S,h,dqk], v [B,S,h,dv] -> o [B,S,h,dv] with a saved
/// lse [B,h,S]; the default is the tiled FlashAttentionCore; see attention_problem.hpp for the interface a
/// user-supplied core provides (CausalAttentionCore in attention_core.hpp is the simple reference core).
///
/// Memory: the layer's schedule owns its activations and scratch per configuration (detail/forward_workspace.hpp). A
/// Forward borrows a per-forward workspace from the layer's pool and gives it back when backward consumes it or when it
/// is destroyed; several Forwards may be pending at once (gradient accumulation). After the first iteration of a loop,
/// forward and backward into caller-provided gradients allocate no View of the layer's. y stays valid for as long as
/// the caller holds it and does not pin its workspace: a free workspace whose y is still held lets it go and writes a
/// new one (so an eval loop that keeps its outputs holds one workspace, plus the outputs). A forward that needs no
/// gradient (MlaRequiresGrad::none()) gives its workspace back before it returns. The layer keeps at most
/// max_free_forward_workspaces() free workspaces (default 2); release_memory() drops them all, and
/// forward_workspace_bytes() says what they hold. A layer is used from one host thread at a time.
///
/// Packed sequences: config.cu_seqlens (the same on every rank) splits the global sequence into documents; each
/// rank's RoPE positions restart at every document start within its shard and the core masks attention per document
/// (both strategies). The layout is part of the configuration the ranks agree on. forward(space, x, flags,
/// cu_seqlens) takes the packing per call instead (it changes every batch in real data), agreed per call; the
/// Forward keeps it for its backward.
///
/// The wire (config.wire_dtype, a float layer, P > 1): each exchange travels in the codec mla/wire_policy.hpp gives its
/// kind (bf16: the all-to-alls and the latent all-gather, and with bf16_all the latent reduce-scatter's partial sums;
/// fp8: the forward's exchanges as fp8 E4M3 with a scale per row, the backward's as bf16). The collectives encode into
/// pooled staging buffers before each launch and decode into the float destinations after each wait
/// (wire/coded_collective.hpp); the launches, waits and their order are the same as with `same`, and the collectives
/// move the codec's bytes (collective_bytes.hpp: half with bf16).
///
/// Errors (InvalidArgument / UsageError), raised before any collective is launched and, on a checked mesh, on every
/// rank: configuration (a size that is not positive, wire_dtype other than same on a double layer, ...), weights whose
/// shapes disagree with it, x or dy of the wrong shape or differing across ranks, backward before forward, a second
/// backward of the same forward.
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
  /// Weight gradients in gradient_value_t<T> (float for bf16), dx in T.
  using gradients_type = MlaGradients<T, memory_space>;
  /// Mixed precision: a layer of bf16 stores its activations, saved tensors and wire payloads in bf16 and accumulates
  /// in float (GEMMs through its Bf16GemmPlan, the attention core in float, statistics and weight gradients in float).
  static constexpr bool is_bf16 = std::is_same_v<T, compat::bf16>;

  /// The state of one forward pass: move-only, consumed by exactly one backward.
  class Forward {
   public:
    Forward() = default;
    Forward(const Forward&) = delete;
    Forward& operator=(const Forward&) = delete;

    // A moved-from Forward is empty, like one never produced: backward refuses it on every rank ("backward before
    // forward") instead of running on a workspace it no longer holds.
    Forward(Forward&& other) noexcept { take(other); }
    Forward& operator=(Forward&& other) noexcept {
      if (this != &other) {
        give_back();
        take(other);
      }
      return *this;
    }
    ~Forward() { give_back(); }

    /// The layer's output y [B, s, D] (valid as long as it is held, also after backward).
    const tensor3& output() const { return y_; }
    bool backward_done() const { return backward_done_; }
    /// Whether this Forward still holds a workspace of its layer (from forward until backward consumes it).
    bool holds_workspace() const { return ws_ != nullptr || widened_ != nullptr; }

   private:
    friend class MlaAttention;
    // Gives the workspace back to the layer's pool, dropping what it references beyond its own buffers.
    void give_back() noexcept {
      if (ws_) ws_->release();
      ws_.reset();
      widened_.reset();
      x_ = tensor3();
    }

    // Moves other's state here and leaves other empty (no owner, no workspace, no output).
    void take(Forward& other) noexcept {
      owner_ = std::exchange(other.owner_, nullptr);
      backward_done_ = std::exchange(other.backward_done_, false);
      flags_ = other.flags_;
      batch_ = other.batch_;
      seq_ = other.seq_;
      y_ = std::exchange(other.y_, tensor3());
      x_ = std::exchange(other.x_, tensor3());
      ws_ = std::move(other.ws_);
      other.ws_.reset();
      widened_ = std::move(other.widened_);
      other.widened_.reset();
    }

    const MlaAttention* owner_ = nullptr;
    bool backward_done_ = false;
    MlaRequiresGrad flags_;
    int batch_ = 0, seq_ = 0;  // the pass's B and S, which its backward runs with
    tensor3 y_, x_;
    std::shared_ptr<detail::ForwardWorkspace<T, ExecSpace>> ws_;     // the schedule's workspace type
    std::shared_ptr<detail::WidenedPass<ExecSpace, Core>> widened_;  // a bf16 layer's pass computed in float
  };

  /// Collective over the mesh (checks the configuration and weights on every rank). The mesh must outlive the layer;
  /// the weights are shared Views (updates by the caller are seen by the layer).
  MlaAttention(const MlaConfig& config, weights_type weights, const Mesh& mesh, Core core = {})
      : config_(config), weights_(std::move(weights)), mesh_(&mesh), core_(std::move(core)) {
    std::string error = config_.error(mesh.size());
    if (error.empty()) error = detail::weights_error(config_, weights_, "weight");
    if (error.empty()) error = documents_error(config_.cu_seqlens);
    if (error.empty()) error = wire_error(mesh);
    if (error.empty() && mesh.ring_size() > 1) error = ring_error(mesh);
    // Every setting the core reads is read and checked here, with the rest of the configuration (never lazily inside
    // a schedule, where ranks that hold no head would not reach it and their peers would wait in a collective).
    auto fields = detail::config_fields(config_);
    fields.push_back({"bytes per element of the layer's value type", static_cast<std::int64_t>(sizeof(T))});
    fields.push_back({"the ring size of the mesh", static_cast<std::int64_t>(mesh.ring_size())});
    if constexpr (is_bf16) {
      // MLACP_BF16_GEMM is read here, checked and agreed with the rest (a bad name is one error on every rank).
      std::int64_t requested = -1;
      try {
        bf16_plan_.emplace();
        requested = static_cast<std::int64_t>(bf16_plan_->requested());
      } catch (const std::exception& e) {
        if (error.empty()) error = e.what();
      }
      fields.push_back({std::string("the bf16 GEMM backend asked for (") + bf16_gemm_env_var + ")", requested});
      // MLACP_BF16_COMPUTE is an agreed setting (Mesh checks that it parses and is the same on every rank).
      compute_.requested = requested_bf16_compute(config_.bf16_compute);
      if (compute_.requested != Bf16Compute::automatic) compute_.chosen = compute_.requested;
    }
    if constexpr (core_capabilities_v<Core>.resolves_settings) {
      const std::string core_error = core_.template resolve<ExecSpace>();
      if (error.empty()) error = core_error;
      for (auto& field : core_.settings()) fields.push_back(std::move(field));
    }
    // The configuration's layout, which forward(space, x, flags) uses, is built before the agreement: an allocation
    // that fails on one rank is then one OutOfMemory on every rank, not a rank missing from the next collective.
    DocumentLayout documents;
    auto kind = detail::AgreedErrorKind::invalid_argument;
    if (error.empty() && !config_.cu_seqlens.empty()) {
      try {
        documents = DocumentLayout(config_.cu_seqlens, config_.seq);
      } catch (const std::exception& e) {
        const auto out_of_memory = detail::translate_allocation_failure(
            e, "mlacp::MlaAttention: rank " + std::to_string(mesh.rank()) + ": the packed documents' offsets");
        if (!out_of_memory) throw;
        error = out_of_memory->what();
        kind = detail::AgreedErrorKind::out_of_memory;
        // An unchecked mesh agrees on nothing: the others learn it from the failure channel at their next wait.
        if (!mesh.checked()) mesh.report_failure(error);
      }
    }
    detail::agree_or_throw(mesh, "mlacp::MlaAttention", error, fields, config_.describe(), kind);
    documents_ = std::move(documents);
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
  /// The packed documents of config().cu_seqlens (empty: one document); a forward given its own cu_seqlens uses those.
  const DocumentLayout& documents() const { return documents_; }
  /// The shape accessors below (seq_partition, local_seq, token_map) describe the S of the last pass that ran (the
  /// configuration's seq before the first; 0 when unset); token_map_for(S) and local_seq_for(S) give them for any S.
  ///
  /// How the S tokens and the H heads are split over the ranks: the first S mod P ranks hold ceil(S/P) tokens, the
  /// others floor(S/P) (heads: the same rule with H), contiguous in rank order (partition.hpp).
  const Partition& seq_partition() const { return context_.seq_partition(); }
  const Partition& head_partition() const { return context_.head_partition(); }
  /// This rank's tokens (x and dy are [B, local_seq(), D]), from global token seq_partition().offset(rank) when the
  /// mesh is flat; on a two-level mesh the global tokens token_map().ranges(ring_rank, ulysses_rank).
  int local_seq() const { return context_.local_seq(); }
  /// Which global tokens each rank holds (token_map.hpp): on a flat mesh rank r holds Partition(S, P) part r; on a
  /// two-level mesh U x C, chunk g = mesh.ring_rank() of the configuration's ring layout, split over its Ulysses group
  /// (seq_partition() is then that split, in chunk-local indices). x, dy, y and dx follow it (shard / unshard).
  const TokenMap& token_map() const { return context_.token_map(); }
  /// This rank's heads in the attention, from global head head_partition().offset(rank).
  int local_heads() const { return context_.local_heads(); }
  /// The token map of a call of `seq` tokens on this layer's mesh and ring layout: which global tokens each rank
  /// brings to such a call (x [B, local_seq_for(seq), D]).
  TokenMap token_map_for(std::int64_t seq) const { return TokenMap::of(*mesh_, seq, config_.ring_layout); }
  /// This rank's token count in a call of `seq` tokens.
  int local_seq_for(std::int64_t seq) const {
    return static_cast<int>(token_map_for(seq).count(mesh_->ring_rank(), mesh_->ulysses_rank()));
  }

  /// The bf16 GEMM plan of a bf16 layer (its per-shape backend choices and oneDNN primitives, bf16_gemm.hpp); null for
  /// float and double layers. The layer installs it for each forward and backward (ScopedBf16GemmPlan).
  const Bf16GemmPlan<ExecSpace>* bf16_gemm_plan() const { return bf16_plan_ ? &*bf16_plan_ : nullptr; }
  /// What a bf16 layer computes with, and the times an automatic one chose by (MlaConfig::bf16_compute). For float
  /// and double layers: requested and chosen stay automatic.
  const Bf16ComputeChoice& bf16_compute_choice() const { return compute_; }
  /// Bytes of the per-call scratch the bf16 attention core call holds (float copies; 0 for float and double).
  std::size_t core_scratch_bytes() const { return context_.core_scratch_bytes(); }

  /// Per-forward workspaces the layer owns, and how many of them a pending Forward holds (a held output holds none).
  /// (A bf16 layer computing in float: its float layer's workspaces are counted too, and forward_workspace_bytes adds
  /// the float copies of the weights and the buffers of the layer's edges.)
  std::size_t forward_workspaces() const {
    return std::visit([](const auto& s) { return s.pool().size(); }, schedule_) +
           on_float_path([](const auto& p) { return p.layer().forward_workspaces(); });
  }
  std::size_t forward_workspaces_in_use() const {
    return std::visit([](const auto& s) { return s.pool().in_use(); }, schedule_) +
           on_float_path([](const auto& p) { return p.layer().forward_workspaces_in_use(); });
  }
  /// Bytes of the buffers the per-forward workspaces own (outputs the caller holds are the caller's).
  std::size_t forward_workspace_bytes() const {
    return std::visit([](const auto& s) { return s.pool().bytes(); }, schedule_) +
           on_float_path([](const auto& p) { return p.layer().forward_workspace_bytes() + p.own_bytes(); });
  }
  /// How many free per-forward workspaces the layer keeps for reuse (default 2: forward, forward, backward, backward
  /// allocates nothing after its first iteration). More forwards pending at once still work; the workspaces beyond the
  /// bound are released once they are free again, so a loop that keeps more pending allocates every iteration.
  std::size_t max_free_forward_workspaces() const {
    return std::visit([](const auto& s) { return s.pool().max_free(); }, schedule_);
  }
  void set_max_free_forward_workspaces(std::size_t n) {
    std::visit([n](const auto& s) { s.pool().set_max_free(n); }, schedule_);
    on_float_path([n](auto& p) {
      p.layer().set_max_free_forward_workspaces(n);
      return std::size_t{0};
    });
  }
  /// Releases every free per-forward workspace now (pending Forwards keep theirs); the next forward allocates again.
  void release_memory() {
    std::visit([](const auto& s) { s.pool().trim(0); }, schedule_);
    on_float_path([](auto& p) {
      p.release_memory();
      return std::size_t{0};
    });
  }

  /// x [B, s, D] -> Forward (y and saved state). Any B and S per call: S is the sum of the ranks' s, and each rank
  /// brings its shard of the token map of that S (s = local_seq_for(S)); the configuration's batch and seq, when set,
  /// bound them. `requires_grad` says which gradients backward will produce; it must be the same on every rank. The
  /// documents are config().cu_seqlens (which end at config().seq).
  Forward forward(const ExecSpace& space, const tensor3& x, const MlaRequiresGrad& requires_grad = {}) const {
    return forward(space, x, requires_grad, config_.cu_seqlens);
  }

  /// forward of this call's packed documents: `cu_seqlens` (empty: one document) in place of config().cu_seqlens,
  /// checked as the configuration's (same messages) and agreed across the ranks in the call's one input agreement (its
  /// count and FNV-1a hash), so a bad or differing packing is one error on every rank before any collective. The
  /// Forward keeps the layout for its backward. Changing it every call allocates nothing after the first iteration
  /// while the document count stays within config().max_documents.
  ///
  /// The call's shape comes first: one gather of every rank's B and s (detail::call_shape, whatever the checked mode),
  /// from which every rank derives S and the same verdict (B differing across ranks, past config().batch, S past
  /// config().seq, a rank whose s is not its share of S). A pass of a new shape rebuilds the token map (host only);
  /// the workspaces are sized by the largest shape seen (detail::Buffer), so only a shape larger than any before
  /// allocates, besides the output y (the caller's, exactly its shape).
  Forward forward(const ExecSpace& space, const tensor3& x, const MlaRequiresGrad& requires_grad,
                  const std::vector<std::int64_t>& cu_seqlens) const {
    const detail::EntryGuard entry(*mesh_, "mlacp::MlaAttention::forward");
    const detail::CallShape shape =
        detail::call_shape(*mesh_, config_, x.extent(0), x.extent(1), "mlacp::MlaAttention::forward");
    if (!shape.error.empty()) throw InvalidArgument(shape.error);
    context_.set_shape(shape.batch, shape.seq);
    if (std::string e = detail::shard_error(shape, context_.token_map(), "mlacp::MlaAttention::forward"); !e.empty())
      throw InvalidArgument(e);
    std::string documents_problem = cu_seqlens_error(cu_seqlens, shape.seq, "MlaAttention::forward");
    if (documents_problem.empty()) documents_problem = documents_error(cu_seqlens);
    detail::check_input(context_, space, "forward", "x", x, requires_grad, "", documents_problem,
                        {{"cu_seqlens.size()", static_cast<std::int64_t>(cu_seqlens.size())},
                         {"cu_seqlens (FNV-1a hash of the offsets)", detail::hash_offsets(cu_seqlens)}});
    if constexpr (is_bf16) {
      if (compute_.chosen == Bf16Compute::automatic) choose_bf16_compute(space, x, requires_grad, cu_seqlens);
    }
    const std::uint64_t parked = diagnostics::parked_handles();
    try {
      compat::ScopedRegion region("mlacp::MlaAttention::forward");
      const auto gemm_scope = bf16_gemm_scope();
      Forward f;
      f.owner_ = this;
      f.flags_ = flags_for(config_, requires_grad);
      f.batch_ = shape.batch;
      f.seq_ = shape.seq;
      f.x_ = x;
      if constexpr (is_bf16) {
        if (compute_.chosen == Bf16Compute::float32) {
          f.widened_ = float_path().forward(space, x, f.flags_, cu_seqlens, f.y_);
          return f;
        }
      }
      f.y_ = std::visit(
          [&](const auto& schedule) {
            auto ws = schedule.pool().acquire();
            f.ws_ = ws;
            auto& documents = ws->documents;
            // The RoPE table of packed documents (or of a zigzag ring's two ranges) follows the layout and S.
            if (documents.layout.assign(space, cu_seqlens, shape.seq,
                                        static_cast<std::size_t>(config_.max_documents) + 1) ||
                documents.seq != shape.seq)
              documents.stale = true;
            documents.seq = shape.seq;
            return schedule.forward(space, {f.x_, f.flags_, *ws});
          },
          schedule_);
      // A forward whose backward computes nothing (no_grad, inference) gives its workspace back at once: the caller's y
      // keeps only itself, and the next forward reuses the workspace.
      if (!detail::needs_backward(f.flags_)) f.give_back();
      return f;
    } catch (const std::exception& e) {
      report_and_rethrow("mlacp::MlaAttention::forward", e, parked);
    }
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
    backward_into(space, f, dy, grads);
  }

  /// bf16 weight gradients, on request (bf16 layers; the default, gradients_type, is float): the pass's weight
  /// gradients are computed in float into the layer's own float buffers (allocated once, zeroed per call) and added
  /// to `grads` with one rounding per element, so a sum over micro-batches rounds once per micro-batch, not once per
  /// GEMM panel. dx is written as by the float overload.
  using bf16_gradients_type = MlaGradients<T, memory_space, compat::bf16>;
  template <class U = T, std::enable_if_t<std::is_same_v<U, compat::bf16>, int> = 0>
  void backward(const ExecSpace& space, Forward& f, const tensor3& dy, bf16_gradients_type& grads) const {
    backward_into(space, f, dy, grads);
  }

 private:
  template <class G>
  void backward_into(const ExecSpace& space, Forward& f, const tensor3& dy,
                     MlaGradients<T, memory_space, G>& grads) const {
    const detail::EntryGuard entry(*mesh_, "mlacp::MlaAttention::backward");
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
    // The pass runs with its forward's shape (another shape may have run since).
    if (state_error.empty()) context_.set_shape(f.batch_, f.seq_);
    // The caller's gradient Views are checked before the agreement too: a bad one on one rank raises the same error
    // on every rank, before any collective, instead of a hang or a write out of bounds.
    detail::check_input(context_, space, "backward", "dy", dy, f.flags_, state_error,
                        detail::gradients_error(context_, grads));
    f.backward_done_ = true;
    const std::uint64_t parked = diagnostics::parked_handles();
    try {
      compat::ScopedRegion region("mlacp::MlaAttention::backward");
      const auto gemm_scope = bf16_gemm_scope();
      detail::allocate_missing(context_, grads, f.flags_);
      // Weight gradients in another type than the schedules write (bf16 on request): into the float buffers first.
      constexpr bool staged = !std::is_same_v<G, gradient_value_t<T>>;
      gradients_type* target = nullptr;
      if constexpr (staged) {
        target = &staged_gradients(space, grads);
      } else {
        target = &grads;
      }
      // Without a workspace (given back at forward: no gradient needed) the backward has nothing to compute or send.
      // The workspace came from this layer's schedule (the owner check above), so it has the schedule's type.
      if (f.ws_) {
        std::visit(
            [&](const auto& schedule) {
              using W = typename std::decay_t<decltype(schedule)>::workspace_type;
              schedule.backward(space, {f.x_, f.flags_, static_cast<W&>(*f.ws_)}, dy, *target);
            },
            schedule_);
      } else if (f.widened_) {
        if constexpr (is_bf16) as_float_->backward(space, *f.widened_, dy, *target);
      }
      if constexpr (staged) add_staged_gradients(space, grads);
      f.give_back();
    } catch (const std::exception& e) {
      report_and_rethrow("mlacp::MlaAttention::backward", e, parked);
    }
  }

 private:
  // A pass that failed on this rank while collectives may be pending: the failure goes on the mesh's failure channel
  // (the others' waits raise CommunicationError naming it), and this rank raises it, an allocation failure as
  // OutOfMemory naming the View's label and the bytes. `parked`: diagnostics::parked_handles() when the pass began.
  // Where the pass parked handles, or handles are still pending (held by a workspace or the ring driver; they park when
  // the layer is destroyed), the schedule's buffers, which those requests may use, are kept for the life of the
  // process: requests on a broken mesh may never complete, and a peer's progress may still read a send buffer.
  [[noreturn]] void report_and_rethrow(const std::string& where, const std::exception& e, std::uint64_t parked) const {
    const auto out_of_memory =
        detail::translate_allocation_failure(e, where + ": rank " + std::to_string(mesh_->rank()));
    mesh_->report_failure(out_of_memory ? std::string(out_of_memory->what()) : where + ": " + e.what());
    std::visit(
        [&](const auto& schedule) {
          if (diagnostics::parked_handles() > parked || pending_collectives() > 0)
            schedule.keep_memory_of_parked_requests();
        },
        schedule_);
    if (out_of_memory && dynamic_cast<const OutOfMemory*>(&e) == nullptr) throw *out_of_memory;
    throw;
  }

  using context_type = detail::ScheduleContext<T, ExecSpace, Core>;
  /// The strategy's schedule, chosen once at construction.
  using schedule_type =
      std::variant<detail::LatentSchedule<T, ExecSpace, Core>, detail::ExpandedSchedule<T, ExecSpace, Core>>;

  // Packed documents for a core that takes no DocumentLayout ("" when the core takes one, or for one document).
  static std::string documents_error(const std::vector<std::int64_t>& cu_seqlens) {
    if (cu_seqlens.size() <= 2 || core_capabilities_v<Core>.documents) return "";
    return "mlacp::MlaAttention: cu_seqlens has " + std::to_string(cu_seqlens.size() - 1) +
           " documents but the attention core takes no DocumentLayout; expected a core whose capabilities "
           "include documents (attention_problem.hpp) or one document";
  }

  // A two-level mesh whose ring this layer cannot run ("" when it can): the core must compute positioned blocks
  // (the blocks capability, attention_problem.hpp), on bf16 Views itself for a bf16 layer.
  std::string ring_error(const Mesh& mesh) const {
    const std::string where = "mlacp::MlaAttention: the mesh has ring = " + std::to_string(mesh.ring_size()) + " (" +
                              std::to_string(mesh.ulysses_size()) + " x " + std::to_string(mesh.ring_size()) + ")";
    if (!detail::core_computes_blocks<Core, ExecSpace>(core_))
      return where +
             " but the attention core computes no positioned blocks on this execution space; expected a core "
             "whose capabilities include blocks (FlashAttentionCore, CausalAttentionCore; attention_problem.hpp) "
             "or ring = 1";
    if constexpr (is_bf16) {
      if (!detail::core_computes_bf16<Core, ExecSpace>(core_))
        return where +
               " on a bf16 layer but the attention core does not compute on bf16 Views; expected "
               "FlashAttentionCore's BLAS path (ring attention has no float copies of the travelling chunks) "
               "or ring = 1";
    }
    return "";
  }

  // config.wire_dtype on a layer that cannot use it ("" when it can): a double layer (the accuracy reference) takes
  // `same` only; bf16_all on a float layer whose latent reduce-scatter MPI would sum (it has no bf16 sum). A bf16
  // layer's wire is bf16 already: bf16 and bf16_all are accepted and change nothing; fp8 is refused (its codec
  // carries float).
  std::string wire_error(const Mesh& mesh) const {
    const WireDtype wire = config_.wire_dtype;
    if (wire == WireDtype::same) return "";
    if constexpr (std::is_same_v<T, double>) {
      return std::string("mlacp::MlaAttention: wire_dtype = ") + to_string(wire) +
             " on a double layer; expected wire_dtype = same (a narrower wire is for float layers; a double layer is "
             "the accuracy reference)";
    } else if constexpr (!std::is_same_v<T, float>) {
      if (wire == WireDtype::float8_e4m3)
        return "mlacp::MlaAttention: wire_dtype = fp8 on a bf16 layer; expected wire_dtype = same, bf16 or bf16_all "
               "(the fp8 codec carries float payloads; a bf16 layer's wire is bf16 already)";
    } else {
      if (wire == WireDtype::bfloat16_all && config_.strategy == MlaStrategy::latent && mesh.size() > 1 &&
          Backend<ExecSpace>::Transport::sums_with_mpi(mesh))
        return "mlacp::MlaAttention: wire_dtype = bf16_all moves the latent reduce-scatter's partial sums as bf16, "
               "which the mpi reduce-scatter algorithm (MLACP_REDUCE_SCATTER=mpi or ReduceScatterAlgorithm::mpi) "
               "cannot sum (MPI has no bf16 sum); expected wire_dtype = bf16 (partial sums in float) or the pairwise "
               "algorithm (the default)";
    }
    return "";
  }

  // The layer's float weight-gradient buffers for a backward into gradients of another type: one per gradient the
  // caller's struct holds (allocated), of its shape, zeroed; dx is the caller's own.
  template <class G>
  gradients_type& staged_gradients(const ExecSpace& space, const MlaGradients<T, memory_space, G>& grads) const {
    for_each_parameter(
        [&](const ParameterInfo& info, auto& mine, const auto& theirs) {
          if (theirs.data() == nullptr) {
            mine = std::remove_reference_t<decltype(mine)>();
            return;
          }
          if (detail::shape_of(mine) != detail::shape_of(theirs) || mine.data() == nullptr)
            mine = detail::allocate_view<std::remove_reference_t<decltype(mine)>>(
                std::string("mlacp::staged grad ") + info.name, detail::shape_of(theirs));
          else
            Kokkos::deep_copy(space, mine, 0.0f);
        },
        staged_, grads);
    staged_.dx = grads.dx;
    return staged_;
  }
  // grads += the staged float gradients, one rounding per element.
  template <class G>
  void add_staged_gradients(const ExecSpace& space, MlaGradients<T, memory_space, G>& grads) const {
    for_each_parameter(
        [&](const ParameterInfo&, const auto& mine, auto& theirs) {
          if (theirs.data() == nullptr) return;
          detail::add_staged_gradient(space, mine, theirs);
        },
        staged_, grads);
    staged_.dx = tensor3();
  }

  // f(the float path) where a bf16 layer has built one; 0 otherwise (and for float and double layers, which never
  // instantiate it).
  template <class F>
  std::size_t on_float_path(F&& f) const {
    if constexpr (is_bf16) {
      if (as_float_) return f(*as_float_);
    }
    return 0;
  }

  // The float path of a bf16 layer, built on first use (collective: every rank's forward reaches it with the same
  // choice, agreed or configured).
  detail::Bf16AsFloat<ExecSpace, Core>& float_path() const {
    if (!as_float_)
      as_float_ = std::make_shared<detail::Bf16AsFloat<ExecSpace, Core>>(config_, weights_, *mesh_, core_);
    return *as_float_;
  }

  // Bf16Compute::automatic, at the first forward (on every rank, after the call's checks). bf16 matrix hardware on
  // every rank (one allreduce): bf16, untimed. Otherwise a warm-up pass of each path, then two timed rounds alternating
  // (a pass: this forward, and backward with dy = y where the call needs gradients). Each path's best time, the
  // slowest rank's (one allreduce of the maximum), chooses; the other path's memory goes.
  void choose_bf16_compute(const ExecSpace& space, const tensor3& x, const MlaRequiresGrad& requires_grad,
                           const std::vector<std::int64_t>& cu_seqlens) const {
    // One allreduce of the maximum of `values` over the ranks (none on one rank).
    const auto agree_max = [this](std::vector<double>& values, const char* operation) {
      if (mesh_->size() == 1) return;
      CollectiveInfo info;
      info.name = "mlacp::MlaAttention: the bf16 compute choice";
      info.operation = operation;
      info.bytes = static_cast<std::int64_t>(values.size() * sizeof(double));
      mpi::allreduce_max(mesh_->comm(), values, info, "mlacp::MlaAttention::forward: the bf16 compute choice");
    };
    std::vector<double> without_hardware{bf16_plan_->on_bf16_hardware() ? 0.0 : 1.0};
    agree_max(without_hardware, "MPI_Iallreduce(MAX) of whether a rank lacks bf16 matrix hardware");
    compute_.chosen = untimed_bf16_compute(Bf16Compute::automatic, without_hardware[0] == 0.0);
    if (compute_.chosen != Bf16Compute::automatic) {
      compute_.by_hardware = true;
      return;
    }
    const bool backward_too = detail::needs_backward(flags_for(config_, requires_grad));
    gradients_type g;  // accumulated over the passes (the same work in each)
    const auto pass = [&](Bf16Compute path) {
      compute_.chosen = path;
      compat::fence(space, "mlacp: before a timed pass of the bf16 compute choice");
      const auto start = std::chrono::steady_clock::now();
      {
        Forward f = forward(space, x, requires_grad, cu_seqlens);
        if (backward_too) backward(space, f, f.output(), g);
      }
      compat::fence(space, "mlacp: after a timed pass of the bf16 compute choice");
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    std::vector<double> best(2, std::numeric_limits<double>::infinity());
    try {
      pass(Bf16Compute::bfloat16);
      pass(Bf16Compute::float32);
      for (int round = 0; round < 2; ++round) {
        best[0] = std::min(best[0], pass(Bf16Compute::bfloat16));
        best[1] = std::min(best[1], pass(Bf16Compute::float32));
      }
    } catch (...) {
      compute_.chosen = Bf16Compute::automatic;
      throw;
    }
    agree_max(best, "MPI_Iallreduce(MAX) of the two paths' times");
    compute_.bf16_seconds = best[0];
    compute_.float_seconds = best[1];
    compute_.chosen = best[1] < best[0] ? Bf16Compute::float32 : Bf16Compute::bfloat16;
    if (compute_.chosen == Bf16Compute::bfloat16) {
      as_float_.reset();
    } else {
      std::visit([](const auto& s) { s.pool().trim(0); }, schedule_);
    }
  }

  // The layer's bf16 plan installed for one call (nothing for float and double).
  std::unique_ptr<ScopedBf16GemmPlan<ExecSpace>> bf16_gemm_scope() const {
    if (!bf16_plan_) return nullptr;
    return std::make_unique<ScopedBf16GemmPlan<ExecSpace>>(*bf16_plan_);
  }

  schedule_type make_schedule() const {
    if (config_.strategy == MlaStrategy::latent) return detail::LatentSchedule<T, ExecSpace, Core>(context_);
    return detail::ExpandedSchedule<T, ExecSpace, Core>(context_);
  }

  // Declaration order is construction order: the context refers to the settings, the schedule (which owns the memory)
  // to the context (the layer is not movable, so these references stay valid).
  MlaConfig config_;
  weights_type weights_;
  const Mesh* mesh_;
  Core core_;
  DocumentLayout documents_;
  mutable std::optional<Bf16GemmPlan<ExecSpace>> bf16_plan_;  // bf16 layers only: a cache of shapes, like the pools
  mutable gradients_type staged_;      // float weight gradients of a backward into bf16 ones (on request)
  mutable Bf16ComputeChoice compute_;  // bf16 layers: what they compute with
  mutable std::shared_ptr<detail::Bf16AsFloat<ExecSpace, Core>> as_float_;      // bf16 layers computing in float
  mutable context_type context_{config_, weights_, *mesh_, core_, documents_};  // its shape: the pass's
  schedule_type schedule_ = make_schedule();
};

}  // namespace mlacp

#include <mlacp/mla/detail/bf16_as_float.hpp>
