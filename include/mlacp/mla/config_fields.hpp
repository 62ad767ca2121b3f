// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MlaConfig's fields as one table: the one place that lists them. describe(), the size checks of error(), the Python
// binding (its keywords, attributes and repr) and the tools' flags and JSON read it, so that a new field is one row
// here (and its member in mla_config.hpp) instead of an edit in each of them.
#pragma once

#include <mlacp/mla/mla_config.hpp>

namespace mlacp {

/// What one row says of a field.
struct ConfigField {
  const char* name;    ///< the C++ member, the Python keyword and attribute, the tools' flag (--name, '_' as '-')
  const char* symbol;  ///< its key in describe() (cu_seqlens: "documents", their count) and in the tools' JSON
  const char* help;    ///< one line for --help and the Python docstrings
  bool size = false;   ///< a dimension: error() demands a positive value, describe() always shows it
  bool shown = false;  ///< describe() always shows it (other fields: where they differ from the default)
  bool local = false;  ///< may differ across ranks (it sizes an allocation only): the layer does not agree on it
  bool bound = false;  ///< a size that is an optional maximum: error() takes 0 (unset, any) or a positive value
};

/// The table: calls f(field, &MlaConfig::member) for each field, in the order describe() and the JSON list them.
/// The members are int, double, bool, MlaStrategy, WireDtype, RingLayout, Bf16Compute and std::vector<std::int64_t>. A
/// caller that keeps a field (the Python binding's attributes, a tool's flag) keeps its pointer to member.
template <class F>
void for_each_config_member(F&& f) {
  f(ConfigField{"batch", "B", "B, the largest batch size a call brings (0: any)", true, false, false, true},
    &MlaConfig::batch);
  f(ConfigField{"seq", "S", "S, the longest global sequence a call brings (0: any)", true, false, false, true},
    &MlaConfig::seq);
  f(ConfigField{"hidden", "D", "D, the model width", true}, &MlaConfig::hidden);
  f(ConfigField{"heads", "H", "H, the global head count", true}, &MlaConfig::heads);
  f(ConfigField{"nope", "dn", "dn, qk_nope_head_dim", true}, &MlaConfig::nope);
  f(ConfigField{"rope", "dr", "dr, qk_rope_head_dim (even)", true}, &MlaConfig::rope);
  f(ConfigField{"vdim", "dv", "dv, v_head_dim", true}, &MlaConfig::vdim);
  f(ConfigField{"latent", "R", "R, kv_lora_rank", true}, &MlaConfig::latent);
  f(ConfigField{"q_lora_rank", "Rq", "Rq: 0 projects the query with one dense w_q; > 0 factors it (w_qa, g_q, w_qb)"},
    &MlaConfig::q_lora_rank);
  f(ConfigField{"softmax_scale", "softmax_scale", "the attention's softmax scale: 0 means 1/sqrt(nope + rope)"},
    &MlaConfig::softmax_scale);
  f(ConfigField{"bias", "bias", "b_q, b_kvb and b_o present", false, true}, &MlaConfig::bias);
  f(ConfigField{"strategy", "strategy", "how keys and values reach the heads: 'latent' or 'expanded'", false, true},
    &MlaConfig::strategy);
  f(ConfigField{"rope_base", "rope_base", "RoPE's base"}, &MlaConfig::rope_base);
  f(ConfigField{"rope_factor", "rope_factor", "YaRN's scaling factor (1: plain RoPE)"}, &MlaConfig::rope_factor);
  f(ConfigField{"rope_original_max_position", "rope_original_max_position",
                "YaRN's original context length (original_max_position_embeddings)"},
    &MlaConfig::rope_original_max_position);
  f(ConfigField{"rope_beta_fast", "rope_beta_fast", "YaRN's beta_fast"}, &MlaConfig::rope_beta_fast);
  f(ConfigField{"rope_beta_slow", "rope_beta_slow", "YaRN's beta_slow"}, &MlaConfig::rope_beta_slow);
  f(ConfigField{"rope_mscale", "rope_mscale", "YaRN's mscale (0: absent)"}, &MlaConfig::rope_mscale);
  f(ConfigField{"rope_mscale_all_dim", "rope_mscale_all_dim", "YaRN's mscale_all_dim (0: absent)"},
    &MlaConfig::rope_mscale_all_dim);
  f(ConfigField{"rope_attention_factor", "rope_attention_factor",
                "YaRN's factor on cos and sin (0: derived from the mscales)"},
    &MlaConfig::rope_attention_factor);
  f(ConfigField{"rope_interleave", "rope_interleave",
                "the checkpoints' rope rows rotate interleaved pairs (DeepSeek's); the loaders permute them"},
    &MlaConfig::rope_interleave);
  f(ConfigField{"rms_eps", "rms_eps", "the RMSNorms' epsilon"}, &MlaConfig::rms_eps);
  f(ConfigField{"overlap", "overlap", "overlap each collective with its independent compute (false: wait at once)"},
    &MlaConfig::overlap);
  f(ConfigField{"cu_seqlens", "documents", "packed documents: offsets 0 < ... < seq (empty: one document)"},
    &MlaConfig::cu_seqlens);
  f(ConfigField{"max_documents", "max_documents", "per-call packed documents that need no allocation", false, false,
                true},
    &MlaConfig::max_documents);
  f(ConfigField{"wire_dtype", "wire", "what a float layer's collectives move: 'same', 'bf16', 'bf16_all' or 'fp8'",
                false, true},
    &MlaConfig::wire_dtype);
  f(ConfigField{"ring_layout", "ring_layout", "the ring's token layout: 'contiguous' or 'zigzag'", false, true},
    &MlaConfig::ring_layout);
  f(ConfigField{"bf16_compute", "bf16_compute",
                "how a bf16 layer computes: 'auto' (time both at the first forward), 'bf16' or 'float'"},
    &MlaConfig::bf16_compute);
}

/// Calls f(field, member) for each field of `config` (an MlaConfig, const or not): the table over one object.
template <class Config, class F>
void for_each_config_field(Config& c, F&& f) {
  for_each_config_member([&](const ConfigField& field, auto pointer) { f(field, c.*pointer); });
}

}  // namespace mlacp
