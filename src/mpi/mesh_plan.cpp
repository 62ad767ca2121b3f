// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/model/mesh_plan.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/mpi/communicator.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <vector>

namespace mlacp::model {
namespace {

CollectiveInfo info_of(const std::string& name, const std::string& operation) {
  CollectiveInfo info;
  info.name = name;
  info.operation = operation;
  return info;
}

// "1234 bytes (1.18 MiB)".
std::string bytes_text(double bytes) {
  std::ostringstream out;
  out << std::setprecision(15) << bytes << " bytes (" << std::setprecision(4) << bytes / (1024.0 * 1024.0) << " MiB)";
  return out.str();
}

// FNV-1a, 64 bits: a fingerprint of the planner's inputs, for the agreement.
std::uint64_t fingerprint(const std::string& text) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const unsigned char ch : text) {
    hash ^= ch;
    hash *= 1099511628211ull;
  }
  return hash;
}

// Everything the plan depends on (the strategy and the ring layout are not: the plan chooses them).
std::string planner_inputs(const MlaConfig& c, Dtype dtype, const MachineParams& machine, double memory_per_rank) {
  std::ostringstream out;
  out << std::setprecision(17) << c.batch << ' ' << c.seq << ' ' << c.hidden << ' ' << c.heads << ' ' << c.nope << ' '
      << c.rope << ' ' << c.vdim << ' ' << c.latent << ' ' << c.bias << ' ' << c.overlap << ' ' << c.rope_base << ' '
      << c.rms_eps << ' ' << c.max_documents << ' ' << to_string(c.wire_dtype) << " cu_seqlens";
  for (const auto offset : c.cu_seqlens) out << ' ' << offset;
  out << " dtype " << to_string(dtype) << " memory_per_rank " << memory_per_rank << '\n' << machine_to_json(machine);
  return out.str();
}

// "ranks 0, 1, 3".
std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// This rank's outcome: the plan and its first choice, or why there is none.
struct Outcome {
  PlannedMesh planned;
  std::string error;  // "" when planned holds the choice
};

Outcome plan_here(const MlaConfig& config, Dtype dtype, const MachineParams& machine, double memory_per_rank,
                  const Cluster& cluster) {
  Outcome out;
  out.planned.cluster = cluster;
  try {
    PlanRequest request;
    request.config = config;
    request.dtype = dtype;
    request.cluster = cluster;
    request.memory_per_rank = memory_per_rank;
    out.planned.plan = plan(request, machine);
    const Plan& p = out.planned.plan;
    if (const PlanRow* best = p.best()) {
      out.planned.choice = best->prediction.choice;
      return out;
    }
    const std::string where = "mlacp::model::plan_mesh: " + config.describe() + " in " + to_string(dtype) + " on " +
                              std::to_string(cluster.nodes) + " node(s) x " + std::to_string(cluster.ranks_per_node) +
                              " rank(s)";
    if (p.rows.empty()) {
      out.error = where + ": the planner found no choice that can run it";
      return out;
    }
    const auto smallest = std::min_element(p.rows.begin(), p.rows.end(), [](const PlanRow& a, const PlanRow& b) {
      return a.prediction.memory.total() < b.prediction.memory.total();
    });
    out.error = where + ": no choice fits the memory budget of " + bytes_text(p.budget) +
                " per rank; the smallest need is " + bytes_text(smallest->prediction.memory.total()) + " per rank (" +
                smallest->prediction.choice.describe() + ")";
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  if (out.error.empty()) out.error = "mlacp::model::plan_mesh: the planner failed without a message";
  return out;
}

}  // namespace

Cluster cluster_of(MPI_Comm comm) {
  const std::string what = "mlacp::model::cluster_of: MPI_Iallgather of the ranks' nodes";
  const std::int64_t leader = mpi::node_leader(comm);
  const auto leaders = mpi::allgather(comm, {leader}, info_of("cluster_of", what), what);
  // The nodes in order of their first rank, and the ranks of each.
  std::vector<std::int64_t> nodes;
  std::vector<int> first_rank, ranks;
  for (std::size_t r = 0; r < leaders.size(); ++r) {
    const auto it = std::find(nodes.begin(), nodes.end(), leaders[r]);
    if (it == nodes.end()) {
      nodes.push_back(leaders[r]);
      first_rank.push_back(static_cast<int>(r));
      ranks.push_back(1);
    } else {
      ++ranks[static_cast<std::size_t>(it - nodes.begin())];
    }
  }
  // Every rank holds the same list, so every rank finds the same verdict.
  if (std::any_of(ranks.begin(), ranks.end(), [&](int n) { return n != ranks.front(); })) {
    std::ostringstream text;
    text << "mlacp::model::cluster_of: the nodes hold different numbers of ranks (";
    for (std::size_t i = 0; i < nodes.size(); ++i)
      text << (i ? ", " : "") << "the node of rank " << first_rank[i] << ": " << ranks[i]
           << (ranks[i] == 1 ? " rank" : " ranks");
    text << "); the performance model needs the same number of ranks on every node";
    throw InvalidArgument(text.str());
  }
  Cluster cluster;
  cluster.nodes = static_cast<int>(nodes.size());
  cluster.ranks_per_node = ranks.front();
  return cluster;
}

