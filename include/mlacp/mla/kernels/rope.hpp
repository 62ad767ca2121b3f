// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Rotary position embedding (RoPE), rotate-half (GPT-NeoX) form, as docs/spec.md step 4:
//   inv_freq[j] = base^(-2j/width), j in [0, width/2);  angle = p * inv_freq[j];
//   cos/sin repeated to length width as [f, f];  rot(x) = x*cos + rotate_half(x)*sin,  rotate_half([x1, x2]) = [-x2,
//   x1]
// i.e. for each pair (x1 = x[j], x2 = x[j + width/2]):  x1' = x1*cos - x2*sin,  x2' = x2*cos + x1*sin.
// Angles are computed in double whatever the value type. The frequencies (the base, and YaRN's scaling with its factor
// on cos and sin) are a RopeFrequencies (rope_frequencies.hpp); a plain base converts to one.
//
// Rank-3 tensors `[B, s, d]` (the shared rope key of the latent payload) go through as_rank4() (view_utils.hpp).
//
// Positions: a rank's tokens are either at consecutive positions from an offset (one document: position = global token
// index), or at an explicit per-token table of positions (make_rope_positions: packed documents, where a position
// restarts at 0 at each document's start, and any split of S over the ranks).
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/mla/kernels/rope_frequencies.hpp>
#include <mlacp/mla/kernels/view_utils.hpp>
#include <mlacp/view_types.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace mlacp {
namespace detail {

template <class View4>
void rope_validate(const char* who, const View4& x, int first_column, int width) {
  static_assert(compat::view_rank_v<View4> == 4, "mlacp RoPE: expects a rank-4 View [B, s, n, d]");
  const std::string prefix = std::string("mlacp::") + who + ": ";
  if (width <= 0 || width % 2 != 0) {
    throw mlacp::InvalidArgument(prefix + named("width", width) + ", expected an even number > 0");
  }
  if (first_column < 0) {
    throw mlacp::InvalidArgument(prefix + named("first_column", first_column) + ", expected >= 0");
  }
  if (static_cast<std::int64_t>(first_column) + width > static_cast<std::int64_t>(x.extent(3))) {
    throw mlacp::InvalidArgument(prefix + named("first_column", first_column) + " + " + named("width", width) +
                                 " exceeds the last extent " + std::to_string(x.extent(3)) +
                                 ", expected first_column + width <= extent(3)");
  }
}

/// The cos/sin table of RoPE for a rank's tokens, row t for local token t: [tokens, width/2] each, in double whatever
/// the value type. Token t is at position position_offset + t (consecutive positions), or at positions(t) when the
/// table was built from an explicit positions View. The angles depend on the position and the frequency only, so a
/// layer whose token positions are fixed (a rank's shard) builds it once and every rotation reads it instead of
/// calling transcendental functions.
template <class MemSpace>
struct RopeTable {
  detail::Matrix<double, MemSpace> cos, sin;
  Kokkos::View<const std::int64_t*, MemSpace> positions;  // with explicit_positions: the positions of the rows
  bool explicit_positions = false;                        // false: consecutive positions from position_offset
  std::int64_t position_offset = 0;
  int width = 0;
  RopeFrequencies frequencies;

