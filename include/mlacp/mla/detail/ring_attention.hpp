// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Ring attention across the rings of a two-level mesh (issue 21, Mesh(comm, ring) with C > 1). Each rank holds the
// queries of its ring chunk (its Ulysses group's tokens, token_map.hpp) for its heads; chunk by chunk, over C steps,
// it receives the keys of the other chunks from its ring predecessor, passes the chunk it holds to its successor, and
// merges the attention of its queries over each chunk by log-sum-exp (the core's forward of a positioned problem).
// Every step's exchange is launched before the compute on the current chunk and waited after it (launch_send_recv, two
// buffers per stream), so the next chunk travels while this one is computed.
//
// What travels depends on the strategy: the latent strategy passes the latent payload [RMSNorm(c), RoPE(k_pe)]
// (R + dr numbers per token, whatever the head count) and expands each chunk for the rank's heads on arrival (its rows
// of w_kvb, as after the Ulysses all-gather); the expanded strategy passes K and V of the rank's heads.
//
// The backward passes the chunks again (the keys are recomputed, not kept: memory O(S/C)) and sends each chunk's
// gradient accumulator (the latent payload's gradient partial sums, or dK and dV) one step behind, back round the
// ring to the chunk's owner: at step t the accumulator of the chunk held at step t - 1 arrives while step t computes,
// takes step t's contribution and leaves; the last exchange, which brings the owner its finished accumulator, is
// waited by finish_backward(), so that the caller can launch its next collective before it.
//
// Accumulation: the running output, dq and the travelling gradients are in T's accumulation type (float for bf16: one
// rounding at the end, not one per step); the latent strategy's per-chunk dK and dV are rounded to T for the w_kvb
// GEMMs, as the flat layer's are.
#pragma once

#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/detail/schedule_context.hpp>
#include <mlacp/mla/detail/timeline.hpp>
#include <mlacp/mla/kernels/attention_core.hpp>
#include <mlacp/mla/kernels/detail/kv_layout.hpp>
#include <mlacp/mla/kernels/detail/linear.hpp>
#include <mlacp/mla/kernels/token_segments.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/pieces/latent_kv_linear.hpp>
#include <mlacp/send_recv.hpp>
#include <mlacp/token_map.hpp>
#include <mlacp/view_types.hpp>
#include <mlacp/wire/cast.hpp>

#include <algorithm>
#include <any>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace mlacp::detail {

/// The global positions of a chunk's rows as the core's block calls take them.
inline TokenSegments segments_of(const std::vector<TokenRange>& ranges) {
  TokenSegments segments;
  for (const TokenRange& r : ranges) segments.add(r.begin, r.count);
  return segments;
}

/// `*dst` (+)= `src`, converting (accumulate: add; else `*dst` is not read). (A function of its own: nvcc refuses a
/// device lambda whose captures are first used inside an `if constexpr`.)
template <class Src, class Dst>
KOKKOS_INLINE_FUNCTION void ring_value(const Src& src, Dst* dst, bool accumulate) {
  if constexpr (std::is_same_v<Src, Dst>) {
    *dst = accumulate ? Dst(*dst + src) : src;
  } else {
    const float widened = cast_value<float>(src);
    *dst = accumulate ? cast_value<Dst>(cast_value<float>(*dst) + widened) : cast_value<Dst>(widened);
  }
}

/// dst[i] (+)= src[i] over n values, converting (accumulate: add).
template <class ExecSpace, class Src, class Dst>
void ring_copy(const ExecSpace& space, const Src* src, Dst* dst, std::int64_t n, bool accumulate) {
  if (n == 0) return;
  Kokkos::parallel_for(
      "mlacp::ring accumulate", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { ring_value(src[i], dst + i, accumulate); });
}

template <class T, class ExecSpace, class Core>
class RingAttention {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using A = compat::accumulation_t<T>;
  using context_type = ScheduleContext<T, ExecSpace, Core>;
  using pass_type = typename context_type::pass_type;
  using tensor3 = Tensor3<T, memory_space>;
  using tensor4 = Tensor4<T, memory_space>;
  using lse_view = Tensor3<A, memory_space>;
  template <class X>
  using flat = Vector<X, memory_space>;
  template <class X>
  using view3 = Tensor3<X, memory_space, Unmanaged>;
  template <class X>
  using view4 = Tensor4<X, memory_space, Unmanaged>;
  using gradient_rows = typename context_type::gradient_rows;
  using gradient_part = typename context_type::gradient_part;

