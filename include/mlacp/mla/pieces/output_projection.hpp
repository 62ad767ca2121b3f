// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The output projection piece: head-to-token exchange of the attention output, consumed per source rank by o_proj as
// each block arrives; its backward overlaps the token-to-head all-to-all of the output gradient with the o_proj weight
// gradient.
#pragma once

#include <mlacp/all_to_all.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/detail/buffer.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/detail/timeline.hpp>
#include <mlacp/mla/kernels/detail/linear.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/partition.hpp>
#include <mlacp/send_recv.hpp>
#include <mlacp/view_types.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace mlacp {

namespace detail {
/// The buffers of the output projection's per-peer exchange in T (wire_dtype same), owned by the caller (a schedule's
/// scratch): allocated on first use, reused by every later forward. `send` [B, S, h, dv]: the attention output packed
/// by destination (B > 1: each destination's tokens are strided in it); `recv` [B, s, H, dv]: the blocks as they
/// arrive, source r's [B, s, h_r, dv] at offset B * s * heads.offset(r) * dv.
template <class T, class MemorySpace>
struct OutputExchangeBuffers {
  Buffer<Tensor4<T, MemorySpace>> send, recv;
  /// bf16 layers: y [B*s, D] summed over the source blocks in float, rounded into y once (empty otherwise).
  Buffer<Matrix<compat::accumulation_t<T>, MemorySpace>> y_sum;
  std::size_t bytes() const { return bytes_of(send, recv, y_sum); }
};

/// Row r of the attention output o [B, S, h, dv] that goes to the destination whose tokens are [first, first +
/// count): the destination's block [B, count, h, dv] row by row (each row one head's dv values of one token).
template <class T>
struct TokenBlockRows {
  const T* o;
  std::int64_t S, h, dv, first, count;
  KOKKOS_INLINE_FUNCTION const T* operator()(const std::int64_t r) const {
    const std::int64_t j = r % h, t = (r / h) % count, b = r / (h * count);
    return o + ((b * S + first + t) * h + j) * dv;
  }
};

/// Row r of a received head block [B, s, count, dv] in `local` [B, s, H, dv]: heads [first, first + count).
template <class T>
struct HeadBlockRows {
  T* local;
  std::int64_t H, dv, first, count;
  KOKKOS_INLINE_FUNCTION T* operator()(const std::int64_t r) const {
    return local + ((r / count) * H + first + r % count) * dv;
  }
};

/// Destination r's tokens of o [B, S, h, dv], encoded by Codec into `packed` at row B * seq.offset(r) * h: the block
/// [B, seq.count(r), h, dv] (each row Codec::wire_width(dv) wire values).
template <class Codec, class ExecSpace, class Tensor4View, class W>
void pack_token_block(const ExecSpace& space, const Tensor4View& o, const Partition& seq, int r, W* packed) {
  using T = typename Tensor4View::non_const_value_type;
  const auto S = static_cast<std::int64_t>(o.extent(1));
  const auto B = static_cast<std::int64_t>(o.extent(0));
  const auto h = static_cast<std::int64_t>(o.extent(2)), dv = static_cast<std::int64_t>(o.extent(3));
  const std::int64_t first = seq.offset(r), count = seq.count(r);
  encode_rows<Codec, T>(space, "mlacp::pack O blocks", B * count * h, dv,
                        TokenBlockRows<T>{o.data(), S, h, dv, first, count},
                        packed + B * first * h * Codec::wire_width(dv));
}

/// o [B, S, h, dv] encoded by Codec into `packed` by destination (pack_token_block for every destination).
template <class Codec, class ExecSpace, class Tensor4View, class W>
void pack_token_blocks(const ExecSpace& space, const Tensor4View& o, const Partition& seq, W* packed) {
  for (int r = 0; r < seq.parts(); ++r) pack_token_block<Codec>(space, o, seq, r, packed);
}

/// A received head block [B, s, count, dv] (encoded by Codec) decoded into heads [first, first + count) of `local`
/// [B, s, H, dv].
template <class Codec, class ExecSpace, class W, class Tensor4View>
void unpack_head_block(const ExecSpace& space, const W* block, const Tensor4View& local, std::int64_t first,
                       std::int64_t count) {
  using T = typename Tensor4View::non_const_value_type;
  const auto tokens = static_cast<std::int64_t>(local.extent(0) * local.extent(1)),
             H = static_cast<std::int64_t>(local.extent(2)), dv = static_cast<std::int64_t>(local.extent(3));
  decode_rows<Codec, T>(space, "mlacp::unpack O block", tokens * count, dv, block,
                        HeadBlockRows<T>{local.data(), H, dv, first, count});
}

/// y [rows, D] = round(y_sum + bias), one rounding per element (bias empty: none). (A free function: nvcc refuses a
/// device lambda in a private member function.)
template <class ExecSpace, class Sum, class Bias, class Y>
void round_sum_into(const ExecSpace& space, const Sum& y_sum, const Bias& bias, const Y& y) {
  using T = typename Y::non_const_value_type;
  using A = typename Sum::non_const_value_type;
  const bool has_bias = bias.data() != nullptr;
  Kokkos::parallel_for(
      "mlacp::round y",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
          space, {0, 0}, {static_cast<std::int64_t>(y.extent(0)), static_cast<std::int64_t>(y.extent(1))}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
        A v = y_sum(i, j);
        if (has_bias) v += static_cast<A>(bias(j));
        y(i, j) = cast_value<T>(v);
      });
}
}  // namespace detail

