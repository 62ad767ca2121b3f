// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What every part of an MLA schedule reads: the layer's settings (configuration, weights, mesh, attention core, the
// configuration's packed documents), the shape of the pass that runs (its B and S, the TokenMap of that S), how
// tokens and heads are split over the ranks, where collectives write, the rank's rows of w_kvb, the RoPE table of a
// pass and the attention core's call. It owns no per-call memory: each schedule owns its own (forward_workspace.hpp).
#pragma once

#include <mlacp/compat.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/detail/forward_workspace.hpp>
#include <mlacp/mla/detail/timeline.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/mla/kernels/attention_problem.hpp>
#include <mlacp/mla/kernels/rope.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/mla/weights.hpp>
#include <mlacp/mla/wire_policy.hpp>
#include <mlacp/partition.hpp>
#include <mlacp/token_map.hpp>
#include <mlacp/view_types.hpp>
#include <mlacp/wire/cast.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace mlacp::detail {

/// dst = src converted through float (bf16 widened or float rounded), two rank-4 Views of the same extents. (A free
/// function: nvcc refuses a device lambda in a private member function.)
template <class ExecSpace, class Src, class Dst>
void convert_tensor4(const ExecSpace& space, const char* label, const Src& src, const Dst& dst) {
  using D = typename Dst::non_const_value_type;
  if (dst.size() == 0) return;
  Kokkos::parallel_for(
      label,
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>, Kokkos::IndexType<std::int64_t>>(
          space, {0, 0, 0, 0},
          {static_cast<std::int64_t>(dst.extent(0)), static_cast<std::int64_t>(dst.extent(1)),
           static_cast<std::int64_t>(dst.extent(2)), static_cast<std::int64_t>(dst.extent(3))}),
      KOKKOS_LAMBDA(const std::int64_t a, const std::int64_t b, const std::int64_t c, const std::int64_t d) {
        dst(a, b, c, d) = cast_value<D>(src(a, b, c, d));
      });
}

/// The layer's settings as its schedules read them. It refers to what the layer owns (the layer is not movable, so
/// the references stay valid); the one-document RoPE table is a cache of this configuration, built on first use.
///
/// The pass's shape: config() is the layer's configuration with batch and seq those of the pass that runs now
/// (set_shape, before each forward and backward; a layer runs one pass at a time), and the token map and the
/// partitions follow that S. Until the first pass they are the configuration's (its maxima; 0 when unset).
template <class T, class ExecSpace, class Core>
class ScheduleContext {
 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using value_type = T;
  using tensor3 = Tensor3<T, memory_space>;
  using tensor4 = Tensor4<T, memory_space>;
  using tensor5 = Tensor5<T, memory_space>;
  using matrix_rows = Matrix<T, memory_space, Unmanaged>;
  using vector_part = Vector<T, memory_space, Unmanaged>;
  using weights_type = MlaWeights<T, memory_space>;
  using gradients_type = MlaGradients<T, memory_space>;
  /// The weight gradients' value type (float for bf16 weights, weights.hpp) and windows on them.
  using gradient_value_type = gradient_value_t<T>;
  using gradient_rows = Matrix<gradient_value_type, memory_space, Unmanaged>;
  using gradient_part = Vector<gradient_value_type, memory_space, Unmanaged>;
  using pass_type = ForwardPass<T, ExecSpace>;
  /// The Views the attention core computes on: T's for float and double; float for bf16, whose q, k, v, o and dO the
  /// context widens into float scratch around the core's call and whose gradients it rounds back (core_forward).
  using core_value_type = compat::accumulation_t<T>;
  using core_tensor3 = Tensor3<core_value_type, memory_space>;
  using core_tensor4 = Tensor4<core_value_type, memory_space>;
  static constexpr bool widens_for_core = !std::is_same_v<core_value_type, T>;

