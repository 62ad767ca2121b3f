// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The global token positions of the rows of a block of queries or keys (ring attention, issue 21): at most two
// ascending, non-overlapping segments [begin, begin + count) concatenated in row order. A contiguous ring chunk is one
// segment, a zigzag chunk (parts g and 2C-1-g of the sequence) two. Plain data, copied into kernels by value.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/error.hpp>

#include <cstdint>
#include <string>

namespace mlacp {

struct TokenSegments {
  static constexpr int max_segments = 2;

  std::int64_t begin_[max_segments] = {0, 0};
  std::int64_t count_[max_segments] = {0, 0};
  int segments_ = 0;

  /// One segment [begin, begin + count) (none when count is 0).
  static TokenSegments contiguous(std::int64_t begin, std::int64_t count) {
    TokenSegments s;
    s.add(begin, count);
    return s;
  }

  /// Appends the segment [begin, begin + count) after the others: dropped when empty; InvalidArgument when count or
  /// begin is negative, when it starts before the end of the previous segment, or when it would be a third one.
  TokenSegments& add(std::int64_t begin, std::int64_t count) {
    const std::string what = "mlacp::TokenSegments::add(" + std::to_string(begin) + ", " + std::to_string(count) + ")";
    if (count < 0 || begin < 0) throw InvalidArgument(what + ": expected begin >= 0 and count >= 0");
    if (count == 0) return *this;
    if (segments_ > 0 && begin < end(segments_ - 1))
      throw InvalidArgument(what + ": the segment starts before the end of the previous one (" +
                            std::to_string(end(segments_ - 1)) + "); expected ascending, non-overlapping segments");
    if (segments_ == max_segments)
      throw InvalidArgument(what + ": a third non-empty segment; expected at most " + std::to_string(max_segments));
    begin_[segments_] = begin;
    count_[segments_] = count;
    ++segments_;
    return *this;
  }

  /// Number of (non-empty) segments.
  KOKKOS_INLINE_FUNCTION int segments() const { return segments_; }
  KOKKOS_INLINE_FUNCTION std::int64_t begin(int i) const { return begin_[i]; }
  KOKKOS_INLINE_FUNCTION std::int64_t count(int i) const { return count_[i]; }
  /// One past the last position of segment i.
  KOKKOS_INLINE_FUNCTION std::int64_t end(int i) const { return begin_[i] + count_[i]; }
  /// The first row of segment i.
  KOKKOS_INLINE_FUNCTION std::int64_t row_of_segment(int i) const { return i == 0 ? 0 : count_[0]; }
  /// Number of rows (tokens).
  KOKKOS_INLINE_FUNCTION std::int64_t rows() const {
    return (segments_ > 0 ? count_[0] : 0) + (segments_ > 1 ? count_[1] : 0);
  }
  /// The global position of row `row` (0 <= row < rows()).
  KOKKOS_INLINE_FUNCTION std::int64_t position(std::int64_t row) const {
    return row < count_[0] ? begin_[0] + row : begin_[1] + (row - count_[0]);
  }
  /// One past the last position (0 when empty).
  KOKKOS_INLINE_FUNCTION std::int64_t last_end() const { return segments_ > 0 ? end(segments_ - 1) : 0; }
};

}  // namespace mlacp