  /// True when built for `tokens` consecutive positions from `offset` with this width and these frequencies.
  bool matches(std::int64_t tokens, std::int64_t offset, int w, const RopeFrequencies& f) const {
    return cos.data() != nullptr && !explicit_positions && static_cast<std::int64_t>(cos.extent(0)) == tokens &&
           position_offset == offset && width == w && frequencies == f;
  }
  /// True when built from this positions View (the same allocation) with this width and these frequencies.
  template <class PositionsView>
  bool matches(const PositionsView& p, int w, const RopeFrequencies& f) const {
    return explicit_positions && positions.data() == p.data() && positions.extent(0) == p.extent(0) && width == w &&
           frequencies == f;
  }
};

/// Fills table.cos / table.sin: row t at position `positions(t)` when `explicit_positions`, else at
/// table.position_offset + t.
template <class ExecSpace, class MemSpace>
void rope_fill_table(const ExecSpace& space, const RopeTable<MemSpace>& table,
                     const Kokkos::View<const std::int64_t*, MemSpace>& positions, bool explicit_positions) {
  const auto cos_table = table.cos;
  const auto sin_table = table.sin;
  const std::int64_t half = table.width / 2, position_offset = table.position_offset;
  const double width_double = static_cast<double>(table.width), base = table.frequencies.base;
  // YaRN (rope_frequencies.hpp): the ramp's bounds once here; with factor 1 the plain frequencies, bit for bit.
  const bool yarn = table.frequencies.yarn();
  const YarnRamp ramp = yarn ? yarn_ramp(table.frequencies, table.width) : YarnRamp{};
  const double factor = table.frequencies.factor, amplitude = table.frequencies.attention_factor;
  Kokkos::parallel_for(
      "mlacp::rope_table",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0,
                                                                      static_cast<std::int64_t>(cos_table.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t t) {
        const double position = static_cast<double>(explicit_positions ? positions(t) : position_offset + t);
        for (std::int64_t j = 0; j < half; ++j) {
          double inv_freq = compat::math::pow(base, -2.0 * static_cast<double>(j) / width_double);
          if (yarn) {
            double r = (static_cast<double>(j) - ramp.lo) / (ramp.hi - ramp.lo);
            r = r < 0 ? 0.0 : (r > 1 ? 1.0 : r);
            inv_freq = inv_freq / factor * r + inv_freq * (1 - r);
          }
          const double angle = position * inv_freq;
          cos_table(t, j) = amplitude * compat::math::cos(angle);
          sin_table(t, j) = amplitude * compat::math::sin(angle);
        }
      });
}

/// A table of `tokens` rows for this width and these frequencies, allocated and not yet filled (the two make_rope_table
/// forms).
template <class MemSpace>
RopeTable<MemSpace> allocate_rope_table(std::int64_t tokens, int width, const RopeFrequencies& frequencies) {
  RopeTable<MemSpace> table;
  const std::int64_t half = width / 2;
  table.cos = decltype(table.cos)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::rope cos"), tokens, half);
  table.sin = decltype(table.sin)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::rope sin"), tokens, half);
  table.width = width;
  table.frequencies = frequencies;
  return table;
}

/// Builds (allocates and fills, asynchronously on `space`) the table of `positions` positions from `position_offset`.
template <class ExecSpace>
RopeTable<typename ExecSpace::memory_space> make_rope_table(const ExecSpace& space, std::int64_t positions,
                                                            std::int64_t position_offset, int width,
                                                            const RopeFrequencies& frequencies) {
  auto table = allocate_rope_table<typename ExecSpace::memory_space>(positions, width, frequencies);
  table.position_offset = position_offset;
  rope_fill_table(space, table, Kokkos::View<const std::int64_t*, typename ExecSpace::memory_space>(), false);
  return table;
}

/// Points `table` (allocated for positions.extent(0) rows, e.g. by allocate_rope_table) at the explicit positions
/// `positions` and fills it asynchronously on `space`: make_rope_table's positions form without the allocation, for a
/// table rebuilt in place when the positions change (the table keeps a reference to `positions`).
template <class ExecSpace, class MemSpace>
void refill_rope_table(const ExecSpace& space, RopeTable<MemSpace>& table,
                       const decltype(RopeTable<MemSpace>::positions)& positions) {
  table.positions = positions;
  table.explicit_positions = true;
  rope_fill_table(space, table, table.positions, true);
}

/// Builds the table of the rank-local tokens at the explicit positions `positions` [tokens] (make_rope_positions),
/// asynchronously on `space`; the table keeps a reference to `positions`.
template <class ExecSpace, class PositionsView, std::enable_if_t<Kokkos::is_view<PositionsView>::value, int> = 0>
RopeTable<typename ExecSpace::memory_space> make_rope_table(const ExecSpace& space, const PositionsView& positions,
                                                            int width, const RopeFrequencies& frequencies) {
  static_assert(compat::view_rank_v<PositionsView> == 1, "mlacp RoPE: positions must be a rank-1 View [tokens]");
  static_assert(std::is_same_v<typename PositionsView::non_const_value_type, std::int64_t>,
                "mlacp RoPE: positions must hold std::int64_t");
  auto table = allocate_rope_table<typename ExecSpace::memory_space>(static_cast<std::int64_t>(positions.extent(0)),
                                                                     width, frequencies);
  refill_rope_table(space, table, positions);
  return table;
}

/// Rotates columns [src_first, src_first + width) of every (b, t, n) row of the contiguous LayoutRight rank-4 `src`
/// [B, s, n, d] into columns [dst_first, dst_first + width) of `dst` [B, s, n, d'] (may be `src`: in place), row t at
/// table position t. sin_sign = +1: the rotation; -1: its transpose (= inverse). One work item per row; the inner loop
/// runs over the contiguous pairs with the row's table entries (no divide, no transcendental call per element).
template <class ExecSpace, class Src, class Dst, class MemSpace>
void rope_rotate(const ExecSpace& space, const Src& src, int src_first, const Dst& dst, int dst_first,
                 const RopeTable<MemSpace>& table, double sin_sign) {
  static_assert_accessible<ExecSpace, Src>();
  static_assert_accessible<ExecSpace, Dst>();
  using value_type = typename Dst::non_const_value_type;
  const std::int64_t n_s = static_cast<std::int64_t>(src.extent(1)), n_h = static_cast<std::int64_t>(src.extent(2));
  const std::int64_t rows = static_cast<std::int64_t>(src.extent(0)) * n_s * n_h;
  const std::int64_t half = table.width / 2;
  if (rows == 0 || half == 0) return;
  const std::int64_t src_width = static_cast<std::int64_t>(src.extent(3)),
                     dst_width = static_cast<std::int64_t>(dst.extent(3));
  const auto* from = src.data() + src_first;
  value_type* to = dst.data() + dst_first;
  const double* cos_data = table.cos.data();
  const double* sin_data = table.sin.data();
  Kokkos::parallel_for(
      "mlacp::rope", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t t = (row / n_h) % n_s;
        const double* c = cos_data + t * half;
        const double* s = sin_data + t * half;
        const auto* x = from + row * src_width;
        value_type* y = to + row * dst_width;
        for (std::int64_t j = 0; j < half; ++j) {
          const double x1 = static_cast<double>(x[j]), x2 = static_cast<double>(x[j + half]);
          const double sn = sin_sign * s[j];
          y[j] = static_cast<value_type>(x1 * c[j] - x2 * sn);
          y[j + half] = static_cast<value_type>(x2 * c[j] + x1 * sn);
        }
      });
}