  /// `mesh` is the layer's whole mesh; on a two-level mesh (ring size C > 1) every Ulysses collective runs on its
  /// Ulysses group (mesh()), the ring's exchanges on its ring (ring_mesh()), and the tokens are split by the
  /// configuration's ring layout (token_map()).
  ScheduleContext(const MlaConfig& config, const weights_type& weights, const Mesh& mesh, const Core& core,
                  const DocumentLayout& documents)
      : config_(config),
        frequencies_(rope_frequencies(config)),
        weights_(&weights),
        whole_(&mesh),
        mesh_(&mesh.ulysses_group()),
        ring_(mesh.ring_size() > 1 ? &mesh.ring_group() : nullptr),
        core_(&core),
        documents_(&documents),
        token_map_(config.seq > 0 ? config.seq : 0, mesh.ulysses_size(), mesh.ring_size(), config.ring_layout),
        seq_part_(ring_ ? token_map_.chunk_partition(ring_->rank()) : split(config.seq, mesh.size())),
        head_part_(split(config.heads, mesh_->size())) {}

  /// The layer's configuration with the pass's batch and seq.
  const MlaConfig& config() const { return config_; }
  /// Makes (B, S) the shape of the passes that follow: config().batch and seq, the token map of S and the token
  /// partition. Nothing changes (and nothing is allocated) when the shape is the current one.
  void set_shape(int batch, int seq) {
    if (batch == config_.batch && seq == config_.seq) return;
    token_map_ = TokenMap(seq, whole_->ulysses_size(), whole_->ring_size(), config_.ring_layout);
    seq_part_ = ring_ ? token_map_.chunk_partition(ring_->rank()) : split(seq, whole_->size());
    config_.batch = batch;
    config_.seq = seq;
  }
  const weights_type& weights() const { return *weights_; }
  /// The Ulysses group: where the all-to-alls, the latent all-gather and reduce-scatter run (the whole mesh when flat).
  const Mesh& mesh() const { return *mesh_; }
  /// The layer's whole mesh: where the inputs are agreed and failures reported.
  const Mesh& whole_mesh() const { return *whole_; }
  /// Ring attention (a two-level mesh with C > 1): this rank's ring, its place in it, and the token map.
  bool ring() const { return ring_ != nullptr; }
  const Mesh& ring_mesh() const { return *ring_; }
  int ring_rank() const { return ring_ ? ring_->rank() : 0; }
  int ring_size() const { return ring_ ? ring_->size() : 1; }
  const TokenMap& token_map() const { return token_map_; }
  /// The attention core (the ring calls its block forms directly, ring_attention.hpp).
  const Core& core() const { return *core_; }
  /// The tokens of the head-local attention operands (q, k, v, o [B, attention_seq(), h, *]): S when flat, this rank's
  /// ring chunk (token_map().chunk_size(ring_rank())) on a ring.
  int attention_seq() const {
    return ring_ ? static_cast<int>(token_map_.chunk_size(ring_->rank())) : (config_.seq > 0 ? config_.seq : 0);
  }
  /// The packed documents of config().cu_seqlens, the same on every rank; empty: one document.
  const DocumentLayout& documents() const { return *documents_; }
  /// How the tokens and the heads are split over the ranks (Partition's rule: the first S mod P ranks hold one token
  /// more, the first H mod P ranks one head more).
  const Partition& seq_partition() const { return seq_part_; }
  const Partition& head_partition() const { return head_part_; }
  int local_seq() const { return static_cast<int>(seq_part_.count(mesh_->rank())); }
  int local_heads() const { return static_cast<int>(head_part_.count(mesh_->rank())); }

  // ---- where the collectives write, and the rank's part of w_kvb ----

  /// A collective's destination in the layer's memory (allocated once); empty at P == 1, where a collective returns
  /// its input and writes nothing.
  template <class ViewType, class... Extents>
  ViewType into(Buffer<ViewType>& slot, const char* label, Extents... n) const {
    return mesh_->size() > 1 ? ensure(slot, label, n...) : ViewType();
  }
  /// The wire codec of one kind of this layer's exchanges (MlaConfig::wire_dtype's row of mla/wire_policy.hpp) for a
  /// float layer; same for the others (a bf16 layer's wire is bf16 already, a double layer refuses the setting). The
  /// collectives launch plainly at P == 1 whatever the codec.
  WireCodec codec(WireExchange exchange) const {
    if constexpr (std::is_same_v<T, float>)
      return wire_codec(config_.wire_dtype, exchange);
    else
      return WireCodec::same;
  }

