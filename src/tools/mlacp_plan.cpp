// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-plan: the performance model's front-end (mlacp/model/planner.hpp).
//
// Plan mode (no MPI launch needed): every (strategy, U x C, layout) that can run the layer on nodes x ranks-per-node
// ranks, ranked by the model's forward + backward time on the machine a JSON file describes, with memory per rank,
// bytes per level and hidden fraction; the last line recommends the fastest choice that fits the memory budget.
//   mlacp-plan --batch 1 --heads 128 --nope 128 --rope 64 --vdim 128 --latent 512 --q-lora 1536 --hidden 7168
//              --seq 131072 --dtype bf16 --nodes 4 --ranks-per-node 8 --memory-per-rank 80GiB --machine gpu.json
// Exit status: 0 when a choice fits, 1 when none fits the budget, 2 on bad usage (a flag, a value, the machine file).
//
// Calibrate mode: measures the machine's parameters on the ranks it is launched on (mlacp/model/calibrate.hpp) and
// rank 0 writes them as the JSON plan mode reads:
//   mpirun -np 4 mlacp-plan --calibrate --out machine.json [--quick] [--repeats N] [--ranks-per-node G]
#include <mpi.h>
#include <mlacp/error.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/model/calibrate.hpp>
#include <mlacp/model/machine.hpp>
#include <mlacp/model/planner.hpp>

#include "config_flags.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace model = mlacp::model;

const char* usage =
    "usage: mlacp-plan --batch B --heads H --nope dn --rope dr --vdim dv --latent R [--q-lora Rq] --hidden D\n"
    "                  --seq S [--cu-seqlens 0,a,...,S] --dtype double|float|bf16 --nodes N --ranks-per-node G\n"
    "                  [--memory-per-rank BYTES] [--strategy latent|expanded] [--ring C] [--layout zigzag|contiguous]\n"
    "                  [--wire-dtype same|bf16|bf16_all|fp8] [--<any MlaConfig field>] [--hf-config FILE]\n"
    "                  --machine params.json [--json FILE]\n"
    "       mpirun -np P mlacp-plan --calibrate [--out params.json] [--quick] [--repeats N] [--ranks-per-node G]\n"
    "Plan: ranks every (strategy, U x C, layout) that runs the layer on N x G ranks by the model's forward + backward\n"
    "time on the machine params.json describes, and recommends the fastest that fits the memory per rank (BYTES: a\n"
    "number with an optional suffix kB MB GB TB or KiB MiB GiB TiB, e.g. 80GiB, 1.5e9; default the machine file's\n"
    "memory_per_rank_bytes, 0 there: no limit). --strategy, --ring C (0: any) and --layout restrict the choices;\n"
    "--q-lora Rq models a low-rank query projection; --wire-dtype bf16 (float only) a float layer whose all-to-alls\n"
    "and latent all-gather move bf16 (bf16_all: its reduce-scatter too; fp8: the forward's as fp8 with a scale per\n"
    "row, the backward's as bf16); --json FILE also writes the plan as JSON.\n"
    "Exit status: 0 when a choice fits, 1 when none fits the memory budget, 2 on bad usage.\n"
    "Calibrate: measures the network levels, GEMM rates, attention core and memory bandwidth on the ranks it runs on\n"
    "and writes them (default machine.json); --quick measures tiny sizes (seconds become a fraction of one),\n"
    "--repeats N timed runs per figure (median; default 5), --ranks-per-node G treats G consecutive ranks as a node\n"
    "(default: the ranks that share memory), so that one machine exercises the inter-node level.\n";

// Bad usage: the message names the flag and the value; main prints it with the usage text and exits 2.
struct UsageFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An integer flag of the plan's own, parsed as the configuration's are (config_flags.hpp).
int parse_int(const std::string& flag, const std::string& value) {
  try {
    return mlacp::tools::detail::parse_value<int>(value);
  } catch (const std::logic_error&) {
    throw UsageFailure(flag + " " + value + ": " + mlacp::tools::detail::expected_value<int>());
  }
}

