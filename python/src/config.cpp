// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MlaConfig (its fields from config_fields.hpp's table: the same names as the C++ struct), its enums and
// MlaRequiresGrad.
#include <mlacp/error.hpp>
#include <mlacp/mla/config_fields.hpp>
#include <mlacp/mla/hf_config.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/mla/weights.hpp>
#include <mlacp/mla/wire_policy.hpp>

#include <pybind11/stl.h>

#include <cstdint>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "bindings.hpp"

namespace mlacp::python {
namespace py = pybind11;

namespace {

// An MlaStrategy or its name ("latent" / "expanded"; InvalidArgument naming the value otherwise).
MlaStrategy strategy_of(const py::handle& value) {
  if (py::isinstance<py::str>(value)) return parse_strategy(value.cast<std::string>());
  return value.cast<MlaStrategy>();
}

}  // namespace

RingLayout ring_layout_of(const py::handle& value) {
  if (py::isinstance<py::str>(value)) return parse_ring_layout(value.cast<std::string>());
  return value.cast<RingLayout>();
}

namespace {

WireDtype wire_dtype_of(const py::handle& value) {
  if (py::isinstance<py::str>(value)) return parse_wire_dtype(value.cast<std::string>());
  return value.cast<WireDtype>();
}

// A field's value from Python: the enums also by name, the offsets from any sequence of ints. A value of another
// type is a TypeError naming the field.
template <class T>
T field_from(const char* name, const py::handle& value) {
  try {
    if constexpr (std::is_same_v<T, MlaStrategy>) {
      return strategy_of(value);
    } else if constexpr (std::is_same_v<T, RingLayout>) {
      return ring_layout_of(value);
    } else if constexpr (std::is_same_v<T, WireDtype>) {
      return wire_dtype_of(value);
    } else if constexpr (std::is_same_v<T, Bf16Compute>) {
      return py::isinstance<py::str>(value) ? parse_bf16_compute(value.cast<std::string>()) : value.cast<Bf16Compute>();
    } else {
      return value.cast<T>();
    }
  } catch (const py::cast_error&) {
    throw py::type_error(std::string("mlacp.MlaConfig: ") + name + " = " + py::repr(value).cast<std::string>() +
                         " has the wrong type (" + py::str(py::type::of(value)).cast<std::string>() + ")");
  }
}

// A field's value as Python writes it: enums as their quoted names.
template <class T>
std::string field_repr(const T& value) {
  if constexpr (std::is_enum_v<T>) {
    return std::string("'") + to_string(value) + "'";
  } else {
    return py::repr(py::cast(value)).template cast<std::string>();
  }
}

// mlacp.MlaConfig(field=value, ...) over config_fields.hpp's table; cu_seqlens only when set.
std::string repr(const MlaConfig& c) {
  std::string out = "mlacp.MlaConfig(";
  bool first = true;
  for_each_config_field(c, [&](const ConfigField& field, const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, std::vector<std::int64_t>>) {
      if (value.empty()) return;
    }
    out += (first ? "" : ", ") + std::string(field.name) + "=" + field_repr(value);
    first = false;
  });
  return out + ")";
}

// MlaConfig(**keywords): each keyword a field of the table; anything else is a TypeError naming it and the fields.
MlaConfig from_keywords(const py::kwargs& keywords) {
  MlaConfig c;
  std::size_t used = 0;
  for_each_config_field(c, [&](const ConfigField& field, auto& member) {
    if (!keywords.contains(field.name)) return;
    member = field_from<std::decay_t<decltype(member)>>(field.name, keywords[field.name]);
    ++used;
  });
  if (used != keywords.size()) {
    std::string names;
    std::set<std::string> known;
    for_each_config_member([&](const ConfigField& field, auto) {
      names += (names.empty() ? "" : ", ") + std::string(field.name);
      known.insert(field.name);
    });
    for (const auto& item : keywords) {
      const std::string key = py::str(item.first).cast<std::string>();
      if (known.count(key) == 0)
        throw py::type_error("mlacp.MlaConfig: unexpected keyword '" + key + "'; expected one of " + names);
    }
  }
  return c;
}

// MlaConfig.from_hf_config: a Hugging Face config as a path (str or os.PathLike: its file), a dict, or an object
// (transformers' PretrainedConfig: its to_dict(); any other: its attributes), read by mla/hf_config.hpp.
MlaConfig from_hf_config(const py::object& cfg, int batch, int seq) {
  const py::module_ os = py::module_::import("os");
  if (py::isinstance<py::str>(cfg) || py::isinstance(cfg, os.attr("PathLike")))
    return mla_config_from_hf_file(os.attr("fspath")(cfg).cast<std::string>(), batch, seq);
  py::object fields;
  if (py::isinstance<py::dict>(cfg))
    fields = cfg;
  else if (py::hasattr(cfg, "to_dict"))
    fields = cfg.attr("to_dict")();
  else if (py::hasattr(cfg, "__dict__"))
    fields = cfg.attr("__dict__");
  else
    throw py::type_error("mlacp.MlaConfig.from_hf_config: " + py::repr(cfg).cast<std::string>() +
                         "; expected a config.json path, a dict or a config object");
  // Values JSON cannot hold (a torch dtype among the unrelated keys) become their repr: the reader ignores the keys it
  // does not read and refuses a wrong type by name where it reads one.
  const std::string text = py::module_::import("json")
                               .attr("dumps")(fields, py::arg("default") = py::module_::import("builtins").attr("repr"))
                               .cast<std::string>();
  return mla_config_from_hf_json(text, batch, seq, "from_hf_config");
}

}  // namespace

