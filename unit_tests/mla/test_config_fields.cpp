// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MlaConfig's field table (config_fields.hpp): it lists every member once, and describe() and error() read it.
#include <gtest/gtest.h>
#include <mlacp/mla/config_fields.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

namespace {

// A value of each member's type that differs from MlaConfig's default, from the field's position `i`.
struct Changed {
  int i = 0;
  template <class T>
  void operator()(const mlacp::ConfigField&, T& member) {
    ++i;
    if constexpr (std::is_same_v<T, int>) {
      member = 2 * i;  // even: rope stays valid
    } else if constexpr (std::is_same_v<T, double>) {
      member = 0.5 + i;
    } else if constexpr (std::is_same_v<T, bool>) {
      member = !member;
    } else if constexpr (std::is_same_v<T, mlacp::MlaStrategy>) {
      member = mlacp::MlaStrategy::expanded;
    } else if constexpr (std::is_same_v<T, mlacp::WireDtype>) {
      member = mlacp::WireDtype::bfloat16;
    } else if constexpr (std::is_same_v<T, mlacp::RingLayout>) {
      member = mlacp::RingLayout::contiguous;
    } else if constexpr (std::is_same_v<T, mlacp::Bf16Compute>) {
      member = mlacp::Bf16Compute::float32;
    } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
      member = {0, 1};
    } else {
      static_assert(!sizeof(T), "a member type the table's readers do not handle");
    }
  }
};

// MlaConfig's member count, by a structured binding: it compiles only while MlaConfig has exactly this many members.
// A member added to mla_config.hpp fails it here: add its row to config_fields.hpp, then a name below.
constexpr std::size_t config_members() {
  [[maybe_unused]] auto binding = [](const mlacp::MlaConfig& c) {  // maybe_unused: nvcc ignores (void)binding
    const auto& [batch, seq, hidden, heads, nope, rope, vdim, latent, bias, q_lora_rank, softmax_scale, strategy,
                 rope_base, rms_eps, overlap, cu_seqlens, max_documents, wire_dtype, ring_layout, bf16_compute,
                 rope_factor, rope_original_max_position, rope_beta_fast, rope_beta_slow, rope_mscale,
                 rope_mscale_all_dim, rope_attention_factor, rope_interleave] = c;
    (void)batch, (void)seq, (void)hidden, (void)heads, (void)nope, (void)rope, (void)vdim, (void)latent, (void)bias,
        (void)q_lora_rank, (void)softmax_scale, (void)strategy, (void)rope_base, (void)rms_eps, (void)overlap,
        (void)cu_seqlens, (void)max_documents, (void)wire_dtype, (void)ring_layout, (void)bf16_compute,
        (void)rope_factor, (void)rope_original_max_position, (void)rope_beta_fast, (void)rope_beta_slow,
        (void)rope_mscale, (void)rope_mscale_all_dim, (void)rope_attention_factor, (void)rope_interleave;
  };
  (void)binding;
  return 28;
}

TEST(ConfigFields, EveryMemberIsARowOnce) {
  std::set<std::string> names, symbols;
  std::set<const void*> members;
  mlacp::MlaConfig c;
  mlacp::for_each_config_field(c, [&](const mlacp::ConfigField& f, const auto& member) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    EXPECT_TRUE(symbols.insert(f.symbol).second) << f.symbol;
    EXPECT_TRUE(members.insert(&member).second) << f.name << ": a member listed twice";
    EXPECT_NE(std::string(f.help), "") << f.name;
  });
  EXPECT_EQ(members.size(), config_members()) << "a member of MlaConfig has no row in config_fields.hpp";
}

TEST(ConfigFields, DescribeShowsTheSizesAlwaysAndOtherFieldsWhenSet) {
  mlacp::MlaConfig c;
  const std::string plain = c.describe();
  EXPECT_EQ(plain, "B=0 S=0 D=0 H=0 dn=0 dr=0 dv=0 R=0 bias=no strategy=latent wire=same ring_layout=zigzag");
  mlacp::for_each_config_field(c, Changed{});
  const std::string changed = c.describe();
  mlacp::for_each_config_field(c, [&](const mlacp::ConfigField& f, const auto&) {
    EXPECT_NE(changed.find(std::string(f.symbol) + "="), std::string::npos) << f.symbol << " in " << changed;
  });
  EXPECT_NE(changed.find("documents=1"), std::string::npos) << changed;
}

// A size must be positive; a bound (batch and seq, the optional maxima of a call's shape) may be 0, unset, but not
// negative.
TEST(ConfigFields, ErrorNamesTheFirstSizeThatIsNotPositive) {
  mlacp::MlaConfig c;
  mlacp::for_each_config_field(c, Changed{});
  c.cu_seqlens = {};
  c.seq = 8;
  EXPECT_EQ(c.error(1), "");
  int bounds = 0;
  mlacp::for_each_config_field(c, [&](const mlacp::ConfigField& f, auto& member) {
    if constexpr (std::is_same_v<std::decay_t<decltype(member)>, int>) {
      if (!f.size) return;
      const int before = member;
      member = 0;
      if (f.bound) {
        ++bounds;
        EXPECT_EQ(c.error(1), "") << f.name << " = 0 is unset: any shape per call";
        member = -1;
        EXPECT_EQ(c.error(1), std::string("mlacp::MlaConfig: ") + f.name +
                                  " = -1; expected 0 (unset: a call brings any) or a positive maximum");
      } else {
        EXPECT_EQ(c.error(1), std::string("mlacp::MlaConfig: ") + f.name + " = 0; expected a positive size");
      }
      member = before;
    }
  });
  EXPECT_EQ(bounds, 2) << "batch and seq";
}

}  // namespace