  /// Head blocks of d columns as an inverse all-to-all receives them, or as the dO all-to-all sends them: the P blocks
  /// [P, B, s, h, d] of an even head split, or one block of all heads [1, B, s, H, d] when the heads are split
  /// unevenly (InputA2APair::launch_backward, OutputProjection::backward). `into`: empty at P == 1.
  tensor5 blocks_into(Buffer<tensor5>& slot, const char* label, int d) const {
    if (head_part_.uniform()) return into(slot, label, mesh_->size(), config_.batch, local_seq(), local_heads(), d);
    return into(slot, label, 1, config_.batch, local_seq(), config_.heads, d);
  }
  tensor5 blocks(Buffer<tensor5>& slot, const char* label, int d) const {
    if (head_part_.uniform()) return ensure(slot, label, mesh_->size(), config_.batch, local_seq(), local_heads(), d);
    return ensure(slot, label, 1, config_.batch, local_seq(), config_.heads, d);
  }

  /// The rank's head rows of w_kvb (and of its gradient): rows [o*(dn+dv), (o+h)*(dn+dv)) with o the rank's first head
  /// and h its head count (head_partition()).
  template <class M>
  Matrix<typename M::value_type, memory_space, Unmanaged> rows_of(const M& m) const {
    using rows_type = Matrix<typename M::value_type, memory_space, Unmanaged>;
    if (m.data() == nullptr) return rows_type();
    const auto [begin, end] = selected_rows();
    return rows_type(m.data() + begin * m.extent(1), end - begin, m.extent(1));
  }
  template <class V>
  Vector<typename V::value_type, memory_space, Unmanaged> part_of(const V& v) const {
    using part_type = Vector<typename V::value_type, memory_space, Unmanaged>;
    if (v.data() == nullptr) return part_type();
    const auto [begin, end] = selected_rows();
    return part_type(v.data() + begin, end - begin);
  }

  /// The RoPE table of this rank's token positions in the pass's documents, read by every rotation of q, k_pe and
  /// their gradients. One document: the global token indices [o, o + s) (o, s: the rank's seq_partition() offset and
  /// count), one table for the layer built on first use. Packed documents: the position within each token's document,
  /// restarting at 0 at its start, kept with the pass's documents; rebuilt in place (no allocation after the
  /// workspace's first) when the pass brought another layout than the workspace's last.
  ///
  /// On a ring the positions stay global: the rank's tokens are the global ranges token_map().ranges(g, u) (one range,
  /// or two with the zigzag layout, whose positions go through the explicit table as packed documents do).
  const RopeTable<memory_space>& rope_table(const ExecSpace& space, ForwardDocuments<memory_space>& d) const {
    const auto& ranges = token_map_.ranges(ring_rank(), mesh_->rank());
    const std::int64_t offset = ranges.empty() ? 0 : ranges.front().begin;
    const int width = config_.rope;
    const RopeFrequencies& frequencies = frequencies_;
    if (d.layout.single() && ranges.size() <= 1) {
      if (!one_document_rope_.table.matches(local_seq(), offset, width, frequencies)) {
        RopeTable<memory_space>& table = one_document_rope_.lay_out(local_seq(), width, frequencies);
        table.position_offset = offset;
        rope_fill_table(space, table, Kokkos::View<const std::int64_t*, memory_space>(), false);
      }
      return one_document_rope_.table;
    }
    if (!d.stale) return d.table.table;
    const auto s = static_cast<std::size_t>(local_seq());
    ensure(d.positions, "mlacp::rope positions", s);
    std::size_t row = 0;
    for (const TokenRange& range : ranges) {
      const auto n = static_cast<std::size_t>(range.count);
      fill_rope_positions(space, Kokkos::subview(d.positions.view(), std::make_pair(row, row + n)), range.begin,
                          d.layout);
      row += n;
    }
    RopeTable<memory_space>& table = d.table.lay_out(static_cast<std::int64_t>(s), width, frequencies);
    refill_rope_table(space, table, d.positions.view());
    d.stale = false;
    return table;
  }
  const RopeTable<memory_space>& rope_table(const ExecSpace& space, const pass_type& p) const {
    return rope_table(space, p.w.documents);
  }

