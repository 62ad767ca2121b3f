// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The wire codecs by value (what a collective's payload travels as), without their kernels: what a configuration or a
// launch names. codecs.hpp registers the codec type of each, and gives each its name (to_string) from that type.
#pragma once

namespace mlacp {

/// What a collective's payload travels as.
enum class WireCodec {
  same,      ///< the Views' own values (detail::SameCodec)
  bfloat16,  ///< float rounded into bf16 (detail::Bf16Codec)
  fp8_e4m3,  ///< float as fp8 E4M3 with a float scale per row (detail::Fp8E4M3Codec)
};

}  // namespace mlacp
