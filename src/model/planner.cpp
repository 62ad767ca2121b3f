// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/model/planner.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace mlacp::model {

const PlanRow* Plan::best() const {
  for (const PlanRow& r : rows)
    if (r.fits) return &r;
  return nullptr;
}

namespace {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

/// Bytes as MiB or GiB, whichever reads better.
std::string size_text(double bytes) {
  const double mib = bytes / (1024.0 * 1024.0);
  if (mib >= 10 * 1024) return fixed(mib / 1024, 1) + " GiB";
  return fixed(mib, mib >= 100 ? 0 : 1) + " MiB";
}

/// Seconds as ms (s above 10 s).
std::string time_text(double s) {
  return s >= 10 ? fixed(s, 2) + " s" : fixed(s * 1e3, s * 1e3 >= 100 ? 1 : 3) + " ms";
}

/// A number for a message, to nine digits.
std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

Plan plan(const PlanRequest& request, const MachineParams& machine) {
  const Cluster& cluster = request.cluster;
  if (cluster.nodes < 1 || cluster.ranks_per_node < 1)
    throw InvalidArgument("mlacp::model::plan: cluster of " + std::to_string(cluster.nodes) + " nodes x " +
                          std::to_string(cluster.ranks_per_node) + " ranks per node: expected at least 1 of each");
  const int P = cluster.ranks();
  std::string config_error = request.config.error(P);
  if (config_error.empty()) config_error = request.config.shape_error();
  if (!config_error.empty()) throw InvalidArgument("mlacp::model::plan: " + config_error);
  const std::string machine_error = machine.error();
  if (!machine_error.empty())
    throw InvalidArgument("mlacp::model::plan: machine \"" + machine.name + "\": " + machine_error);
  if (request.memory_per_rank < 0)
    throw InvalidArgument("mlacp::model::plan: memory per rank " + number_text(request.memory_per_rank) +
                          ": expected a non-negative number of bytes (0: the machine's)");
  if (request.ring < 0 || (request.ring > 0 && P % request.ring != 0))
    throw InvalidArgument("mlacp::model::plan: ring " + std::to_string(request.ring) + ": expected a divisor of the " +
                          std::to_string(P) + " ranks (or 0: every one)");

  Plan out;
  out.request = request;
  out.machine = machine.name;
  out.budget = request.memory_per_rank > 0 ? request.memory_per_rank : machine.memory_per_rank_bytes;
  std::vector<MlaStrategy> strategies = {MlaStrategy::latent, MlaStrategy::expanded};
  if (request.strategy) strategies = {*request.strategy};
  for (MlaStrategy strategy : strategies)
    for (int C = 1; C <= P; ++C) {
      if (P % C != 0 || (request.ring > 0 && C != request.ring)) continue;
      std::vector<RingLayout> layouts = {RingLayout::zigzag};
      if (C > 1) layouts = {RingLayout::zigzag, RingLayout::contiguous};
      if (C > 1 && request.layout) layouts = {*request.layout};
      for (RingLayout layout : layouts) {
        Choice choice;
        choice.strategy = strategy;
        choice.ulysses = P / C;
        choice.ring = C;
        choice.layout = layout;
        MlaConfig config = request.config;
        config.strategy = strategy;
        config.ring_layout = layout;
        if (!choice_error(config, choice, cluster).empty()) continue;
        PlanRow row;
        row.prediction = predict(config, request.dtype, choice, cluster, machine);
        const double need = row.prediction.memory.total();
        if (out.budget > 0 && need > out.budget) {
          row.fits = false;
          row.why_not = "needs " + size_text(need) + " per rank, budget " + size_text(out.budget);
        }
        out.rows.push_back(std::move(row));
      }
    }
  std::stable_sort(out.rows.begin(), out.rows.end(), [](const PlanRow& a, const PlanRow& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return a.prediction.total_s() < b.prediction.total_s();
    return a.prediction.memory.total() < b.prediction.memory.total();
  });
  return out;
}

std::string format_plan(const Plan& plan) {
  const PlanRequest& r = plan.request;
  std::ostringstream s;
  s << "mlacp-plan: " << r.config.describe() << " dtype=" << to_string(r.dtype) << " on " << r.cluster.nodes
    << " node(s) x " << r.cluster.ranks_per_node << " rank(s) = " << r.cluster.ranks() << " ranks\n";
  s << "machine: " << plan.machine << "\n";
  s << "memory budget per rank: " << (plan.budget > 0 ? size_text(plan.budget) : std::string("none")) << "\n";
  s << "predictions of the performance model (mlacp/model/layer_model.hpp), ranked:\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-3s %-30s %11s %11s %11s %7s %11s %11s %11s  %s\n", "#", "choice", "forward",
                "backward", "total", "hidden", "intra/rank", "inter/rank", "memory", "fits");
  s << line;
  int i = 0;
  for (const PlanRow& row : plan.rows) {
    const Prediction& p = row.prediction;
    std::snprintf(line, sizeof line, "  %-3d %-30s %11s %11s %11s %6.0f%% %11s %11s %11s  %s\n", ++i,
                  p.choice.describe().c_str(), time_text(p.forward_s).c_str(), time_text(p.backward_s).c_str(),
                  time_text(p.total_s()).c_str(), 100 * p.hidden_fraction, size_text(p.bytes.intra).c_str(),
                  size_text(p.bytes.inter).c_str(), size_text(p.memory.total()).c_str(),
                  row.fits ? "yes" : ("no: " + row.why_not).c_str());
    s << line;
  }
  if (const PlanRow* best = plan.best()) {
    const Prediction& p = best->prediction;
    s << "recommendation: " << p.choice.describe() << ": predicted " << time_text(p.total_s()) << " per forward + "
      << "backward, " << size_text(p.memory.total()) << " per rank"
      << " (Mesh(comm, " << p.choice.ring << "), MlaConfig::strategy = " << to_string(p.choice.strategy);
    if (p.choice.ring > 1) s << ", ring_layout = " << to_string(p.choice.layout);
    s << ")\n";
  } else if (plan.rows.empty()) {
    s << "no choice can run this layer on this cluster\n";
  } else {
    s << "no choice fits: the smallest needs " << size_text(plan.rows.front().prediction.memory.total())
      << " per rank (" << plan.rows.front().prediction.choice.describe() << "), the budget is "
      << size_text(plan.budget) << "\n";
  }
  return s.str();
}