MachineParams read_machine(MPI_Comm comm, const std::string& path) {
  const std::string what = "mlacp::model::read_machine: MPI_Ibcast of " + path;
  const auto info = info_of("read_machine", what);
  // Rank 0 reads: [1, length] and the text, or [0, length] and why not.
  std::string text;
  std::int64_t header[2] = {0, 0};
  if (mpi::rank(comm) == 0) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream contents;
    if (in) contents << in.rdbuf();
    if (in && !in.bad()) {
      text = contents.str();
      header[0] = 1;
    } else {
      text = "mlacp::model::read_machine: cannot read " + path + " (on rank 0): " + std::strerror(errno);
    }
    header[1] = static_cast<std::int64_t>(text.size());
  }
  mpi::broadcast(comm, header, sizeof header, 0, info, what);
  text.resize(static_cast<std::size_t>(header[1]));
  if (header[1] > 0) mpi::broadcast(comm, text.data(), static_cast<int>(header[1]), 0, info, what);
  if (header[0] == 0) throw InvalidArgument(text);
  return machine_from_json(text, path);  // the same text on every rank: the same result, or the same error
}

PlannedMesh plan_mesh(MPI_Comm comm, const MlaConfig& config, Dtype dtype, const MachineParams& machine,
                      double memory_per_rank) {
  const Cluster cluster = cluster_of(comm);
  Outcome here = plan_here(config, dtype, machine, memory_per_rank, cluster);

  // One allgather agrees on the outcome: [failed, message length, fingerprint of the inputs, the choice].
  const std::string what = "mlacp::model::plan_mesh: MPI_Iallgather of the ranks' plans";
  const Choice& c = here.planned.choice;
  const std::vector<std::int64_t> mine = {
      here.error.empty() ? 0 : 1,
      static_cast<std::int64_t>(here.error.size()),
      static_cast<std::int64_t>(fingerprint(planner_inputs(config, dtype, machine, memory_per_rank))),
      static_cast<std::int64_t>(c.strategy),
      c.ulysses,
      c.ring,
      static_cast<std::int64_t>(c.layout)};
  constexpr std::size_t fields = 7;
  const auto all = mpi::allgather(comm, mine, info_of("plan_mesh", what), what);
  const int P = static_cast<int>(all.size() / fields);
  auto field = [&](int r, std::size_t f) { return all[static_cast<std::size_t>(r) * fields + f]; };

  // Different inputs: the ranks would plan different layers; name the ranks of each.
  std::vector<std::int64_t> prints;
  std::vector<std::vector<int>> ranks_of_print;
  for (int r = 0; r < P; ++r) {
    const auto it = std::find(prints.begin(), prints.end(), field(r, 2));
    if (it == prints.end()) {
      prints.push_back(field(r, 2));
      ranks_of_print.push_back({r});
    } else {
      ranks_of_print[static_cast<std::size_t>(it - prints.begin())].push_back(r);
    }
  }
  if (prints.size() > 1) {
    std::string text =
        "mlacp::model::plan_mesh: the ranks passed different inputs (the layer, the dtype, the memory "
        "budget or the machine parameters): ";
    for (std::size_t i = 0; i < ranks_of_print.size(); ++i)
      text += (i ? "; " : "") + ranks_text(ranks_of_print[i]) + " one set";
    throw InvalidArgument(text + "; every rank must plan the same layer");
  }

  // A failure (the same on every rank, the plan being deterministic): the lowest failing rank's message, everywhere.
  std::vector<int> failed;
  for (int r = 0; r < P; ++r)
    if (field(r, 0) != 0) failed.push_back(r);
  if (!failed.empty()) {
    const int root = failed.front();
    std::string message = here.error;
    message.resize(static_cast<std::size_t>(field(root, 1)));
    if (!message.empty())
      mpi::broadcast(comm, message.data(), static_cast<int>(message.size()), root,
                     info_of("plan_mesh", "mlacp::model::plan_mesh: MPI_Ibcast of the failure"),
                     "mlacp::model::plan_mesh: MPI_Ibcast of the failure");
    if (static_cast<int>(failed.size()) < P)
      message += " (on " + ranks_text(failed) + " only: the planner is not deterministic here)";
    throw InvalidArgument(message);
  }

  // The same inputs plan the same choice; should floating point differ between the ranks' hosts, rank 0's choice
  // is everyone's (the mesh and the layer need the same on every rank).
  Choice& choice = here.planned.choice;
  choice.strategy = static_cast<MlaStrategy>(field(0, 3));
  choice.ulysses = static_cast<int>(field(0, 4));
  choice.ring = static_cast<int>(field(0, 5));
  choice.layout = static_cast<RingLayout>(field(0, 6));
  return here.planned;
}

MlaConfig apply(const Choice& choice, MlaConfig config) {
  config.strategy = choice.strategy;
  config.ring_layout = choice.layout;
  return config;
}

}  // namespace mlacp::model