// A byte count: a non-negative number (strtod syntax) with an optional unit, decimal (kB MB GB TB) or binary (KiB
// MiB GiB TiB), case-insensitive, "B" alone allowed.
double parse_bytes(const std::string& flag, const std::string& value) {
  const auto bad = [&] {
    return UsageFailure(flag + " " + value +
                        ": expected a byte count, a number with an optional unit (e.g. 80GiB, 512MiB, 1.5e9)");
  };
  std::size_t used = 0;
  double number = 0;
  try {
    number = std::stod(value, &used);
  } catch (const std::logic_error&) {
    throw bad();
  }
  std::string unit = value.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char ch) { return std::tolower(ch); });
  static const std::map<std::string, double> units = {
      {"", 1.0},    {"b", 1.0},      {"kb", 1e3},        {"mb", 1e6},           {"gb", 1e9},
      {"tb", 1e12}, {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  const auto it = units.find(unit);
  if (it == units.end() || !std::isfinite(number) || number < 0) throw bad();
  return number * it->second;
}

// "80 GiB", "512 MiB", "3.2 kiB", "12 B".
std::string format_bytes(double bytes) {
  static const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (std::abs(bytes) >= 1024.0 && unit < 5) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.4g %s", bytes, names[unit]);
  return text;
}

// ---- plan mode --------------------------------------------------------------------------------------------------

struct PlanOptions {
  model::PlanRequest request;
  std::string machine;
  std::string json;
  bool help = false;
};

// The plan's own flags (the request's choices, the cluster, the machine, the output) first; every other flag is an
// MlaConfig field's, from config_fields.hpp's table (src/tools/config_flags.hpp, as mlacp-mla-block's).
PlanOptions parse_plan(int argc, char** argv) {
  PlanOptions o;
  auto& r = o.request;
  auto& c = r.config;
  const std::map<std::string, int*> ints = {
      {"--ring", &r.ring}, {"--nodes", &r.cluster.nodes}, {"--ranks-per-node", &r.cluster.ranks_per_node}};
  // Flags without a default: the layer's dimensions, its dtype, the cluster and the machine.
  std::vector<std::string> required = {"--batch",  "--heads", "--nope",  "--rope",  "--vdim",           "--latent",
                                       "--hidden", "--seq",   "--dtype", "--nodes", "--ranks-per-node", "--machine"};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      return o;
    }
    if (flag.rfind("--", 0) != 0) throw UsageFailure("unexpected argument '" + flag + "'");
    required.erase(std::remove(required.begin(), required.end(), flag), required.end());
    if (flag == "--hf-config") {  // it gives the attention's dimensions
      for (const char* given : {"--hidden", "--heads", "--nope", "--rope", "--vdim", "--latent"})
        required.erase(std::remove(required.begin(), required.end(), given), required.end());
    }
    std::string value;
    const auto next = [&]() -> const std::string& {  // the flag's value (a switch takes none)
      if (i + 1 >= argc) throw UsageFailure(flag + " needs a value");
      return value = argv[++i];
    };
    try {
      if (auto it = ints.find(flag); it != ints.end()) {
        *it->second = parse_int(flag, next());
      } else if (flag == "--dtype") {
        r.dtype = model::parse_dtype(next());
      } else if (flag == "--strategy") {
        r.strategy = mlacp::parse_strategy(next());
      } else if (flag == "--layout" || flag == "--ring-layout") {
        r.layout = mlacp::parse_ring_layout(next());
      } else if (flag == "--memory-per-rank") {
        r.memory_per_rank = parse_bytes(flag, next());
      } else if (flag == "--machine") {
        o.machine = next();
      } else if (flag == "--json") {
        o.json = next();
      } else if (!mlacp::tools::apply_config_flag(c, flag, next)) {
        throw UsageFailure("unknown flag " + flag);
      }
    } catch (const mlacp::Error& e) {
      // parse_dtype / parse_strategy / parse_ring_layout name the value; say which flag it came with.
      throw UsageFailure(flag + " " + value + ": " + e.what());
    } catch (const std::invalid_argument& e) {  // apply_config_flag's "FLAG VALUE: expected ..."
      throw UsageFailure(e.what());
    }
  }
  if (!required.empty()) {
    std::string missing;
    for (const std::string& flag : required) missing += (missing.empty() ? "" : ", ") + flag;
    throw UsageFailure("missing " + missing);
  }
  if (r.ring < 0) throw UsageFailure("--ring " + std::to_string(r.ring) + ": expected C >= 1, or 0 for any");
  if (c.wire_dtype != mlacp::WireDtype::same && r.dtype != model::Dtype::float32)
    throw UsageFailure(std::string("--wire-dtype ") + mlacp::to_string(c.wire_dtype) + " with --dtype " +
                       model::to_string(r.dtype) + ": expected --dtype float (a narrower wire is a float layer's)");
  if (c.q_lora_rank < 0)
    throw UsageFailure("--q-lora " + std::to_string(c.q_lora_rank) + ": expected Rq >= 1, or 0 for none");
  if (r.cluster.nodes < 1) throw UsageFailure("--nodes " + std::to_string(r.cluster.nodes) + ": expected at least 1");
  if (r.cluster.ranks_per_node < 1)
    throw UsageFailure("--ranks-per-node " + std::to_string(r.cluster.ranks_per_node) + ": expected at least 1");
  return o;
}

