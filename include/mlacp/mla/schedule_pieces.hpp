// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the MLA layer's two schedules (latent_schedule.hpp, expanded_schedule.hpp) share: the layer's settings and
// memory as one context, the input and gradient checks that run on every rank before any collective, and the compute
// pieces both strategies run (the q projection, the kv_a projection, attention + output projection, the output and
// attention backward, the Q branch's and the payload's backward). The MlaAttention plan owns the memory and dispatches
// to one schedule; a schedule says only what is its own: which collectives run, in which order, and what overlaps them.
#pragma once

#include <mlacp/all_gather.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/detail/finite_check.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/config.hpp>
#include <mlacp/mla/document_layout.hpp>
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
#include <mlacp/partition.hpp>
#include <mlacp/view_types.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mlacp::detail {

/// Which gradients of the pass need which part of the backward.
inline bool needs_q(const MlaRequiresGrad& r) { return r.x || r.w_q || r.b_q; }
inline bool needs_payload(const MlaRequiresGrad& r) { return r.x || r.w_kva || r.g_kv; }
inline bool needs_kv(const MlaRequiresGrad& r) { return needs_payload(r) || r.w_kvb || r.b_kvb; }
inline bool needs_attention(const MlaRequiresGrad& r) { return needs_q(r) || needs_kv(r); }

/// Whether Core's forward takes a trailing DocumentLayout (packed documents) after (space, q, k, v, o, lse).
template <class Core, class ExecSpace, class Tensor4View, class Tensor3View, class = void>
struct core_takes_documents : std::false_type {};
template <class Core, class ExecSpace, class Tensor4View, class Tensor3View>
struct core_takes_documents<
    Core, ExecSpace, Tensor4View, Tensor3View,
    std::void_t<decltype(std::declval<const Core&>().forward(
        std::declval<const ExecSpace&>(), std::declval<const Tensor4View&>(), std::declval<const Tensor4View&>(),
        std::declval<const Tensor4View&>(), std::declval<const Tensor4View&>(), std::declval<const Tensor3View&>(),
        std::declval<const DocumentLayout&>()))>> : std::true_type {};
template <class Core, class ExecSpace, class Tensor4View, class Tensor3View>
inline constexpr bool core_takes_documents_v = core_takes_documents<Core, ExecSpace, Tensor4View, Tensor3View>::value;

/// One forward pass as a schedule sees it: its input x [B, s, D], the gradients its backward will produce, and the
/// workspace it borrowed from the layer's pool.
template <class T, class ExecSpace>
struct ForwardPass {
  const Tensor3<T, typename ExecSpace::memory_space>& x;
  const MlaRequiresGrad& flags;
  ForwardWorkspace<T, ExecSpace>& w;
};

/// The layer's settings (configuration, weights, mesh, attention core) and its per-call scratch, with the pieces both
/// schedules use. It refers to what the layer owns (the layer is not movable, so the references stay valid); its
/// const operations write the scratch, which is a cache of this configuration.
template <class T, class ExecSpace, class Core>
class SchedulePieces {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using tensor3 = Tensor3<T, memory_space>;
  using tensor4 = Tensor4<T, memory_space>;
  using tensor5 = Tensor5<T, memory_space>;
  using matrix_rows = Matrix<T, memory_space, Unmanaged>;
  using vector_part = Vector<T, memory_space, Unmanaged>;
  using weights_type = MlaWeights<T, memory_space>;
  using gradients_type = MlaGradients<T, memory_space>;
  using forward_workspace = ForwardWorkspace<T, ExecSpace>;
  using scratch_type = LayerScratch<T, ExecSpace>;
  using pass_type = ForwardPass<T, ExecSpace>;

  SchedulePieces(const MlaConfig& config, const weights_type& weights, const Mesh& mesh, const Core& core,
                 const DocumentLayout& documents, scratch_type& scratch)
      : config_(&config),
        weights_(&weights),
        mesh_(&mesh),
        core_(&core),
        documents_(&documents),
        scratch_(&scratch),
        seq_part_(split(config.seq, mesh.size())),
        head_part_(split(config.heads, mesh.size())) {}

