// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The planner (planner.hpp) on the communicator a layer will run on: the cluster it spans, the planner's first choice
// agreed on every rank, and the configuration that runs it (src/mpi/mesh_plan.cpp):
//
//   auto machine = mlacp::model::read_machine(comm, "machine.json");  // collective: one read, the same on every rank
//   auto pm = mlacp::model::plan_mesh(comm, cfg, mlacp::model::Dtype::float32, machine);
//   mlacp::Mesh mesh(comm, pm.choice.ring);
//   mlacp::MlaAttention<float> layer(apply(pm.choice, cfg), weights, mesh);
#pragma once

#include <mpi.h>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/model/layer_model.hpp>
#include <mlacp/model/machine.hpp>
#include <mlacp/model/planner.hpp>

#include <string>

namespace mlacp::model {

/// The cluster `comm` runs on: its nodes by MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), and the ranks of each. Every
/// node must hold the same number of ranks, else every rank throws InvalidArgument naming the counts. Collective.
/// The model places a Ulysses group of U consecutive ranks inside a node (Mesh(comm, C) groups consecutive ranks), so
/// it describes the run when the ranks of a node are consecutive (mpirun's and srun's default block placement); with
/// another placement the chosen mesh still runs, but its groups cross nodes other than as modelled.
Cluster cluster_of(MPI_Comm comm);

/// read_machine(path) on rank 0 of `comm`, the file's text broadcast and parsed on every rank: the same parameters on
/// every rank, or the same InvalidArgument (the file cannot be read, or does not parse) on every rank. Collective.
MachineParams read_machine(MPI_Comm comm, const std::string& path);

/// The planner's first choice on comm's cluster, with its plan.
struct PlannedMesh {
  Choice choice;    ///< Mesh(comm, choice.ring) and apply(choice, config) run it
  Plan plan;        ///< every choice, ranked (format_plan prints it)
  Cluster cluster;  ///< cluster_of(comm)
};

/// Plans `config` (its strategy and ring_layout are ignored: the plan chooses them) in `dtype` on cluster_of(comm)
/// with `machine`, and returns the first choice that fits `memory_per_rank` bytes per rank (0: the machine's
/// memory_per_rank_bytes; 0 there too: no limit). Collective: every rank plans (the plan is deterministic) and one
/// small allgather agrees on the outcome, so that every rank returns the same choice, or every rank throws the same
/// InvalidArgument before the mesh or the layer runs a collective: when no choice fits the budget (naming the smallest
/// need, its choice and the budget), when the planner refuses the request (naming why), or when the ranks passed
/// different layers, dtypes, budgets or machines (naming the ranks).
PlannedMesh plan_mesh(MPI_Comm comm, const MlaConfig& config, Dtype dtype, const MachineParams& machine,
                      double memory_per_rank = 0);

/// `config` with the choice's strategy and ring_layout (the layout is ignored by a mesh with ring size 1).
MlaConfig apply(const Choice& choice, MlaConfig config);

}  // namespace mlacp::model
