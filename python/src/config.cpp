// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MlaConfig (the same field names as the C++ struct), MlaStrategy and MlaRequiresGrad.
#include <mlacp/error.hpp>
#include <mlacp/mla/config.hpp>
#include <mlacp/mla/weights.hpp>

#include <pybind11/stl.h>

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

std::string repr(const MlaConfig& c) {
  auto flag = [](bool b) { return b ? std::string("True") : std::string("False"); };
  return "mlacp.MlaConfig(batch=" + std::to_string(c.batch) + ", seq=" + std::to_string(c.seq) +
         ", hidden=" + std::to_string(c.hidden) + ", heads=" + std::to_string(c.heads) +
         ", nope=" + std::to_string(c.nope) + ", rope=" + std::to_string(c.rope) + ", vdim=" + std::to_string(c.vdim) +
         ", latent=" + std::to_string(c.latent) + ", q_lora_rank=" + std::to_string(c.q_lora_rank) +
         ", softmax_scale=" + py::repr(py::float_(c.softmax_scale)).cast<std::string>() + ", bias=" + flag(c.bias) +
         ", strategy='" + to_string(c.strategy) +
         "', rope_base=" + py::repr(py::float_(c.rope_base)).cast<std::string>() +
         ", rms_eps=" + py::repr(py::float_(c.rms_eps)).cast<std::string>() + ", overlap=" + flag(c.overlap) +
         ", ring_layout='" + to_string(c.ring_layout) + "'" +
         (c.cu_seqlens.empty() ? std::string()
                               : ", cu_seqlens=" + py::repr(py::cast(c.cu_seqlens)).cast<std::string>()) +
         ")";
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

  const MlaConfig defaults;
  py::class_<MlaConfig>(m, "MlaConfig",
                        "The dimensions of one MLA block (mlacp::MlaConfig; seq is the global sequence length S).")
      .def(py::init([](int batch, int seq, int hidden, int heads, int nope, int rope, int vdim, int latent,
                       int q_lora_rank, double softmax_scale, bool bias, const py::object& strategy, double rope_base,
                       double rms_eps, bool overlap, std::vector<std::int64_t> cu_seqlens,
                       const py::object& ring_layout) {
             MlaConfig c;
             c.batch = batch;
             c.seq = seq;
             c.hidden = hidden;
             c.heads = heads;
             c.nope = nope;
             c.rope = rope;
             c.vdim = vdim;
             c.latent = latent;
             c.q_lora_rank = q_lora_rank;
             c.softmax_scale = softmax_scale;
             c.bias = bias;
             c.strategy = strategy_of(strategy);
             c.rope_base = rope_base;
             c.rms_eps = rms_eps;
             c.overlap = overlap;
             c.cu_seqlens = std::move(cu_seqlens);
             c.ring_layout = ring_layout_of(ring_layout);
             return c;
           }),
           py::kw_only(), py::arg("batch") = 0, py::arg("seq") = 0, py::arg("hidden") = 0, py::arg("heads") = 0,
           py::arg("nope") = 0, py::arg("rope") = 0, py::arg("vdim") = 0, py::arg("latent") = 0,
           py::arg("q_lora_rank") = defaults.q_lora_rank, py::arg("softmax_scale") = defaults.softmax_scale,
           py::arg("bias") = defaults.bias, py::arg("strategy") = "latent", py::arg("rope_base") = defaults.rope_base,
           py::arg("rms_eps") = defaults.rms_eps, py::arg("overlap") = defaults.overlap,
           py::arg("cu_seqlens") = std::vector<std::int64_t>{},
           py::arg("ring_layout") = to_string(defaults.ring_layout))
      .def(py::init<const MlaConfig&>(), py::arg("other"), "A copy.")
      .def_readwrite("batch", &MlaConfig::batch)
      .def_readwrite("seq", &MlaConfig::seq)
      .def_readwrite("hidden", &MlaConfig::hidden)
      .def_readwrite("heads", &MlaConfig::heads)
      .def_readwrite("nope", &MlaConfig::nope)
      .def_readwrite("rope", &MlaConfig::rope)
      .def_readwrite("vdim", &MlaConfig::vdim)
      .def_readwrite("latent", &MlaConfig::latent)
      .def_readwrite("q_lora_rank", &MlaConfig::q_lora_rank,
                     "Rq: 0 projects the query with one dense w_q; > 0 factors it (w_qa, g_q, w_qb; docs/spec.md "
                     "step 1)")
      .def_readwrite("softmax_scale", &MlaConfig::softmax_scale,
                     "The attention's softmax scale: 0 means 1/sqrt(nope + rope), a positive value replaces it")
      .def_readwrite("bias", &MlaConfig::bias)
      .def_property(
          "strategy", [](const MlaConfig& c) { return c.strategy; },
          [](MlaConfig& c, const py::object& s) { c.strategy = strategy_of(s); }, "MlaStrategy or 'latent'/'expanded'")
      .def_readwrite("rope_base", &MlaConfig::rope_base)
      .def_readwrite("rms_eps", &MlaConfig::rms_eps)
      .def_readwrite("overlap", &MlaConfig::overlap)
      .def_readwrite("cu_seqlens", &MlaConfig::cu_seqlens,
                     "Packed documents: offsets 0 < ... < seq over the global sequence (empty: one document)")
      .def_property(
          "ring_layout", [](const MlaConfig& c) { return c.ring_layout; },
          [](MlaConfig& c, const py::object& l) { c.ring_layout = ring_layout_of(l); },
          "The ring's token layout on a two-level mesh: RingLayout or 'contiguous'/'zigzag' (mlacp.TokenMap)")
      .def("qk_dim", &MlaConfig::qk_dim)
      .def("q_lora", &MlaConfig::q_lora, "Whether the query is factored (q_lora_rank > 0).")
      .def("attention_scale", &MlaConfig::attention_scale,
           "The softmax scale the attention uses: softmax_scale when set (> 0), else 1/sqrt(nope + rope).")
      .def("error", &MlaConfig::error, py::arg("group_size"),
           "Why this configuration cannot run on a group of group_size ranks ('' when it can).")
      .def("describe", &MlaConfig::describe)
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