/// One forward invocation of the output projection and its backward (the reference's _OutputProjection).
template <class T, class ExecSpace>
class OutputProjection {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using tensor3 = detail::Tensor3<T, memory_space>;
  using tensor4 = detail::Tensor4<T, memory_space>;
  using tensor5 = detail::Tensor5<T, memory_space>;
  using matrix = detail::Matrix<T, memory_space>;
  using vector = detail::Vector<T, memory_space>;
  /// The weight gradients' Views: in T's accumulation type (float for bf16: the layer's float gradients).
  using gradient_matrix = detail::Matrix<compat::accumulation_t<T>, memory_space>;
  using gradient_vector = detail::Vector<compat::accumulation_t<T>, memory_space>;

  using buffers_type = detail::OutputExchangeBuffers<T, memory_space>;

  /// attention_output [B, S, h, dv] (head-local) -> y [B, s, D] = o_tokens [B*s, H*dv] w_o^T (+ b_o, when not empty),
  /// tokens split by `seq`, heads by `heads` (both outlive the invocation: the layer's). At P > 1 the head-to-token
  /// exchange is per peer: each rank's token block is sent to it and each source's head block received on its own
  /// (launch_send_recv, rank + k / rank - k at step k), and y is summed block by block as they arrive, y = sum over
  /// sources r of O_r [B*s, h_r*dv] w_o[:, r's head columns]^T: the own block first (no wait), then each received one
  /// (its GEMM progressing the others in flight). `overlap` false: every exchange is waited right after its launch,
  /// before any GEMM (the same sums in the same order). Saves what backward needs. `y_out` [B, s, D]: where y is
  /// written (a layer's workspace); empty: allocated. `local_out` [B, s, H, dv]: where the gathered heads (kept for the
  /// w_o gradient) go; empty: allocated. `codec`: what the blocks travel as (wire/codecs.hpp): same moves T through
  /// `buffers` (null: allocated per call); another codec encodes each destination's block into a pooled buffer before
  /// the sends and decodes each arriving block into `local_out`.
  tensor3 forward(const ExecSpace& space, const tensor4& attention_output, const matrix& w_o, const vector& b_o,
                  const Mesh& mesh, const Partition& seq, const Partition& heads, tensor3 y_out = {},
                  const tensor4& local_out = {}, WireCodec codec = WireCodec::same, buffers_type* buffers = nullptr,
                  bool overlap = true) {
    return forward_impl(space, attention_output, w_o, b_o, mesh, &seq, &heads, std::move(y_out), local_out, codec,
                        buffers, overlap, {});
  }
  /// forward() with the attention output produced block by block as it leaves (timeline.hpp, output_forward with
  /// o_blocks): `produce(r)` writes the rows of `attention_output` that are rank r's tokens (seq's part r). At P > 1
  /// it is called for each peer right before that peer's block is sent, so that the block travels while the next is
  /// produced, and for this rank last, before its own block's GEMM; at P == 1 once, before the exchange. The sums are
  /// those of forward() on the finished attention output.
  tensor3 forward_as_computed(const ExecSpace& space, const std::function<void(int)>& produce,
                              const tensor4& attention_output, const matrix& w_o, const vector& b_o, const Mesh& mesh,
                              const Partition& seq, const Partition& heads, tensor3 y_out = {},
                              const tensor4& local_out = {}, WireCodec codec = WireCodec::same,
                              buffers_type* buffers = nullptr, bool overlap = true) {
    return forward_impl(space, attention_output, w_o, b_o, mesh, &seq, &heads, std::move(y_out), local_out, codec,
                        buffers, overlap, produce);
  }
  /// The even split (S and H divisible by the group size).
  tensor3 forward(const ExecSpace& space, const tensor4& attention_output, const matrix& w_o, const vector& b_o,
                  const Mesh& mesh, tensor3 y_out = {}, const tensor4& local_out = {},
                  WireCodec codec = WireCodec::same, buffers_type* buffers = nullptr, bool overlap = true) {
    return forward_impl(space, attention_output, w_o, b_o, mesh, nullptr, nullptr, std::move(y_out), local_out, codec,
                        buffers, overlap, {});
  }