template <class View4>
void rope_check_contiguous(const char* who, const View4& x) {
  static_assert(std::is_same_v<typename View4::array_layout, Kokkos::LayoutRight>,
                "mlacp RoPE: expects a LayoutRight View");
  if (x.size() != 0 && !x.span_is_contiguous())
    throw mlacp::InvalidArgument(std::string("mlacp::") + who + ": the View (label '" + x.label() +
                                 "') is not contiguous; expected a contiguous LayoutRight View");
}

template <class View4, class MemSpace>
void rope_check_table(const char* who, const View4& x, const RopeTable<MemSpace>& table) {
  if (x.extent(1) > table.cos.extent(0))
    throw mlacp::InvalidArgument(std::string("mlacp::") + who + ": " + std::to_string(x.extent(1)) +
                                 " tokens, the RoPE table has " + std::to_string(table.cos.extent(0)) +
                                 "; expected at most the table's tokens");
}

template <class View4, class PositionsView>
void rope_check_positions(const char* who, const View4& x, const PositionsView& positions) {
  if (positions.extent(0) != x.extent(1))
    throw mlacp::InvalidArgument(std::string("mlacp::") + who + ": positions has " +
                                 std::to_string(positions.extent(0)) + " entries, expected one per token (" +
                                 std::to_string(x.extent(1)) + ")");
}

