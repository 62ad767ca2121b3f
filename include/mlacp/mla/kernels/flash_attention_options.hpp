// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Options of the tiled (flash-style) causal attention core: which implementation runs and its tile sizes.
#pragma once

#include <mlacp/error.hpp>
#include <mlacp/settings.hpp>

#include <cstdint>
#include <string>
#include <utility>

namespace mlacp {

/// Which implementation of the tiled core runs.
///  - blas: host execution spaces only. The tile products are Kokkos Kernels GEMMs on tiles (the BLAS TPL on host
///    builds), the softmax and masking are Kokkos kernels on the tiles.
///  - team: any execution space (Serial, OpenMP, CUDA, HIP). One team per (batch, head, tile), tile products as
///    KokkosBatched team GEMMs with the score tiles and accumulators in team scratch memory.
///  - automatic: what the execution space's Backend says (backend.hpp: blas on host spaces, team on devices).
enum class FlashAttentionPath { automatic, blas, team };

/// Tile sizes of the core: `query_tile` queries by `key_tile` keys per score tile. 0 means the path's default (chosen
/// by measurement, see perf_tests/perf_attention.cpp and docs/api.md; on the BLAS path by the problem's shape where
/// neither is set: flash_large_tile_blas below). The environment variable MLACP_ATTENTION_TILES=QxK overrides the
/// defaults (not explicit values) without recompiling.
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

/// The BLAS path's tiles by shape, where no tile is set (options, MLACP_ATTENTION_TILES): flash_large_tile_blas on
/// both sides for sequences of at least flash_large_tile_min_seq tokens whose query/key head dim is at least
/// flash_large_tile_min_head_dim or whose inputs are stored in bf16, else the defaults above. Measured
/// (mlacp-perf-attention, P = 2, Intel Xeon AVX-512/AMX, docs/performance.md): at dqk = 192, dv = 128 the 256 x 256
/// tiles took 3-13% less time than 128 x 128 at S = 1024, 2048 and 4096 in float, double and bf16 (the tile GEMMs run
/// closer to the BLAS's rate, and oneDNN's bf16 matmul packs each key tile once per 256 queries instead of 128); at
/// dqk = dv = 32 they won in bf16 (7-14%) and lost 2-10% in float and double; at S = 512 neither won by more than
/// the noise.
inline constexpr int flash_large_tile_blas = 256;
inline constexpr std::int64_t flash_large_tile_min_seq = 1024;
inline constexpr std::int64_t flash_large_tile_min_head_dim = 128;

namespace detail {

/// The tiles a path runs with, before the problem's shape is known: set (explicit options first, then
/// MLACP_ATTENTION_TILES=QxK) or the path's defaults; `by_shape`: none was set on the BLAS path, so a problem's
/// shape may choose the large tiles (for_problem).
struct FlashTileChoice {
  int query = 0, key = 0;
  bool by_shape = false;
  /// The tiles of a problem over a sequence of n_s tokens with query/key head dim d_qk; `narrow`: inputs stored in a
  /// type narrower than the accumulation (bf16). Equal on every rank that runs the same shapes.
  std::pair<int, int> for_problem(std::int64_t n_s, std::int64_t d_qk, bool narrow) const {
    if (by_shape && n_s >= flash_large_tile_min_seq && (narrow || d_qk >= flash_large_tile_min_head_dim))
      return {flash_large_tile_blas, flash_large_tile_blas};
    return {query, key};
  }
};

/// A path's tiles where none is set: its defaults, chosen by shape on the BLAS path.
inline FlashTileChoice flash_default_tile_choice(bool blas_path) {
  if (blas_path) return {flash_default_query_tile_blas, flash_default_key_tile_blas, true};
  return {flash_default_query_tile_team, flash_default_key_tile_team, false};
}

/// The tiles a path runs with before the shape (FlashTileChoice): explicit options first, then
/// MLACP_ATTENTION_TILES=QxK, then the path's defaults (flash_default_tile_choice). A malformed or non-positive setting
/// is an InvalidArgument naming it.
inline FlashTileChoice flash_tile_choice(const FlashAttentionOptions& o, bool blas_path) {
  FlashTileChoice c = flash_default_tile_choice(blas_path);
  if (const auto tiles = Settings::from_environment().attention_tiles(); tiles[0] > 0) {
    c.query = tiles[0];
    c.key = tiles[1];
    c.by_shape = false;
  }
  if (o.query_tile != 0) c.query = o.query_tile;
  if (o.key_tile != 0) c.key = o.key_tile;
  if (o.query_tile != 0 || o.key_tile != 0) c.by_shape = false;
  if (c.query <= 0 || c.key <= 0)
    throw InvalidArgument("mlacp::FlashAttentionCore: query_tile = " + std::to_string(c.query) +
                          ", key_tile = " + std::to_string(c.key) + "; expected positive tile sizes");
  return c;
}

/// The tiles of flash_tile_choice for a problem too small for the large tiles (or with them set).
inline std::pair<int, int> flash_tiles(const FlashAttentionOptions& o, bool blas_path) {
  const FlashTileChoice c = flash_tile_choice(o, blas_path);
  return {c.query, c.key};
}

}  // namespace detail
}  // namespace mlacp