  const MlaConfig& config() const { return *config_; }
  const weights_type& weights() const { return *weights_; }
  const Mesh& mesh() const { return *mesh_; }
  scratch_type& scratch() const { return *scratch_; }
  /// The packed documents (config().cu_seqlens), the same on every rank; empty: one document.
  const DocumentLayout& documents() const { return *documents_; }
  /// How the tokens and the heads are split over the ranks (Partition's rule: the first S mod P ranks hold one token
  /// more, the first H mod P ranks one head more).
  const Partition& seq_partition() const { return seq_part_; }
  const Partition& head_partition() const { return head_part_; }
  int local_seq() const { return static_cast<int>(seq_part_.count(mesh_->rank())); }
  int local_heads() const { return static_cast<int>(head_part_.count(mesh_->rank())); }

  // ---- checks (before any collective, agreed by every rank) ----

  /// Every setting that changes which collective runs or which numbers come out; the doubles as their bit patterns
  /// (equal settings have equal bits, and the message names the setting).
  AgreementFields config_fields() const {
    auto bits = [](double v) {
      std::int64_t b = 0;
      std::memcpy(&b, &v, sizeof b);
      return b;
    };
    const MlaConfig& c = *config_;
    return {{"batch", c.batch},
            {"seq", c.seq},
            {"hidden", c.hidden},
            {"heads", c.heads},
            {"nope", c.nope},
            {"rope", c.rope},
            {"vdim", c.vdim},
            {"latent", c.latent},
            {"bias", c.bias},
            {"strategy", static_cast<int>(c.strategy)},
            {"overlap", c.overlap},
            {"rope_base (bit pattern of the double)", bits(c.rope_base)},
            {"rms_eps (bit pattern of the double)", bits(c.rms_eps)},
            {"cu_seqlens.size()", static_cast<std::int64_t>(c.cu_seqlens.size())},
            {"cu_seqlens (FNV-1a hash of the offsets)", hash_offsets(c.cu_seqlens)}};
  }

  /// FNV-1a over the bytes of the offsets: equal layouts hash equally; a differing one is caught with overwhelming
  /// probability (the sizes are compared too).
  static std::int64_t hash_offsets(const std::vector<std::int64_t>& offsets) {
    std::uint64_t h = 14695981039346656037ull;
    for (const std::int64_t v : offsets) {
      const auto u = static_cast<std::uint64_t>(v);
      for (int byte = 0; byte < 8; ++byte) {
        h ^= (u >> (8 * byte)) & 0xffu;
        h *= 1099511628211ull;
      }
    }
    std::int64_t out = 0;
    std::memcpy(&out, &h, sizeof out);
    return out;
  }

  /// The caller's gradient Views that are provided (allocated) must have exactly their weight's shape (dx: x's), else
  /// a message naming the first that does not; "" when all fit. Empty Views are allocated later where needed.
  std::string gradients_error(const gradients_type& g) const {
    const MlaConfig& c = *config_;
    std::string error;
    auto mismatch = [&](const char* name, const std::string& got, const std::string& expected) {
      error = std::string("mlacp::MlaAttention::backward: gradient ") + name + " has shape " + got + "; expected " +
              expected + " on rank " + std::to_string(mesh_->rank());
    };
    // The parameters' gradients, with the table's shapes (parameter_table.hpp).
    for_each_parameter(
        [&](const ParameterInfo& info, const auto& view) {
          if (!error.empty() || view.data() == nullptr) return;
          const ParameterShape expected = info.shape(c), got = shape_of(view);
          if (got != expected) mismatch(info.name, got.str(), expected.str());
        },
        static_cast<const MlaParameters<T, memory_space>&>(g));
    if (error.empty() && g.dx.data() != nullptr) {
      const std::array<std::size_t, 3> expected{
          static_cast<std::size_t>(c.batch), static_cast<std::size_t>(local_seq()), static_cast<std::size_t>(c.hidden)};
      const std::array<std::size_t, 3> got{g.dx.extent(0), g.dx.extent(1), g.dx.extent(2)};
      if (got != expected) mismatch("dx", extents_string(got), extents_string(expected));
    }
    return error;
  }

