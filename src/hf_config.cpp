// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mla/hf_config.hpp>
#include <mlacp/mla/kernels/rope_frequencies.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace mlacp {

namespace {

using Json = nlohmann::json;

/// Reads the keys of one JSON object, naming the source and the key in every refusal.
class HfReader {
 public:
  HfReader(const Json& object, std::string where) : object_(object), where_(std::move(where)) {}

  bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }

  /// An integer >= `minimum` (and at most INT_MAX); absent or null: `fallback`, or refused when there is none.
  int integer(const char* key, int minimum, std::optional<int> fallback = std::nullopt) const {
    const std::string expected = minimum == 1 && !fallback
                                     ? "a positive integer"
                                     : "an integer >= " + std::to_string(minimum) + (fallback ? " or null" : "");
    if (!has(key)) {
      if (fallback) return *fallback;
      refuse(key, "absent", expected);
    }
    const Json& v = object_.at(key);
    if (!v.is_number_integer() || v.get<std::int64_t>() < minimum ||
        v.get<std::int64_t>() > std::numeric_limits<int>::max())
      refuse(key, v.dump(), expected);
    return v.get<int>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const Json& v = object_.at(key);
    if (!v.is_number()) refuse(key, v.dump(), "a number");
    return v.get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const Json& v = object_.at(key);
    if (!v.is_boolean()) refuse(key, v.dump(), "true or false");
    return v.get<bool>();
  }
  std::string text(const char* key) const {
    const Json& v = object_.at(key);
    if (!v.is_string()) refuse(key, v.dump(), "a string");
    return v.get<std::string>();
  }

  [[noreturn]] void refuse(const std::string& key, const std::string& value, const std::string& expected) const {
    throw InvalidArgument("mlacp::mla_config_from_hf: " + where_ + ": " + key + " = " + value + "; expected " +
                          expected);
  }

 private:
  const Json& object_;
  std::string where_;
};

/// The rope scaling's object: rope_scaling, or rope_parameters (newer transformers); null when neither is set.
const Json* rope_scaling_of(const Json& cfg, std::string& key) {
  for (const char* k : {"rope_scaling", "rope_parameters"}) {
    if (cfg.contains(k) && !cfg.at(k).is_null()) {
      key = k;
      return &cfg.at(k);
    }
  }
  return nullptr;
}

void apply_rope_scaling(MlaConfig& c, const Json& cfg, const HfReader& top, const std::string& where) {
  std::string key;
  const Json* scaling = rope_scaling_of(cfg, key);
  if (scaling == nullptr) return;
  if (!scaling->is_object()) top.refuse(key, scaling->dump(), "an object or null");
  const HfReader r(*scaling, where + ": " + key);
  // rope_parameters may carry the base itself (newer transformers).
  c.rope_base = r.number("rope_theta", c.rope_base);
  std::string type = "default";
  for (const char* k : {"type", "rope_type"}) {
    if (r.has(k)) type = r.text(k);
  }
  if (type == "default") return;
  if (type != "yarn")
    r.refuse("type", "'" + type + "'",
             "'yarn' (DeepSeek-V2/V3's scaling) or 'default': mlacp implements no other rope scaling");
  c.rope_factor = r.number("factor", 1.0);
  c.rope_original_max_position = r.has("original_max_position_embeddings")
                                     ? r.integer("original_max_position_embeddings", 0, 0)
                                     : top.integer("max_position_embeddings", 0, 0);
  c.rope_beta_fast = r.number("beta_fast", 32.0);
  c.rope_beta_slow = r.number("beta_slow", 1.0);
  c.rope_mscale = r.number("mscale", 0.0);
  c.rope_mscale_all_dim = r.number("mscale_all_dim", 0.0);
  c.rope_attention_factor = r.number("attention_factor", 0.0);
}

}  // namespace

void apply_hf_config(MlaConfig& c, const std::string& json_text, const std::string& where) {
  Json cfg;
  try {
    cfg = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    throw InvalidArgument("mlacp::mla_config_from_hf: " + where + " is not JSON: " + e.what());
  }
  if (!cfg.is_object())
    throw InvalidArgument("mlacp::mla_config_from_hf: " + where + " holds " + std::string(cfg.type_name()) +
                          "; expected a JSON object (a Hugging Face config.json)");
  const HfReader r(cfg, where);
  if (r.flag("attention_bias", false))
    r.refuse("attention_bias", "true",
             "false: Hugging Face's attention_bias puts biases on q_a_proj, kv_a_proj_with_mqa and o_proj, which "
             "mlacp's layer does not have (its optional biases are on q, kv_b and o)");
  MlaConfig out = c;
  out.hidden = r.integer("hidden_size", 1);
  out.heads = r.integer("num_attention_heads", 1);
  out.q_lora_rank = r.integer("q_lora_rank", 0, 0);
  out.latent = r.integer("kv_lora_rank", 1);
  out.nope = r.integer("qk_nope_head_dim", 1);
  out.rope = r.integer("qk_rope_head_dim", 1);
  out.vdim = r.integer("v_head_dim", 1);
  out.rope_base = r.number("rope_theta", 10000.0);
  out.rope_interleave = r.flag("rope_interleave", true);
  out.rms_eps = 1e-6;  // the attention's two RMSNorms (rms_norm_eps is the decoder's)
  out.rope_factor = 1.0;
  apply_rope_scaling(out, cfg, r, where);
  out.softmax_scale =
      out.rope_factor == 1.0 ? 0.0 : yarn_softmax_scale(out.rope_factor, out.rope_mscale_all_dim, out.qk_dim());
  if (const std::string why = out.yarn_error(); !why.empty())
    throw InvalidArgument("mlacp::mla_config_from_hf: " + where + ": " + why);
  c = out;
}

MlaConfig mla_config_from_hf_json(const std::string& json_text, int batch, int seq, const std::string& where) {
  MlaConfig c;
  c.batch = batch;
  c.seq = seq;
  apply_hf_config(c, json_text, where);
  return c;
}

void apply_hf_config_file(MlaConfig& config, const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw InvalidArgument("mlacp::mla_config_from_hf: cannot read '" + path + "'; expected a Hugging Face config.json");
  std::ostringstream text;
  text << in.rdbuf();
  apply_hf_config(config, text.str(), path);
}

MlaConfig mla_config_from_hf_file(const std::string& path, int batch, int seq) {
  MlaConfig c;
  c.batch = batch;
  c.seq = seq;
  apply_hf_config_file(c, path);
  return c;
}

}  // namespace mlacp