 private:
  // The tag of the per-peer exchange: one message per ordered pair and forward, apart from ring attention's (21+,
  // 31+, on the ring's communicator).
  static constexpr int exchange_tag = 41;

  tensor3 forward_impl(const ExecSpace& space, const tensor4& attention_output, const matrix& w_o, const vector& b_o,
                       const Mesh& mesh, const Partition* seq, const Partition* heads, tensor3 y_out,
                       const tensor4& local_out, WireCodec codec, buffers_type* buffers, bool overlap,
                       const std::function<void(int)>& produce) {
    if (forwarded_) throw UsageError("mlacp::OutputProjection: forward called twice on the same invocation");
    tensor3 y;
    tensor4 local;
    if (mesh.size() == 1) {
      // Nothing to exchange: the collective's local copy (or the input itself), then one GEMM.
      if (produce) produce(0);
      AsyncCollective<tensor4> exchange;
      auto steps = detail::timeline::steps(
          [&](detail::timeline::Step step, int) {
            if (step != detail::timeline::Step::o_block) return;
            const auto B = static_cast<std::int64_t>(local.extent(0)), s = static_cast<std::int64_t>(local.extent(1));
            const auto Hdv = static_cast<std::int64_t>(local.extent(2) * local.extent(3));
            y = allocated_y(std::move(y_out), B, s, w_o);
            detail::ComputePhase<ExecSpace> phase(space, names::w_o_fprop);
            detail::linear_forward(space, detail::as_matrix(local, B * s, Hdv), w_o, b_o,
                                   detail::as_matrix(y, B * s, static_cast<std::int64_t>(w_o.extent(0))));
          },
          [&](detail::timeline::Comm, int) {
            exchange = seq == nullptr ? launch_all_to_all(space, attention_output, 2, 1, mesh, names::o_a2a, local_out)
                                      : launch_all_to_all(space, attention_output, 2, 1, *heads, *seq, mesh,
                                                          names::o_a2a, local_out);
          },
          [&](detail::timeline::Comm, int) { local = exchange.wait(); });  // [B, s, H, dv]
      detail::timeline::output_forward(steps, detail::timeline::part_facts(1, overlap));
    } else {
      const int P = mesh.size();
      const auto S = static_cast<std::int64_t>(attention_output.extent(1));
      const auto h = static_cast<std::int64_t>(attention_output.extent(2));
      if (seq == nullptr && S % P != 0)
        throw InvalidArgument("mlacp::OutputProjection: the attention output has " + std::to_string(S) +
                              " tokens; expected a multiple of the group size " + std::to_string(P) +
                              " for the even split (pass Partitions for an uneven one)");
      const Partition token_part = seq != nullptr ? *seq : Partition(S, P);
      const Partition head_part = heads != nullptr ? *heads : Partition(h * P, P);
      if (token_part.total() != S || token_part.parts() != P)
        throw InvalidArgument("mlacp::OutputProjection: the token partition " + token_part.str() + " splits " +
                              std::to_string(token_part.total()) + " tokens over " +
                              std::to_string(token_part.parts()) + " ranks; expected " + std::to_string(S) +
                              " tokens (the attention output's) over the group's " + std::to_string(P));
      if (head_part.parts() != P || head_part.count(mesh.rank()) != h)
        throw InvalidArgument("mlacp::OutputProjection: the attention output has " + std::to_string(h) +
                              " heads on rank " + std::to_string(mesh.rank()) + "; expected the head partition " +
                              head_part.str() + "'s count for it over the group's " + std::to_string(P) + " ranks");
      const auto H = head_part.total();
      if (static_cast<std::int64_t>(w_o.extent(1)) != H * static_cast<std::int64_t>(attention_output.extent(3)))
        throw InvalidArgument(
            "mlacp::OutputProjection: w_o has " + std::to_string(w_o.extent(1)) +
            " columns; expected H * dv = " + std::to_string(H * static_cast<std::int64_t>(attention_output.extent(3))));
      buffers_type own;
      buffers_type& b = buffers != nullptr ? *buffers : own;
      std::tie(y, local) = detail::visit_codec(codec, [&](auto tag) {
        using Codec = typename decltype(tag)::type;
        if constexpr (!Codec::template carries<T>) {
          throw InvalidArgument(std::string("mlacp::OutputProjection: the wire codec ") + Codec::name +
                                " carries float only; expected the codec same for this layer's value type");
          return std::pair<tensor3, tensor4>();
        } else {
          return exchange_and_project<Codec>(space, attention_output, w_o, b_o, mesh, token_part, head_part,
                                             std::move(y_out), local_out, b, overlap, produce);
        }
      });
    }
    local_output_ = local;
    w_o_ = w_o;
    mesh_ = &mesh;
    seq_ = seq;
    heads_ = heads;
    forwarded_ = true;
    return y;
  }

