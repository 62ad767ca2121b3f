// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The default attention core of the MLA layer: tiled causal attention in the flash-attention style (MLA_SPEC step 6).
// The forward walks key tiles per query tile with an online softmax and saves only O and the row log-sum-exp; the
// backward recomputes the score tiles from lse, computes D_i = rowsum(dO_i o O_i) once, accumulates dK/dV per key
// tile and dQ per query tile. Tiles above the diagonal are skipped and the diagonal tiles masked. Memory is O(S) (the
// row term) plus O(tile) scratch, never S x S. Softmax statistics (running max, running sum, D) are double.
//
// Two implementations (FlashAttentionPath): the BLAS path for host execution spaces (tile products are Kokkos Kernels
// GEMMs, the BLAS TPL on host builds: flash_attention_blas.hpp) and the team path for any execution space
// (KokkosBatched team GEMMs with tiles in team scratch: flash_attention_team.hpp). Both compute the same numbers to
// rounding.
//
// Packed sequences: forward and backward take an optional DocumentLayout (document_layout.hpp, `cu_seqlens`), the same
// for every batch row; attention is then causal within each document and never crosses one (query t sees keys
// [start_of(t), t]). Tiles that hold no visible pair are skipped, those crossing a document boundary masked per row.
// Without a layout (or with one document) the work and the numbers are those of plain causal attention.
//
// The core owns its scratch (allocated at the first call of a configuration, reused after), so calls through one core
// object must be ordered: one execution-space instance, or fences between instances. Copies of a core do not share
// scratch.
//
// Ring attention's blocks (forward_block, backward_block; the interface at the top of attention_core.hpp) run the same
// kernels on positioned ranges (detail::FlashRange: query rows at global positions q_pos.., key rows at k_pos..): one
// call per (query segment, key segment) pair that holds a visible (query, key) pair, the forward merged into o_acc and
// lse_acc by log-sum-exp, the backward accumulated into dq, dk, dv. The square forward and backward are the range
// q_pos = k_pos = 0, n_q = n_k = S. The block calls use the core's scratch too: the same ordering rule holds.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/mla/kernels/attention_core.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_blas.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_scratch.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_team.hpp>
#include <mlacp/mla/kernels/flash_attention_options.hpp>
#include <mlacp/mla/kernels/token_segments.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mlacp {

class FlashAttentionCore {
 public:
  FlashAttentionCore() = default;
  explicit FlashAttentionCore(const FlashAttentionOptions& options) : options_(options) {}
  FlashAttentionCore(const FlashAttentionCore& other) : options_(other.options_), resolved_(other.resolved_) {}
  FlashAttentionCore& operator=(const FlashAttentionCore& other) {
    options_ = other.options_;
    resolved_ = other.resolved_;
    scratch_.reset();
    return *this;
  }
  FlashAttentionCore(FlashAttentionCore&&) noexcept = default;
  FlashAttentionCore& operator=(FlashAttentionCore&&) noexcept = default;
  ~FlashAttentionCore() = default;

  const FlashAttentionOptions& options() const { return options_; }

