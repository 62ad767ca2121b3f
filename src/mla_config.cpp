// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mla/config_fields.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/mla/wire_policy.hpp>
#include <mlacp/settings.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace mlacp {

const char* to_string(MlaStrategy strategy) noexcept { return strategy == MlaStrategy::latent ? "latent" : "expanded"; }

MlaStrategy parse_strategy(const std::string& name) {
  if (name == "latent") return MlaStrategy::latent;
  if (name == "expanded") return MlaStrategy::expanded;
  throw InvalidArgument("mlacp: strategy '" + name + "' is not known; expected 'latent' or 'expanded'");
}

const char* to_string(WireDtype wire) noexcept { return wire_policy(wire).name; }

WireDtype parse_wire_dtype(const std::string& name) {
  std::string names;
  for (const auto& row : wire_policies) {
    if (name == row.name) return row.dtype;
    names += std::string(names.empty() ? "" : ", ") + "'" + row.name + "'";
  }
  throw InvalidArgument("mlacp: wire dtype '" + name + "' is not known; expected one of " + names);
}

const char* to_string(RingLayout layout) noexcept { return layout == RingLayout::contiguous ? "contiguous" : "zigzag"; }

RingLayout parse_ring_layout(const std::string& name) {
  if (name == "contiguous") return RingLayout::contiguous;
  if (name == "zigzag") return RingLayout::zigzag;
  throw InvalidArgument("mlacp: ring layout '" + name + "' is not known; expected 'contiguous' or 'zigzag'");
}

const char* to_string(Bf16Compute compute) noexcept {
  return compute == Bf16Compute::automatic ? "auto" : compute == Bf16Compute::bfloat16 ? "bf16" : "float";
}

Bf16Compute parse_bf16_compute(const std::string& name) {
  if (name == "auto") return Bf16Compute::automatic;
  if (name == "bf16") return Bf16Compute::bfloat16;
  if (name == "float") return Bf16Compute::float32;
  throw InvalidArgument("mlacp: bf16 compute '" + name + "' is not known; expected 'auto', 'bf16' or 'float'");
}

Bf16Compute requested_bf16_compute(Bf16Compute configured) {
  if (configured != Bf16Compute::automatic) return configured;
  const std::string env = Settings::from_environment().bf16_compute();
  return env.empty() ? Bf16Compute::automatic : parse_bf16_compute(env);
}

Bf16Compute untimed_bf16_compute(Bf16Compute requested, bool bf16_hardware) {
  return requested == Bf16Compute::automatic && bf16_hardware ? Bf16Compute::bfloat16 : requested;
}

std::string MlaConfig::error(int /*group_size: any positive S and H run on any group*/) const {
  std::ostringstream out;
  for_each_config_field(*this, [&](const ConfigField& field, const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, int>) {
      if (field.size && (field.bound ? value < 0 : value <= 0) && out.tellp() == 0)
        out << "mlacp::MlaConfig: " << field.name << " = " << value
            << (field.bound ? "; expected 0 (unset: a call brings any) or a positive maximum"
                            : "; expected a positive size");
    }
  });
  if (out.tellp() != 0) return out.str();
  if (const std::string e = int_products_error(batch, seq); !e.empty()) return e;
  if (rope % 2 != 0) {
    out << "mlacp::MlaConfig: rope = " << rope << "; expected an even qk_rope_head_dim (RoPE rotates pairs)";
  } else if (!(rms_eps > 0) || !(rope_base > 0)) {
    out << "mlacp::MlaConfig: rms_eps = " << rms_eps << ", rope_base = " << rope_base << "; expected positive values";
  } else if (q_lora_rank < 0) {
    out << "mlacp::MlaConfig: q_lora_rank = " << q_lora_rank
        << "; expected 0 (a dense w_q) or a positive query latent width";
  } else if (!(softmax_scale >= 0) || !std::isfinite(softmax_scale)) {
    out << "mlacp::MlaConfig: softmax_scale = " << softmax_scale
        << "; expected 0 (1/sqrt(dqk)) or a positive finite scale";
  } else if (!yarn_error().empty()) {
    out << yarn_error();
  } else if (max_documents < 1) {
    out << "mlacp::MlaConfig: max_documents = " << max_documents << "; expected a positive count of documents";
  } else if (!cu_seqlens.empty() && seq == 0) {
    out << "mlacp::MlaConfig: cu_seqlens has " << cu_seqlens.size() - 1 << " documents ending at token "
        << cu_seqlens.back() << " but seq is unset; expected seq = " << cu_seqlens.back()
        << " (the configuration's packing fixes S; a packing per call goes to MlaAttention::forward)";
  } else {
    out << cu_seqlens_error(cu_seqlens, seq, "MlaConfig");
  }
  return out.str();
}