std::string plan_to_json(const Plan& plan) {
  // Keys in the order written: the request before the rows, each row's choice before its figures.
  using Json = nlohmann::ordered_json;
  const PlanRequest& r = plan.request;
  const MlaConfig& c = r.config;
  Json rows = Json::array();
  for (const PlanRow& row : plan.rows) {
    const Prediction& p = row.prediction;
    rows.push_back({{"strategy", to_string(p.choice.strategy)},
                    {"ulysses", p.choice.ulysses},
                    {"ring", p.choice.ring},
                    {"layout", p.choice.ring > 1 ? to_string(p.choice.layout) : "none"},
                    {"forward_s", p.forward_s},
                    {"backward_s", p.backward_s},
                    {"total_s", p.total_s()},
                    {"compute_s", p.compute_s},
                    {"communication_s", p.communication_s},
                    {"exposed_s", p.exposed_s},
                    {"hidden_fraction", p.hidden_fraction},
                    {"bytes_intra", p.bytes.intra},
                    {"bytes_inter", p.bytes.inter},
                    {"memory_bytes", p.memory.total()},
                    {"fits", row.fits},
                    {"why_not", row.why_not}});
  }
  const PlanRow* best = plan.best();
  const Json doc = {{"tool", "mlacp-plan"},
                    {"machine", plan.machine},
                    {"budget_bytes", plan.budget},
                    {"request",
                     {{"batch", c.batch},
                      {"seq", c.seq},
                      {"hidden", c.hidden},
                      {"heads", c.heads},
                      {"nope", c.nope},
                      {"rope", c.rope},
                      {"vdim", c.vdim},
                      {"latent", c.latent},
                      {"q_lora", c.q_lora_rank},
                      {"documents", c.cu_seqlens.empty() ? 1 : c.cu_seqlens.size() - 1},
                      {"dtype", to_string(r.dtype)},
                      {"nodes", r.cluster.nodes},
                      {"ranks_per_node", r.cluster.ranks_per_node}}},
                    {"rows", std::move(rows)},
                    {"best", best ? Json(best - plan.rows.data()) : Json()}};
  return doc.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace mlacp::model