void bind_config(py::module_& m) {
  py::enum_<MlaStrategy>(m, "MlaStrategy", "How keys and values reach the head-sharded attention (docs/spec.md).")
      .value("latent", MlaStrategy::latent)
      .value("expanded", MlaStrategy::expanded);
  py::enum_<RingLayout>(m, "RingLayout",
                        "Which global tokens each ring chunk holds on a two-level mesh (mlacp::RingLayout; "
                        "mlacp.TokenMap has the map).")
      .value("contiguous", RingLayout::contiguous)
      .value("zigzag", RingLayout::zigzag);
  // The values and their names from the wire policy's table (mla/wire_policy.hpp).
  py::enum_<WireDtype> wire_dtype(m, "WireDtype", "What a float layer's collectives move (mlacp::WireDtype).");
  for (const auto& row : wire_policies) wire_dtype.value(row.name, row.dtype);
  py::enum_<Bf16Compute>(m, "Bf16Compute", "How a bf16 layer computes (mlacp::Bf16Compute).")
      .value("auto", Bf16Compute::automatic)
      .value("bf16", Bf16Compute::bfloat16)
      .value("float", Bf16Compute::float32);

  auto config =
      py::class_<MlaConfig>(m, "MlaConfig",
                            "The dimensions and choices of one MLA block (mlacp::MlaConfig; seq is the global "
                            "sequence length S). Keyword arguments only, one per field (mlacp/mla/config_fields.hpp); "
                            "the enums also take their names ('latent', 'zigzag', 'bf16').")
          .def(py::init(&from_keywords))
          .def(py::init<const MlaConfig&>(), py::arg("other"), "A copy.");
  // One attribute per field of the table, read and written as the keywords are.
  for_each_config_member([&](const ConfigField& field, auto member) {
    using T = std::decay_t<decltype(MlaConfig().*member)>;
    const char* name = field.name;  // a string literal of the table: lives as long as the program
    config.def_property(
        field.name, [member](const MlaConfig& c) { return c.*member; },
        [member, name](MlaConfig& c, const py::object& value) { c.*member = field_from<T>(name, value); }, field.help);
  });
  config.def("qk_dim", &MlaConfig::qk_dim)
      .def("q_lora", &MlaConfig::q_lora, "Whether the query is factored (q_lora_rank > 0).")
      .def("attention_scale", &MlaConfig::attention_scale,
           "The softmax scale the attention uses: softmax_scale when set (> 0), else 1/sqrt(nope + rope).")
      .def("error", &MlaConfig::error, py::arg("group_size"),
           "Why this configuration cannot run on a group of group_size ranks ('' when it can).")
      .def("describe", &MlaConfig::describe)
      .def_static("from_hf_config", &from_hf_config, py::arg("cfg"), py::arg("batch") = 0, py::arg("seq") = 0,
                  "The attention of a Hugging Face DeepSeek-V2/V3 config (a config.json path, a dict or a config "
                  "object): dimensions, q_lora_rank, rope_theta, YaRN with its softmax scale, and rope_interleave "
                  "(True when the config has none: DeepSeek's checkpoints). The attention's RMSNorm eps stays 1e-6; "
                  "unrelated keys are ignored; attention_bias true and rope scalings other than yarn are refused by "
                  "name (mlacp/mla/hf_config.hpp). batch and seq: the layer's optional maxima (0: any shape per call).")
      .def("__repr__", &repr)
      .def("__copy__", [](const MlaConfig& c) { return c; })
      .def("__deepcopy__", [](const MlaConfig& c, const py::dict&) { return c; });

  // x's flag, then one per entry of the parameter table (parameter_table.hpp), by the entry's name.
  auto requires_grad =
      py::class_<MlaRequiresGrad>(m, "MlaRequiresGrad", "Which inputs, weights and biases need a gradient.")
          .def(py::init<>())
          .def_readwrite("x", &MlaRequiresGrad::x)
          .def_static("none", &MlaRequiresGrad::none);
  for (const ParameterInfo& info : parameter_table()) {
    bool MlaRequiresGrad::*flag = info.flag;
    requires_grad.def_property(
        info.name, [flag](const MlaRequiresGrad& r) { return r.*flag; },
        [flag](MlaRequiresGrad& r, bool value) { r.*flag = value; });
  }

  m.def(
      "parameter_table",
      [](const MlaConfig& c) {
        py::list rows;
        for (const ParameterInfo& info : parameter_table()) {
          const ParameterShape shape = info.shape(c);
          py::tuple extents(static_cast<std::size_t>(info.rank));
          for (int d = 0; d < info.rank; ++d) extents[static_cast<std::size_t>(d)] = shape[static_cast<std::size_t>(d)];
          const char* kind = info.kind == ParameterKind::weight ? "weight"
                             : info.kind == ParameterKind::bias ? "bias"
                                                                : "norm_gain";
          const char* gradient = info.gradient == GradientType::accumulation_type ? "accumulation" : "?";
          rows.append(py::make_tuple(info.name, extents, info.present(c), info.name, kind, gradient));
        }
        return rows;
      },
      py::arg("config"),
      "The parameter table (mlacp/mla/parameter_table.hpp) for a configuration: one (name, shape, present, flag, "
      "kind, gradient) per parameter, in registration order; flag names the MlaRequiresGrad field, kind is 'weight', "
      "'bias' or 'norm_gain', gradient the gradient's value type ('accumulation': float for bfloat16 weights, else the "
      "weight's dtype).");
}

}  // namespace mlacp::python