  /// Checks t's shape and agrees with the other ranks on it and on the flags; `usage_error` (misuse found by the
  /// caller) takes precedence and is raised as UsageError, then t's shape, then `other_error` (e.g. the gradients'),
  /// then the finite check (on the caller's instance `space`, which orders it after whatever wrote t).
  /// `extra`: more fields agreed in the same agreement (forward: the call's packed documents).
  void check_input(const ExecSpace& space, const char* where, const char* name, const tensor3& t,
                   const MlaRequiresGrad& r, const std::string& usage_error, const std::string& other_error,
                   const AgreementFields& extra = {}) const {
    const auto B = static_cast<std::size_t>(config_->batch), s = static_cast<std::size_t>(local_seq());
    const auto D = static_cast<std::size_t>(config_->hidden);
    std::string error = usage_error;
    if (error.empty() &&
        (t.extent(0) != B || t.extent(1) != s || t.extent(2) != D || (t.data() == nullptr && t.size() != 0)))
      error = std::string("mlacp::MlaAttention::") + where + ": " + name + " has shape [" +
              std::to_string(t.extent(0)) + ", " + std::to_string(t.extent(1)) + ", " + std::to_string(t.extent(2)) +
              "]" + (t.data() == nullptr ? " (unallocated)" : "") + "; expected [B, s, D] = [" + std::to_string(B) +
              ", " + std::to_string(s) + ", " + std::to_string(D) +
              "] (s: this rank's tokens of S = " + std::to_string(config_->seq) + " split as " + seq_part_.str() +
              ") on rank " + std::to_string(mesh_->rank()) + " of a group of P = " + std::to_string(mesh_->size());
    if (error.empty()) error = other_error;
    if (error.empty() && mesh_->check_finite()) {
      const auto bad = count_non_finite(space, t);
      if (bad > 0)
        error = std::string("mlacp::MlaAttention::") + where + ": " + name + " holds " + std::to_string(bad) +
                " non-finite value(s) (NaN or Inf) on rank " + std::to_string(mesh_->rank()) + " (finite check on)";
    }
    // Bit 0: x, bit i + 1: the parameter table's entry i (parameter_table.hpp).
    const std::int64_t flags = flag_word(r);
    agree_or_throw(*mesh_, std::string("mlacp::MlaAttention::") + where, error,
                   with_extra(extra, {{std::string(name) + ".extent(0)", static_cast<std::int64_t>(t.extent(0))},
                                      // The token extents differ across ranks on an uneven split: agreed as the excess
                                      // over this rank's count (0 everywhere when every rank passes its own).
                                      {std::string(name) + ".extent(1) - this rank's token count",
                                       static_cast<std::int64_t>(t.extent(1)) - static_cast<std::int64_t>(s)},
                                      {std::string(name) + ".extent(2)", static_cast<std::int64_t>(t.extent(2))},
                                      {"the gradient flags (MlaRequiresGrad)", flags}}),
                   std::string(name) + " [" + std::to_string(t.extent(0)) + ", " + std::to_string(t.extent(1)) + ", " +
                       std::to_string(t.extent(2)) + "]",
                   !usage_error.empty());
  }

  /// Gradient Views the caller did not provide and that are needed are allocated (zeroed) with their shapes; provided
  /// ones (checked with every rank before anything ran, gradients_error) are used as they are.
  void allocate_missing(gradients_type& g, const MlaRequiresGrad& r) const {
    const MlaConfig& c = *config_;
    for_each_parameter(
        [&](const ParameterInfo& info, auto& view) {
          if (r.*(info.flag) && info.present(c) && view.data() == nullptr)
            view = allocate_view<std::remove_reference_t<decltype(view)>>(std::string("mlacp::grad ") + info.name,
                                                                          info.shape(c));
        },
        static_cast<MlaParameters<T, memory_space>&>(g));
    if (r.x && g.dx.data() == nullptr)
      g.dx = tensor3("mlacp::dx", static_cast<std::size_t>(c.batch), static_cast<std::size_t>(local_seq()),
                     static_cast<std::size_t>(c.hidden));
  }

  // ---- where the collectives write, and the rank's part of w_kvb ----

  /// A collective's destination in the layer's memory (allocated once); empty at P == 1, where a collective returns
  /// its input and writes nothing.
  template <class ViewType, class... Extents>
  ViewType into(ViewType& slot, const char* label, Extents... n) const {
    return mesh_->size() > 1 ? ensure(slot, label, n...) : ViewType();
  }
  /// The head blocks an inverse all-to-all receives: the P blocks [P, B, s, h, d] of an even head split, or one block
  /// of all heads [1, B, s, H, d] when the heads are split unevenly (InputA2APair::launch_backward).
  tensor5 blocks_into(tensor5& slot, const char* label, int d) const {
    if (head_part_.uniform()) return into(slot, label, mesh_->size(), config_->batch, local_seq(), local_heads(), d);
    return into(slot, label, 1, config_->batch, local_seq(), config_->heads, d);
  }

