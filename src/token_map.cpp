// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// TokenMap: the formulas of the ring layouts (token_map.hpp), computed once at construction.
#include <mlacp/mesh.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/token_map.hpp>

#include <algorithm>
#include <limits>

namespace mlacp {

namespace {

// Appends [begin, begin + count) to `ranges`: empty ranges omitted, a range adjacent to the last one merged into it.
void append(std::vector<TokenRange>& ranges, std::int64_t begin, std::int64_t count) {
  if (count == 0) return;
  if (!ranges.empty() && ranges.back().end() == begin)
    ranges.back().count += count;
  else
    ranges.push_back({begin, count});
}

// The sum of k for k = first .. last (0 when last < first).
std::int64_t sum_between(std::int64_t first, std::int64_t last) {
  if (last < first) return 0;
  return (first + last) * (last - first + 1) / 2;
}

}  // namespace

TokenMap::TokenMap(std::int64_t seq, int ulysses_size, int ring_size, RingLayout layout)
    : seq_(seq), ulysses_(ulysses_size), ring_(ring_size), layout_(layout) {
  if (seq < 0) throw InvalidArgument("mlacp::TokenMap: seq = " + std::to_string(seq) + "; expected seq >= 0");
  if (ulysses_size < 1)
    throw InvalidArgument("mlacp::TokenMap: ulysses_size = " + std::to_string(ulysses_size) +
                          "; expected ulysses_size >= 1 (U, the ranks of a Ulysses group)");
  if (ring_size < 1 || ring_size > std::numeric_limits<int>::max() / 2)
    throw InvalidArgument("mlacp::TokenMap: ring_size = " + std::to_string(ring_size) +
                          "; expected ring_size >= 1 (C, the Ulysses groups of the ring)");
  if (layout != RingLayout::contiguous && layout != RingLayout::zigzag)
    throw InvalidArgument("mlacp::TokenMap: layout = " + std::to_string(static_cast<int>(layout)) +
                          "; expected RingLayout::contiguous or RingLayout::zigzag");

  const auto C = static_cast<std::size_t>(ring_size);
  chunks_.resize(C);
  if (layout == RingLayout::contiguous) {
    const Partition parts(seq, ring_size);
    for (int g = 0; g < ring_size; ++g) append(chunks_[static_cast<std::size_t>(g)], parts.offset(g), parts.count(g));
  } else {
    const Partition parts(seq, 2 * ring_size);
    for (int g = 0; g < ring_size; ++g) {
      const int mirror = 2 * ring_size - 1 - g;
      append(chunks_[static_cast<std::size_t>(g)], parts.offset(g), parts.count(g));
      append(chunks_[static_cast<std::size_t>(g)], parts.offset(mirror), parts.count(mirror));
    }
  }

  chunk_parts_.reserve(C);
  ranks_.resize(C * static_cast<std::size_t>(ulysses_size));
  for (std::size_t g = 0; g < C; ++g) {
    std::int64_t size = 0;
    for (const TokenRange& r : chunks_[g]) size += r.count;
    chunk_parts_.emplace_back(size, ulysses_size);
    max_chunk_ = std::max(max_chunk_, size);
    const Partition& part = chunk_parts_.back();
    for (int u = 0; u < ulysses_size; ++u) {
      // Chunk-local [lo, hi) through the chunk's ranges, in order.
      const std::int64_t lo = part.offset(u), hi = lo + part.count(u);
      max_count_ = std::max(max_count_, hi - lo);
      auto& mine = ranks_[g * static_cast<std::size_t>(ulysses_size) + static_cast<std::size_t>(u)];
      std::int64_t at = 0;  // chunk-local index of the current range's first token
      for (const TokenRange& r : chunks_[g]) {
        const std::int64_t a = std::max(lo, at), b = std::min(hi, at + r.count);
        if (a < b) append(mine, r.begin + (a - at), b - a);
        at += r.count;
      }
    }
  }
}

TokenMap TokenMap::of(const Mesh& mesh, std::int64_t seq, RingLayout layout) {
  return TokenMap(seq, mesh.ulysses_size(), mesh.ring_size(), layout);
}

std::size_t TokenMap::check_g(const char* who, int g) const {
  if (g < 0 || g >= ring_)
    throw InvalidArgument(std::string("mlacp::TokenMap::") + who + ": g = " + std::to_string(g) +
                          "; expected 0 <= g < " + std::to_string(ring_) + " (the ring size C of " + describe() + ")");
  return static_cast<std::size_t>(g);
}

std::size_t TokenMap::check_gu(const char* who, int g, int u) const {
  const std::size_t i = check_g(who, g);
  if (u < 0 || u >= ulysses_)
    throw InvalidArgument(std::string("mlacp::TokenMap::") + who + ": u = " + std::to_string(u) +
                          "; expected 0 <= u < " + std::to_string(ulysses_) + " (the Ulysses size U of " + describe() +
                          ")");
  return i * static_cast<std::size_t>(ulysses_) + static_cast<std::size_t>(u);
}

std::int64_t TokenMap::chunk_token(int g, std::int64_t t) const {
  const std::size_t i = check_g("chunk_token", g);
  std::int64_t rest = t;
  if (t >= 0)
    for (const TokenRange& r : chunks_[i]) {
      if (rest < r.count) return r.begin + rest;
      rest -= r.count;
    }
  throw InvalidArgument("mlacp::TokenMap::chunk_token: t = " + std::to_string(t) + "; expected 0 <= t < " +
                        std::to_string(chunk_parts_[i].total()) + " (the size of chunk " + std::to_string(g) + " of " +
                        describe() + ")");
}

std::int64_t TokenMap::global_token(int g, int u, std::int64_t i) const {
  const std::size_t k = check_gu("global_token", g, u);
  std::int64_t rest = i;
  if (i >= 0)
    for (const TokenRange& r : ranks_[k]) {
      if (rest < r.count) return r.begin + rest;
      rest -= r.count;
    }
  throw InvalidArgument("mlacp::TokenMap::global_token: i = " + std::to_string(i) + "; expected 0 <= i < " +
                        std::to_string(count(g, u)) + " (the tokens of rank g = " + std::to_string(g) +
                        ", u = " + std::to_string(u) + " of " + describe() + ")");
}

TokenOwner TokenMap::owner(std::int64_t t) const {
  if (t < 0 || t >= seq_)
    throw InvalidArgument("mlacp::TokenMap::owner: t = " + std::to_string(t) + "; expected 0 <= t < " +
                          std::to_string(seq_) + " (the sequence length of " + describe() + ")");
  for (int g = 0; g < ring_; ++g) {
    std::int64_t local = 0;  // chunk-local index of the current range's first token
    for (const TokenRange& r : chunks_[static_cast<std::size_t>(g)]) {
      if (t >= r.begin && t < r.end()) {
        const std::int64_t c = local + (t - r.begin);
        const Partition& part = chunk_parts_[static_cast<std::size_t>(g)];
        // The even rule: the first m parts hold q + 1 tokens, the others q (and c < total, so q > 0 past them).
        const std::int64_t q = part.total() / ulysses_, m = part.total() % ulysses_;
        const auto u = static_cast<int>(c < m * (q + 1) ? c / (q + 1) : m + (c - m * (q + 1)) / q);
        return {g, u, c - part.offset(u)};
      }
      local += r.count;
    }
  }
  throw InvalidArgument("mlacp::TokenMap::owner: no rank holds token " + std::to_string(t));  // unreachable
}

std::string TokenMap::describe() const {
  return "TokenMap(seq=" + std::to_string(seq_) + ", ulysses=" + std::to_string(ulysses_) +
         ", ring=" + std::to_string(ring_) + ", " + to_string(layout_) + ")";
}

std::int64_t causal_pairs(const TokenMap& map, int g) {
  std::int64_t pairs = 0;
  for (const TokenRange& r : map.chunk(g)) pairs += sum_between(r.begin + 1, r.end());
  return pairs;
}

std::int64_t causal_pairs(const TokenMap& map, int g, const DocumentLayout& documents) {
  if (documents.empty()) return causal_pairs(map, g);
  if (documents.total() != map.seq())
    throw InvalidArgument("mlacp::causal_pairs: the documents cover " + std::to_string(documents.total()) +
                          " tokens; expected the sequence length " + std::to_string(map.seq()) + " of " +
                          map.describe());
  const std::vector<std::int64_t>& c = documents.cu_seqlens();
  std::int64_t pairs = 0;
  for (const TokenRange& r : map.chunk(g)) {
    // The documents that overlap r: query t of document [s, e) sees t - s + 1 keys.
    auto d = std::upper_bound(c.begin(), c.end(), r.begin) - 1;
    for (; d + 1 != c.end() && *d < r.end(); ++d) {
      const std::int64_t s = *d, a = std::max(s, r.begin), b = std::min(*(d + 1), r.end());
      pairs += sum_between(a - s + 1, b - s);
    }
  }
  return pairs;
}

}  // namespace mlacp