  /// Bytes of the buffers the ring owns (its per-configuration scratch).
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& s : data_) n += bytes_of(s.slot[0], s.slot[1]);
    for (const auto& s : grad_) n += bytes_of(s.slot[0], s.slot[1], s.contribution);
    return n + bytes_of(o_acc_, dq_acc_, k_, v_, kv_, latent_, dk_acc_, dv_acc_, dk_, dv_, dkv_, dkpe_, d_latent_);
  }

  // ---- forward ----

  /// Expanded strategy: q [B, Sg, h, dqk] and the own chunk's k [B, Sg, h, dqk], v [B, Sg, h, dv] -> o [B, Sg, h, dv],
  /// lse [B, h, Sg]; K and V travel, and are attended as they arrive.
  void forward_expanded(const ExecSpace& space, const context_type& ctx, const pass_type& p, const tensor4& q,
                        const tensor4& k, const tensor4& v, const tensor4& o, const lse_view& lse) {
    const MlaConfig& c = ctx.config();
    const int h = ctx.local_heads(), dqk = c.qk_dim(), dv = c.vdim;
    if (h == 0) return;  // the whole ring holds no head (its ranks share their Ulysses position)
    reserve_data(ctx, {{k.data(), h * dqk, names::ring_k}, {v.data(), h * dv, names::ring_v}});
    attend(space, ctx, p, q, o, lse, expanded_source(ctx));
  }

  /// Latent strategy: q and the own chunk's payload [B, Sg, R+dr] -> o, lse; the payload travels and each chunk is
  /// expanded into the rank's heads (its rows of w_kvb) on arrival.
  void forward_latent(const ExecSpace& space, const context_type& ctx, const pass_type& p, const tensor4& q,
                      const tensor3& payload, const tensor4& o, const lse_view& lse) {
    const MlaConfig& c = ctx.config();
    if (ctx.local_heads() == 0) return;  // the whole ring holds no head
    reserve_data(ctx, {{payload.data(), c.latent + c.rope, names::ring_payload}});
    reserve_expansion(ctx);
    attend(space, ctx, p, q, o, lse, latent_source(space, ctx, false, {}, {}));
  }

  // ---- backward ----

  /// Expanded strategy: dq [B, Sg, h, dqk] (empty: not needed) is written; the own chunk's dK and dV travel round the
  /// ring and are written into dk, dv by finish_backward (empty: not needed; then nothing but K and V travels).
  void backward_expanded(const ExecSpace& space, const context_type& ctx, const pass_type& p, const tensor4& q,
                         const tensor4& k, const tensor4& v, const tensor4& o, const lse_view& lse, const tensor4& d_o,
                         const tensor4& dq, const tensor4& dk, const tensor4& dv) {
    const MlaConfig& c = ctx.config();
    const int h = ctx.local_heads(), dqk = c.qk_dim(), dvd = c.vdim;
    finish_count_ = 0;
    backward_facts_.heads = false;
    if (h == 0) return;  // no head: dq, dk and dv are empty
    reserve_data(ctx, {{k.data(), h * dqk, names::ring_k}, {v.data(), h * dvd, names::ring_v}});
    const bool kv = dk.data() != nullptr || dv.data() != nullptr;
    if (kv) {
      reserve_grad(ctx, {{h * dqk, names::ring_dk}, {h * dvd, names::ring_dv}});
      finish_into(0, dk.data(), dk.size());
      finish_into(1, dv.data(), dv.size());
    }
    differentiate(space, ctx, p, q, o, lse, d_o, dq, kv, expanded_source(ctx));
  }

  /// Latent strategy: dq as above; the own chunk's payload gradient (all ring ranks' contributions for the rank's
  /// heads) travels round the ring and is written into grad_payload [B, Sg, R+dr] by finish_backward (empty: not
  /// needed); dw_sel / db_sel (the rank's rows of w_kvb's and b_kvb's gradients; empty: not needed) accumulate every
  /// chunk's contribution as it is computed.
  void backward_latent(const ExecSpace& space, const context_type& ctx, const pass_type& p, const tensor4& q,
                       const tensor3& payload, const tensor4& o, const lse_view& lse, const tensor4& d_o,
                       const tensor4& dq, const tensor3& grad_payload, const gradient_rows& dw_sel,
                       const gradient_part& db_sel) {
    const MlaConfig& c = ctx.config();
    const int B = c.batch, h = ctx.local_heads(), dn = c.nope, dvd = c.vdim, dr = c.rope, R = c.latent;
    finish_count_ = 0;
    backward_facts_.heads = false;
    if (h == 0) {  // no head: no contribution to the payload's gradient (the reduce-scatter still takes its zeros)
      if (grad_payload.data() != nullptr) Kokkos::deep_copy(space, grad_payload, T(0));
      return;
    }
    reserve_data(ctx, {{payload.data(), R + dr, names::ring_payload}});
    reserve_expansion(ctx);
    const int n_max = static_cast<int>(ctx.token_map().max_chunk_size());
    ensure(dk_acc_, "mlacp::ring dk", B, n_max, h, dn + dr);
    ensure(dv_acc_, "mlacp::ring dv", B, n_max, h, dvd);
    ensure(dkv_, "mlacp::ring d kv", B, n_max, h * (dn + dvd));
    ensure(dkpe_, "mlacp::ring d k_pe", B, n_max, dr);
    ensure(d_latent_, "mlacp::ring d latent", B, n_max, R);
    if constexpr (!std::is_same_v<A, T>) {
      ensure(dk_, "mlacp::ring dk (rounded)", B, n_max, h, dn + dr);
      ensure(dv_, "mlacp::ring dv (rounded)", B, n_max, h, dvd);
    }
    const bool travels = grad_payload.data() != nullptr;
    if (travels) {
      reserve_grad(ctx, {{R + dr, names::ring_d_payload}});
      finish_into(0, grad_payload.data(), grad_payload.size());
    }
    differentiate(space, ctx, p, q, o, lse, d_o, dq, travels, latent_source(space, ctx, travels, dw_sel, db_sel));
  }

  /// Waits the exchange that brings this rank its own chunk's finished gradient accumulators and writes them where the
  /// backward call said (dk/dv, or the payload gradient): the timeline's ring_finish. A no-op when nothing travelled.
  void finish_backward(const ExecSpace& space) {
    auto steps = timeline::steps(
        [&](timeline::Step, int) {
          for (int i = 0; i < finish_count_; ++i)
            if (finish_[i].data != nullptr)
              ring_copy(space, own_grad(i).data(), finish_[i].data, finish_[i].size, false);
        },
        [&](timeline::Comm, int) {}, [&](timeline::Comm, int i) { grad_[i % 2].pending.wait(); });
    timeline::ring_finish(steps, backward_facts_);
    backward_facts_.heads = false;  // finished: nothing is left to wait
    finish_count_ = 0;
  }

  /// Copies of every buffer the ring's exchanges read or write (its slots, contributions, accumulators and expanded
  /// chunks): what a copy keeps allocated after the driver is gone (ScheduleBase::keep_memory_of_parked_requests).
  std::vector<std::any> buffers() const {
    std::vector<std::any> out{o_acc_, dq_acc_, dk_acc_, dv_acc_, k_,    v_,       dk_,
                              dv_,    kv_,     latent_, dkv_,    dkpe_, d_latent_};
    for (const auto& d : data_) out.insert(out.end(), {d.slot[0], d.slot[1]});
    for (const auto& g : grad_) out.insert(out.end(), {g.slot[0], g.slot[1], g.contribution});
    return out;
  }

 private:
  struct DataStream {
    const T* own = nullptr;
    int width = 0;
    const char* name = "";
    Buffer<flat<T>> slot[2];
    AsyncCollective<view3<T>> pending;
  };
  struct GradStream {
    int width = 0;
    const char* name = "";
    Buffer<flat<A>> slot[2];
    Buffer<flat<A>> contribution;
    AsyncCollective<view3<A>> pending;
  };
  struct DataSpec {
    const T* own;
    int width;
    const char* name;
  };
  struct GradSpec {
    int width;
    const char* name;
  };

  // Tags keep the streams between the same two ranks apart (data, then gradients).
  static constexpr int data_tag = 21;
  static constexpr int grad_tag = 31;

  std::size_t chunk_values(const context_type& ctx, int width) const {
    return static_cast<std::size_t>(ctx.config().batch) * static_cast<std::size_t>(ctx.token_map().max_chunk_size()) *
           static_cast<std::size_t>(width);
  }

  void reserve_data(const context_type& ctx, std::initializer_list<DataSpec> specs) {
    data_count_ = 0;
    for (const DataSpec& spec : specs) {
      DataStream& s = data_[data_count_++];
      s.own = spec.own;
      s.width = spec.width;
      s.name = spec.name;
      for (auto& slot : s.slot) ensure(slot, "mlacp::ring chunk", chunk_values(ctx, spec.width));
    }
  }
  void reserve_grad(const context_type& ctx, std::initializer_list<GradSpec> specs) {
    grad_count_ = 0;
    for (const GradSpec& spec : specs) {
      GradStream& s = grad_[grad_count_++];
      s.width = spec.width;
      s.name = spec.name;
      for (auto& slot : s.slot) ensure(slot, "mlacp::ring gradient", chunk_values(ctx, spec.width));
      ensure(s.contribution, "mlacp::ring contribution", chunk_values(ctx, spec.width));
    }
  }
  void reserve_expansion(const context_type& ctx) {
    const MlaConfig& c = ctx.config();
    const int B = c.batch, n = static_cast<int>(ctx.token_map().max_chunk_size()), h = ctx.local_heads();
    ensure(k_, "mlacp::ring k", B, n, h, c.qk_dim());
    ensure(v_, "mlacp::ring v", B, n, h, c.vdim);
    ensure(kv_, "mlacp::ring kv", B, n, h * (c.nope + c.vdim));
    ensure(latent_, "mlacp::ring latent", B, n, c.latent);
  }

  // The own chunk's gradient accumulator, after the last exchange: the slot the last step received into.
  view3<A> own_grad(int stream) {
    return view3<A>(grad_[stream].slot[(ring_size_ - 1) % 2].view().data(), batch_, own_rows_, grad_[stream].width);
  }

  // The rank's heads' k, v of the chunk whose payload is `payload` (latent strategy), into k_, v_ (first n rows).
  void expand(const ExecSpace& space, const context_type& ctx, int chunk, const T* payload) {
    const MlaConfig& c = ctx.config();
    const int B = c.batch, h = ctx.local_heads(), dn = c.nope, dv = c.vdim, dr = c.rope, R = c.latent;
    const std::int64_t n = ctx.token_map().chunk_size(chunk);
    ComputePhase<ExecSpace> phase(space, names::ring_expand);
    const view3<const T> pay(payload, B, n, R + dr);
    const view3<T> latent(latent_.view().data(), B, n, R), kv(kv_.view().data(), B, n, h * (dn + dv));
    copy_columns(space, pay, 0, latent, 0, R);
    kv_up_forward(space, as_matrix(latent, B * n, R), ctx.rows_of(ctx.weights().w_kvb),
                  ctx.part_of(ctx.weights().b_kvb), as_matrix(kv, B * n, h * (dn + dv)));
    assemble_kv(space, view4<T>(kv.data(), B, n, h, dn + dv), pay, view4<T>(k_.view().data(), B, n, h, dn + dr),
                view4<T>(v_.view().data(), B, n, h, dv), dn, R);
  }

  // A chunk's dK or dV in T: the accumulator itself (float, double), or its rounding into `slot` (bf16).
  static view4<T> rounded(const ExecSpace& space, const view4<A>& src, const tensor4& slot) {
    if constexpr (std::is_same_v<A, T>) {
      (void)space, (void)slot;
      return src;
    } else {
      const view4<T> dst(slot.data(), src.extent(0), src.extent(1), src.extent(2), src.extent(3));
      ring_copy(space, src.data(), dst.data(), static_cast<std::int64_t>(src.size()), false);
      return dst;
    }
  }

  // Ring step t's data stream k: the chunk held now to the successor, the next from the predecessor into slot t % 2.
  void launch_data(const ExecSpace& space, const context_type& ctx, int t, int k,
                   const std::array<const T*, 2>& current) {
    const int C = ctx.ring_size(), g = ctx.ring_rank();
    const int held = (g - t + C) % C, next = (g - t - 1 + 2 * C) % C;
    const auto& map = ctx.token_map();
    DataStream& s = data_[k];
    const view3<const T> send(current[k], batch_, map.chunk_size(held), s.width);
    const view3<T> recv(s.slot[t % 2].view().data(), batch_, map.chunk_size(next), s.width);
    s.pending =
        launch_send_recv(space, send, (g + 1) % C, recv, (g + C - 1) % C, ctx.ring_mesh(), s.name, data_tag + k);
  }
  void wait_data(int t, int k, std::array<const T*, 2>& current) {
    data_[k].pending.wait();
    current[k] = data_[k].slot[t % 2].view().data();
  }

  void prepare(const context_type& ctx) {
    batch_ = ctx.config().batch;
    ring_size_ = ctx.ring_size();
    own_rows_ = ctx.token_map().chunk_size(ctx.ring_rank());
  }

  // The timeline's facts of this ring pass: the strategy picks the streams (data: 1 or 2); `travels`: the gradient
  // accumulators travel (dK and dV, or the payload's); the KV path runs when they travel or when the source folds
  // w_kvb's gradients itself (`folds`: the latent source with w_kvb or b_kvb needed and no payload gradient).
  timeline::Facts facts(const context_type& ctx, bool travels, bool folds = false) const {
    timeline::Facts f;
    f.strategy = data_count_ == 1 ? MlaStrategy::latent : MlaStrategy::expanded;
    f.ring = ctx.ring_size();
    f.payload = travels;
    f.kv = travels || folds;
    return f;
  }

  // ---- the strategies' sources: what travels, how a chunk is expanded on arrival, how its gradient folds back ----

  /// K and V travel as they are: a chunk's keys are the data streams themselves, and its dK, dV accumulate straight
  /// into the travelling accumulators.
  struct ExpandedSource {
    const context_type* ctx;
    static constexpr bool expands = false;
    void expand(int, const std::array<const T*, 2>&) const {}
    std::pair<view4<const T>, view4<const T>> keys(int chunk, const std::array<const T*, 2>& data) const {
      const MlaConfig& c = ctx->config();
      const int h = ctx->local_heads();
      const std::int64_t n = ctx->token_map().chunk_size(chunk);
      return {view4<const T>(data[0], c.batch, n, h, c.qk_dim()), view4<const T>(data[1], c.batch, n, h, c.vdim)};
    }
    std::array<A*, 2> gradients(const std::array<A*, 2>& into) const { return into; }
    /// Folds nothing itself: dK and dV are the travelling accumulators (computed exactly when they travel).
    bool kv() const { return false; }
    void fold(int, const std::array<A*, 2>&) const {}
  };
  ExpandedSource expanded_source(const context_type& ctx) { return ExpandedSource{&ctx}; }

  /// The latent payload travels: each chunk is expanded into the rank's heads on arrival (its rows of w_kvb, as after
  /// the Ulysses all-gather); its dK, dV accumulate in the ring's own buffers and fold back through w_kvb into the
  /// travelling payload gradient (and w_kvb's gradients), as LatentKVLinear's backward does for the flat layer.
  struct LatentSource {
    RingAttention* ring;
    ExecSpace space;
    const context_type* ctx;
    bool travels;
    gradient_rows dw_sel;
    gradient_part db_sel;
    static constexpr bool expands = true;
    void expand(int chunk, const std::array<const T*, 2>& data) const { ring->expand(space, *ctx, chunk, data[0]); }
    std::pair<view4<const T>, view4<const T>> keys(int chunk, const std::array<const T*, 2>&) const {
      const MlaConfig& c = ctx->config();
      const int h = ctx->local_heads();
      const std::int64_t n = ctx->token_map().chunk_size(chunk);
      return {view4<const T>(ring->k_.view().data(), c.batch, n, h, c.qk_dim()),
              view4<const T>(ring->v_.view().data(), c.batch, n, h, c.vdim)};
    }
    bool kv() const { return travels || dw_sel.data() != nullptr || db_sel.data() != nullptr; }
    std::array<A*, 2> gradients(const std::array<A*, 2>&) const {
      if (!kv()) return {nullptr, nullptr};
      return {ring->dk_acc_.view().data(), ring->dv_acc_.view().data()};
    }
    void fold(int chunk, const std::array<A*, 2>& into) const {
      if (!kv()) return;
      ring->fold(space, *ctx, chunk, travels ? into[0] : nullptr, dw_sel, db_sel);
    }
  };
  LatentSource latent_source(const ExecSpace& space, const context_type& ctx, bool travels, const gradient_rows& dw_sel,
                             const gradient_part& db_sel) {
    return LatentSource{this, space, &ctx, travels, dw_sel, db_sel};
  }

  // The latent chunk's dK, dV (in dk_acc_, dv_acc_) in T (rounded once for bf16) -> d(kv) and the shared key's
  // gradient, as the flat layer; then the payload gradient's contribution (into `into`, when it travels) and w_kvb's
  // gradients.
  void fold(const ExecSpace& space, const context_type& ctx, int chunk, A* into, const gradient_rows& dw_sel,
            const gradient_part& db_sel) {
    const MlaConfig& c = ctx.config();
    const int B = c.batch, h = ctx.local_heads(), dn = c.nope, dvd = c.vdim, dr = c.rope, R = c.latent;
    const std::int64_t n = ctx.token_map().chunk_size(chunk);
    ComputePhase<ExecSpace> phase(space, names::ring_kv_backward);
    const view4<T> dk_t = rounded(space, view4<A>(dk_acc_.view().data(), B, n, h, dn + dr), dk_.view());
    const view4<T> dv_t = rounded(space, view4<A>(dv_acc_.view().data(), B, n, h, dvd), dv_.view());
    const view3<T> dkv(dkv_.view().data(), B, n, h * (dn + dvd)), dkpe(dkpe_.view().data(), B, n, dr);
    disassemble_kv_grad(space, dk_t, dv_t, view4<T>(dkv.data(), B, n, h, dn + dvd), dkpe, dn);
    const auto dkv2 = as_matrix(dkv, B * n, h * (dn + dvd));
    const view3<T> latent_j(latent_.view().data(), B, n, R);
    if (into != nullptr)
      kv_up_dgrad(space, dkv2, ctx.rows_of(ctx.weights().w_kvb), view3<T>(d_latent_.view().data(), B, n, R), dkpe,
                  view3<A>(into, B, n, R + dr));
    kv_up_wgrad(space, dkv2, as_matrix(latent_j, B * n, R), dw_sel, db_sel);
  }

  // ---- the driver: knows the ring, not the strategies ----

  // The forward over the ring, as the timeline's ring_forward orders it: at step t the next chunk travels while the
  // chunk held is (expanded and) attended, merged into the running output.
  template <class Source>
  void attend(const ExecSpace& space, const context_type& ctx, const pass_type& p, const tensor4& q, const tensor4& o,
              const lse_view& lse, const Source& source) {
    prepare(ctx);
    const int C = ctx.ring_size(), g = ctx.ring_rank();
    const auto& map = ctx.token_map();
    const MlaConfig& c = ctx.config();
    const TokenSegments q_rows = segments_of(map.chunk(g));
    // The running output: o itself when it is in the accumulation type, else float scratch rounded into o at the end.
    view4<A> o_acc;
    if constexpr (std::is_same_v<A, T>) {
      o_acc = view4<A>(o.data(), o.extent(0), o.extent(1), o.extent(2), o.extent(3));
    } else {
      o_acc = ensure(o_acc_, "mlacp::ring o (float)", o.extent(0), o.extent(1), o.extent(2), o.extent(3));
    }
    std::array<const T*, 2> current{data_[0].own, data_count_ > 1 ? data_[1].own : nullptr};
    auto steps = timeline::steps(
        [&](timeline::Step step, int t) {
          const int chunk = (g - t + C) % C;
          if (step == timeline::Step::ring_expand) return source.expand(chunk, current);
          if constexpr (core_capabilities_v<Core>.blocks) {
            const auto [k_j, v_j] = source.keys(chunk, current);
            ComputePhase<ExecSpace> phase(space, names::attention_fprop);
            ctx.core().forward(space, attention_problem(q, k_j, v_j, o_acc, lse, p.w.documents.layout)
                                          .positioned(q_rows, segments_of(map.chunk(chunk)), c.seq, t == 0));
          } else {
            // The layer refuses a two-level mesh for a core without blocks at construction (MlaAttention::ring_error).
            (void)p, (void)q_rows, (void)o_acc, (void)lse, (void)q, (void)c;
            throw UsageError("mlacp: ring attention with a core that computes no positioned blocks");
          }
        },
        [&](timeline::Comm, int i) { launch_data(space, ctx, i / 2, i % 2, current); },
        [&](timeline::Comm, int i) { wait_data(i / 2, i % 2, current); });
    timeline::ring_forward(steps, facts(ctx, false));
    if constexpr (!std::is_same_v<A, T>)
      ring_copy(space, o_acc.data(), o.data(), static_cast<std::int64_t>(o.size()), false);
  }

  template <class DK, class DV>
  void block_backward(const ExecSpace& space, const context_type& ctx, const pass_type& p, const tensor4& q,
                      const tensor4& o, const lse_view& lse, const tensor4& d_o, int chunk, const view4<const T>& k_j,
                      const view4<const T>& v_j, const DK& dk_j, const DV& dv_j) {
    const auto& map = ctx.token_map();
    ComputePhase<ExecSpace> phase(space, names::attention_bprop);
    if constexpr (core_capabilities_v<Core>.blocks) {
      ctx.core().backward(space, attention_problem(q, k_j, v_j, o, lse, d_o, dq_view_, dk_j, dv_j, p.w.documents.layout)
                                     .positioned(segments_of(map.chunk(ctx.ring_rank())), segments_of(map.chunk(chunk)),
                                                 ctx.config().seq, false));
    } else {
      (void)q, (void)k_j, (void)v_j, (void)o, (void)lse, (void)d_o, (void)dk_j, (void)dv_j, (void)p, (void)map;
      throw UsageError("mlacp: ring attention with a core that computes no positioned blocks");
    }
  }

  // The backward over the ring, as the timeline's ring_backward orders it: the chunks travel again, this rank's
  // contribution to each chunk's gradient accumulators is computed (the source's gradients, folded back) and added to
  // the accumulator arriving one step behind, which leaves for the next rank; dq accumulates over the chunks. The
  // last exchange is waited by finish_backward.
  template <class Source>
  void differentiate(const ExecSpace& space, const context_type& ctx, const pass_type& p, const tensor4& q,
                     const tensor4& o, const lse_view& lse, const tensor4& d_o, const tensor4& dq, bool travels,
                     const Source& source) {
    prepare(ctx);
    if (!travels) grad_count_ = 0;
    const int C = ctx.ring_size(), g = ctx.ring_rank();
    const auto& map = ctx.token_map();
    const MlaConfig& c = ctx.config();
    const int h = ctx.local_heads();
    // dq accumulates over the chunks: dq itself in the accumulation type, else float scratch rounded at the end.
    dq_view_ = view4<A>();
    if (dq.data() != nullptr) {
      if constexpr (std::is_same_v<A, T>) {
        dq_view_ = view4<A>(dq.data(), dq.extent(0), dq.extent(1), dq.extent(2), dq.extent(3));
      } else {
        dq_view_ = ensure(dq_acc_, "mlacp::ring dq (float)", dq.extent(0), dq.extent(1), dq.extent(2), dq.extent(3));
      }
      Kokkos::deep_copy(space, dq_view_, A(0));
    }
    std::array<const T*, 2> current{data_[0].own, data_count_ > 1 ? data_[1].own : nullptr};
    // Step 0 writes its contribution straight into the slot it sends; later steps into the contribution buffer, added
    // to the arriving accumulator once it is there.
    const auto into = [&](int t) {
      std::array<A*, 2> ptr{nullptr, nullptr};
      for (int i = 0; i < grad_count_; ++i)
        ptr[i] = t == 0 ? grad_[i].slot[1].view().data() : grad_[i].contribution.view().data();
      return ptr;
    };
    const auto rows = [&](int t) { return map.chunk_size((g - t + C) % C); };
    auto steps = timeline::steps(
        [&](timeline::Step step, int i) {
          switch (step) {
            case timeline::Step::ring_expand:
              return source.expand((g - i + C) % C, current);
            case timeline::Step::ring_attention_backward: {
              const int chunk = (g - i + C) % C;
              const std::int64_t n = rows(i);
              const std::array<A*, 2> grads = source.gradients(into(i));
              view4<A> dk_j, dv_j;
              if (grads[0] != nullptr) {
                dk_j = view4<A>(grads[0], c.batch, n, h, c.qk_dim());
                dv_j = view4<A>(grads[1], c.batch, n, h, c.vdim);
                Kokkos::deep_copy(space, dk_j, A(0));
                Kokkos::deep_copy(space, dv_j, A(0));
              }
              const auto [k_j, v_j] = source.keys(chunk, current);
              return block_backward(space, ctx, p, q, o, lse, d_o, chunk, k_j, v_j, dk_j, dv_j);
            }
            case timeline::Step::ring_fold:
              return source.fold((g - i + C) % C, into(i));
            case timeline::Step::ring_accumulate: {
              const int t = i / 2;
              GradStream& s = grad_[i % 2];
              ring_copy(space, s.contribution.view().data(), s.slot[(t + 1) % 2].view().data(),
                        static_cast<std::int64_t>(batch_) * rows(t) * s.width, true);
              return;
            }
            default:
              return;
          }
        },
        [&](timeline::Comm comm, int i) {
          const int t = i / 2;
          if (comm == timeline::Comm::ring_data) return launch_data(space, ctx, t, i % 2, current);
          GradStream& s = grad_[i % 2];
          const view3<A> send(s.slot[(t + 1) % 2].view().data(), batch_, rows(t), s.width);
          const view3<A> recv(s.slot[t % 2].view().data(), batch_, map.chunk_size((g - t - 1 + 2 * C) % C), s.width);
          s.pending = launch_send_recv(space, send, (g + 1) % C, recv, (g + C - 1) % C, ctx.ring_mesh(), s.name,
                                       grad_tag + i % 2);
        },
        [&](timeline::Comm comm, int i) {
          if (comm == timeline::Comm::ring_data) return wait_data(i / 2, i % 2, current);
          grad_[i % 2].pending.wait();
        });
    backward_facts_ = facts(ctx, travels, source.kv());
    timeline::ring_backward(steps, backward_facts_);
    if constexpr (!std::is_same_v<A, T>) {
      if (dq.data() != nullptr)
        ring_copy(space, dq_view_.data(), dq.data(), static_cast<std::int64_t>(dq.size()), false);
    }
  }

  // Where finish_backward writes stream i's finished accumulator (converted to T): `size` values at `data`.
  struct FinishTarget {
    T* data = nullptr;
    std::int64_t size = 0;
  };
  void finish_into(int i, T* data, std::size_t size) {
    finish_[i] = FinishTarget{data, static_cast<std::int64_t>(size)};
    finish_count_ = std::max(finish_count_, i + 1);
  }

  std::array<DataStream, 2> data_;
  std::array<GradStream, 2> grad_;
  int data_count_ = 0, grad_count_ = 0;
  int batch_ = 0, ring_size_ = 1;
  std::int64_t own_rows_ = 0;
  Buffer<Tensor4<A, memory_space>> o_acc_, dq_acc_, dk_acc_, dv_acc_;
  view4<A> dq_view_;
  Buffer<tensor4> k_, v_, dk_, dv_;
  Buffer<tensor3> kv_, latent_, dkv_, dkpe_, d_latent_;
  std::array<FinishTarget, 2> finish_;
  int finish_count_ = 0;
  timeline::Facts backward_facts_ = facts_none();
  static timeline::Facts facts_none() {
    timeline::Facts f;
    f.heads = false;
    return f;
  }
};

}  // namespace mlacp::detail