  /// The rank's head rows of w_kvb (and of its gradient): rows [o*(dn+dv), (o+h)*(dn+dv)) with o the rank's first head
  /// and h its head count (head_partition()).
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

  /// The RoPE table of this rank's token positions in the pass's documents, read by every rotation of q, k_pe and
  /// their gradients. One document: the global token indices [o, o + s) (o, s: the rank's seq_partition() offset and
  /// count), one table for the layer built on first use. Packed documents: the position within each token's document,
  /// restarting at 0 at its start, in the pass's workspace; rebuilt in place (no allocation after the workspace's
  /// first) when the pass brought another layout than the workspace's last.
  const RopeTable<memory_space>& rope_table(const ExecSpace& space, const pass_type& p) const {
    const std::int64_t offset = seq_part_.offset(mesh_->rank());
    const int width = config_->rope;
    const double base = config_->rope_base;
    auto& d = p.w.documents;
    if (d.layout.single()) {
      auto& table = scratch_->rope;
      if (!table.matches(local_seq(), offset, width, base))
        table = make_rope_table(space, local_seq(), offset, width, base);
      return table;
    }
    if (!d.stale) return d.table;
    const auto s = static_cast<std::size_t>(local_seq());
    ensure(d.positions, "mlacp::rope positions", s);
    fill_rope_positions(space, d.positions, offset, d.layout);
    if (!(d.table.cos.data() != nullptr && d.table.cos.extent(0) == s && d.table.width == width &&
          d.table.base == base))
      d.table = allocate_rope_table<memory_space>(static_cast<std::int64_t>(s), width, base);
    refill_rope_table(space, d.table, d.positions);
    d.stale = false;
    return d.table;
  }

  // ---- forward pieces ----

  /// q = RoPE(x w_q^T + b_q) [B, s, H, dqk], in the workspace.
  tensor4 project_q(const ExecSpace& space, const pass_type& p) const {
    const MlaConfig& c = *config_;
    const int B = c.batch, s = local_seq(), D = c.hidden, H = c.heads, dqk = c.qk_dim();
    const tensor4& q = ensure(p.w.q_local, "mlacp::q", B, s, H, dqk);
    ComputePhase<ExecSpace> phase(space, "w_q fprop");
    linear_forward(space, as_matrix(p.x, B * s, D), weights_->w_q, weights_->b_q, as_matrix(q, B * s, H * dqk));
    rope_forward(space, q, c.nope, q, c.nope, rope_table(space, p));
    return q;
  }

  /// kv_a = x w_kva^T [B, s, R+dr] (saved for the RMSNorm backward), then RMSNorm(c) into columns [0, R) of
  /// `latent_out` and RoPE(k_pe) into columns [rope_first, rope_first + dr) of `rope_out`: each kernel writes straight
  /// where its result is used (the payload in the latent strategy, c and k_pe in the expanded one), no copies.
  void project_kv_a(const ExecSpace& space, const pass_type& p, const tensor3& latent_out, const tensor3& rope_out,
                    int rope_first) const {
    const MlaConfig& c = *config_;
    const int B = c.batch, s = local_seq(), D = c.hidden, R = c.latent, dr = c.rope;
    ComputePhase<ExecSpace> phase(space, "w_kva fprop");
    const tensor3& kv_a = ensure(p.w.kv_a, "mlacp::kv_a", B, s, R + dr);
    linear_forward(space, as_matrix(p.x, B * s, D), weights_->w_kva, vector_part(), as_matrix(kv_a, B * s, R + dr));
    rms_norm_forward(space, kv_a, weights_->g_kv, latent_out, ensure(p.w.rstd, "mlacp::rstd", B * s), c.rms_eps);
    rope_forward(space, as_rank4(kv_a), R, as_rank4(rope_out), rope_first, rope_table(space, p));
  }

