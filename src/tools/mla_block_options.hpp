// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// mlacp-mla-block's command line: its options (Options), their parsing (the configuration's flags from the table,
// config_flags.hpp, and the tool's own) and their agreement over MPI_COMM_WORLD before Kokkos starts.
#pragma once

#include <mlacp/mesh.hpp>
#include <mlacp/mla/mla_config.hpp>

#include <cstdint>
#include <string>

namespace mlacp::tools::block {

struct Options {
  mlacp::MlaConfig config;
  std::string dtype = "double";
  std::uint64_t seed = 1;
  int iters = 1;
  int warmup = 0;  // untimed iterations before the `iters` timed ones
  bool reference = true;
  std::string dump;
  std::string json;             // "" = no JSON report
  double tolerance = -1;        // < 0: docs/spec.md's (1e-10 double, 1e-4 float, 2e-2 bf16)
  mlacp::Ring ring;             // --ring C | node: the two-level mesh (ring attention); default flat
  std::string machine;          // --machine FILE: the model's machine ("" = no prediction)
  bool plan_ring = false;       // --ring plan: the planner picks strategy, ring size and layout
  double memory_per_rank = 0;   // --memory-per-rank BYTES: the plan's budget (0: the machine's)
  bool strategy_given = false;  // --strategy / --ring-layout on the command line (--ring plan overrides them)
  bool layout_given = false;
};

/// The usage text (printed by parse_agreed after --help or a bad flag).
extern const char* const usage;

/// Parses argv; throws std::invalid_argument with a message naming the flag and value ("" after --help).
Options parse(int argc, char** argv);

/// The flags agreed over MPI_COMM_WORLD: -1 and `options` to run, or the exit code (0 after --help, 2 after a bad flag
/// on any rank; rank 0 prints the usage and the lowest failing rank's message).
int parse_agreed(int argc, char** argv, int rank, Options& options);

/// Whether argv asks for Kokkos' own help (--kokkos-help).
bool asks_for_kokkos_help(int argc, char** argv);

}  // namespace mlacp::tools::block