int run_plan(int argc, char** argv) {
  PlanOptions options;
  try {
    options = parse_plan(argc, argv);
  } catch (const UsageFailure& e) {
    std::cerr << "mlacp-plan: " << e.what() << "\n" << usage;
    return 2;
  }
  if (options.help) {
    std::cout << usage;
    return 0;
  }
  model::Plan result;
  try {
    const model::MachineParams machine = model::read_machine(options.machine);
    result = model::plan(options.request, machine);
  } catch (const mlacp::InvalidArgument& e) {
    // The machine file or the request (the layer on these ranks, the cluster): the message names the value.
    std::cerr << "mlacp-plan: " << e.what() << "\n";
    return 2;
  }
  std::cout << model::format_plan(result);
  if (!options.json.empty()) {
    std::ofstream out(options.json);
    out << model::plan_to_json(result);
    out.close();
    if (!out) {
      std::cerr << "mlacp-plan: --json " << options.json << ": cannot write the file\n";
      return 2;
    }
    std::cout << "wrote " << options.json << "\n";
  }
  if (result.rows.empty()) {
    std::cerr << "mlacp-plan: no (strategy, U x C, layout) the request allows can run on "
              << result.request.cluster.nodes << " x " << result.request.cluster.ranks_per_node << " ranks\n";
    return 1;
  }
  if (result.best() == nullptr) {
    double smallest = result.rows.front().prediction.memory.total();
    const model::PlanRow* row = &result.rows.front();
    for (const model::PlanRow& candidate : result.rows) {
      if (candidate.prediction.memory.total() < smallest) {
        smallest = candidate.prediction.memory.total();
        row = &candidate;
      }
    }
    std::cerr << "mlacp-plan: no choice fits the memory budget: the smallest, " << row->prediction.choice.describe()
              << ", needs " << format_bytes(smallest) << " per rank; the budget is " << format_bytes(result.budget)
              << " per rank\n";
    return 1;
  }
  return 0;
}

// ---- calibrate mode ---------------------------------------------------------------------------------------------

struct CalibrateOptions {
  std::string out = "machine.json";
  model::CalibrationOptions calibration;
  bool help = false;
};

CalibrateOptions parse_calibrate(int argc, char** argv) {
  CalibrateOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--calibrate") continue;
    if (flag == "--quick") {
      o.calibration.quick = true;
    } else if (flag == "--help" || flag == "-h") {
      o.help = true;
    } else if (flag == "--out" || flag == "--repeats" || flag == "--ranks-per-node") {
      if (i + 1 >= argc) throw UsageFailure(flag + " needs a value");
      const std::string value = argv[++i];
      if (flag == "--out") o.out = value;
      if (flag == "--repeats") o.calibration.repeats = parse_int(flag, value);
      if (flag == "--ranks-per-node") o.calibration.ranks_per_node = parse_int(flag, value);
    } else {
      throw UsageFailure(flag + ": --calibrate takes only --out FILE, --quick, --repeats N and --ranks-per-node G");
    }
  }
  return o;
}

int run_calibrate(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      const CalibrateOptions options = parse_calibrate(argc, argv);
      if (options.help) {
        if (rank == 0) std::cout << usage;
      } else {
        // Every rank measures and returns the same report; rank 0 writes the file and prints it.
        model::CalibrationReport report = model::calibrate_report(MPI_COMM_WORLD, options.calibration);
        // A simulated link's rate (scripts/netns-cluster.sh exports it) names the machine file: a test-bed setting,
        // read by the tool, not by the library.
        if (const char* testbed = std::getenv("MLACP_TESTBED_RATE"); testbed && *testbed) {
          report.machine.name += std::string(", testbed ") + testbed;
        }
        if (rank == 0) {
          model::write_machine(report.machine, options.out);
          std::cout << "mlacp-plan --calibrate on " << size << " ranks\n"
                    << model::format_report(report) << "wrote " << options.out << "\n"
                    << std::flush;
        }
      }
    } catch (const UsageFailure& e) {
      // Same arguments on every rank: every rank gets here; rank 0 explains.
      if (rank == 0) std::cerr << "mlacp-plan: " << e.what() << "\n" << usage;
      code = 2;
    } catch (const mlacp::Error& e) {
      // An option calibrate refuses (InvalidArgument, on every rank) is bad usage; anything else (the nodes, MPI,
      // writing the file) a failed calibration.
      std::cerr << "mlacp-plan: rank " + std::to_string(rank) + ": " + e.what() + "\n" << std::flush;
      code = dynamic_cast<const mlacp::InvalidArgument*>(&e) != nullptr ? 2 : 1;
    }
  }
  MPI_Finalize();
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // MPI only for calibration: plan mode runs anywhere, without a launcher.
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--calibrate") return run_calibrate(argc, argv);
  return run_plan(argc, argv);
}