  /// The attention core on the saved head-local q, k, v, then the output projection (its all-to-all and w_o): y.
  tensor3 attend_and_project(const ExecSpace& space, const pass_type& p) const {
    const MlaConfig& c = *config_;
    const int B = c.batch, S = c.seq, s = local_seq(), h = local_heads();
    forward_workspace& w = p.w;
    ensure(w.o, "mlacp::o", B, S, h, c.vdim);
    ensure(w.lse, "mlacp::lse", B, h, S);
    {
      ComputePhase<ExecSpace> phase(space, "attention fprop");
      core_forward(space, p, w.q_saved, w.k_saved, w.v_saved, w.o, w.lse);
    }
    return w.out_proj.forward(space, w.o, weights_->w_o, weights_->b_o, *mesh_, seq_part_, head_part_,
                              ensure(w.y, "mlacp::y", B, s, c.hidden),
                              into(w.o_tokens, "mlacp::o tokens", B, s, c.heads, c.vdim));
  }

  // ---- backward pieces ----

  /// The output projection's backward (dO all-to-all overlapped with the w_o wgrad), then the attention backward on
  /// head-local data: dq (if the Q branch needs it), dk and dv (if the KV path needs them). False when nothing upstream
  /// of the attention needs a gradient (then nothing more runs).
  bool output_and_attention_backward(const ExecSpace& space, const pass_type& p, const tensor3& dy, gradients_type& g,
                                     tensor4& dq, tensor4& dk, tensor4& dv) const {
    const MlaConfig& c = *config_;
    const MlaRequiresGrad& r = p.flags;
    const int B = c.batch, S = c.seq, h = local_heads();
    scratch_type& scratch = *scratch_;
    forward_workspace& w = p.w;
    tensor4 d_o = w.out_proj.backward(
        space, dy, needs_attention(r), r.w_o ? g.w_o : decltype(g.w_o)(), r.b_o && c.bias ? g.b_o : decltype(g.b_o)(),
        c.overlap, needs_attention(r) ? d_o_blocks() : tensor5(),
        needs_attention(r) ? into(scratch.d_o_heads, "mlacp::dO heads", 1, B, S, h, c.vdim) : tensor5());
    if (!needs_attention(r)) return false;
    // The core overwrites its gradients: the scratch needs no zeroing.
    if (needs_q(r)) dq = ensure(scratch.dq, "mlacp::dq", B, S, h, c.qk_dim());
    if (needs_kv(r)) {
      dk = ensure(scratch.dk, "mlacp::dk", B, S, h, c.qk_dim());
      dv = ensure(scratch.dv, "mlacp::dv", B, S, h, c.vdim);
    }
    ComputePhase<ExecSpace> phase(space, "attention bprop");
    core_backward(space, p, w.q_saved, w.k_saved, w.v_saved, w.o, w.lse, d_o, dq, dk, dv);
    return true;
  }

  /// The token-local dq as the head blocks [P, B, s, h, dqk] the inverse all-to-all received (block r: heads
  /// [r*h, (r+1)*h); one block [1, B, s, H, dqk] when the heads are split unevenly) -> w_q / b_q gradients and dx += dq
  /// w_q, one GEMM per block on w_q's rows of its heads (no unpack).
  void q_branch_backward(const ExecSpace& space, const pass_type& p, const tensor5& dq_blocks,
                         gradients_type& g) const {
    const MlaConfig& c = *config_;
    const int B = c.batch, s = local_seq(), D = c.hidden, dqk = c.qk_dim();
    const auto parts = static_cast<std::int64_t>(dq_blocks.extent(0)),
               h = static_cast<std::int64_t>(dq_blocks.extent(3));
    const std::int64_t rows = static_cast<std::int64_t>(B) * s, width = h * dqk;
    ComputePhase<ExecSpace> phase(space, "q backward");
    // RoPE acts per token and head: the blocks are P*B batches of [s, h, dqk] with the same positions.
    const tensor4 blocks(dq_blocks.data(), parts * B, s, h, dqk);
    rope_backward(space, blocks, c.nope, blocks, c.nope, rope_table(space, p));
    const auto x2 = as_matrix(p.x, rows, D);
    for (std::int64_t r = 0; r < parts; ++r) {
      const matrix_rows block(dq_blocks.data() + r * rows * width, static_cast<std::size_t>(rows),
                              static_cast<std::size_t>(width));
      const auto heads = std::make_pair(static_cast<std::size_t>(r * width), static_cast<std::size_t>((r + 1) * width));
      if (p.flags.w_q) linear_wgrad(space, block, x2, Kokkos::subview(g.w_q, heads, Kokkos::ALL()));
      if (p.flags.b_q && c.bias) bias_grad(space, block, Kokkos::subview(g.b_q, heads));
      if (p.flags.x)
        linear_dgrad(space, block, Kokkos::subview(weights_->w_q, heads, Kokkos::ALL()), T(1),
                     as_matrix(g.dx, rows, D));
    }
  }

