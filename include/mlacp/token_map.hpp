// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Which global tokens each rank of a two-level mesh (issue 21: U x C ranks) holds, and the copies between a global
// tensor and a rank's local one. x, dy, y and dx follow the map; RoPE positions and documents stay global.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/partition.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mlacp {

class Mesh;
class DocumentLayout;

/// Global tokens [begin, begin + count).
struct TokenRange {
  std::int64_t begin = 0;
  std::int64_t count = 0;
  std::int64_t end() const noexcept { return begin + count; }
  bool operator==(const TokenRange& o) const noexcept { return begin == o.begin && count == o.count; }
  bool operator!=(const TokenRange& o) const noexcept { return !(*this == o); }
};

/// Where a global token lives: rank (g, u) (Ulysses group g = ring rank, Ulysses rank u) at local index `index`.
struct TokenOwner {
  int g = 0;
  int u = 0;
  std::int64_t index = 0;
};

/// Which global tokens each rank of a U x C mesh holds.
///
/// The S tokens are split into C ring chunks; chunk g is what Ulysses group g holds together.
///  * contiguous: chunk g = part g of Partition(S, C).
///  * zigzag: the S tokens in 2C parts by Partition(S, 2C); chunk g = parts g and 2C-1-g (in that order, ascending
///    positions; the two parts of chunk C-1 are adjacent and form one range).
/// Rank (g, u) holds the chunk-local tokens of part u of Partition(chunk_size(g), U), mapped to global positions
/// through the chunk's ranges in order (so one or two ranges). With C = 1 (either layout) rank u holds part u of
/// Partition(S, U): today's flat Ulysses. Empty ranges are omitted, adjacent ones merged. Every global token is held
/// by exactly one rank, and a rank's local tokens are its ranges' tokens in ascending global order.
///
/// A host-side value: everything is computed at construction; the accessors allocate nothing.
class TokenMap {
 public:
  /// Throws InvalidArgument on seq < 0, ulysses_size < 1 or ring_size < 1 (naming the value).
  TokenMap(std::int64_t seq, int ulysses_size, int ring_size, RingLayout layout);
  /// U and C from the mesh (ulysses_size(), ring_size()).
  static TokenMap of(const Mesh& mesh, std::int64_t seq, RingLayout layout);

  std::int64_t seq() const noexcept { return seq_; }
  int ulysses_size() const noexcept { return ulysses_; }
  int ring_size() const noexcept { return ring_; }
  RingLayout layout() const noexcept { return layout_; }

  /// Chunk g's global ranges: ascending, empty ranges omitted, adjacent ones merged (at most 2).
  const std::vector<TokenRange>& chunk(int g) const { return chunks_[check_g("chunk", g)]; }
  std::int64_t chunk_size(int g) const { return chunk_parts_[check_g("chunk_size", g)].total(); }
  std::int64_t max_chunk_size() const noexcept { return max_chunk_; }
  /// Partition(chunk_size(g), U): how chunk g's tokens are split over its Ulysses group.
  const Partition& chunk_partition(int g) const { return chunk_parts_[check_g("chunk_partition", g)]; }
  /// Rank (g, u)'s global ranges: ascending, empty ranges omitted (none when it holds no token), at most 2.
  const std::vector<TokenRange>& ranges(int g, int u) const { return ranks_[check_gu("ranges", g, u)]; }
  /// Tokens held by rank (g, u).
  std::int64_t count(int g, int u) const {
    const std::size_t i = check_gu("count", g, u);
    return chunk_parts_[i / static_cast<std::size_t>(ulysses_)].count(u);
  }
  /// The largest count over the ranks (the local extent a buffer must have to hold any rank's tokens).
  std::int64_t max_count() const noexcept { return max_count_; }
  /// The global index of chunk g's chunk-local token t (0 <= t < chunk_size(g)).
  std::int64_t chunk_token(int g, std::int64_t t) const;
  /// The global index of rank (g, u)'s local token i (0 <= i < count(g, u)).
  std::int64_t global_token(int g, int u, std::int64_t i) const;
  /// Which rank holds global token t (0 <= t < seq()), and where in its local tokens.
  TokenOwner owner(std::int64_t t) const;

  /// "TokenMap(seq=16, ulysses=2, ring=2, zigzag)", for messages.
  std::string describe() const;

 private:
  std::size_t check_g(const char* who, int g) const;
  std::size_t check_gu(const char* who, int g, int u) const;

  std::int64_t seq_ = 0;
  int ulysses_ = 1;
  int ring_ = 1;
  RingLayout layout_ = RingLayout::zigzag;
  std::vector<std::vector<TokenRange>> chunks_;  // per chunk g
  std::vector<Partition> chunk_parts_;           // per chunk g: Partition(chunk_size(g), U)
  std::vector<std::vector<TokenRange>> ranks_;   // per rank g * U + u
  std::int64_t max_chunk_ = 0;
  std::int64_t max_count_ = 0;
};