  /// Reads every setting the core runs with on ExecSpace once, now: the path (blas on a space that cannot reach host
  /// memory is refused) and the tiles (the options, else MLACP_ATTENTION_TILES, else the path's defaults). Returns ""
  /// when they are valid (the core then runs with these tiles and never reads the environment again) or the message
  /// naming the bad setting. The MLA layer calls it in its constructor, before its agreement, so that a bad setting
  /// is one error on every rank at construction (ranks that hold no head never reach the core's kernels).
  template <class ExecSpace>
  std::string resolve() {
    resolved_ = Resolved{};
    try {
      const bool blas = use_blas<ExecSpace>();
      const auto [tq, tk] = detail::flash_tiles(options_, blas);
      resolved_ = Resolved{tq, tk, blas};
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  }
  /// The settings resolve() fixed, by name (each rank of a layer must run the same): the query and key tiles and
  /// whether the BLAS path runs; the tiles are 0 before resolve() (or after a failed one). Always the same fields.
  std::vector<std::pair<std::string, std::int64_t>> settings() const {
    return {{"FlashAttentionCore query tile (options or MLACP_ATTENTION_TILES)", resolved_.query_tile},
            {"FlashAttentionCore key tile (options or MLACP_ATTENTION_TILES)", resolved_.key_tile},
            {"FlashAttentionCore BLAS path", resolved_.blas ? 1 : 0}};
  }

  /// The (query tile, key tile) pairs the forward visits on ExecSpace for a sequence of n_s tokens packed as
  /// `documents`, and those it visits for the same n_s as one document (the backward visits the same pairs).
  template <class ExecSpace>
  std::pair<std::int64_t, std::int64_t> tile_pairs(std::int64_t n_s, const DocumentLayout& documents) const {
    const auto [tq, tk] = tiles(use_blas<ExecSpace>());
    documents.check_total(n_s, "FlashAttentionCore::tile_pairs");
    if (n_s == 0) return {0, 0};
    return detail::flash_tile_pairs(documents.host(n_s), n_s, tq, tk);
  }

  /// True when `path` would run the BLAS path on ExecSpace (automatic: wherever host memory is reachable).
  template <class ExecSpace>
  static constexpr bool runs_blas(FlashAttentionPath path) {
    constexpr bool host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
    return host && path != FlashAttentionPath::team;
  }

  /// o [B, S, h, dv] and lse [B, h, S] from q, k [B, S, h, dqk] and v [B, S, h, dv]. Asynchronous on `space`.
  template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView>
  void forward(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
               const LseView& lse) const {
    forward(space, q, k, v, o, lse, DocumentLayout());
  }

  /// forward of packed documents: causal within each document of `documents` (empty: one document), which must cover
  /// S tokens.
  template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView>
  void forward(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
               const LseView& lse, const DocumentLayout& documents) const {
    check_common<ExecSpace, QView, KView, VView, OView, LseView>();
    const char* who = "FlashAttentionCore::forward";
    detail::attention_check(who, q, k, v, o, lse);
    const auto docs = documents.offsets_for<ExecSpace>(static_cast<std::int64_t>(q.extent(1)), who);
    if (q.extent(0) * q.extent(1) * q.extent(2) == 0) return;
    using T = compat::accumulation_t<typename OView::non_const_value_type>;
    using Mem = typename ExecSpace::memory_space;
    const bool blas = use_blas<ExecSpace>();
    const auto [tq, tk] = tiles(blas);
    if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
      if (blas) {
        detail::flash_forward_blas(space, q, k, v, o, lse, docs, tq, tk, scratch<T, Mem>());
        return;
      }
    }
    if constexpr (stored_narrower<OView>) {
      throw InvalidArgument(no_bf16_team);
    } else {
      detail::flash_forward_team(space, q, k, v, o, lse, docs, tq, tk);
    }
  }

  /// dq, dk, dv (each may be empty: not needed) from the forward's q, k, v, o, lse and d_o [B, S, h, dv]; overwritten.
  template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView, class DoView,
            class DqView, class DkView, class DvView>
  void backward(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
                const LseView& lse, const DoView& d_o, const DqView& dq, const DkView& dk, const DvView& dv) const {
    backward(space, q, k, v, o, lse, d_o, dq, dk, dv, DocumentLayout());
  }

