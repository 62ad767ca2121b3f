// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MlaConfig's dimensions as the tools' JSON writes them, from config_fields.hpp's table: each size field and the
// query's rank under its symbol (B, S, D, H, dn, dr, dv, R, Rq: docs/spec.md's names), in the table's order. The
// readers of the tools' JSON (perf_tests/peers/*.py, scripts/*.py) know these keys.
#pragma once

#include <mlacp/mla/config_fields.hpp>
#include <mlacp/mla/mla_config.hpp>

#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

namespace mlacp::tools {

inline nlohmann::ordered_json config_dims_json(const MlaConfig& c) {
  nlohmann::ordered_json dims = nlohmann::ordered_json::object();
  for_each_config_field(c, [&](const ConfigField& field, const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, int>) {
      if (field.size || std::string(field.name) == "q_lora_rank") dims[field.symbol] = value;
    }
  });
  return dims;
}

}  // namespace mlacp::tools
