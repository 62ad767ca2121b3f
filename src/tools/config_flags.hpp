// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MlaConfig's command-line flags for the tools, from config_fields.hpp's table: `--<field>` with '_' written '-'
// (--q-lora-rank, --rope-base, --max-documents, ...). A flag field is a switch: --bias sets bias (off by default),
// --no-overlap clears overlap (on by default). The spellings the tools always took stay as aliases (--q-lora,
// --blocking). A field added to the table is a flag of every tool that parses with this, without another edit.
#pragma once

#include <mlacp/mla/config_fields.hpp>
#include <mlacp/mla/hf_config.hpp>
#include <mlacp/mla/mla_config.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::tools {

/// `--<name>` of a table field ('_' as '-').
inline std::string flag_of(const char* name) {
  std::string flag = std::string("--") + name;
  for (char& ch : flag)
    if (ch == '_') ch = '-';
  return flag;
}

namespace detail {

/// `text` as a T, the whole of it; std::invalid_argument otherwise.
template <class T>
T parse_value(const std::string& text) {
  std::size_t used = 0;
  T value{};
  if constexpr (std::is_same_v<T, int>) {
    value = std::stoi(text, &used);
  } else if constexpr (std::is_same_v<T, double>) {
    value = std::stod(text, &used);
  } else if constexpr (std::is_same_v<T, MlaStrategy>) {
    return parse_strategy(text);
  } else if constexpr (std::is_same_v<T, WireDtype>) {
    return parse_wire_dtype(text);
  } else if constexpr (std::is_same_v<T, RingLayout>) {
    return parse_ring_layout(text);
  } else if constexpr (std::is_same_v<T, Bf16Compute>) {
    return parse_bf16_compute(text);
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    // Comma-separated offsets 0 < a < b < ... < S (checked with the configuration).
    std::size_t begin = 0;
    while (begin <= text.size()) {
      const std::size_t end = std::min(text.find(',', begin), text.size());
      value.push_back(parse_value<std::int64_t>(text.substr(begin, end - begin)));
      begin = end + 1;
    }
    return value;
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    value = std::stoll(text, &used);
  }
  if (used != text.size()) throw std::invalid_argument("trailing characters");
  return value;
}

/// What a value of T looks like, for the message of one that does not parse.
template <class T>
const char* expected_value() {
  if constexpr (std::is_same_v<T, int> || std::is_same_v<T, std::int64_t>)
    return "expected an integer";
  else if constexpr (std::is_same_v<T, double>)
    return "expected a number";
  else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>)
    return "expected comma-separated offsets 0,a,...,S";
  else
    return "not a valid value";
}

}  // namespace detail

/// Applies `flag` to `c` when it names a field of the table (or an alias): a switch directly, any other field from
/// the value `next()` returns (it consumes the next argument). --hf-config FILE sets the attention's fields from a
/// Hugging Face config.json (apply_hf_config_file; flags after it override them). Returns false, changing nothing, when
/// `flag` names no field. A value that does not parse is std::invalid_argument "FLAG VALUE: expected an integer" (a
/// number, offsets; mlacp::Error's message for the enums' names).
inline bool apply_config_flag(MlaConfig& c, std::string flag, const std::function<std::string()>& next) {
  if (flag == "--hf-config") {  // the attention's fields from a Hugging Face config.json (mla/hf_config.hpp)
    apply_hf_config_file(c, next());
    return true;
  }
  static const std::map<std::string, std::string> aliases = {{"--q-lora", "--q-lora-rank"},
                                                             {"--blocking", "--no-overlap"}};
  if (const auto alias = aliases.find(flag); alias != aliases.end()) flag = alias->second;
  const MlaConfig defaults;
  bool found = false;
  for_each_config_member([&](const ConfigField& field, auto pointer) {
    auto& member = c.*pointer;
    using T = std::decay_t<decltype(member)>;
    if (found) return;
    if constexpr (std::is_same_v<T, bool>) {
      const bool on_by_default = defaults.*pointer;
      const std::string name = flag_of(field.name);
      const std::string switch_flag = on_by_default ? "--no-" + name.substr(2) : name;
      if (flag != switch_flag) return;
      member = !on_by_default;
      found = true;
    } else {
      if (flag != flag_of(field.name)) return;
      found = true;
      const std::string value = next();
      try {
        member = detail::parse_value<T>(value);
      } catch (const std::logic_error&) {  // std::stoi's invalid_argument and out_of_range, our trailing characters
        throw std::invalid_argument(flag + " " + value + ": " + detail::expected_value<T>());
      }
    }
  });
  return found;
}

}  // namespace mlacp::tools
