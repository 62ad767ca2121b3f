// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap's harness: what the command line asks for (Settings), and the measurement of any pair
// (overlap/pair.hpp) from calibration to its rows in the report (Report): the compute alone, the collective alone, the
// piece overlapped and blocking, interleaved round by round, and the sweeps. harness.cpp holds it; main.cpp prints.
#pragma once

#include <mlacp/panelled_gemm.hpp>

#include <string>
#include <vector>

#include "pair.hpp"

namespace mlacp::perf::overlap {

// What the command line asks for.
struct Settings {
  int rows = 0, repeats = 0, warmup = 0;
  bool quick = false;
  bool panel_sweep = false;      // E by OverlapPolicy::panels
  bool balance_sweep = false;    // E at comm/compute 0.67 and 1.5 (library pairs, not --quick)
  bool progress_thread = false;  // the opt-in progress-thread experiment
  bool uneven = true;            // also the library pairs with an uneven split (S, H not divisible by P)
  bool ring = true;              // the ring step pairs (P >= 2), each beside its raw-MPI ceiling
  bool ring_expanded = false;    // also the ring step with the expanded strategy's K and V travelling
  int ring_heads = 1;            // heads of the ring step's attention
  int ring_chunk = 0;            // the ring step's chunk length; 0: calibrated
  bool only_ring = false;        // the ring step pairs only
  int modes = 2;                 // 0: the library's collectives; 1: also the transfer only (raw MPI)
  std::vector<int> panel_counts;
  mlacp::OverlapPolicy default_policy;
};

struct Phases {
  double launch = 0, compute = 0, wait = 0;
};

// One table row of the report.
struct Row {
  std::string label;
  double compute, comm, pair, blocking, e, pair_over_ideal;
};

struct PhaseRow {
  std::string label;
  Phases phases;
  double compute_alone;
};

// What the report prints on rank 0, collected pair by pair.
struct Report {
  Json pair_docs = Json::array();
  std::vector<Row> table;
  std::vector<PhaseRow> phases;
  std::vector<std::string> sweep_lines, balance_lines;
  std::vector<std::string> uneven_lines;  // E even against E uneven, per library pair
  Json uneven_docs = Json::array();
  std::vector<std::string> ring_lines;  // the ring step pairs beside their raw-MPI ceilings
  Json ring_docs = Json::array();
};

// The overlap's figures of merit (E, pair/ideal; see main.cpp) and the panels OverlapPolicy splits `rows` into.
int effective_panels(std::int64_t rows, const mlacp::OverlapPolicy& p);
double overlap_e(double compute, double comm, double blocking, double overlapped);
double pair_over_ideal(double compute, double comm, double blocking, double overlapped);

// One pair in one mode (raw: the transfer only), from calibration to its entries in the report. Returns its E.
double benchmark_pair(const PairSpec& spec, bool raw, const Settings& settings, MPI_Comm comm, Report& report);
// The three library pairs once more with an uneven split, their E beside `even_e` (pair_do, pair_dq, pair_rs).
void benchmark_uneven(const mlacp::Mesh& mesh, const std::vector<double>& even_e, const Settings& settings,
                      Report& report);
// The ring step pairs, each beside its raw-MPI ceiling.
void benchmark_ring(const mlacp::Mesh& mesh, const Settings& settings, Report& report);

}  // namespace mlacp::perf::overlap
