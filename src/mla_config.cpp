// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mla/config.hpp>
#include <mlacp/mla/document_layout.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <utility>

namespace mlacp {

const char* to_string(MlaStrategy strategy) noexcept { return strategy == MlaStrategy::latent ? "latent" : "expanded"; }

MlaStrategy parse_strategy(const std::string& name) {
  if (name == "latent") return MlaStrategy::latent;
  if (name == "expanded") return MlaStrategy::expanded;
  throw InvalidArgument("mlacp: strategy '" + name + "' is not known; expected 'latent' or 'expanded'");
}

const char* to_string(WireDtype wire) noexcept {
  switch (wire) {
    case WireDtype::bfloat16:
      return "bf16";
    case WireDtype::bfloat16_all:
      return "bf16_all";
    case WireDtype::same:
      break;
  }
  return "same";
}

WireDtype parse_wire_dtype(const std::string& name) {
  if (name == "same") return WireDtype::same;
  if (name == "bf16") return WireDtype::bfloat16;
  if (name == "bf16_all") return WireDtype::bfloat16_all;
  throw InvalidArgument("mlacp: wire dtype '" + name + "' is not known; expected 'same', 'bf16' or 'bf16_all'");
}

const char* to_string(RingLayout layout) noexcept { return layout == RingLayout::contiguous ? "contiguous" : "zigzag"; }

RingLayout parse_ring_layout(const std::string& name) {
  if (name == "contiguous") return RingLayout::contiguous;
  if (name == "zigzag") return RingLayout::zigzag;
  throw InvalidArgument("mlacp: ring layout '" + name + "' is not known; expected 'contiguous' or 'zigzag'");
}

std::string MlaConfig::error(int /*group_size: any positive S and H run on any group*/) const {
  std::ostringstream out;
  const std::pair<const char*, int> dims[] = {{"batch", batch}, {"seq", seq},   {"hidden", hidden}, {"heads", heads},
                                              {"nope", nope},   {"rope", rope}, {"vdim", vdim},     {"latent", latent}};
  for (const auto& [name, value] : dims) {
    if (value <= 0) {
      out << "mlacp::MlaConfig: " << name << " = " << value << "; expected a positive size";
      return out.str();
    }
  }
  // Products the layer computes in int (GEMM dimensions, token rows) must fit in it: a wrapped size would allocate or
  // index the wrong amount.
  const std::pair<const char*, std::int64_t> products[] = {
      {"batch * seq (token rows)", std::int64_t{batch} * seq},
      {"nope + rope (qk_head_dim)", std::int64_t{nope} + rope},
      {"nope + vdim", std::int64_t{nope} + vdim},
      {"latent + rope (w_kva's rows)", std::int64_t{latent} + rope},
      {"heads * (nope + rope) (w_q's rows)", std::int64_t{heads} * (std::int64_t{nope} + rope)},
      {"heads * (nope + vdim) (w_kvb's rows)", std::int64_t{heads} * (std::int64_t{nope} + vdim)},
      {"heads * vdim (w_o's columns)", std::int64_t{heads} * vdim}};
  for (const auto& [name, value] : products) {
    if (value > std::numeric_limits<int>::max()) {
      out << "mlacp::MlaConfig: " << name << " = " << value << " (" << describe()
          << "); expected at most INT_MAX = " << std::numeric_limits<int>::max();
      return out.str();
    }
  }
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
  } else if (max_documents < 1) {
    out << "mlacp::MlaConfig: max_documents = " << max_documents << "; expected a positive count of documents";
  } else {
    out << cu_seqlens_error(cu_seqlens, seq, "MlaConfig");
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

std::string MlaConfig::describe() const {
  std::ostringstream out;
  out << "B=" << batch << " S=" << seq << " D=" << hidden << " H=" << heads << " dn=" << nope << " dr=" << rope
      << " dv=" << vdim << " R=" << latent << " bias=" << (bias ? "yes" : "no") << " strategy=" << to_string(strategy)
      << " wire=" << to_string(wire_dtype) << " ring_layout=" << to_string(ring_layout);
  if (q_lora_rank != 0) out << " Rq=" << q_lora_rank;
  if (softmax_scale != 0) out << " softmax_scale=" << softmax_scale;
  if (!cu_seqlens.empty()) out << " documents=" << cu_seqlens.size() - 1;
  return out.str();
}

}  // namespace mlacp
