// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MlaConfig from a Hugging Face config.json (mla/hf_config.hpp, issue 34): DeepSeek-V3's and V2-Lite's configs as they
// ship (the MoE keys, auto_map and quantization_config ignored), every field set (YaRN, the softmax scale, the RoPE
// convention, the attention's eps), rope_type / rope_parameters, and the refusals that name the key: attention_bias
// true, a rope scaling other than yarn, a wrong type, a missing dimension, a file that cannot be read, text that is not
// JSON.
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/error.hpp>
#include <mlacp/mla/hf_config.hpp>
#include <mlacp/mla/kernels/rope_frequencies.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

namespace {

// DeepSeek-V3's config.json as released (abridged only in the MoE and vocabulary keys, which stay present).
const char* const kV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}, "aux_loss_alpha": 0.001,
  "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
  "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
  "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280
})";

// DeepSeek-V2-Lite's attention keys: no query latent (q_lora_rank null), mscale 0.707, and a decoder eps of 1e-6
// written as rms_norm_eps 1e-5 here to show that the attention's stays 1e-6.
const char* const kV2Lite = R"({
  "hidden_size": 2048, "num_attention_heads": 16, "q_lora_rank": null, "kv_lora_rank": 512,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_theta": 10000, "rms_norm_eps": 1e-5,
  "max_position_embeddings": 163840, "attention_bias": false,
  "rope_scaling": {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                   "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
})";

std::string message_of(const std::string& text) {
  try {
    mlacp::mla_config_from_hf_json(text, 1, 16, "cfg");
  } catch (const mlacp::InvalidArgument& e) {
    return e.what();
  }
  return "(no exception)";
}

/// kV3 with `from` replaced by `to` (each present once).
std::string v3_with(const std::string& from, const std::string& to) {
  std::string text = kV3;
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(HfConfig, DeepSeekV3AsItShips) {
  const auto c = mlacp::mla_config_from_hf_json(kV3, 2, 4096);
  EXPECT_EQ(c.error(1), "");
  EXPECT_EQ(c.batch, 2);
  EXPECT_EQ(c.seq, 4096);
  EXPECT_EQ(c.hidden, 7168);
  EXPECT_EQ(c.heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.latent, 512);
  EXPECT_EQ(c.nope, 128);
  EXPECT_EQ(c.rope, 64);
  EXPECT_EQ(c.vdim, 128);
  EXPECT_EQ(c.rope_base, 10000.0);
  EXPECT_EQ(c.rms_eps, 1e-6);
  EXPECT_FALSE(c.bias);
  EXPECT_TRUE(c.rope_interleave);  // shipped configs carry none: DeepSeek's checkpoints rotate interleaved pairs
  EXPECT_EQ(c.rope_factor, 40.0);
  EXPECT_EQ(c.rope_original_max_position, 4096);
  EXPECT_EQ(c.rope_beta_fast, 32.0);
  EXPECT_EQ(c.rope_beta_slow, 1.0);
  EXPECT_EQ(c.rope_mscale, 1.0);
  EXPECT_EQ(c.rope_mscale_all_dim, 1.0);
  EXPECT_EQ(c.rope_attention_factor, 0.0);
  // Hugging Face's DeepseekV3Attention: softmax_scale = qk_head_dim^-0.5 * g(mscale_all_dim)^2.
  const double g = 0.1 * std::log(40.0) + 1;
  EXPECT_NEAR(c.attention_scale(), g * g / std::sqrt(192.0), 1e-15);
  EXPECT_EQ(mlacp::rope_frequencies(c).attention_factor, 1.0);
}

TEST(HfConfig, DeepSeekV2LiteDenseQueryAndItsMscale) {
  const auto c = mlacp::mla_config_from_hf_json(kV2Lite);
  EXPECT_EQ(c.batch, 0);  // unset: set before a layer is built
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.rms_eps, 1e-6);
  EXPECT_EQ(c.rope_mscale, 0.707);
  const double g = 0.1 * 0.707 * std::log(40.0) + 1;
  EXPECT_NEAR(c.attention_scale(), g * g / std::sqrt(192.0), 1e-15);
  EXPECT_EQ(mlacp::rope_frequencies(c).attention_factor, 1.0);  // g(0.707) / g(0.707)
}

