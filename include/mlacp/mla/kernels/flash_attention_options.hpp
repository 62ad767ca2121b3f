// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Options of the tiled (flash-style) causal attention core: which implementation runs and its tile sizes.
#pragma once

#include <mlacp/error.hpp>
#include <mlacp/settings.hpp>

#include <string>

namespace mlacp {

/// Which implementation of the tiled core runs.
///  - blas: host execution spaces only. The tile products are Kokkos Kernels GEMMs on tiles (the BLAS TPL on host
///    builds), the softmax and masking are Kokkos kernels on the tiles.
///  - team: any execution space (Serial, OpenMP, CUDA, HIP). One team per (batch, head, tile), tile products as
///    KokkosBatched team GEMMs with the score tiles and accumulators in team scratch memory.
///  - automatic: what the execution space's Backend says (backend.hpp: blas on host spaces, team on devices).
enum class FlashAttentionPath { automatic, blas, team };

/// Tile sizes of the core: `query_tile` queries by `key_tile` keys per score tile. 0 means the path's default (chosen
/// by measurement, see perf_tests/perf_attention.cpp and docs/api.md). The environment variable
/// MLACP_ATTENTION_TILES=QxK overrides the defaults (not explicit values) without recompiling.
struct FlashAttentionOptions {
  int query_tile = 0;
  int key_tile = 0;
  FlashAttentionPath path = FlashAttentionPath::automatic;
};

/// Default tiles of each path. Host (BLAS): 128 x 128 was the best or within the noise of the best of 64x64, 128x128,
/// 64x256 and 128x256 at dqk = dv = 32 and at dqk = 192, dv = 128, S = 512 and 2048, float and double
/// (mlacp-perf-attention, docs/api.md); longer key tiles lose in the backward, shorter ones to GEMM call overhead.
/// Team: small enough that a score tile and the accumulators fit in a GPU's team scratch.
inline constexpr int flash_default_query_tile_blas = 128;
inline constexpr int flash_default_key_tile_blas = 128;
inline constexpr int flash_default_query_tile_team = 32;
inline constexpr int flash_default_key_tile_team = 32;

namespace detail {

/// The tiles a path runs with: explicit options first, then MLACP_ATTENTION_TILES=QxK, then the path's defaults.
/// A malformed or non-positive setting is an InvalidArgument naming it.
inline std::pair<int, int> flash_tiles(const FlashAttentionOptions& o, bool blas_path) {
  int q = blas_path ? flash_default_query_tile_blas : flash_default_query_tile_team;
  int k = blas_path ? flash_default_key_tile_blas : flash_default_key_tile_team;
  if (const auto tiles = Settings::from_environment().attention_tiles(); tiles[0] > 0) {
    q = tiles[0];
    k = tiles[1];
  }
  if (o.query_tile != 0) q = o.query_tile;
  if (o.key_tile != 0) k = o.key_tile;
  if (q <= 0 || k <= 0)
    throw InvalidArgument("mlacp::FlashAttentionCore: query_tile = " + std::to_string(q) +
                          ", key_tile = " + std::to_string(k) + "; expected positive tile sizes");
  return {q, k};
}

}  // namespace detail
}  // namespace mlacp
