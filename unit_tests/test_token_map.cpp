// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// TokenMap (include/mlacp/token_map.hpp): the contiguous and zigzag formulas for even and uneven S, empty parts, the
// flat case, coverage, shard / unshard, the causal balance of the layouts, errors.
#include <mlacp/mesh.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/token_map.hpp>

#include <algorithm>

#include "collective_test_helpers.hpp"

namespace mlacp {
// gtest's printer for the expectations on ranges.
void PrintTo(const TokenRange& r, std::ostream* out) { *out << '[' << r.begin << ", +" << r.count << ')'; }
}  // namespace mlacp

namespace {

using mlacp::RingLayout;
using mlacp::TokenMap;
using mlacp::TokenRange;
using Ranges = std::vector<TokenRange>;

// Every global token held by exactly one rank; ranges ascending and non-empty; counts agree with the ranges; owner,
// global_token and chunk_token agree with the ranges.
void expect_consistent(const TokenMap& map) {
  SCOPED_TRACE(map.describe());
  std::vector<int> held(static_cast<std::size_t>(map.seq()), 0);
  std::int64_t max_count = 0;
  for (int g = 0; g < map.ring_size(); ++g) {
    const Ranges& chunk = map.chunk(g);
    EXPECT_LE(chunk.size(), 2U);
    std::int64_t size = 0;
    for (std::size_t k = 0; k < chunk.size(); ++k) {
      EXPECT_GT(chunk[k].count, 0);
      if (k > 0) {
        EXPECT_LT(chunk[k - 1].end(), chunk[k].begin);  // ascending, not adjacent
      }
      size += chunk[k].count;
    }
    EXPECT_EQ(map.chunk_size(g), size);
    EXPECT_EQ(map.chunk_partition(g), mlacp::Partition(size, map.ulysses_size()));
    std::int64_t chunk_local = 0;
    for (int u = 0; u < map.ulysses_size(); ++u) {
      const Ranges& mine = map.ranges(g, u);
      EXPECT_LE(mine.size(), 2U);
      std::int64_t n = 0;
      for (std::size_t k = 0; k < mine.size(); ++k) {
        EXPECT_GT(mine[k].count, 0);
        if (k > 0) {
          EXPECT_LT(mine[k - 1].end(), mine[k].begin);
        }
        for (std::int64_t t = mine[k].begin; t < mine[k].end(); ++t, ++n, ++chunk_local) {
          ++held[static_cast<std::size_t>(t)];
          EXPECT_EQ(map.global_token(g, u, n), t);
          EXPECT_EQ(map.chunk_token(g, chunk_local), t);  // rank u's tokens follow rank u-1's in the chunk
          const mlacp::TokenOwner o = map.owner(t);
          EXPECT_EQ(o.g, g);
          EXPECT_EQ(o.u, u);
          EXPECT_EQ(o.index, n);
        }
      }
      EXPECT_EQ(map.count(g, u), n);
      max_count = std::max(max_count, n);
    }
    EXPECT_EQ(chunk_local, size);
  }
  EXPECT_EQ(map.max_count(), max_count);
  for (std::size_t t = 0; t < held.size(); ++t) EXPECT_EQ(held[t], 1) << "token " << t;
}

TEST(TokenMap, ContiguousFormulaEvenAndUneven) {
  const TokenMap even(16, 2, 2, RingLayout::contiguous);
  EXPECT_EQ(even.chunk(0), (Ranges{{0, 8}}));
  EXPECT_EQ(even.chunk(1), (Ranges{{8, 8}}));
  EXPECT_EQ(even.ranges(0, 0), (Ranges{{0, 4}}));
  EXPECT_EQ(even.ranges(0, 1), (Ranges{{4, 4}}));
  EXPECT_EQ(even.ranges(1, 0), (Ranges{{8, 4}}));
  EXPECT_EQ(even.ranges(1, 1), (Ranges{{12, 4}}));
  EXPECT_EQ(even.max_chunk_size(), 8);
  // S = 11, C = 3: chunks {4, 4, 3}; U = 2: chunk 2 split {2, 1}.
  const TokenMap uneven(11, 2, 3, RingLayout::contiguous);
  EXPECT_EQ(uneven.chunk(2), (Ranges{{8, 3}}));
  EXPECT_EQ(uneven.ranges(2, 0), (Ranges{{8, 2}}));
  EXPECT_EQ(uneven.ranges(2, 1), (Ranges{{10, 1}}));
  EXPECT_EQ(uneven.max_chunk_size(), 4);
  for (const auto& map : {even, uneven}) expect_consistent(map);
}

TEST(TokenMap, ZigzagFormulaEvenAndUneven) {
  // S = 16, C = 2: parts of 4; chunk 0 = parts 0 and 3, chunk 1 = parts 1 and 2 (adjacent: one range).
  const TokenMap even(16, 2, 2, RingLayout::zigzag);
  EXPECT_EQ(even.chunk(0), (Ranges{{0, 4}, {12, 4}}));
  EXPECT_EQ(even.chunk(1), (Ranges{{4, 8}}));
  EXPECT_EQ(even.ranges(0, 0), (Ranges{{0, 4}}));
  EXPECT_EQ(even.ranges(0, 1), (Ranges{{12, 4}}));
  EXPECT_EQ(even.ranges(1, 0), (Ranges{{4, 4}}));
  EXPECT_EQ(even.ranges(1, 1), (Ranges{{8, 4}}));
  // S = 16, C = 2, U = 3: chunk 0 (8 tokens) split {3, 3, 2}: rank 1 straddles the two ranges.
  const TokenMap straddle(16, 3, 2, RingLayout::zigzag);
  EXPECT_EQ(straddle.ranges(0, 0), (Ranges{{0, 3}}));
  EXPECT_EQ(straddle.ranges(0, 1), (Ranges{{3, 1}, {12, 2}}));
  EXPECT_EQ(straddle.ranges(0, 2), (Ranges{{14, 2}}));
  // S = 13, C = 3: 6 parts {3, 2, 2, 2, 2, 2} at offsets 0, 3, 5, 7, 9, 11; chunk g = parts g and 5 - g.
  const TokenMap uneven(13, 2, 3, RingLayout::zigzag);
  EXPECT_EQ(uneven.chunk(0), (Ranges{{0, 3}, {11, 2}}));
  EXPECT_EQ(uneven.chunk(1), (Ranges{{3, 2}, {9, 2}}));
  EXPECT_EQ(uneven.chunk(2), (Ranges{{5, 4}}));
  EXPECT_EQ(uneven.chunk_size(0), 5);
  EXPECT_EQ(uneven.max_chunk_size(), 5);
  EXPECT_EQ(uneven.ranges(0, 0), (Ranges{{0, 3}}));
  EXPECT_EQ(uneven.ranges(0, 1), (Ranges{{11, 2}}));
  EXPECT_EQ(uneven.ranges(1, 0), (Ranges{{3, 2}}));
  EXPECT_EQ(uneven.ranges(1, 1), (Ranges{{9, 2}}));
  EXPECT_EQ(uneven.chunk_token(0, 3), 11);
  for (const auto& map : {even, straddle, uneven}) expect_consistent(map);
}

TEST(TokenMap, ShortSequencesLeaveEmptyParts) {
  // S = 3 < 2C = 4: parts {1, 1, 1, 0}; chunk 0 = part 0 (part 3 is empty), chunk 1 = parts 1 and 2.
  const TokenMap zigzag(3, 2, 2, RingLayout::zigzag);
  EXPECT_EQ(zigzag.chunk(0), (Ranges{{0, 1}}));
  EXPECT_EQ(zigzag.chunk(1), (Ranges{{1, 2}}));
  EXPECT_EQ(zigzag.ranges(0, 1), Ranges{});
  EXPECT_EQ(zigzag.count(0, 1), 0);
  const TokenMap none(0, 2, 3, RingLayout::zigzag);
  EXPECT_EQ(none.chunk(2), Ranges{});
  EXPECT_EQ(none.max_chunk_size(), 0);
  EXPECT_EQ(none.max_count(), 0);
  for (std::int64_t s = 0; s <= 20; ++s)
    for (int u = 1; u <= 4; ++u)
      for (int c = 1; c <= 4; ++c)
        for (const auto layout : {RingLayout::contiguous, RingLayout::zigzag})
          expect_consistent(TokenMap(s, u, c, layout));
}

TEST(TokenMap, OneRingIsFlatUlysses) {
  for (const std::int64_t s : {0, 1, 7, 16, 33})
    for (const int u : {1, 2, 3, 4})
      for (const auto layout : {RingLayout::contiguous, RingLayout::zigzag}) {
        const TokenMap map(s, u, 1, layout);
        const mlacp::Partition flat(s, u);
        EXPECT_EQ(map.chunk_partition(0), flat);
        for (int r = 0; r < u; ++r) {
          const Ranges expected = flat.count(r) ? Ranges{{flat.offset(r), flat.count(r)}} : Ranges{};
          EXPECT_EQ(map.ranges(0, r), expected) << map.describe() << " rank " << r;
        }
      }
}

TEST(TokenMap, CausalWorkIsBalancedByZigzag) {
  for (const int c : {2, 4}) {
    for (const auto layout : {RingLayout::contiguous, RingLayout::zigzag}) {
      const TokenMap map(4096, 2, c, layout);
      std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = 0, sum = 0;
      for (int g = 0; g < c; ++g) {
        std::int64_t direct = 0;
        for (const TokenRange& r : map.chunk(g))
          for (std::int64_t t = r.begin; t < r.end(); ++t) direct += t + 1;
        EXPECT_EQ(mlacp::causal_pairs(map, g), direct);
        lo = std::min(lo, direct);
        hi = std::max(hi, direct);
        sum += direct;
      }
      EXPECT_EQ(sum, 4096LL * 4097 / 2);
      const double ratio = static_cast<double>(hi) / static_cast<double>(lo);
      if (layout == RingLayout::zigzag)
        EXPECT_LE(ratio, 1.02) << map.describe();
      else
        EXPECT_GE(ratio, 2 * c - 1 - 0.01) << map.describe();  // (2C-1): chunk C-1 against chunk 0
    }
  }
}

TEST(TokenMap, CausalPairsWithPackedDocuments) {
  const TokenMap map(16, 2, 2, RingLayout::zigzag);  // chunk 0 = [0, 4) + [12, 16), chunk 1 = [4, 12)
  const mlacp::DocumentLayout docs({0, 3, 10, 16}, 16);
  for (int g = 0; g < 2; ++g) {
    std::int64_t direct = 0;
    for (const TokenRange& r : map.chunk(g))
      for (std::int64_t t = r.begin; t < r.end(); ++t) direct += t - docs.start_of(t) + 1;
    EXPECT_EQ(mlacp::causal_pairs(map, g, docs), direct);
  }
  EXPECT_EQ(mlacp::causal_pairs(map, 1, mlacp::DocumentLayout()), mlacp::causal_pairs(map, 1));
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] {
        mlacp::causal_pairs(map, 0, mlacp::DocumentLayout({0, 5}, 5));
      },
      "the documents cover 5 tokens; expected the sequence length 16");
}

