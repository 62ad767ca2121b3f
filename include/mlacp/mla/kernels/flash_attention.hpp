// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The default attention core of the MLA layer: tiled causal attention in the flash-attention style (docs/spec.md step
// 6). The forward walks key tiles per query tile with an online softmax and saves only O and the row log-sum-exp; the
// backward recomputes the score tiles from lse, computes D_i = rowsum(dO_i o O_i) once, accumulates dK/dV per key
// tile and dQ per query tile. Tiles above the diagonal are skipped and the diagonal tiles masked. Memory is O(S) (the
// row term) plus O(tile) scratch, never S x S. Softmax statistics (running max, running sum, D) are double.
//
// Two implementations (FlashAttentionPath): the BLAS path for host execution spaces (tile products are Kokkos Kernels
// GEMMs, the BLAS TPL on host builds: flash_attention_blas.hpp) and the team path for any execution space
// (KokkosBatched team GEMMs with tiles in team scratch: flash_attention_team.hpp). Both compute the same numbers to
// rounding.
//
// Packed sequences: a problem may carry a DocumentLayout (document_layout.hpp, `cu_seqlens`), the same
// for every batch row; attention is then causal within each document and never crosses one (query t sees keys
// [start_of(t), t]). Tiles that hold no visible pair are skipped, those crossing a document boundary masked per row.
// Without a layout (or with one document) the work and the numbers are those of plain causal attention.
//
// The core owns its scratch (allocated at the first call of a configuration, reused after), so calls through one core
// object must be ordered: one execution-space instance, or fences between instances. Copies of a core do not share
// scratch.
//
// forward and backward take a problem (attention_problem.hpp) and run one code path: the range kernels on positioned
// ranges (detail::FlashRange: query rows at global positions q_pos.., key rows at k_pos..), one call per (query
// segment, key segment) pair that holds a visible (query, key) pair; the forward overwrites (first) or merges into o
// and lse by log-sum-exp, the backward overwrites or accumulates into dq, dk, dv. The square problem is the one range
// q_pos = k_pos = 0, n_q = n_k = S; ring attention's blocks are the others.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/backend.hpp>
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
  /// Every capability (attention_problem.hpp): positioned problems, packed documents, computes_bf16(), resolve() and
  /// settings(), computes_blocks().
  static constexpr AttentionCoreCapabilities capabilities{true, true, true, true, true};

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
      resolved_ = Resolved{detail::flash_tile_choice(options_, blas), blas};
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  }
  /// The settings resolve() fixed, by name (each rank of a layer must run the same): the query and key tiles, whether
  /// a problem's shape may choose the large tiles instead (none set on the BLAS path: flash_large_tile_blas) and
  /// whether the BLAS path runs; the tiles are 0 before resolve() (or after a failed one). Always the same fields.
  std::vector<std::pair<std::string, std::int64_t>> settings() const {
    return {{"FlashAttentionCore query tile (options or MLACP_ATTENTION_TILES)", resolved_.tiles.query},
            {"FlashAttentionCore key tile (options or MLACP_ATTENTION_TILES)", resolved_.tiles.key},
            {"FlashAttentionCore tiles by shape (none set)", resolved_.tiles.by_shape ? 1 : 0},
            {"FlashAttentionCore BLAS path", resolved_.blas ? 1 : 0}};
  }

  /// The (query tile, key tile) the core runs with on ExecSpace for a sequence of n_s tokens with query/key head dim
  /// d_qk, whose inputs are stored in bf16 (`bf16_inputs`) or not: the tiles set, or those the shape chooses.
  template <class ExecSpace>
  std::pair<int, int> tiles_for(std::int64_t n_s, std::int64_t d_qk, bool bf16_inputs) const {
    return tile_choice(use_blas<ExecSpace>()).for_problem(n_s, d_qk, bf16_inputs);
  }

  /// The (query tile, key tile) pairs the forward visits on ExecSpace for a sequence of n_s tokens packed as
  /// `documents`, and those it visits for the same n_s as one document (the backward visits the same pairs), at the
  /// tiles of tiles_for(n_s, d_qk, bf16_inputs).
  template <class ExecSpace>
  std::pair<std::int64_t, std::int64_t> tile_pairs(std::int64_t n_s, const DocumentLayout& documents,
                                                   std::int64_t d_qk = 0, bool bf16_inputs = false) const {
    const auto [tq, tk] = tiles_for<ExecSpace>(n_s, d_qk, bf16_inputs);
    documents.check_total(n_s, "FlashAttentionCore::tile_pairs");
    if (n_s == 0) return {0, 0};
    return detail::flash_tile_pairs(documents.host(n_s), n_s, tq, tk);
  }

  /// True when `path` would run the BLAS path on ExecSpace (automatic: where its Backend runs tiles on the BLAS).
  template <class ExecSpace>
  static constexpr bool runs_blas(FlashAttentionPath path) {
    return Backend<ExecSpace>::attention_on_blas && path != FlashAttentionPath::team;
  }

  /// The forward of a problem (attention_problem.hpp): o and lse of the queries at q_rows against the keys at k_rows,
  /// overwritten (first) or merged by log-sum-exp into what they hold. Each (query segment, key segment) pair that
  /// holds a visible (query, key) pair is one call of the range kernel of the path (BLAS or team); the others are
  /// skipped. The square problem is the one range q_pos = k_pos = 0, n_q = n_k = S. bf16: the BLAS path only.
  template <class ExecSpace, class Problem>
  void forward(const ExecSpace& space, const Problem& pb) const {
    using Q = std::decay_t<decltype(pb.q)>;
    using O = std::decay_t<decltype(pb.o)>;
    check_common<ExecSpace, Q, std::decay_t<decltype(pb.k)>, std::decay_t<decltype(pb.v)>, O,
                 std::decay_t<decltype(pb.lse)>>();
    using T = compat::accumulation_t<typename Q::non_const_value_type>;
    static_assert(std::is_same_v<typename O::non_const_value_type, T> ||
                      std::is_same_v<typename O::non_const_value_type, typename Q::non_const_value_type>,
                  "mlacp::FlashAttentionCore::forward: o must be in q's value type or its accumulation type");
    const char* who = "FlashAttentionCore::forward";
    const auto& q = pb.q;
    const auto& k = pb.k;
    const auto& v = pb.v;
    const auto& o = pb.o;
    const auto& lse = pb.lse;
    detail::problem_check(who, q, k, v, o, lse, pb);
    const auto docs = pb.documents().template offsets_for<ExecSpace>(pb.seq, who);
    const bool blas = use_blas<ExecSpace>();
    if constexpr (stored_narrower<Q> || stored_narrower<O>) {
      if (!blas) throw InvalidArgument(no_bf16_team);
    }
    if (q.extent(0) * q.extent(2) * pb.q_rows.rows() == 0) return;
    const std::pair<int, int> tile_sizes = problem_tiles(blas, pb);
    const int tq = tile_sizes.first, tk = tile_sizes.second;  // captured below: C++17 captures no structured binding
    const bool square = pb.square();
    using Mem = typename ExecSpace::memory_space;
    const auto host_docs = pb.documents().host(pb.seq);
    for (int s = 0; s < pb.q_rows.segments(); ++s) {
      bool merge = !pb.first;
      for (int t = 0; t < pb.k_rows.segments(); ++t) {
        const detail::FlashRange rg = range(pb, s, t);
        if (!detail::flash_range_visible(host_docs, rg)) continue;
        // The square problem's tiles are clamped to the sequence; a positioned one keeps the configured tiles, so
        // that ring chunks of different sizes share one scratch (reserve_tiles grows it to the largest tiles seen).
        const std::int64_t rq = square ? std::min<std::int64_t>(tq, rg.n_q) : tq;
        const std::int64_t rk = square ? std::min<std::int64_t>(tk, rg.n_k) : tk;
        run_path(
            blas,
            [&] {
              if constexpr (Backend<ExecSpace>::attention_on_blas)
                detail::flash_forward_blas_range(space, q, k, v, o, lse, docs, rg, merge, rq, rk, scratch<T, Mem>());
            },
            [&] {
              if constexpr (!stored_narrower<Q> && !stored_narrower<O>)
                detail::flash_forward_team_range(space, q, k, v, o, lse, docs, rg, merge, rq, rk);
            });
        merge = true;
      }
      // First, and no key of the problem visible to the segment: no attention.
      if (!merge) detail::block_no_attention(space, o, lse, pb.q_rows.row_of_segment(s), pb.q_rows.count(s));
    }
  }

  /// The backward of a problem: o and lse are the final (merged over every key) forward of the queries, d_o its
  /// gradient; dq [B, nq, h, dqk], dk [B, nk, h, dqk], dv [B, nk, h, dv] (each may be empty: not needed) are
  /// overwritten (first) or accumulated (+=, in the accumulation type) with this problem's contribution. The square
  /// problem with first overwrites through the range kernel itself (outputs in q's value type: bf16 rounded once); any
  /// other problem with first zeroes the outputs and accumulates. bf16: the BLAS path only.
  template <class ExecSpace, class Problem>
  void backward(const ExecSpace& space, const Problem& pb) const {
    using Q = std::decay_t<decltype(pb.q)>;
    using DO = std::decay_t<decltype(pb.d_o)>;
    using DQ = std::decay_t<decltype(pb.dq)>;
    using DK = std::decay_t<decltype(pb.dk)>;
    using DV = std::decay_t<decltype(pb.dv)>;
    check_common<ExecSpace, Q, std::decay_t<decltype(pb.k)>, std::decay_t<decltype(pb.v)>, std::decay_t<decltype(pb.o)>,
                 std::decay_t<decltype(pb.lse)>>();
    static_assert_accessible<ExecSpace, DO>();
    static_assert_accessible<ExecSpace, DQ>();
    static_assert_accessible<ExecSpace, DK>();
    static_assert_accessible<ExecSpace, DV>();
    using T = compat::accumulation_t<typename Q::non_const_value_type>;
    const char* who = "FlashAttentionCore::backward";
    const auto& q = pb.q;
    const auto& k = pb.k;
    const auto& v = pb.v;
    const auto& lse = pb.lse;
    const auto& d_o = pb.d_o;
    detail::problem_check(who, q, k, v, pb.o, lse, pb);
    const bool do_dq = pb.needs_dq(), do_dk = pb.needs_dk(), do_dv = pb.needs_dv();
    detail::block_gradient_check(who, q, k, v, d_o, pb.dq, pb.dk, pb.dv, do_dq, do_dk, do_dv);
    const auto docs = pb.documents().template offsets_for<ExecSpace>(pb.seq, who);
    const bool blas = use_blas<ExecSpace>();
    if constexpr (stored_narrower<Q>) {
      if (!blas) throw InvalidArgument(no_bf16_team);
    }
    if (q.extent(0) * q.extent(2) * pb.q_rows.rows() * pb.k_rows.rows() == 0 || !(do_dq || do_dk || do_dv)) return;
    // The square problem overwrites in its one range; any other problem that overwrites starts from zero.
    const bool overwrite = pb.first && pb.square();
    if (pb.first && !overwrite) {
      if (do_dq) detail::zero_view(space, pb.dq);
      if (do_dk) detail::zero_view(space, pb.dk);
      if (do_dv) detail::zero_view(space, pb.dv);
    }
    const std::pair<int, int> tile_sizes = problem_tiles(blas, pb);
    const int tq = tile_sizes.first, tk = tile_sizes.second;  // captured below: C++17 captures no structured binding
    const bool square = pb.square();
    using Mem = typename ExecSpace::memory_space;
    auto& ws = scratch<T, Mem>();
    const auto host_docs = pb.documents().host(pb.seq);
    bool row_term = false;
    for (int s = 0; s < pb.q_rows.segments(); ++s) {
      for (int t = 0; t < pb.k_rows.segments(); ++t) {
        const detail::FlashRange rg = range(pb, s, t);
        if (!detail::flash_range_visible(host_docs, rg)) continue;
        if (!row_term && (do_dq || do_dk)) {  // D of every query row, once per call
          ws.reserve_row_term(static_cast<std::int64_t>(q.extent(0) * q.extent(1) * q.extent(2)));
          detail::flash_row_term(space, pb.o, d_o, ws.row_term);
          row_term = true;
        }
        // The square problem's tiles are clamped to the sequence; a positioned one keeps the configured tiles, so
        // that ring chunks of different sizes share one scratch (reserve_tiles grows it to the largest tiles seen).
        const std::int64_t rq = square ? std::min<std::int64_t>(tq, rg.n_q) : tq;
        const std::int64_t rk = square ? std::min<std::int64_t>(tk, rg.n_k) : tk;
        run_path(
            blas,
            [&] {
              if constexpr (Backend<ExecSpace>::attention_on_blas)
                detail::flash_backward_blas_range(space, q, k, v, lse, d_o, pb.dq, pb.dk, pb.dv, do_dq, do_dk, do_dv,
                                                  docs, rg, !overwrite, rq, rk, ws, ws.row_term);
            },
            [&] {
              if constexpr (!stored_narrower<Q>)
                detail::flash_backward_team_range(space, q, k, v, lse, d_o, pb.dq, pb.dk, pb.dv, do_dq, do_dk, do_dv,
                                                  docs, rg, !overwrite, rq, rk, ws.row_term);
            });
      }
    }
  }

  /// Whether positioned problems run on ExecSpace: both paths compute them (the team path on float and
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
    return resolved_.tiles.query > 0 ? resolved_.blas : use_blas<ExecSpace>();
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

  // The range of query segment s and key segment t of a problem.
  template <class Problem>
  static detail::FlashRange range(const Problem& pb, int s, int t) {
    return {pb.q_rows.begin(s), pb.q_rows.row_of_segment(s), pb.q_rows.count(s),
            pb.k_rows.begin(t), pb.k_rows.row_of_segment(t), pb.k_rows.count(t)};
  }

  // The resolved tiles when resolve() ran for this path, else read now (a core used on its own).
  detail::FlashTileChoice tile_choice(bool blas) const {
    if (resolved_.tiles.query > 0 && resolved_.blas == blas) return resolved_.tiles;
    return detail::flash_tile_choice(options_, blas);
  }
  // The tiles a problem runs with on the path: those set, or those its global sequence, query/key head dim and stored
  // type choose (the forward and the backward of a problem run the same).
  template <class Problem>
  std::pair<int, int> problem_tiles(bool blas, const Problem& pb) const {
    return tile_choice(blas).for_problem(pb.seq, static_cast<std::int64_t>(pb.q.extent(3)),
                                         stored_narrower<std::decay_t<decltype(pb.q)>>);
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
    detail::FlashTileChoice tiles;  // query 0: not resolved
    bool blas = false;
  };

  FlashAttentionOptions options_;
  Resolved resolved_;
  mutable std::unique_ptr<ScratchBase> scratch_;
};

}  // namespace mlacp