  /// The local payload gradient -> g_kv / w_kva gradients and dx += d(kv_a) w_kva. The latent's gradient is columns
  /// [0, R) of `d_latent` [B, s, >= R]; the rotated key's is columns [rope_first, rope_first + dr) of `d_rope`. The
  /// RoPE transpose writes straight into d(kv_a)'s last dr columns and the RMSNorm backward into its first R.
  void payload_backward(const ExecSpace& space, const pass_type& p, const tensor3& d_latent, const tensor3& d_rope,
                        int rope_first, gradients_type& g) const {
    const MlaConfig& c = *config_;
    const int B = c.batch, s = local_seq(), D = c.hidden, R = c.latent, dr = c.rope;
    const tensor3& d_kv_a = ensure(scratch_->d_kv_a, "mlacp::d kv_a", B, s, R + dr);
    rope_backward(space, as_rank4(d_rope), rope_first, as_rank4(d_kv_a), R, rope_table(space, p));
    rms_norm_backward(space, p.w.kv_a, weights_->g_kv, p.w.rstd, d_latent, d_kv_a,
                      p.flags.g_kv ? g.g_kv : decltype(g.g_kv)());
    const auto da2 = as_matrix(d_kv_a, B * s, R + dr);
    if (p.flags.w_kva) linear_wgrad(space, da2, as_matrix(p.x, B * s, D), g.w_kva);
    if (p.flags.x) linear_dgrad(space, da2, weights_->w_kva, T(1), as_matrix(g.dx, B * s, D));
  }

 private:
  // The core with the pass's document layout; a core that takes no layout (see attention_core.hpp) is only called
  // with one document (the layer refuses packed documents for it, at construction and per call).
  template <class... Args>
  void core_forward(const ExecSpace& space, const pass_type& p, const Args&... args) const {
    if constexpr (core_takes_documents_v<Core, ExecSpace, tensor4, Tensor3<T, memory_space>>)
      core_->forward(space, args..., p.w.documents.layout);
    else
      core_->forward(space, args...);
  }
  template <class... Args>
  void core_backward(const ExecSpace& space, const pass_type& p, const Args&... args) const {
    if constexpr (core_takes_documents_v<Core, ExecSpace, tensor4, Tensor3<T, memory_space>>)
      core_->backward(space, args..., p.w.documents.layout);
    else
      core_->backward(space, args...);
  }

  static AgreementFields with_extra(const AgreementFields& extra, AgreementFields fields) {
    fields.insert(fields.end(), extra.begin(), extra.end());
    return fields;
  }

  std::pair<std::size_t, std::size_t> selected_rows() const {
    const auto width = static_cast<std::size_t>(config_->nope + config_->vdim);
    const auto first = static_cast<std::size_t>(head_part_.offset(mesh_->rank()));
    return {first * width, (first + static_cast<std::size_t>(local_heads())) * width};
  }

  // The dO the output projection's backward writes in the all-to-all's send layout: the P head blocks [P, B, s, h, dv]
  // of an even head split, or all heads [1, B, s, H, dv] when they are split unevenly (OutputProjection::backward).
  tensor5 d_o_blocks() const {
    const MlaConfig& c = *config_;
    if (head_part_.uniform())
      return ensure(scratch_->d_o_blocks, "mlacp::dO blocks", mesh_->size(), c.batch, local_seq(), local_heads(),
                    c.vdim);
    return ensure(scratch_->d_o_blocks, "mlacp::dO blocks", 1, c.batch, local_seq(), c.heads, c.vdim);
  }

  // A Partition of a configuration's extent; one that is not positive gets a placeholder (the configuration error
  // names it before anything runs).
  static Partition split(int total, int parts) { return Partition(total > 0 ? total : 0, parts > 0 ? parts : 1); }

  const MlaConfig* config_;
  const weights_type* weights_;
  const Mesh* mesh_;
  const Core* core_;
  const DocumentLayout* documents_;
  scratch_type* scratch_;
  Partition seq_part_;
  Partition head_part_;
};

}  // namespace mlacp::detail