template <class View>
void fill(const View& global) {
  auto h = Kokkos::create_mirror_view(global);
  for (std::size_t b = 0; b < h.extent(0); ++b)
    for (std::size_t t = 0; t < h.extent(1); ++t)
      for (std::size_t d = 0; d < h.extent(2); ++d) h(b, t, d) = static_cast<double>(1000 * b + 10 * t + d);
  Kokkos::deep_copy(global, h);
}

TEST(TokenMap, ShardThenUnshardReproducesTheGlobalTensor) {
  const Kokkos::DefaultExecutionSpace space;
  for (const auto layout : {RingLayout::contiguous, RingLayout::zigzag})
    for (const std::int64_t s : {3, 13, 16}) {
      const TokenMap map(s, 3, 2, layout);
      Kokkos::View<double***> global("global", 2, static_cast<std::size_t>(s), 3);
      Kokkos::View<double***> back("back", 2, static_cast<std::size_t>(s), 3);
      fill(global);
      for (int g = 0; g < 2; ++g)
        for (int u = 0; u < 3; ++u) {
          Kokkos::View<double***> local("local", 2, static_cast<std::size_t>(map.count(g, u)), 3);
          mlacp::shard(space, map, g, u, global, local);
          space.fence();
          auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), local);
          for (std::int64_t i = 0; i < map.count(g, u); ++i)
            EXPECT_EQ(h(1, static_cast<std::size_t>(i), 2),
                      1000.0 + 10.0 * static_cast<double>(map.global_token(g, u, i)) + 2.0);
          mlacp::unshard(space, map, g, u, local, back);
        }
      space.fence();
      auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), global);
      auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), back);
      for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a.data()[i], b.data()[i]) << map.describe();
    }
  // Rank 2 and 4 Views.
  const TokenMap map(8, 2, 2, RingLayout::zigzag);
  Kokkos::View<float**> g2("g2", 1, 8), l2("l2", 1, 2);
  Kokkos::View<float****> g4("g4", 1, 8, 2, 2), l4("l4", 1, 2, 2, 2);
  Kokkos::deep_copy(g2, 1.0F);
  Kokkos::deep_copy(g4, 2.0F);
  mlacp::shard(space, map, 0, 1, g2, l2);
  mlacp::shard(space, map, 0, 1, g4, l4);
  mlacp::unshard(space, map, 0, 1, l4, g4);
  space.fence();
  EXPECT_EQ(Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), l2)(0, 1), 1.0F);
}