// The bodies of rope_forward (sin_sign = +1, who = "rope_forward") and rope_backward (-1, "rope_backward"), one per
// form: consecutive positions from an offset, explicit positions, a prebuilt table.
template <class ExecSpace, class View4>
void rope_at_offset(const char* who, double sin_sign, const ExecSpace& space, const View4& x, int first_column,
                    int width, std::int64_t position_offset, const RopeFrequencies& frequencies) {
  rope_validate(who, x, first_column, width);
  rope_check_contiguous(who, x);
  const auto table =
      make_rope_table(space, static_cast<std::int64_t>(x.extent(1)), position_offset, width, frequencies);
  rope_rotate(space, x, first_column, x, first_column, table, sin_sign);
}

template <class ExecSpace, class View4, class PositionsView>
void rope_at_positions(const char* who, double sin_sign, const ExecSpace& space, const View4& x, int first_column,
                       int width, const PositionsView& positions, const RopeFrequencies& frequencies) {
  rope_validate(who, x, first_column, width);
  rope_check_contiguous(who, x);
  rope_check_positions(who, x, positions);
  rope_rotate(space, x, first_column, x, first_column, make_rope_table(space, positions, width, frequencies), sin_sign);
}

template <class ExecSpace, class Src, class Dst, class MemSpace>
void rope_with_table(const char* who, double sin_sign, const ExecSpace& space, const Src& src, int src_first,
                     const Dst& dst, int dst_first, const RopeTable<MemSpace>& table) {
  rope_validate(who, src, src_first, table.width);
  rope_validate(who, dst, dst_first, table.width);
  rope_check_table(who, src, table);
  rope_rotate(space, src, src_first, dst, dst_first, table, sin_sign);
}

}  // namespace detail

/// Rotates, in place, columns [first_column, first_column + width) of every (b, t, n) row of the rank-4 View
/// x `[B, s, n, d]`, row t being at global position position_offset + t. Throws mlacp::InvalidArgument unless width is
/// even and > 0, first_column >= 0 and first_column + width <= x.extent(3). Asynchronous on `space`. Builds its cos/sin
/// table per call; code that rotates the same positions repeatedly builds a RopeTable once (make_rope_table) and
/// passes it instead.
template <class ExecSpace, class View4>
void rope_forward(const ExecSpace& space, const View4& x, int first_column, int width, std::int64_t position_offset,
                  const RopeFrequencies& frequencies = RopeFrequencies()) {
  detail::rope_at_offset("rope_forward", 1.0, space, x, first_column, width, position_offset, frequencies);
}

/// The transpose (= inverse) of rope_forward, in place: maps the gradient with respect to the rotated values to the
/// gradient with respect to the unrotated ones. Same arguments and checks as rope_forward.
template <class ExecSpace, class View4>
void rope_backward(const ExecSpace& space, const View4& x, int first_column, int width, std::int64_t position_offset,
                   const RopeFrequencies& frequencies = RopeFrequencies()) {
  detail::rope_at_offset("rope_backward", -1.0, space, x, first_column, width, position_offset, frequencies);
}

namespace detail {
/// make_rope_positions' checks: "" or the message naming the bad argument.
inline std::string rope_positions_error(std::int64_t global_offset, std::int64_t local_count,
                                        const DocumentLayout& documents) {
  const std::string who = "mlacp::make_rope_positions: ";
  if (global_offset < 0) return who + named("global_offset", global_offset) + ", expected >= 0";
  if (local_count < 0) return who + named("local_count", local_count) + ", expected >= 0";
  if (!documents.empty() && global_offset + local_count > documents.total())
    return who + named("global_offset", global_offset) + " + " + named("local_count", local_count) +
           " exceeds the document layout's S = " + std::to_string(documents.total()) +
           ", expected the rank's tokens inside the packed sequence";
  return "";
}
}  // namespace detail

/// make_rope_positions (below) into a View the caller owns (`positions` [local_count], e.g. reused when the layout
/// changes): the same positions, checks and messages, no allocation.
template <class ExecSpace>
void fill_rope_positions(const ExecSpace& space,
                         const Kokkos::View<std::int64_t*, typename ExecSpace::memory_space>& positions,
                         std::int64_t global_offset, const DocumentLayout& documents = DocumentLayout()) {
  const auto local_count = static_cast<std::int64_t>(positions.extent(0));
  const std::string error = detail::rope_positions_error(global_offset, local_count, documents);
  if (!error.empty()) throw InvalidArgument(error);
  const std::int64_t total = documents.empty() ? global_offset + local_count : documents.total();
  const auto docs = documents.offsets_for<ExecSpace>(total, "make_rope_positions");
  Kokkos::parallel_for(
      "mlacp::rope_positions", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, local_count),
      KOKKOS_LAMBDA(const std::int64_t t) {
        const std::int64_t g = global_offset + t;
        positions(t) = g - docs.start_of(g);
      });
}

