// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The bf16 layer (mixed precision: bf16 weights, x, y and dx; weight gradients in float), its own translation unit
// like the float and double ones. Python hands it torch.bfloat16 storage as unmanaged Views of mlacp::bf16 (no copy)
// and views its y (an int16 NumPy array over the same bytes) as torch.bfloat16: that needs mlacp::bf16 to be exactly
// torch's bfloat16 in memory, which is checked here at compile time (size, alignment, trivially copyable bytes) and at
// import (the bit patterns of a few values: the upper half of an IEEE binary32, round to nearest even).
#include <cstdint>
#include <cstring>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <string>
#include <type_traits>

#include "bindings.hpp"
#include "layer.hpp"

namespace {

static_assert(sizeof(mlacp::bf16) == 2, "torch.bfloat16 is two bytes: so must mlacp::bf16 be to wrap its storage");
static_assert(alignof(mlacp::bf16) <= 2, "torch.bfloat16 storage is 2-byte aligned");
static_assert(std::is_trivially_copyable_v<mlacp::bf16> && std::is_standard_layout_v<mlacp::bf16>,
              "mlacp::bf16 must be its two bytes and nothing else to alias torch.bfloat16 storage");

std::uint16_t bits_of(float value) {
  const mlacp::bf16 b(value);
  std::uint16_t bits = 0;
  std::memcpy(&bits, &b, sizeof bits);
  return bits;
}

float value_of(std::uint16_t bits) {
  mlacp::bf16 b{};
  std::memcpy(static_cast<void*>(&b), &bits, sizeof bits);
  return static_cast<float>(b);
}

/// torch.bfloat16's layout (the upper 16 bits of the float; torch rounds to nearest even): checked on a few values,
/// a tie among them.
void check_torch_layout() {
  struct Case {
    float value;
    std::uint16_t bits;
  };
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  const Case cases[] = {
      {1.0f, 0x3f80}, {-2.5f, 0xc020}, {0.0f, 0x0000}, {1.0f + 1.0f / 256.0f, 0x3f80}, {1.0f + 3.0f / 256.0f, 0x3f82}};
  for (const auto& c : cases)
    if (bits_of(c.value) != c.bits || value_of(c.bits) != static_cast<float>(mlacp::bf16(c.value)))
      throw mlacp::Error("mlacp: this build's bf16 type does not have torch.bfloat16's layout (" +
                         std::to_string(c.value) + " -> bits " + std::to_string(bits_of(c.value)) + ", expected " +
                         std::to_string(c.bits) + "); the bfloat16 layer cannot wrap torch tensors");
}

}  // namespace

void mlacp::python::bind_layer_bfloat16(pybind11::module_& m) {
  check_torch_layout();
  bind_layer<mlacp::bf16>(m, "bfloat16");
}