TEST(HfConfig, RopeTypeRopeParametersAndNoScaling) {
  // rope_type in place of type; original_max_position_embeddings from the top level when the scaling has none.
  auto c = mlacp::mla_config_from_hf_json(
      v3_with("\"original_max_position_embeddings\": 4096, \"type\": \"yarn\"", "\"rope_type\": \"yarn\""));
  EXPECT_EQ(c.rope_factor, 40.0);
  EXPECT_EQ(c.rope_original_max_position, 163840);
  // Newer transformers: rope_parameters, with the base inside.
  c = mlacp::mla_config_from_hf_json(
      v3_with("\"rope_scaling\":",
              "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 50000, "
              "\"factor\": 4, \"original_max_position_embeddings\": 1024}, \"unused\":"));
  EXPECT_EQ(c.rope_base, 50000.0);
  EXPECT_EQ(c.rope_factor, 4.0);
  EXPECT_EQ(c.rope_original_max_position, 1024);
  EXPECT_EQ(c.rope_mscale_all_dim, 0.0);
  EXPECT_EQ(c.softmax_scale, 1.0 / std::sqrt(192.0));
  // No scaling, and the default type: plain RoPE, 1/sqrt(dqk), rope_interleave as written.
  c = mlacp::mla_config_from_hf_json(
      v3_with("\"rope_scaling\": {", "\"rope_interleave\": false, \"rope_scaling\": null, \"was\": {"));
  EXPECT_EQ(c.rope_factor, 1.0);
  EXPECT_EQ(c.softmax_scale, 0.0);
  EXPECT_FALSE(c.rope_interleave);
  c = mlacp::mla_config_from_hf_json(v3_with("\"type\": \"yarn\"", "\"type\": \"default\""));
  EXPECT_EQ(c.rope_factor, 1.0);
}

TEST(HfConfig, RefusalsNameTheKey) {
  EXPECT_NE(message_of(v3_with("\"attention_bias\": false", "\"attention_bias\": true"))
                .find("cfg: attention_bias = true; expected false: Hugging Face's attention_bias puts biases on "
                      "q_a_proj, kv_a_proj_with_mqa and o_proj"),
            std::string::npos);
  EXPECT_NE(message_of(v3_with("\"type\": \"yarn\"", "\"type\": \"linear\"")).find("rope_scaling: type = 'linear'"),
            std::string::npos);
  EXPECT_NE(message_of(v3_with("\"type\": \"yarn\"", "\"type\": \"dynamic\"")).find("expected 'yarn'"),
            std::string::npos);
  EXPECT_NE(message_of(v3_with("\"hidden_size\": 7168", "\"hidden_size\": \"7168\"")).find("hidden_size = \"7168\""),
            std::string::npos);
  EXPECT_NE(message_of(v3_with("\"kv_lora_rank\": 512,", "")).find("kv_lora_rank = absent; expected a positive"),
            std::string::npos);
  EXPECT_NE(message_of(v3_with("\"q_lora_rank\": 1536", "\"q_lora_rank\": -1")).find("q_lora_rank = -1"),
            std::string::npos);
  EXPECT_NE(message_of(v3_with("\"factor\": 40", "\"factor\": 0.5")).find("rope_factor = 0.5"), std::string::npos);
  EXPECT_NE(message_of(v3_with("\"factor\": 40", "\"factor\": \"40\"")).find("rope_scaling: factor = \"40\""),
            std::string::npos);
  EXPECT_NE(message_of(v3_with("\"rope_scaling\": {", "\"rope_scaling\": 4, \"was\": {"))
                .find("rope_scaling = 4; expected an object or null"),
            std::string::npos);
  EXPECT_NE(message_of("[1, 2]").find("holds array; expected a JSON object"), std::string::npos);
  EXPECT_NE(message_of("{\"hidden_size\": 1,}").find("cfg is not JSON"), std::string::npos);
  try {
    mlacp::mla_config_from_hf_file("/nonexistent/config.json");
    ADD_FAILURE() << "no exception";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read '/nonexistent/config.json'"), std::string::npos) << e.what();
  }
}

TEST(HfConfig, FileAndApplyKeepTheOtherFields) {
  const std::string path = "test_hf_config_v3.json";
  std::ofstream(path) << kV3;
  mlacp::MlaConfig c;
  c.batch = 3;
  c.seq = 77;
  c.strategy = mlacp::MlaStrategy::expanded;
  c.overlap = false;
  mlacp::apply_hf_config_file(c, path);
  EXPECT_EQ(c.batch, 3);
  EXPECT_EQ(c.seq, 77);
  EXPECT_EQ(c.strategy, mlacp::MlaStrategy::expanded);
  EXPECT_FALSE(c.overlap);
  EXPECT_EQ(c.hidden, 7168);
  const auto same = mlacp::mla_config_from_hf_file(path, 3, 77);
  EXPECT_EQ(same.describe(), mlacp::mla_config_from_hf_json(kV3, 3, 77).describe());
  std::remove(path.c_str());
}

}  // namespace