  /// The attention core on the pass's square problem (attention_problem.hpp) with its document layout; a core without
  /// the documents capability is only called with one document (the layer refuses packed documents for it, at
  /// construction and per call). For bf16:
  /// a core that computes on bf16 itself (core_computes_bf16: FlashAttentionCore's BLAS path, bf16 tile products with
  /// float accumulation) gets the bf16 Views and the float lse; any other core computes in float: q, k, v (and o, dO)
  /// are widened into the context's float scratch, the core runs on it, and o (dq, dk, dv) are rounded back once. The
  /// widening is O(S) against the core's O(S^2) and the scratch is reused by every call.
  template <class Q, class K, class V, class O, class Lse>
  void core_forward(const ExecSpace& space, const pass_type& p, const Q& q, const K& k, const V& v, const O& o,
                    const Lse& lse) const {
    if constexpr (widens_for_core) {
      if (core_computes_bf16<Core, ExecSpace>(*core_)) return call_core_forward(space, p, q, k, v, o, lse);
      auto& m = core_scratch_;
      const core_tensor4 qf = widened(space, q, m.q, "mlacp::core q (float)");
      const core_tensor4 kf = widened(space, k, m.k, "mlacp::core k (float)");
      const core_tensor4 vf = widened(space, v, m.v, "mlacp::core v (float)");
      const core_tensor4 of = like(o, m.o, "mlacp::core o (float)");
      call_core_forward(space, p, qf, kf, vf, of, lse);
      round_into(space, of, o);
    } else {
      call_core_forward(space, p, q, k, v, o, lse);
    }
  }
  template <class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
  void core_backward(const ExecSpace& space, const pass_type& p, const Q& q, const K& k, const V& v, const O& o,
                     const Lse& lse, const DO& d_o, const DQ& dq, const DK& dk, const DV& dv) const {
    if constexpr (widens_for_core) {
      if (core_computes_bf16<Core, ExecSpace>(*core_))
        return call_core_backward(space, p, q, k, v, o, lse, d_o, dq, dk, dv);
      auto& m = core_scratch_;
      const core_tensor4 qf = widened(space, q, m.q, "mlacp::core q (float)");
      const core_tensor4 kf = widened(space, k, m.k, "mlacp::core k (float)");
      const core_tensor4 vf = widened(space, v, m.v, "mlacp::core v (float)");
      const core_tensor4 of = widened(space, o, m.o, "mlacp::core o (float)");
      const core_tensor4 dof = widened(space, d_o, m.d_o, "mlacp::core dO (float)");
      // An empty gradient View means "not needed" to the core: it stays empty.
      const core_tensor4 dqf = dq.data() ? like(dq, m.dq, "mlacp::core dq (float)") : core_tensor4();
      const core_tensor4 dkf = dk.data() ? like(dk, m.dk, "mlacp::core dk (float)") : core_tensor4();
      const core_tensor4 dvf = dv.data() ? like(dv, m.dv, "mlacp::core dv (float)") : core_tensor4();
      call_core_backward(space, p, qf, kf, vf, of, lse, dof, dqf, dkf, dvf);
      if (dq.data()) round_into(space, dqf, dq);
      if (dk.data()) round_into(space, dkf, dk);
      if (dv.data()) round_into(space, dvf, dv);
    } else {
      call_core_backward(space, p, q, k, v, o, lse, d_o, dq, dk, dv);
    }
  }
  /// Whether the forward's attention runs as one block per owner rank's query rows (timeline.hpp, Facts::o_blocks):
  /// flat, a Ulysses group of more than one rank, and a core that computes positioned problems on the layer's own
  /// Views (for bf16: one that computes on bf16 itself; the float copies of the other cores are of whole tensors).
  bool core_attends_blocks() const {
    if (ring() || mesh_->size() == 1 || !core_computes_blocks<Core, ExecSpace>(*core_)) return false;
    if constexpr (widens_for_core) return core_computes_bf16<Core, ExecSpace>(*core_);
    return true;
  }
  /// The core's forward of the query rows [first, first + count) of q [B, S, h, dqk] against the keys of their causal
  /// prefix [0, first + count) of k, v: a positioned problem (attention_problem.hpp) that overwrites those rows of o
  /// [B, S, h, dv] and lse [B, h, S]. Only where core_attends_blocks().
  template <class Q, class K, class V, class O, class Lse>
  void core_forward_rows(const ExecSpace& space, const pass_type& p, const Q& q, const K& k, const V& v, const O& o,
                         const Lse& lse, std::int64_t first, std::int64_t count) const {
    if constexpr (core_capabilities_v<Core>.blocks) {
      core_->forward(space, attention_rows_problem(q, k, v, o, lse, first, count, core_documents(p)));
    } else {
      (void)space, (void)p, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)first, (void)count;
      throw UsageError("mlacp: the attention in blocks with a core that computes no positioned problems");
    }
  }
  /// Bytes of the float scratch the bf16 core call holds (0 for float and double).
  std::size_t core_scratch_bytes() const {
    const auto& m = core_scratch_;
    return bytes_of(m.q, m.k, m.v, m.o, m.d_o, m.dq, m.dk, m.dv);
  }

 private:
  std::pair<std::size_t, std::size_t> selected_rows() const {
    const auto width = static_cast<std::size_t>(config_.nope + config_.vdim);
    const auto first = static_cast<std::size_t>(head_part_.offset(mesh_->rank()));
    return {first * width, (first + static_cast<std::size_t>(local_heads())) * width};
  }

  // A Partition of a configuration's extent; one that is not positive gets a placeholder (the configuration error
  // names it before anything runs).
  static Partition split(int total, int parts) { return Partition(total > 0 ? total : 0, parts > 0 ? parts : 1); }

  MlaConfig config_;             // the layer's, with the pass's batch and seq
  RopeFrequencies frequencies_;  // of the configuration's RoPE rows, derived once
  const weights_type* weights_;
  const Mesh* whole_;
  const Mesh* mesh_;
  const Mesh* ring_;
  // The core's call on the pass's square problem; a core without the documents capability (attention_problem.hpp)
  // is only called with one document and gets none.
  const DocumentLayout* core_documents(const pass_type& p) const {
    return core_capabilities_v<Core>.documents ? &p.w.documents.layout : nullptr;
  }
  template <class... Args>
  void call_core_forward(const ExecSpace& space, const pass_type& p, const Args&... args) const {
    core_->forward(space, attention_problem(args..., core_documents(p)));
  }
  template <class... Args>
  void call_core_backward(const ExecSpace& space, const pass_type& p, const Args&... args) const {
    core_->backward(space, attention_problem(args..., core_documents(p)));
  }

  // The float scratch of a bf16 core call: `slot` with src's extents, src widened into it.
  template <class Src>
  static core_tensor4 like(const Src& src, Buffer<core_tensor4>& slot, const char* label) {
    return ensure(slot, label, src.extent(0), src.extent(1), src.extent(2), src.extent(3));
  }
  template <class Src>
  static core_tensor4 widened(const ExecSpace& space, const Src& src, Buffer<core_tensor4>& slot, const char* label) {
    const core_tensor4 dst = like(src, slot, label);
    convert_4d(space, "mlacp::widen for the core", src, dst);
    return dst;
  }
  template <class Dst>
  static void round_into(const ExecSpace& space, const core_tensor4& src, const Dst& dst) {
    convert_4d(space, "mlacp::round the core's result", src, dst);
  }
  template <class Src, class Dst>
  static void convert_4d(const ExecSpace& space, const char* label, const Src& src, const Dst& dst) {
    convert_tensor4(space, label, src, dst);
  }

  /// The float copies a bf16 core call computes on (empty for float and double).
  struct CoreScratch {
    Buffer<core_tensor4> q, k, v, o, d_o, dq, dk, dv;
  };

  const Core* core_;
  const DocumentLayout* documents_;
  TokenMap token_map_;
  Partition seq_part_;
  Partition head_part_;
  mutable RopeTableBuffers<memory_space> one_document_rope_;
  mutable CoreScratch core_scratch_;
};

}  // namespace mlacp::detail