/// The number of visible (query, key) pairs of chunk g's queries under causal attention (query t sees keys 0..t):
/// the sum over the chunk's tokens t of t + 1. The attention work of Ulysses group g on the ring, for balance reports.
std::int64_t causal_pairs(const TokenMap& map, int g);
/// The same with packed documents (query t sees keys start_of(t)..t: the sum of t - start_of(t) + 1). An empty
/// layout is one document; a non-empty one must cover map.seq() tokens (InvalidArgument otherwise).
std::int64_t causal_pairs(const TokenMap& map, int g, const DocumentLayout& documents);

namespace detail {

/// Checks that `global` has map.seq() rows and `local` count(g, u) rows in dim 1, and that the other extents agree.
template <class Global, class Local>
void check_shard_views(const char* who, const TokenMap& map, int g, int u, const Global& global, const Local& local) {
  static_assert(compat::view_rank_v<Global> == compat::view_rank_v<Local>,
                "mlacp::shard/unshard: the global and local Views must have one rank");
  static_assert(compat::view_rank_v<Global> >= 2 && compat::view_rank_v<Global> <= 4,
                "mlacp::shard/unshard: Views of rank 2 to 4 ([B, S, ...], tokens in dim 1)");
  static_assert(std::is_same<typename Global::memory_space, typename Local::memory_space>::value,
                "mlacp::shard/unshard: the global and local Views must be in the same memory space");
  const std::int64_t count = map.count(g, u);  // checks g and u
  auto fail = [&](const std::string& what) {
    throw InvalidArgument(std::string("mlacp::") + who + ": " + what + " (rank g = " + std::to_string(g) +
                          ", u = " + std::to_string(u) + " of " + map.describe() + ")");
  };
  if (static_cast<std::int64_t>(global.extent(1)) != map.seq())
    fail("global.extent(1) = " + std::to_string(global.extent(1)) + "; expected the sequence length " +
         std::to_string(map.seq()));
  if (static_cast<std::int64_t>(local.extent(1)) != count)
    fail("local.extent(1) = " + std::to_string(local.extent(1)) + "; expected the rank's token count " +
         std::to_string(count));
  for (unsigned d = 0; d < static_cast<unsigned>(compat::view_rank_v<Global>); ++d)
    if (d != 1 && global.extent(d) != local.extent(d))
      fail("local.extent(" + std::to_string(d) + ") = " + std::to_string(local.extent(d)) + "; expected global's " +
           std::to_string(global.extent(d)));
}

template <class View>
auto rows(const View& v, std::int64_t begin, std::int64_t count) {
  const auto rows = Kokkos::make_pair(static_cast<std::size_t>(begin), static_cast<std::size_t>(begin + count));
  if constexpr (compat::view_rank_v<View> == 2)
    return Kokkos::subview(v, Kokkos::ALL, rows);
  else if constexpr (compat::view_rank_v<View> == 3)
    return Kokkos::subview(v, Kokkos::ALL, rows, Kokkos::ALL);
  else
    return Kokkos::subview(v, Kokkos::ALL, rows, Kokkos::ALL, Kokkos::ALL);
}

}  // namespace detail

/// Copies rank (g, u)'s tokens of `global` [B, S, ...] (tokens in dim 1) into `local` [B, count(g, u), ...]: one
/// Kokkos::deep_copy of subviews on `space` per range (asynchronous on `space`; fence it before reading on another).
/// Views of rank 2 to 4 in one memory space. Throws InvalidArgument on g or u out of range and extents that do not
/// match.
template <class ExecSpace, class Global, class Local>
void shard(const ExecSpace& space, const TokenMap& map, int g, int u, const Global& global, const Local& local) {
  detail::check_shard_views("shard", map, g, u, global, local);
  std::int64_t at = 0;
  for (const TokenRange& r : map.ranges(g, u)) {
    Kokkos::deep_copy(space, detail::rows(local, at, r.count), detail::rows(global, r.begin, r.count));
    at += r.count;
  }
}

/// The inverse of shard: writes `local` [B, count(g, u), ...] into rank (g, u)'s tokens of `global` [B, S, ...] (the
/// other rows of `global` are left as they are).
template <class ExecSpace, class Local, class Global>
void unshard(const ExecSpace& space, const TokenMap& map, int g, int u, const Local& local, const Global& global) {
  detail::check_shard_views("unshard", map, g, u, global, local);
  std::int64_t at = 0;
  for (const TokenRange& r : map.ranges(g, u)) {
    Kokkos::deep_copy(space, detail::rows(global, r.begin, r.count), detail::rows(local, at, r.count));
    at += r.count;
  }
}

}  // namespace mlacp