  /// backward of packed documents (the layout of the forward).
  template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView, class DoView,
            class DqView, class DkView, class DvView>
  void backward(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
                const LseView& lse, const DoView& d_o, const DqView& dq, const DkView& dk, const DvView& dv,
                const DocumentLayout& documents) const {
    check_common<ExecSpace, QView, KView, VView, OView, LseView>();
    static_assert_accessible<ExecSpace, DoView>();
    static_assert_accessible<ExecSpace, DqView>();
    static_assert_accessible<ExecSpace, DkView>();
    static_assert_accessible<ExecSpace, DvView>();
    const char* who = "FlashAttentionCore::backward";
    detail::attention_check(who, q, k, v, o, lse);
    const std::size_t nb = q.extent(0), ns = q.extent(1), nh = q.extent(2), nqk = q.extent(3), nv = v.extent(3);
    detail::check_extents<DoView, 4>(who, "d_o", d_o, {nb, ns, nh, nv});
    const bool do_dq = !view_is_empty(dq), do_dk = !view_is_empty(dk), do_dv = !view_is_empty(dv);
    if (do_dq) detail::check_extents<DqView, 4>(who, "dq", dq, {nb, ns, nh, nqk});
    if (do_dk) detail::check_extents<DkView, 4>(who, "dk", dk, {nb, ns, nh, nqk});
    if (do_dv) detail::check_extents<DvView, 4>(who, "dv", dv, {nb, ns, nh, nv});
    const auto docs = documents.offsets_for<ExecSpace>(static_cast<std::int64_t>(ns), who);
    if (nb * ns * nh == 0 || !(do_dq || do_dk || do_dv)) return;
    using T = compat::accumulation_t<typename DoView::non_const_value_type>;
    using Mem = typename ExecSpace::memory_space;
    const bool blas = use_blas<ExecSpace>();
    const auto [tq, tk] = tiles(blas);
    auto& ws = scratch<T, Mem>();
    if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
      if (blas) {
        detail::flash_backward_blas(space, q, k, v, o, lse, d_o, dq, dk, dv, do_dq, do_dk, do_dv, docs, tq, tk, ws);
        return;
      }
    }
    if constexpr (stored_narrower<DoView>) {
      throw InvalidArgument(no_bf16_team);
    } else {
      if (do_dq || do_dk) ws.reserve_row_term(static_cast<std::int64_t>(nb * nh * ns));
      detail::flash_backward_team(space, q, k, v, o, lse, d_o, dq, dk, dv, do_dq, do_dk, do_dv, docs, tq, tk,
                                  ws.row_term);
    }
  }

  /// Ring attention's blocks (the block interface at the top of attention_core.hpp): the queries of q at the global
  /// positions q_rows against the keys of k, v at k_rows, over a global sequence of `seq` tokens packed as `documents`
  /// (empty: one document). o_acc [B, nq, h, dv] is in the accumulation type (float for bf16 inputs), lse_acc
  /// [B, h, nq]. first: both are overwritten with this block's attention (a row that sees no key: o 0, lse -inf); else
  /// merged by log-sum-exp with what they hold. Each (query segment, key segment) pair that holds a visible (query,
  /// key) pair is one call of the generalised kernel; the others are skipped. Both paths (bf16: the BLAS path only).
  template <class ExecSpace, class Q, class K, class V, class OAcc, class LseAcc>
  void forward_block(const ExecSpace& space, const Q& q, const K& k, const V& v, const OAcc& o_acc,
                     const LseAcc& lse_acc, const TokenSegments& q_rows, const TokenSegments& k_rows,
                     const DocumentLayout& documents, std::int64_t seq, bool first) const {
    check_common<ExecSpace, Q, K, V, OAcc, LseAcc>();
    using T = compat::accumulation_t<typename Q::non_const_value_type>;
    static_assert(std::is_same_v<typename OAcc::non_const_value_type, T>,
                  "mlacp::FlashAttentionCore::forward_block: o_acc must be in the accumulation type of q");
    const char* who = "FlashAttentionCore::forward_block";
    detail::block_check(who, q, k, v, o_acc, lse_acc, q_rows, k_rows, seq);
    const auto docs = documents.offsets_for<ExecSpace>(seq, who);
    const bool blas = use_blas<ExecSpace>();
    if constexpr (stored_narrower<Q>) {
      if (!blas) throw InvalidArgument(no_bf16_team);
    }
    if (q.extent(0) * q.extent(2) * q_rows.rows() == 0) return;
    const std::pair<int, int> tile_sizes = tiles(blas);
    const int tq = tile_sizes.first, tk = tile_sizes.second;  // captured below: C++17 captures no structured binding
    using Mem = typename ExecSpace::memory_space;
    const auto host_docs = documents.host(seq);
    for (int s = 0; s < q_rows.segments(); ++s) {
      bool merge = !first;
      for (int t = 0; t < k_rows.segments(); ++t) {
        const detail::FlashRange rg{q_rows.begin(s), q_rows.row_of_segment(s), q_rows.count(s),
                                    k_rows.begin(t), k_rows.row_of_segment(t), k_rows.count(t)};
        if (!detail::flash_range_visible(host_docs, rg)) continue;
        run_path(
            blas,
            [&] {
              if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible)
                detail::flash_forward_blas_range(space, q, k, v, o_acc, lse_acc, docs, rg, merge, tq, tk,
                                                 scratch<T, Mem>());
            },
            [&] {
              if constexpr (!stored_narrower<Q>)
                detail::flash_forward_team_range(space, q, k, v, o_acc, lse_acc, docs, rg, merge, tq, tk);
            });
        merge = true;
      }
      // First, and no key of the block visible to the segment: no attention.
      if (!merge) detail::block_no_attention(space, o_acc, lse_acc, q_rows.row_of_segment(s), q_rows.count(s));
    }
  }

  /// The backward of a block: o and lse are the final (merged over every key) forward of the queries, d_o its
  /// gradient; dq_acc [B, nq, h, dqk], dk_acc [B, nk, h, dqk], dv_acc [B, nk, h, dv] in the accumulation type are
  /// accumulated (+=) with this block's contribution (each may be empty: not needed). Both paths (bf16: BLAS only).
  template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
  void backward_block(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                      const DO& d_o, const DQ& dq_acc, const DK& dk_acc, const DV& dv_acc, const TokenSegments& q_rows,
                      const TokenSegments& k_rows, const DocumentLayout& documents, std::int64_t seq) const {
    check_common<ExecSpace, Q, K, V, O, Lse>();
    static_assert_accessible<ExecSpace, DO>();
    static_assert_accessible<ExecSpace, DQ>();
    static_assert_accessible<ExecSpace, DK>();
    static_assert_accessible<ExecSpace, DV>();
    using T = compat::accumulation_t<typename Q::non_const_value_type>;
    static_assert(std::is_same_v<typename DQ::non_const_value_type, T> &&
                      std::is_same_v<typename DK::non_const_value_type, T> &&
                      std::is_same_v<typename DV::non_const_value_type, T>,
                  "mlacp::FlashAttentionCore::backward_block: dq_acc, dk_acc, dv_acc must be in the accumulation type");
    const char* who = "FlashAttentionCore::backward_block";
    detail::block_check(who, q, k, v, o, lse, q_rows, k_rows, seq);
    const bool do_dq = !view_is_empty(dq_acc), do_dk = !view_is_empty(dk_acc), do_dv = !view_is_empty(dv_acc);
    detail::block_gradient_check(who, q, k, v, d_o, dq_acc, dk_acc, dv_acc, do_dq, do_dk, do_dv);
    const auto docs = documents.offsets_for<ExecSpace>(seq, who);
    const bool blas = use_blas<ExecSpace>();
    if constexpr (stored_narrower<Q>) {
      if (!blas) throw InvalidArgument(no_bf16_team);
    }
    if (q.extent(0) * q.extent(2) * q_rows.rows() * k_rows.rows() == 0 || !(do_dq || do_dk || do_dv)) return;
    const std::pair<int, int> tile_sizes = tiles(blas);
    const int tq = tile_sizes.first, tk = tile_sizes.second;  // captured below: C++17 captures no structured binding
    using Mem = typename ExecSpace::memory_space;
    auto& ws = scratch<T, Mem>();
    const auto host_docs = documents.host(seq);
    bool row_term = false;
    for (int s = 0; s < q_rows.segments(); ++s) {
      for (int t = 0; t < k_rows.segments(); ++t) {
        const detail::FlashRange rg{q_rows.begin(s), q_rows.row_of_segment(s), q_rows.count(s),
                                    k_rows.begin(t), k_rows.row_of_segment(t), k_rows.count(t)};
        if (!detail::flash_range_visible(host_docs, rg)) continue;
        if (!row_term && (do_dq || do_dk)) {  // D of every query row, once per call
          ws.reserve_row_term(static_cast<std::int64_t>(q.extent(0) * q.extent(1) * q.extent(2)));
          detail::flash_row_term(space, o, d_o, ws.row_term);
          row_term = true;
        }
        run_path(
            blas,
            [&] {
              if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible)
                detail::flash_backward_blas_range(space, q, k, v, lse, d_o, dq_acc, dk_acc, dv_acc, do_dq, do_dk, do_dv,
                                                  docs, rg, true, tq, tk, ws, ws.row_term);
            },
            [&] {
              if constexpr (!stored_narrower<Q>)
                detail::flash_backward_team_range(space, q, k, v, lse, d_o, dq_acc, dk_acc, dv_acc, do_dq, do_dk, do_dv,
                                                  docs, rg, true, tq, tk, ws.row_term);
            });
      }
    }
  }

  /// Whether forward_block and backward_block run on ExecSpace: both paths compute them (the team path on float and
  /// double Views; a ring driver widens bf16 to float around a team-path core as the MLA layer does).
  template <class ExecSpace>
  bool computes_blocks() const {
    return true;
  }

  /// Whether the core computes on bf16 Views itself on ExecSpace: the BLAS path does (bf16 tile products through the
  /// installed bf16 GEMM plan, float accumulation and statistics); the team path takes float and double only, and the
  /// MLA layer widens bf16 into float around it (ScheduleContext::core_forward).
  template <class ExecSpace>
  bool computes_bf16() const {
    return resolved_.query_tile > 0 ? resolved_.blas : use_blas<ExecSpace>();
  }

 private:
  template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView>
  static constexpr void check_common() {
    static_assert(compat::view_rank_v<QView> == 4, "mlacp::FlashAttentionCore: q must be rank-4 [B, S, h, dqk]");
    static_assert(compat::view_rank_v<VView> == 4, "mlacp::FlashAttentionCore: v must be rank-4 [B, S, h, dv]");
    static_assert_accessible<ExecSpace, QView>();
    static_assert_accessible<ExecSpace, KView>();
    static_assert_accessible<ExecSpace, VView>();
    static_assert_accessible<ExecSpace, OView>();
    static_assert_accessible<ExecSpace, LseView>();
  }

  // Views stored in a narrower type than the core accumulates in (bf16).
  template <class ViewType>
  static constexpr bool stored_narrower =
      !std::is_same_v<typename ViewType::non_const_value_type,
                      compat::accumulation_t<typename ViewType::non_const_value_type>>;
  static constexpr const char* no_bf16_team =
      "mlacp::FlashAttentionCore: the team path takes float and double Views; expected the BLAS path for bf16 (the MLA "
      "layer widens bf16 to float around a team-path core)";
  // Runs blas_fn on the BLAS path, team_fn on the team path.
  template <class BlasFn, class TeamFn>
  static void run_path(bool blas, BlasFn&& blas_fn, TeamFn&& team_fn) {
    if (blas)
      blas_fn();
    else
      team_fn();
  }

  // The resolved tiles when resolve() ran for this path, else read now (a core used on its own).
  std::pair<int, int> tiles(bool blas) const {
    if (resolved_.query_tile > 0 && resolved_.blas == blas) return {resolved_.query_tile, resolved_.key_tile};
    return detail::flash_tiles(options_, blas);
  }

  template <class ExecSpace>
  bool use_blas() const {
    if (options_.path == FlashAttentionPath::blas && !runs_blas<ExecSpace>(FlashAttentionPath::blas))
      throw InvalidArgument(
          "mlacp::FlashAttentionCore: path = blas on an execution space that cannot reach host memory; expected "
          "team or automatic");
    return runs_blas<ExecSpace>(options_.path);
  }

  struct ScratchBase {
    virtual ~ScratchBase() = default;
  };
  template <class T, class Mem>
  struct Scratch final : ScratchBase {
    detail::FlashScratch<T, Mem> views;
  };
  template <class T, class Mem>
  detail::FlashScratch<T, Mem>& scratch() const {
    auto* s = dynamic_cast<Scratch<T, Mem>*>(scratch_.get());
    if (s == nullptr) {
      scratch_ = std::make_unique<Scratch<T, Mem>>();
      s = static_cast<Scratch<T, Mem>*>(scratch_.get());
    }
    return s->views;
  }

  struct Resolved {
    int query_tile = 0, key_tile = 0;  // 0: not resolved
    bool blas = false;
  };

  FlashAttentionOptions options_;
  Resolved resolved_;
  mutable std::unique_ptr<ScratchBase> scratch_;
};

}  // namespace mlacp