std::string MlaConfig::int_products_error(std::int64_t batch_rows, std::int64_t seq_tokens) const {
  // Products the layer computes in int (GEMM dimensions, token rows) must fit in it: a wrapped size would allocate or
  // index the wrong amount.
  const std::pair<const char*, std::int64_t> products[] = {
      {"batch * seq (token rows)", batch_rows * seq_tokens},
      {"nope + rope (qk_head_dim)", std::int64_t{nope} + rope},
      {"nope + vdim", std::int64_t{nope} + vdim},
      {"latent + rope (w_kva's rows)", std::int64_t{latent} + rope},
      {"heads * (nope + rope) (w_q's rows)", std::int64_t{heads} * (std::int64_t{nope} + rope)},
      {"heads * (nope + vdim) (w_kvb's rows)", std::int64_t{heads} * (std::int64_t{nope} + vdim)},
      {"heads * vdim (w_o's columns)", std::int64_t{heads} * vdim}};
  for (const auto& [name, value] : products) {
    if (value > std::numeric_limits<int>::max()) {
      // The configuration as the pass would run it, for the message only (the error path alone copies it).
      MlaConfig pass = *this;
      pass.batch = static_cast<int>(std::min<std::int64_t>(batch_rows, std::numeric_limits<int>::max()));
      pass.seq = static_cast<int>(std::min<std::int64_t>(seq_tokens, std::numeric_limits<int>::max()));
      std::ostringstream out;
      out << "mlacp::MlaConfig: " << name << " = " << value << " (" << pass.describe()
          << "); expected at most INT_MAX = " << std::numeric_limits<int>::max();
      return out.str();
    }
  }
  return "";
}

std::string MlaConfig::shape_error() const {
  if (batch > 0 && seq > 0) return "";
  return "mlacp::MlaConfig: batch = " + std::to_string(batch) + ", seq = " + std::to_string(seq) +
         "; expected both set (positive): the shape to price (the layer takes them as optional maxima, the planner "
         "and the model price one shape)";
}

std::string MlaConfig::yarn_error() const {
  std::ostringstream out;
  const auto nonnegative = [](double v) { return v >= 0 && std::isfinite(v); };
  if (!(rope_factor >= 1) || !std::isfinite(rope_factor)) {
    out << "mlacp::MlaConfig: rope_factor = " << rope_factor << "; expected YaRN's factor >= 1 (1: plain RoPE)";
  } else if (rope_factor == 1) {
    // Plain RoPE: the other rows are not read.
  } else if (rope_original_max_position <= 0) {
    out << "mlacp::MlaConfig: rope_original_max_position = " << rope_original_max_position
        << " with rope_factor = " << rope_factor
        << "; expected YaRN's original context length, a positive count of tokens";
  } else if (!(rope_beta_slow > 0) || !(rope_beta_fast > 0) || !std::isfinite(rope_beta_fast) ||
             !std::isfinite(rope_beta_slow)) {
    out << "mlacp::MlaConfig: rope_beta_fast = " << rope_beta_fast << ", rope_beta_slow = " << rope_beta_slow
        << "; expected positive finite numbers of rotations";
  } else if (!nonnegative(rope_mscale) || !nonnegative(rope_mscale_all_dim) || !nonnegative(rope_attention_factor)) {
    out << "mlacp::MlaConfig: rope_mscale = " << rope_mscale << ", rope_mscale_all_dim = " << rope_mscale_all_dim
        << ", rope_attention_factor = " << rope_attention_factor << "; expected finite values >= 0 (0: absent)";
  }
  return out.str();
}

double MlaConfig::attention_scale() const {
  return softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(static_cast<double>(qk_dim()));
}

std::string cu_seqlens_error(const std::vector<std::int64_t>& cu_seqlens, int seq, const char* who) {
  if (cu_seqlens.empty()) return "";
  try {
    DocumentLayout::validate(cu_seqlens, seq, who);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

namespace {

/// A field's value in describe(): numbers as they print, flags as yes/no, enums by name, offsets as their count.
template <class T>
std::string described(const T& value) {
  std::ostringstream out;
  if constexpr (std::is_same_v<T, bool>) {
    out << (value ? "yes" : "no");
  } else if constexpr (std::is_enum_v<T>) {
    out << to_string(value);
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    out << (value.empty() ? 1 : value.size() - 1);
  } else {
    out << value;
  }
  return out.str();
}

}  // namespace

std::string MlaConfig::describe() const {
  // The sizes and the fields marked shown always; any other field only where it differs from MlaConfig's default.
  const MlaConfig defaults;
  std::string out;
  for_each_config_member([&](const ConfigField& field, auto member) {
    const auto& value = this->*member;
    if (field.size || field.shown || !(value == defaults.*member))
      out += (out.empty() ? "" : " ") + std::string(field.symbol) + "=" + described(value);
  });
  return out;
}

}  // namespace mlacp
