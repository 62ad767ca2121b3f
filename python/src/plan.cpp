// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The planner (mlacp/model/planner.hpp) and the machine file (mlacp/model/machine.hpp) for mlacp.plan and
// mlacp.read_machine (python/mlacp/plan.py): the plan's rows as dicts, the same table mlacp-plan prints. Host logic
// only: no Kokkos, no MPI.
#include <mlacp/error.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/model/machine.hpp>
#include <mlacp/model/planner.hpp>

#include <pybind11/stl.h>

#include "bindings.hpp"

namespace mlacp::python {
namespace py = pybind11;

namespace {

// One row as mlacp.plan returns it (python/mlacp/plan.py documents the keys).
py::dict row_dict(const model::PlanRow& row) {
  const model::Prediction& p = row.prediction;
  py::dict d;
  d["choice"] = p.choice.describe();
  d["strategy"] = to_string(p.choice.strategy);
  d["ulysses"] = p.choice.ulysses;
  d["ring"] = p.choice.ring;
  d["layout"] = p.choice.ring > 1 ? py::object(py::str(to_string(p.choice.layout))) : py::object(py::none());
  d["forward_s"] = p.forward_s;
  d["backward_s"] = p.backward_s;
  d["total_s"] = p.total_s();
  d["compute_s"] = p.compute_s;
  d["communication_s"] = p.communication_s;
  d["exposed_s"] = p.exposed_s;
  d["hidden_fraction"] = p.hidden_fraction;
  d["bytes_intra"] = p.bytes.intra;
  d["bytes_inter"] = p.bytes.inter;
  d["memory_bytes"] = p.memory.total();
  d["fits"] = row.fits;
  d["why_not"] = row.why_not;
  return d;
}

std::string non_negative(const char* name, long long value, const char* expected) {
  if (value >= 0) return "";
  return std::string("mlacp.plan: ") + name + "=" + std::to_string(value) + "; expected " + expected;
}

}  // namespace

void bind_plan(py::module_& m) {
  m.def(
      "_plan",
      [](const MlaConfig& config, const std::string& dtype, int nodes, int ranks_per_node,
         const std::string& machine_path, const std::string& machine_json, double memory_per_rank, int q_lora,
         const py::object& strategy, int ring, const py::object& layout) {
        model::PlanRequest request;
        request.config = config;
        request.dtype = model::parse_dtype(dtype);
        if (nodes < 1 || ranks_per_node < 1)
          throw InvalidArgument("mlacp.plan: nodes=" + std::to_string(nodes) +
                                ", ranks_per_node=" + std::to_string(ranks_per_node) + "; expected both at least 1");
        request.cluster.nodes = nodes;
        request.cluster.ranks_per_node = ranks_per_node;
        if (!(memory_per_rank >= 0))
          throw InvalidArgument(
              "mlacp.plan: memory_per_rank=" + py::repr(py::float_(memory_per_rank)).cast<std::string>() +
              "; expected bytes >= 0 (0: the machine's memory per rank)");
        request.memory_per_rank = memory_per_rank;
        for (const std::string& error : {non_negative("q_lora", q_lora, "Rq >= 1, or 0 for a full-rank w_q"),
                                         non_negative("ring", ring, "C >= 1, or 0 for any")})
          if (!error.empty()) throw InvalidArgument(error);
        if (q_lora > 0) request.config.q_lora_rank = q_lora;  // else the configuration's own
        request.ring = ring;
        if (!strategy.is_none())
          request.strategy = py::isinstance<py::str>(strategy) ? parse_strategy(strategy.cast<std::string>())
                                                               : strategy.cast<MlaStrategy>();
        if (!layout.is_none()) request.layout = ring_layout_of(layout);
        // A file (read_machine names it in its errors) or the JSON text of a dict (plan.py's json.dumps).
        const model::MachineParams params = machine_path.empty()
                                                ? model::machine_from_json(machine_json, "mlacp.plan: machine")
                                                : model::read_machine(machine_path);

        const model::Plan plan = model::plan(request, params);
        py::list rows;
        for (const model::PlanRow& row : plan.rows) rows.append(row_dict(row));
        py::dict out;
        out["rows"] = rows;
        out["machine"] = plan.machine;
        out["budget"] = plan.budget;
        out["text"] = model::format_plan(plan);
        out["json"] = model::plan_to_json(plan);
        return out;
      },
      py::arg("config"), py::arg("dtype"), py::arg("nodes"), py::arg("ranks_per_node"), py::arg("machine_path"),
      py::arg("machine_json"), py::arg("memory_per_rank"), py::arg("q_lora"), py::arg("strategy"), py::arg("ring"),
      py::arg("layout"),
      "The planner (use mlacp.plan): {'rows': [...], 'machine', 'budget', 'text' (format_plan), 'json' "
      "(plan_to_json)}; the machine from machine_path when it is not empty, else from the JSON text machine_json.");
  m.def(
      "_read_machine", [](const std::string& path) { return model::machine_to_json(model::read_machine(path)); },
      py::arg("path"), "A machine file, read, checked and written back as JSON text (use mlacp.read_machine).");
}

}  // namespace mlacp::python