/// The RoPE positions of a rank's `local_count` tokens, global tokens [global_offset, global_offset + local_count) of a
/// packed sequence: position(t) = g - documents.start_of(g) for g = global_offset + t, i.e. the position within the
/// token's document (restarting at 0 at each document's start); with the empty layout, the global token index g.
/// global_offset is the rank's first global token (for any split of S over the ranks, even or not). Returns a
/// [local_count] View in ExecSpace's memory, filled asynchronously on `space`; built once per (layout, split, rank)
/// and passed to make_rope_table. Throws mlacp::InvalidArgument unless global_offset >= 0, local_count >= 0 and, for a
/// non-empty layout, global_offset + local_count <= its S.
template <class ExecSpace>
Kokkos::View<std::int64_t*, typename ExecSpace::memory_space> make_rope_positions(
    const ExecSpace& space, std::int64_t global_offset, std::int64_t local_count,
    const DocumentLayout& documents = DocumentLayout()) {
  const std::string error = detail::rope_positions_error(global_offset, local_count, documents);
  if (!error.empty()) throw InvalidArgument(error);
  Kokkos::View<std::int64_t*, typename ExecSpace::memory_space> positions(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::rope positions"), local_count);
  fill_rope_positions(space, positions, global_offset, documents);
  return positions;
}

/// rope_forward / rope_backward at explicit positions: row t of x `[B, s, n, d]` at position positions(t) (a [s] View
/// of std::int64_t, e.g. from make_rope_positions). Same checks as the offset form, and positions.extent(0) == s.
/// Builds its table per call; repeated rotations build it once (make_rope_table with the positions).
template <class ExecSpace, class View4, class PositionsView,
          std::enable_if_t<Kokkos::is_view<PositionsView>::value, int> = 0>
void rope_forward(const ExecSpace& space, const View4& x, int first_column, int width, const PositionsView& positions,
                  const RopeFrequencies& frequencies = RopeFrequencies()) {
  detail::rope_at_positions("rope_forward", 1.0, space, x, first_column, width, positions, frequencies);
}

template <class ExecSpace, class View4, class PositionsView,
          std::enable_if_t<Kokkos::is_view<PositionsView>::value, int> = 0>
void rope_backward(const ExecSpace& space, const View4& x, int first_column, int width, const PositionsView& positions,
                   const RopeFrequencies& frequencies = RopeFrequencies()) {
  detail::rope_at_positions("rope_backward", -1.0, space, x, first_column, width, positions, frequencies);
}

/// rope_forward with a prebuilt table (table.width columns rotated; x.extent(1) <= the table's positions), from
/// columns [src_first, ...) of `src` into columns [dst_first, ...) of `dst` (`dst` may be `src`). Both contiguous
/// LayoutRight [B, s, n, d] / [B, s, n, d'], same B, s, n. Asynchronous on `space`.
template <class ExecSpace, class Src, class Dst, class MemSpace>
void rope_forward(const ExecSpace& space, const Src& src, int src_first, const Dst& dst, int dst_first,
                  const detail::RopeTable<MemSpace>& table) {
  detail::rope_with_table("rope_forward", 1.0, space, src, src_first, dst, dst_first, table);
}

/// The transpose of the table rope_forward (same arguments).
template <class ExecSpace, class Src, class Dst, class MemSpace>
void rope_backward(const ExecSpace& space, const Src& src, int src_first, const Dst& dst, int dst_first,
                   const detail::RopeTable<MemSpace>& table) {
  detail::rope_with_table("rope_backward", -1.0, space, src, src_first, dst, dst_first, table);
}

}  // namespace mlacp
