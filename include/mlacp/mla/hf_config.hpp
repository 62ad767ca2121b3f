// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MlaConfig from a Hugging Face DeepSeek-V2/V3 `config.json`: the attention's fields, YaRN and its softmax scale, and
// the checkpoints' RoPE convention, read in one place (the Python package's MlaConfig.from_hf_config and the tools'
// --hf-config call it).
//
//   hidden_size -> hidden, num_attention_heads -> heads, q_lora_rank (null: 0) -> q_lora_rank,
//   kv_lora_rank -> latent, qk_nope_head_dim -> nope, qk_rope_head_dim -> rope, v_head_dim -> vdim,
//   rope_theta -> rope_base, rope_scaling / rope_parameters of type (or rope_type) "yarn" -> the rope_* YaRN rows
//   (original_max_position_embeddings falls back to max_position_embeddings), rope_interleave (absent: true) ->
//   rope_interleave, and softmax_scale = g(mscale_all_dim)^2 / sqrt(dqk) (docs/spec.md step 4).
//
// The attention's RMSNorm epsilon stays 1e-6 (rms_norm_eps belongs to the decoder's norms). Keys that do not concern
// the attention (the MoE fields, auto_map, quantization_config, ...) are ignored. Values mlacp cannot honour are
// refused by name: attention_bias true (biases on q_a_proj, kv_a_proj_with_mqa and o_proj), a rope type other than
// yarn (or default), a field of the wrong type.
#pragma once

#include <mlacp/mla/mla_config.hpp>

#include <string>

namespace mlacp {

/// Sets `config`'s attention fields from the text of a Hugging Face config.json, leaving the others (batch, seq,
/// strategy, bias, overlap, the wire, ...) as they are. `where` names the source in messages (a path, "config").
/// Throws InvalidArgument naming the key and what was expected, or the parser's message.
void apply_hf_config(MlaConfig& config, const std::string& json_text, const std::string& where = "config");

/// apply_hf_config of the file at `path` (InvalidArgument naming the path when it cannot be read).
void apply_hf_config_file(MlaConfig& config, const std::string& path);

/// A configuration of the attention a Hugging Face config.json describes, with the given batch and sequence length as
/// its optional maxima (0: unset, any shape per call; the planner needs them set).
MlaConfig mla_config_from_hf_json(const std::string& json_text, int batch = 0, int seq = 0,
                                  const std::string& where = "config");

/// mla_config_from_hf_json of the file at `path` (apply_hf_config_file).
MlaConfig mla_config_from_hf_file(const std::string& path, int batch = 0, int seq = 0);

}  // namespace mlacp