TEST(TokenMap, ErrorsNameTheValue) {
  using mlacp::InvalidArgument;
  using mlacp::test::expect_error;
  expect_error<InvalidArgument>([] { TokenMap(-1, 2, 2, RingLayout::zigzag); },
                                "mlacp::TokenMap: seq = -1; expected seq >= 0");
  expect_error<InvalidArgument>([] { TokenMap(8, 0, 2, RingLayout::zigzag); },
                                "mlacp::TokenMap: ulysses_size = 0; expected ulysses_size >= 1");
  expect_error<InvalidArgument>([] { TokenMap(8, 2, 0, RingLayout::zigzag); },
                                "mlacp::TokenMap: ring_size = 0; expected ring_size >= 1");
  const TokenMap map(8, 2, 2, RingLayout::zigzag);
  expect_error<InvalidArgument>([&] { map.chunk(2); },
                                "mlacp::TokenMap::chunk: g = 2; expected 0 <= g < 2 (the ring size C of "
                                "TokenMap(seq=8, ulysses=2, ring=2, zigzag))");
  expect_error<InvalidArgument>([&] { map.ranges(0, -1); }, "mlacp::TokenMap::ranges: u = -1; expected 0 <= u < 2");
  expect_error<InvalidArgument>([&] { map.count(-1, 0); }, "mlacp::TokenMap::count: g = -1");
  expect_error<InvalidArgument>([&] { map.chunk_token(0, 4); }, "chunk_token: t = 4; expected 0 <= t < 4");
  expect_error<InvalidArgument>([&] { map.global_token(0, 0, 2); }, "global_token: i = 2; expected 0 <= i < 2");
  expect_error<InvalidArgument>([&] { map.owner(8); }, "owner: t = 8; expected 0 <= t < 8");
  const Kokkos::DefaultExecutionSpace space;
  Kokkos::View<double***> global("global", 2, 8, 3), short_global("short", 2, 7, 3);
  Kokkos::View<double***> local("local", 2, 2, 3), wrong_local("wrong", 2, 3, 3), wide_local("wide", 2, 2, 4);
  expect_error<InvalidArgument>([&] { mlacp::shard(space, map, 0, 0, short_global, local); },
                                "mlacp::shard: global.extent(1) = 7; expected the sequence length 8");
  expect_error<InvalidArgument>([&] { mlacp::unshard(space, map, 0, 0, wrong_local, global); },
                                "mlacp::unshard: local.extent(1) = 3; expected the rank's token count 2");
  expect_error<InvalidArgument>([&] { mlacp::shard(space, map, 0, 0, global, wide_local); },
                                "local.extent(2) = 4; expected global's 3");
  expect_error<InvalidArgument>([&] { mlacp::shard(space, map, 2, 0, global, local); }, "g = 2");
}

