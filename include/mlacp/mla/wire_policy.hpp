// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Which codec each of a float layer's exchanges travels as, for each MlaConfig::wire_dtype: one row per setting.
// The layer's exchanges fall in three kinds:
//   forward   the token-to-head all-to-alls of Q, K and V, the latent payload's all-gather, the head-to-token O
//   exchange backward  the dO all-to-all and the inverse all-to-alls of dQ, dK and dV reduce    the latent
//   reduce-scatter of dKV's partial sums
// fp8 holds for activations (each row one scale, a relative error of at most 2^-4 per value) and is what the forward
// moves; gradients are not carried in it: their rows mix magnitudes that a per-row E4M3 scale flushes (2^-9 of the
// row's largest value is its smallest subnormal), and the weight gradients sum those errors over every token, so the
// backward exchanges take bf16; partial sums cannot be added in a scaled 8-bit format, so the reduce-scatter keeps
// float (docs/wire.md measures all three against float64). A double layer refuses anything but `same` (it is the
// accuracy reference); a bf16 layer's wire is bf16 already (the setting changes nothing).
#pragma once

#include <mlacp/mla/mla_config.hpp>
#include <mlacp/wire/wire_codec.hpp>

#include <string>

namespace mlacp {

/// The kinds of a layer's exchanges (see above).
enum class WireExchange { forward, backward, reduce };

struct WirePolicy {
  WireDtype dtype;
  const char* name;  ///< the setting's name in configurations, flags and JSON
  WireCodec forward, backward, reduce;
  const char* description;
};

inline constexpr WirePolicy wire_policies[] = {
    {WireDtype::same, "same", WireCodec::same, WireCodec::same, WireCodec::same, "the layer's value type everywhere"},
    {WireDtype::bfloat16, "bf16", WireCodec::bfloat16, WireCodec::bfloat16, WireCodec::same,
     "bf16 all-to-alls and all-gather; the reduce-scatter's partial sums in float"},
    {WireDtype::bfloat16_all, "bf16_all", WireCodec::bfloat16, WireCodec::bfloat16, WireCodec::bfloat16,
     "bf16 everywhere, the reduce-scatter's partial sums too"},
    {WireDtype::float8_e4m3, "fp8", WireCodec::fp8_e4m3, WireCodec::bfloat16, WireCodec::same,
     "fp8 E4M3 with a scale per row on the forward's exchanges, bf16 on the backward's, float partial sums"},
};

/// The row of `dtype`.
constexpr const WirePolicy& wire_policy(WireDtype dtype) {
  for (const auto& row : wire_policies)
    if (row.dtype == dtype) return row;
  return wire_policies[0];
}

/// The codec of one kind of exchange under `dtype`.
constexpr WireCodec wire_codec(WireDtype dtype, WireExchange exchange) {
  const WirePolicy& row = wire_policy(dtype);
  return exchange == WireExchange::forward    ? row.forward
         : exchange == WireExchange::backward ? row.backward
                                              : row.reduce;
}

}  // namespace mlacp
