// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// mlacp-mla-block's command line (mla_block_options.hpp).
#include "mla_block_options.hpp"

#include <mpi.h>
#include <mlacp/error.hpp>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

#include "config_flags.hpp"

namespace mlacp::tools::block {

const char* const usage =
    "usage: mlacp-mla-block [--batch B] [--seq S] [--hidden D] [--heads H] [--nope dn] [--rope dr] [--vdim dv]\n"
    "                       [--latent R] [--strategy latent|expanded] [--dtype float|double|bf16] [--bias] [--seed N]\n"
    "                       [--iters N] [--warmup N] [--dump DIR] [--json FILE] [--tolerance X] [--blocking]\n"
    "                       [--no-reference] [--cu-seqlens 0,a,b,...,S] [--wire-dtype same|bf16|bf16_all|fp8]\n"
    "                       [--ring C|node|plan] [--ring-layout zigzag|contiguous] [--machine FILE]\n"
    "                       [--memory-per-rank BYTES] [--q-lora Rq] [--softmax-scale X] [--hf-config FILE]\n"
    "Defaults: B=2 S=32 D=48 H=4 dn=8 dr=4 dv=6 R=12, latent, double, seed 1, 1 iteration, no warm-up.\n"
    "--no-reference skips the single-rank full-sequence reference (timing at large S): no PASS/FAIL, exit 0.\n"
    "--cu-seqlens packs documents into the sequence (every batch row alike): positions restart and attention stays\n"
    "within each document; the reference and --dump (cu_seqlens.npy, int64) follow.\n"
    "--wire-dtype bf16 (float only) sends the all-to-alls and the latent all-gather as bf16 (bf16_all: the latent\n"
    "reduce-scatter's partial sums too); the default tolerance is then docs/spec.md's bf16 one, 2e-2. fp8: the\n"
    "forward's exchanges as fp8 E4M3 with a scale per row, the backward's as bf16; default tolerance 6e-2\n"
    "(docs/wire.md).\n"
    "--ring C runs ring attention on a two-level mesh of P = U x C ranks (C Ulysses groups of U consecutive ranks;\n"
    "--ring node: one group per node); --ring-layout picks which tokens each ring chunk holds (default zigzag).\n"
    "--machine FILE (the model's machine parameters, mlacp-plan --calibrate or by hand) prints the model's prediction\n"
    "for this run beside the measured time and memory (and \"predicted\" in --json); --ring plan (needs --machine)\n"
    "runs the planner's first choice of strategy, ring size and layout (overriding --strategy and --ring-layout)\n"
    "within --memory-per-rank BYTES (default: the machine's memory per rank).\n"
    "--q-lora Rq factors the query as DeepSeek-V2/V3 do (w_qa [Rq, D], RMSNorm g_q, w_qb [H*dqk, Rq]; 0: dense w_q);\n"
    "--softmax-scale X replaces the attention's 1/sqrt(dqk) (e.g. DeepSeek-V3's YaRN-adjusted scale).\n"
    "--hf-config FILE takes the attention's fields from a Hugging Face DeepSeek config.json (YaRN, its softmax scale,\n"
    "q_lora_rank, ...); flags after it override them; --batch and --seq stay the tool's.\n"
    "Every MlaConfig field is a flag (src/tools/config_flags.hpp): --rope-base X, --rms-eps X, --max-documents N,\n"
    "--q-lora-rank Rq (= --q-lora), --no-overlap (= --blocking), ...\n"
    "Kokkos' own options (--kokkos-threads=N, --kokkos-device-id=N, ...) pass through to Kokkos; --kokkos-help lists\n"
    "them.\n";

Options parse(int argc, char** argv) {
  Options o;
  auto& c = o.config;
  c.batch = 2;
  c.seq = 32;
  c.hidden = 48;
  c.heads = 4;
  c.nope = 8;
  c.rope = 4;
  c.vdim = 6;
  c.latent = 12;
  const std::map<std::string, int*> ints = {{"--iters", &o.iters}, {"--warmup", &o.warmup}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag.rfind("--kokkos-", 0) == 0) continue;  // Kokkos' own (--kokkos-threads=4): Kokkos reads them
    if (flag == "--no-reference") {
      o.reference = false;
      continue;
    }
    if (flag == "--help" || flag == "-h") throw std::invalid_argument("");
    // The configuration's fields (config_flags.hpp: --batch ... --ring-layout, --bias, --blocking, --q-lora).
    try {
      const auto next = [&] {
        if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
        return std::string(argv[++i]);
      };
      if (mlacp::tools::apply_config_flag(c, flag, next)) {
        if (flag == "--strategy") o.strategy_given = true;
        if (flag == "--ring-layout") o.layout_given = true;
        continue;
      }
    } catch (const mlacp::Error& e) {
      throw std::invalid_argument(e.what());
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    try {
      if (auto it = ints.find(flag); it != ints.end()) {
        *it->second = mlacp::tools::detail::parse_value<int>(value);
      } else if (flag == "--ring") {
        o.plan_ring = value == "plan";
        if (!o.plan_ring) o.ring = value == "node" ? mlacp::Ring::node() : mlacp::Ring(std::stoi(value));
      } else if (flag == "--machine") {
        o.machine = value;
      } else if (flag == "--memory-per-rank") {
        std::size_t used = 0;
        o.memory_per_rank = std::stod(value, &used);
        if (used != value.size() || !(o.memory_per_rank > 0)) throw std::invalid_argument("");
      } else if (flag == "--dtype") {
        if (value != "float" && value != "double" && value != "bf16") throw std::invalid_argument("");
        o.dtype = value;
      } else if (flag == "--seed") {
        o.seed = std::stoull(value);
      } else if (flag == "--dump") {
        o.dump = value;
      } else if (flag == "--json") {
        o.json = value;
      } else if (flag == "--tolerance") {
        o.tolerance = std::stod(value);
      } else {
        throw std::invalid_argument("unknown flag " + flag);
      }
    } catch (const mlacp::Error& e) {
      throw std::invalid_argument(e.what());
    } catch (const std::logic_error& e) {
      const std::string what = e.what();
      throw std::invalid_argument(what.rfind("unknown flag", 0) == 0 ? what
                                                                     : flag + " " + value + ": not a valid value");
    }
  }
  // A bf16 wire's default tolerance is docs/spec.md's bf16 bound (an explicit --tolerance wins).
  if (c.wire_dtype != mlacp::WireDtype::same && o.tolerance < 0)
    o.tolerance = c.wire_dtype == mlacp::WireDtype::float8_e4m3 ? 6e-2 : 2e-2;
  if (o.iters < 1) throw std::invalid_argument("--iters " + std::to_string(o.iters) + ": expected at least 1");
  if (o.warmup < 0) throw std::invalid_argument("--warmup " + std::to_string(o.warmup) + ": expected at least 0");
  if (o.plan_ring && o.machine.empty()) throw std::invalid_argument("--ring plan needs --machine FILE");
  if (o.memory_per_rank > 0 && !o.plan_ring) throw std::invalid_argument("--memory-per-rank needs --ring plan");
  return o;
}

// The tool's flags, agreed over MPI_COMM_WORLD before Kokkos starts: -1 and the options to run, or the exit code (0
// after --help, 2 after a bad flag on any rank; rank 0 prints the usage and the lowest failing rank's message), so
// that ranks started with different flags (an MPMD launch) all stop instead of some entering the mesh's collectives.
int parse_agreed(int argc, char** argv, int rank, Options& options) {
  int status = 0;  // 0 run, 1 help, 2 a bad flag
  std::string message;
  try {
    options = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    message = e.what();
    status = message.empty() ? 1 : 2;
  }
  int worst = status;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst == 0) return -1;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failing = status == worst ? rank : size;
  MPI_Allreduce(MPI_IN_PLACE, &failing, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  char text[1024] = {};
  if (rank == failing) std::strncpy(text, message.c_str(), sizeof(text) - 1);
  MPI_Bcast(text, sizeof text, MPI_CHAR, failing, MPI_COMM_WORLD);
  if (rank == 0) {
    if (worst == 2)
      std::cerr << "mlacp-mla-block: " << text << (size > 1 ? " [rank " + std::to_string(failing) + "]" : "") << "\n";
    (worst == 2 ? std::cerr : std::cout) << usage;
  }
  return worst == 2 ? 2 : 0;
}

bool asks_for_kokkos_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--kokkos-help") return true;
  return false;
}

}  // namespace mlacp::tools::block