  static tensor3 allocated_y(tensor3 y_out, std::int64_t B, std::int64_t s, const matrix& w_o) {
    if (y_out.data() != nullptr) return y_out;
    return tensor3(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::y"), B, s, w_o.extent(0));
  }

  // The per-peer exchange of the head blocks (each row of dv values encoded by Codec: T itself, or bf16 or fp8 for a
  // float layer's wire) and the output projection summed block by block. Codec same: through `buffers`, the caller's
  // (see OutputExchangeBuffers); another codec: through pooled staging buffers (the codec's, kept until the
  // exchanges are waited). `produce` (when set): o's rows of a destination are written by it right before that
  // destination's block is packed and sent (forward_as_computed). Returns y and the gathered heads [B, s, H, dv].
  template <class Codec>
  std::pair<tensor3, tensor4> exchange_and_project(const ExecSpace& space, const tensor4& o, const matrix& w_o,
                                                   const vector& b_o, const Mesh& mesh, const Partition& seq,
                                                   const Partition& heads, tensor3 y_out, const tensor4& local_out,
                                                   buffers_type& buffers, bool overlap,
                                                   const std::function<void(int)>& produce) {
    using U = typename Codec::template wire_t<T>;
    constexpr bool same = std::is_same_v<Codec, detail::SameCodec>;
    using unmanaged = detail::Vector<U, memory_space, detail::Unmanaged>;
    const int P = mesh.size(), me = mesh.rank();
    const auto B = static_cast<std::int64_t>(o.extent(0)), S = static_cast<std::int64_t>(o.extent(1));
    const auto h = static_cast<std::int64_t>(o.extent(2)), dv = static_cast<std::int64_t>(o.extent(3));
    const auto s = seq.count(me), H = heads.total(), D = static_cast<std::int64_t>(w_o.extent(0));
    const std::int64_t wide = Codec::wire_width(dv);  // wire values per row (one head of one token)
    const tensor4 local =
        local_out.data() != nullptr
            ? local_out
            : tensor4(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::o tokens"), B, s, H, dv);
    tensor3 y = allocated_y(std::move(y_out), B, s, w_o);
    // The send blocks, by destination: destination r's [B, s_r, h, dv] at row B * seq.offset(r) * h. With B == 1 and
    // T on the wire that is the attention output itself (no pack).
    // Packed: the blocks are packed (all before the first send, or each after it is produced) into `packed`.
    const U* send = nullptr;
    U* recv = nullptr;
    U* packed = nullptr;
    detail::PooledBuffer<U, memory_space> send_staging, recv_staging;  // another codec's (released on return)
    if constexpr (same) {
      if (B == 1) send = o.data();
      if (send == nullptr) {
        packed = detail::ensure(buffers.send, "mlacp::O a2a send", B, S, h, dv).data();
        send = packed;
      }
      recv = detail::ensure(buffers.recv, "mlacp::O a2a recv", B, s, H, dv).data();
    } else {
      send_staging = detail::allocate_buffer<U, memory_space>(space, std::string(names::o_a2a) + " wire send",
                                                              static_cast<std::size_t>(B * S * h * wide));
      packed = send_staging.view.data();
      send = packed;
      recv_staging = detail::allocate_buffer<U, memory_space>(space, std::string(names::o_a2a) + " wire recv",
                                                              static_cast<std::size_t>(B * s * H * wide));
      recv = recv_staging.view.data();
    }
    if (packed != nullptr && !produce) detail::pack_token_blocks<Codec>(space, o, seq, packed);
    // The received blocks, by source: source r's [B, s, h_r, dv] at row B * s * heads.offset(r).
    const auto send_block = [&](int r) {
      return detail::Vector<const U, memory_space, detail::Unmanaged>(
          send + B * seq.offset(r) * h * wide, static_cast<std::size_t>(B * seq.count(r) * h * wide));
    };
    // Step k: to rank me + k, from rank me - k (every pair's send and receive meet at the same step on both ranks).
    std::vector<AsyncCollective<unmanaged>> arriving(static_cast<std::size_t>(P - 1));
    // Block `source` [B, s, h_r, dv] (values of U) into its head columns of `local`, then its GEMM: beta 0 for the
    // first block with heads, 1 after it (b_o is added once, after the last). A bf16 layer sums the blocks' products
    // in float (`sums`' y_sum) and rounds into y once, as its single GEMM of all heads did.
    using A = compat::accumulation_t<T>;
    constexpr bool widened = !std::is_same_v<A, T>;
    const auto y2 = detail::as_matrix(y, B * s, D);
    detail::Matrix<A, memory_space> y_sum;
    if constexpr (widened) {
      buffers_type& b = buffers;
      y_sum = detail::ensure(b.y_sum, "mlacp::y sum", B * s, D);
    }
    const auto tokens = detail::as_matrix(local, B * s, H * dv);
    bool first = true;
    const auto consume = [&](int source, const U* block) {
      const std::int64_t hr = heads.count(source), column = heads.offset(source) * dv, width = hr * dv;
      detail::unpack_head_block<Codec>(space, block, local, heads.offset(source), hr);
      if (hr == 0) return;
      detail::ComputePhase<ExecSpace> phase(space, names::w_o_fprop);
      const auto columns = std::make_pair(static_cast<std::size_t>(column), static_cast<std::size_t>(column + width));
      if constexpr (widened)
        detail::gemm_with_progress(space, "N", "T", A(1), Kokkos::subview(tokens, Kokkos::ALL(), columns),
                                   Kokkos::subview(w_o, Kokkos::ALL(), columns), first ? A(0) : A(1), y_sum);
      else
        detail::gemm_with_progress(space, "N", "T", T(1), Kokkos::subview(tokens, Kokkos::ALL(), columns),
                                   Kokkos::subview(w_o, Kokkos::ALL(), columns), first ? T(0) : T(1), y2);
      first = false;
    };
    // The order (timeline.hpp, output_forward): every exchange launched, the own block's GEMM (no wait: it is in the
    // send buffer already), then each arriving block's.
    auto steps = detail::timeline::steps(
        [&](detail::timeline::Step step, int k) {
          if (step == detail::timeline::Step::attention_block) {
            const int dest = (me + k) % P;
            produce(dest);
            if (packed != nullptr) detail::pack_token_block<Codec>(space, o, seq, dest, packed);
            return;
          }
          if (step != detail::timeline::Step::o_block) return;
          const int source = (me + P - k) % P;
          consume(source, k == 0 ? send + B * seq.offset(me) * h * wide : recv + B * s * heads.offset(source) * wide);
        },
        [&](detail::timeline::Comm, int k) {
          const int dest = (me + k) % P, source = (me + P - k) % P;
          arriving[static_cast<std::size_t>(k - 1)] =
              launch_send_recv(space, send_block(dest), dest,
                               unmanaged(recv + B * s * heads.offset(source) * wide,
                                         static_cast<std::size_t>(B * s * heads.count(source) * wide)),
                               source, mesh, names::o_a2a, exchange_tag);
        },
        [&](detail::timeline::Comm, int k) { arriving[static_cast<std::size_t>(k - 1)].wait(); });
    detail::timeline::output_forward(steps, detail::timeline::part_facts(P, overlap, true, true, bool(produce)));
    if constexpr (widened) {
      if (!first) {
        detail::round_sum_into(space, y_sum, b_o, y2);
        return {y, local};
      }
    }
    if (first) Kokkos::deep_copy(space, y, T(0));  // no head anywhere: y is the bias alone
    if (b_o.data() != nullptr) detail::add_bias(space, y2, b_o);
    return {y, local};
  }

 public:
  /// dy [B, s, D] -> the head-local gradient of the attention output [B, S, h, dv] (empty when not
  /// `needs_attention_grad`). Order: dgrad (dy w_o, written per destination rank), launch the token-to-head all-to-all
  /// of it ("dO a2a"), the weight gradient dw_o += dy^T o (progressing the all-to-all between panels, see progress.hpp)
  /// and db_o += column sums of dy while it is in flight, then wait. dw_o / db_o empty: not needed (skipped). `overlap`
  /// false: wait right after the launch. `blocks` [P, B, s, h, dv] ([1, B, s, H, dv] when the heads are split
  /// unevenly: dO is sent as one token-local block and the all-to-all scatters its heads): where dO is written before
  /// it is sent (a layer's workspace; read by the collective until the wait); empty: allocated. `received` [1, B, S, h,
  /// dv]: where the all-to-all's result goes; empty: allocated. `codec`: what dO travels as (encoded from `blocks`).
  tensor4 backward(const ExecSpace& space, const tensor3& dy, bool needs_attention_grad, const gradient_matrix& dw_o,
                   const gradient_vector& db_o, bool overlap = true, tensor5 blocks = {}, const tensor5& received = {},
                   WireCodec codec = WireCodec::same) {
    if (!forwarded_) throw UsageError("mlacp::OutputProjection: backward before forward");
    if (backwarded_) throw UsageError("mlacp::OutputProjection: a second backward of the same forward");
    backwarded_ = true;
    const auto B = static_cast<std::int64_t>(dy.extent(0)), s = static_cast<std::int64_t>(dy.extent(1));
    const auto D = static_cast<std::int64_t>(dy.extent(2));
    const auto H = static_cast<std::int64_t>(local_output_.extent(2)),
               dv = static_cast<std::int64_t>(local_output_.extent(3));
    const auto dy2 = detail::as_matrix(dy, B * s, D);
    AsyncCollective<tensor5> grad_a2a;
    tensor5 result;
    // Uneven heads: one block of all heads, whose head dimension the all-to-all scatters by the head partition.
    const bool even = heads_ == nullptr || heads_->uniform();
    // The order (timeline.hpp, output_backward): the dgrad, dO's all-to-all launched, w_o's gradients while it is in
    // flight, then its wait.
    auto steps = detail::timeline::steps(
        [&](detail::timeline::Step step, int) {
          if (step == detail::timeline::Step::w_o_dgrad) {
            // dO is written directly in the all-to-all's send layout, [P, B, s, h, dv]: block j (rank j's heads) is
            // the dgrad through w_o's columns of those heads, so no pack runs between the dgrad and the launch.
            // Scattering dim 0 sends each block as it is; gathering the tokens (dim 2) receives in place when B == 1.
            const auto P = even ? static_cast<std::int64_t>(mesh_->size()) : std::int64_t(1), h = H / P;
            if (blocks.data() == nullptr)
              blocks = tensor5(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::dO blocks"), P, B, s, h, dv);
            detail::ComputePhase<ExecSpace> phase(space, names::w_o_dgrad);
            for (std::int64_t j = 0; j < P; ++j) {
              const auto columns =
                  std::make_pair(static_cast<std::size_t>(j * h * dv), static_cast<std::size_t>((j + 1) * h * dv));
              detail::linear_dgrad(space, dy2, Kokkos::subview(w_o_, Kokkos::ALL(), columns), T(0),
                                   detail::Matrix<T, memory_space, detail::Unmanaged>(
                                       blocks.data() + j * B * s * h * dv, static_cast<std::size_t>(B * s),
                                       static_cast<std::size_t>(h * dv)));
            }
          } else if (step == detail::timeline::Step::w_o_wgrad) {
            if (dw_o.data() != nullptr) {
              detail::ComputePhase<ExecSpace> phase(space, names::w_o_wgrad);
              detail::linear_wgrad(space, dy2, detail::as_matrix(local_output_, B * s, H * dv), dw_o);
            }
            if (db_o.data() != nullptr) {
              detail::ComputePhase<ExecSpace> phase(space, names::b_o_grad);
              detail::bias_grad(space, dy2, db_o);
            }
          }
        },
        [&](detail::timeline::Comm, int) {
          grad_a2a =
              seq_ == nullptr ? launch_all_to_all(space, blocks, 2, 0, *mesh_, names::do_a2a, received, codec)
              : even ? launch_all_to_all(space, blocks, 2, 0, *seq_, Partition(mesh_->size(), mesh_->size()), *mesh_,
                                         names::do_a2a, received, codec)
                     : launch_all_to_all(space, blocks, 2, 3, *seq_, *heads_, *mesh_, names::do_a2a, received, codec);
        },
        [&](detail::timeline::Comm, int) { result = grad_a2a.wait(); });
    detail::timeline::output_backward(steps,
                                      detail::timeline::part_facts(mesh_->size(), overlap, needs_attention_grad));
    local_output_ = tensor4();  // released: the saved operand is not needed any more
    // Not needed: empty. (A needed result of no element, on a rank with no head, keeps its shape [B, S, 0, dv].)
    if (!needs_attention_grad) return tensor4();
    return Kokkos::subview(result, 0, Kokkos::ALL(), Kokkos::ALL(), Kokkos::ALL(), Kokkos::ALL());  // [B, S, h, dv]
  }

 private:
  tensor4 local_output_;
  matrix w_o_;
  const Mesh* mesh_ = nullptr;
  const Partition* seq_ = nullptr;
  const Partition* heads_ = nullptr;
  bool forwarded_ = false;
  bool backwarded_ = false;
};

}  // namespace mlacp