TEST(TokenMap, OfTheMesh) {
  int p = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  {
    const mlacp::Mesh flat(MPI_COMM_WORLD);
    const TokenMap map = TokenMap::of(flat, 10, RingLayout::zigzag);
    EXPECT_EQ(map.ulysses_size(), p);
    EXPECT_EQ(map.ring_size(), 1);
    const mlacp::Partition part(10, p);
    EXPECT_EQ(map.count(0, rank), part.count(rank));
  }
  if (p % 2 != 0) return;
  const mlacp::Mesh mesh(MPI_COMM_WORLD, 2);
  const TokenMap map = TokenMap::of(mesh, 16, RingLayout::zigzag);
  EXPECT_EQ(map.ulysses_size(), p / 2);
  EXPECT_EQ(map.ring_size(), 2);
  EXPECT_EQ(map.layout(), RingLayout::zigzag);
  // Every rank shards its own tokens; an allgather of the (global index, value) pairs covers the sequence once.
  const int g = mesh.ring_rank(), u = mesh.ulysses_rank();
  Kokkos::View<double***> global("global", 1, 16, 1);
  fill(global);
  Kokkos::View<double***> local("local", 1, static_cast<std::size_t>(map.count(g, u)), 1);
  mlacp::shard(Kokkos::DefaultExecutionSpace(), map, g, u, global, local);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), local);
  std::vector<double> seen(16, 0.0), all(16, 0.0);
  for (std::int64_t i = 0; i < map.count(g, u); ++i)
    seen[static_cast<std::size_t>(map.global_token(g, u, i))] = h(0, static_cast<std::size_t>(i), 0) + 1.0;
  MPI_Allreduce(seen.data(), all.data(), 16, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t t = 0; t < 16; ++t) EXPECT_EQ(all[t], 10.0 * static_cast<double>(t) + 1.0) << "token " << t;
}

}  // namespace
