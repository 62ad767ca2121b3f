// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// How a global extent (tokens, heads) is split over the ranks of a mesh: the argument of the uneven (v) collectives.
#pragma once

#include <mlacp/error.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace mlacp {

/// A split of a global extent of `total()` indices over `parts()` ranks, in rank order and contiguous: rank r holds
/// the indices offset(r) .. offset(r) + count(r) - 1. A count may be 0 (a rank that holds no token or no head).
/// Host-side value type; every rank of a collective passes the same Partition (checked mode verifies it).
class Partition {
 public:
  /// The even rule: with total = q * parts + m (0 <= m < parts), the first m ranks hold ceil(total / parts) = q + 1
  /// indices and the others floor(total / parts) = q. Throws InvalidArgument on parts < 1 or total < 0.
  Partition(std::int64_t total, int parts) {
    if (parts < 1)
      throw InvalidArgument("mlacp::Partition: parts = " + std::to_string(parts) + "; expected parts >= 1");
    if (total < 0)
      throw InvalidArgument("mlacp::Partition: total = " + std::to_string(total) + "; expected total >= 0");
    const std::int64_t q = total / parts, m = total % parts;
    counts_.resize(static_cast<std::size_t>(parts));
    for (int r = 0; r < parts; ++r) counts_[static_cast<std::size_t>(r)] = q + (r < m ? 1 : 0);
    fill_offsets();
  }

  /// Any split: rank r holds counts[r] indices. Throws InvalidArgument on an empty list or a negative count.
  static Partition from_counts(std::vector<std::int64_t> counts) {
    if (counts.empty())
      throw InvalidArgument("mlacp::Partition::from_counts: no counts; expected one count per rank (parts >= 1)");
    for (std::size_t r = 0; r < counts.size(); ++r)
      if (counts[r] < 0)
        throw InvalidArgument("mlacp::Partition::from_counts: count(" + std::to_string(r) + ") = " +
                              std::to_string(counts[r]) + " in " + to_string(counts) + "; expected counts >= 0");
    std::int64_t sum = 0;
    for (const auto c : counts) {
      if (c > std::numeric_limits<std::int64_t>::max() - sum)
        throw InvalidArgument("mlacp::Partition::from_counts: the counts " + to_string(counts) +
                              " sum beyond the int64 range; expected a representable total");
      sum += c;
    }
    return Partition(std::move(counts));
  }

  int parts() const noexcept { return static_cast<int>(counts_.size()); }
  std::int64_t total() const noexcept { return offsets_.back(); }
  /// Indices held by rank r (0 <= r < parts()).
  std::int64_t count(int r) const { return counts_.at(static_cast<std::size_t>(r)); }
  /// The first index held by rank r: the sum of the counts of the ranks before it (0 <= r <= parts(); offset(parts())
  /// is total()).
  std::int64_t offset(int r) const { return offsets_.at(static_cast<std::size_t>(r)); }
  const std::vector<std::int64_t>& counts() const noexcept { return counts_; }
  /// Whether every rank holds the same count.
  bool uniform() const noexcept {
    for (const auto c : counts_)
      if (c != counts_.front()) return false;
    return true;
  }

  bool operator==(const Partition& other) const noexcept { return counts_ == other.counts_; }
  bool operator!=(const Partition& other) const noexcept { return !(*this == other); }

  /// "{3, 3, 2}": the counts, for messages.
  std::string str() const { return to_string(counts_); }

 private:
  explicit Partition(std::vector<std::int64_t> counts) : counts_(std::move(counts)) { fill_offsets(); }

  void fill_offsets() {
    offsets_.assign(counts_.size() + 1, 0);
    for (std::size_t r = 0; r < counts_.size(); ++r) offsets_[r + 1] = offsets_[r] + counts_[r];
  }

  static std::string to_string(const std::vector<std::int64_t>& counts) {
    std::ostringstream out;
    out << '{';
    for (std::size_t r = 0; r < counts.size(); ++r) out << (r ? ", " : "") << counts[r];
    out << '}';
    return out.str();
  }

  std::vector<std::int64_t> counts_;
  std::vector<std::int64_t> offsets_;  ///< parts() + 1 prefix sums
};

}  // namespace mlacp
