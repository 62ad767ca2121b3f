// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-mla-block: runs the MLA layer under MPI at the given dimensions, computes the same layer on the full sequence
// on rank 0 with P = 1, prints the relative error of the output and of every gradient and PASS or FAIL (exit code 0
// or 1), and with --dump DIR writes the tensors as .npy files (docs/spec.md "Dump format"). Run it with mpirun or srun
// to check an installation: `srun -n 4 mlacp-mla-block --strategy latent --dtype double`.
//
// It is also the timing tool the PyTorch peer (perf_tests/peers/) is compared with: --no-reference skips the P = 1
// reference (which does not fit at large S), --warmup N untimed iterations come first, and every run reports the
// median time (barrier, forward + backward, fence, max over ranks), the peak resident memory (max over ranks) and a
// roofline line: the layer's FLOPs per rank (mlacp/mla/flop_count.hpp) against the rate of one GEMM of the layer's
// q_proj shape measured in the same run, as the fraction of that rate the measured time corresponds to.
//
// With --machine FILE (MachineParams' JSON, model/machine.hpp) it also prints the performance model's prediction for
// the run's own strategy, mesh and layout beside the measured median and the measured peak of Kokkos memory, and
// --ring plan lets the planner (model/mesh_plan.hpp) choose the strategy, the ring size and the layout.
#include <mpi.h>
#include <sys/resource.h>
#include <mlacp/allocation.hpp>
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/collective_bytes.hpp>
#include <mlacp/collectives.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/detail/input_checks.hpp>
#include <mlacp/mla/flop_count.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/model/layer_model.hpp>
#include <mlacp/model/mesh_plan.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/panelled_gemm.hpp>
#include <mlacp/testing/synthetic.hpp>
#include <mlacp/token_map.hpp>
#include <mlacp/version.hpp>

#include <Kokkos_Core.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "config_flags.hpp"
#include "config_json.hpp"
#include "npy.hpp"

#include "mla_block_options.hpp"
#include "mla_block_support.hpp"

namespace {

using namespace mlacp::tools::block;

// What the model says about the run: its prediction for the run's own choice (or why there is none), and the
// planner's choice with --ring plan.
struct ModelReport {
  std::string machine;  // MachineParams::name; "" = no --machine
  std::optional<mlacp::model::Prediction> prediction;
  std::string why_not;  // no prediction: the model's reason
  std::string planned;  // --ring plan: the choice it ran
};

// Which of the run's collectives OverlapPolicy polls beside compute (panelled_gemm.hpp): those of a mesh level whose
// bytes do not move through shared memory (or every level, with poll_shared_memory) from min_poll_bytes per rank on;
// the others complete at their wait, beside unpanelled GEMMs.
std::string describe_polling(const mlacp::Mesh& mesh) {
  const mlacp::OverlapPolicy& p = mlacp::overlap_policy();
  const std::string from = p.min_poll_bytes == std::numeric_limits<std::int64_t>::max()
                               ? "never polled"
                               : "polled from " + std::to_string(p.min_poll_bytes) + " bytes per rank";
  auto level = [&](const mlacp::Mesh& m) {
    if (!m.shared_memory()) return "over the network: " + from;
    return p.poll_shared_memory ? "through shared memory: " + from : std::string("through shared memory: not polled");
  };
  const std::string panels = " (GEMMs in up to " + std::to_string(p.panels) + " panels while one is pending)";
  if (mesh.ring_size() == 1) return "collectives " + level(mesh) + panels;
  return "Ulysses collectives " + level(mesh.ulysses_group()) + ", ring " + level(mesh.ring_group()) + panels;
}

template <class T>
int run(const Options& o, const mlacp::Mesh& mesh, const ModelReport& model) {
  const auto& c = o.config;
  const int P = mesh.size(), rank = mesh.rank();
  constexpr bool bf16 = std::is_same_v<T, mlacp::bf16>;
  // The reference's value type and the dump's: double for bf16 runs' reference; float for their dump (bf16 widens to
  // float exactly, docs/spec.md's dump format).
  using Ref = std::conditional_t<bf16, double, T>;
  using DumpT = std::conditional_t<bf16, float, T>;
  const double tolerance = o.tolerance >= 0 ? o.tolerance : (std::is_same_v<T, double> ? 1e-10 : bf16 ? 2e-2 : 1e-4);
  using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
  const Space space;

  // The full x and dy only when the reference or the dump needs them: at large S they would count in the peak
  // memory of every rank, which is reported next to the peer's (which holds only its shard).
  const bool need_full = o.reference || !o.dump.empty();
  // The configuration first, on every rank, before anything is allocated from its sizes: a bad size (negative, or a
  // product past INT_MAX) is the layer's own clear error on every rank, and ranks started with different settings
  // (an MPMD launch) learn which differs.
  {
    auto fields = mlacp::detail::config_fields(c);
    fields.push_back({"bytes per element of the layer's value type (--dtype)", static_cast<std::int64_t>(sizeof(T))});
    // The tool runs one shape: the layer's optional maxima are the run's B and S here.
    std::string error = c.error(P);
    if (error.empty()) error = c.shape_error();
    mlacp::detail::agree_or_throw(mesh, "mlacp-mla-block", error, fields, c.describe());
  }
  const std::string where = "mlacp-mla-block: rank " + std::to_string(rank);
  std::string allocation_problem = preflight_error<T>(o, mesh, where);
  mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the run's memory", allocation_problem);
  Tensor3 x_full, dy_full;
  try {
    if (need_full) {
      x_full = mlacp::detail::allocate_view_or_throw<Tensor3>(where, "x (full sequence)", c.batch, c.seq, c.hidden);
      dy_full = mlacp::detail::allocate_view_or_throw<Tensor3>(where, "dy (full sequence)", c.batch, c.seq, c.hidden);
      mlacp::testing::synthetic::fill(x_full, o.seed + 100, 1.0);
      mlacp::testing::synthetic::fill(dy_full, o.seed + 200, 1.0);
    }
  } catch (const mlacp::OutOfMemory& e) {
    allocation_problem = e.what();
  }
  mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the inputs", allocation_problem);
  // The Kokkos memory of the distributed run (diagnostics.hpp), what the model's memory per rank predicts: counted
  // from here, so that the weights, their gradients, this rank's inputs and outputs and the layer's workspaces are
  // in; the full x and dy above (the reference's and the dump's), the GEMM-rate probes and the reference are not.
  mlacp::diagnostics::count_view_allocations();
  const double view_base = static_cast<double>(mlacp::diagnostics::view_live_bytes());
  mlacp::diagnostics::reset_view_peak_bytes();
  double view_peak = 0;  // bytes above view_base, the highest seen outside the probes
  auto note_view_peak = [&] {
    view_peak = std::max(view_peak, static_cast<double>(mlacp::diagnostics::view_peak_bytes()) - view_base);
  };

  // The layer validates the configuration on every rank (before any other collective).
  mlacp::MlaWeights<T, Mem> weights;
  try {
    weights = mlacp::testing::synthetic::weights<T, Mem>(c, o.seed);
  } catch (const mlacp::OutOfMemory& e) {
    allocation_problem = e.what();
  }
  mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the weights", allocation_problem);
  mlacp::MlaAttention<T> layer(c, weights, mesh);
  const int s = layer.local_seq();
  Tensor3 x, dy;
  try {
    x = mlacp::detail::allocate_view_or_throw<Tensor3>(where, "x", c.batch, s, c.hidden);
    dy = mlacp::detail::allocate_view_or_throw<Tensor3>(where, "dy", c.batch, s, c.hidden);
  } catch (const mlacp::OutOfMemory& e) {
    allocation_problem = e.what();
  }
  mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the rank's inputs", allocation_problem);
  if (need_full) {
    // This rank's tokens: its ranges of the layer's token map (one contiguous range on a flat mesh).
    mlacp::shard(space, layer.token_map(), mesh.ring_rank(), mesh.ulysses_rank(), x_full, x);
    mlacp::shard(space, layer.token_map(), mesh.ring_rank(), mesh.ulysses_rank(), dy_full, dy);
  } else {
    mlacp::testing::synthetic::fill(x, o.seed + 100 + 7919 * static_cast<std::uint64_t>(rank), 1.0);
    mlacp::testing::synthetic::fill(dy, o.seed + 200 + 7919 * static_cast<std::uint64_t>(rank), 1.0);
  }

  note_view_peak();
  GemmRate gemm = gemm_rate<T>(c, s, mesh);
  mlacp::diagnostics::reset_view_peak_bytes();  // the probe's matrices are not the layer's
  std::vector<double> times;
  typename mlacp::MlaAttention<T>::gradients_type grads;
  Tensor3 y;
  // The layer's own collectives only: the bytes this rank hands to them per iteration (collective_bytes.hpp).
  mlacp::reset_collective_bytes();
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    barrier(mesh, "iteration start");
    const auto start = std::chrono::steady_clock::now();
    auto forward = layer.forward(space, x);
    grads = layer.backward(space, forward, dy);
    Kokkos::fence();
    const double seconds = max_over_ranks(
        mesh, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), "iteration time");
    if (it >= o.warmup) times.push_back(seconds);
    y = forward.output();
  }
  note_view_peak();
  view_peak = max_over_ranks(mesh, view_peak, "peak Kokkos bytes");
  const double wire_bytes_per_iteration =
      static_cast<double>(mlacp::collective_bytes().total()) / static_cast<double>(o.warmup + o.iters);
  gemm.flops_per_s = std::max(gemm.flops_per_s, gemm_rate<T>(c, s, mesh).flops_per_s);
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  // Before the reference runs on rank 0: the distributed layer's own high-water mark.
  const double peak_rss = peak_rss_bytes(mesh);
  const AttentionBalance balance = attention_balance(layer, x, dy, mesh);
  const mlacp::MlaFlops flops = mlacp::mla_flops(c, P);
  const double fraction = flops.total() / gemm.flops_per_s / median;

  // Distributed results, assembled on rank 0 in global order; weight gradients summed over ranks.
  std::vector<std::pair<std::string, std::vector<double>>> got;
  if (need_full) {
    // This rank's values on the host first (an allocation that fails here is agreed before the raw MPI gathers).
    std::vector<std::pair<std::string, std::vector<double>>> local;
    try {
      local.emplace_back("y", to_host(y));
      local.emplace_back("dx", to_host(grads.dx));
      // Weight gradients in the parameter table's order (parameter_table.hpp): "d" + name, those the layer has.
      mlacp::for_each_parameter(
          [&](const mlacp::ParameterInfo& info, const auto& gradient) {
            std::vector<double> values = to_host(gradient);
            if (!values.empty()) local.emplace_back(std::string("d") + info.name, std::move(values));
          },
          grads);
    } catch (const std::exception& e) {
      const auto out_of_memory = mlacp::detail::translate_allocation_failure(e, where);
      if (!out_of_memory) throw;
      allocation_problem = out_of_memory->what();
    }
    mlacp::detail::agree_on_allocation(mesh, "mlacp-mla-block: the results' host copies", allocation_problem);
    const auto ranges = ranges_of_ranks(layer.token_map(), mesh);
    const auto S = static_cast<std::size_t>(c.seq);
    for (auto& [name, values] : local)
      got.emplace_back(name, name == "y" || name == "dx" ? gather_tokens(values, c.batch, c.hidden, ranges, S, mesh)
                                                         : sum_to_root(values, mesh));
  }

  int verdict = 0;
  if (rank == 0) {
    std::cout << "mlacp-mla-block: " << c.describe() << " dtype=" << o.dtype << " P=" << P
              << " (U=" << mesh.ulysses_size() << " x C=" << mesh.ring_size() << ") seed=" << o.seed
              << (c.overlap ? "" : " (blocking collectives)") << "\n";
    if (c.overlap) std::cout << "  overlap: " << describe_polling(mesh) << "\n";
    std::cout << "  iteration time (max over ranks): median " << std::setprecision(4) << median * 1e3 << " ms, min "
              << times.front() * 1e3 << " ms over " << o.iters << " iteration(s) after " << o.warmup << " warm-up\n";
    std::cout << "  peak resident memory (max over ranks): " << std::setprecision(4) << peak_rss / (1 << 20)
              << " MiB\n";
    std::cout << "  peak Kokkos bytes (max over ranks): " << std::setprecision(4) << view_peak / (1 << 20) << " MiB ("
              << std::setprecision(15) << view_peak
              << " bytes: weights, gradients, the rank's inputs and outputs, the layer's workspaces)\n";
    if (!model.machine.empty() && model.prediction) {
      const mlacp::model::Prediction& p = *model.prediction;
      std::cout << "  model (" << model.machine << "; " << p.choice.describe() << "): predicted forward+backward "
                << std::setprecision(4) << p.total_s() * 1e3 << " ms (forward " << p.forward_s * 1e3 << ", backward "
                << p.backward_s * 1e3 << "), measured " << median * 1e3 << " ms, error " << std::fixed
                << std::setprecision(1) << error_percent(p.total_s(), median) << "%" << std::defaultfloat << "\n";
      std::cout << "  model memory per rank: predicted " << std::setprecision(4) << p.memory.total() / (1 << 20)
                << " MiB, measured peak Kokkos bytes (max over ranks) " << view_peak / (1 << 20) << " MiB, error "
                << std::fixed << std::setprecision(1) << error_percent(p.memory.total(), view_peak) << "%"
                << std::defaultfloat << "; predicted hidden fraction " << std::setprecision(3) << p.hidden_fraction
                << ", bytes intra " << std::setprecision(4) << p.bytes.intra / (1 << 20) << " MiB, inter "
                << p.bytes.inter / (1 << 20) << " MiB\n";
    } else if (!model.machine.empty()) {
      std::cout << "  model (" << model.machine << "): no prediction: " << model.why_not << "\n";
    }
    std::cout << "  attention balance (" << mlacp::to_string(c.ring_layout) << ", U=" << mesh.ulysses_size()
              << " x C=" << mesh.ring_size() << "): visible pairs x heads max/min " << std::setprecision(4)
              << balance.pairs_ratio() << ", attention thread CPU time max/min " << balance.cpu_ratio() << " ("
              << balance.cpu_max * 1e3 << " / " << balance.cpu_min * 1e3 << " ms)\n";
    std::cout << "  bytes handed to the layer's collectives per iteration (rank 0): " << std::setprecision(4)
              << wire_bytes_per_iteration / (1 << 20) << " MiB; forward workspace "
              << layer.forward_workspace_bytes() / double(1 << 20) << " MiB\n";
    std::cout << "  roofline per rank: forward " << std::setprecision(4) << flops.forward * 1e-9
              << " GFLOP (attention core " << flops.attention_forward * 1e-9 << "), backward " << flops.backward * 1e-9
              << " GFLOP (attention core " << flops.attention_backward * 1e-9 << "); GEMM rate "
              << gemm.flops_per_s * 1e-9 << " GFLOP/s (" << gemm.shape << ", " << o.dtype << ", median of "
              << gemm.repeats << ", the higher of before and after the layer); fraction of the machine's GEMM rate "
              << std::fixed << std::setprecision(3) << fraction << std::defaultfloat << "\n";
    std::string reference_status = "skipped";
    double worst = NAN;
    if (o.reference) {
      // The reference: the same layer on the full sequence, one rank, P = 1.
      mlacp::Mesh self(MPI_COMM_SELF);
      mlacp::MlaAttention<Ref> reference(c, reference_weights<Ref>(c, weights), self);
      auto ref_forward = reference.forward(space, widened<Ref>(x_full));
      const auto ref = reference.backward(space, ref_forward, widened<Ref>(dy_full));
      std::map<std::string, std::vector<double>> want = {{"y", to_host(ref_forward.output())}, {"dx", to_host(ref.dx)}};
      mlacp::for_each_parameter([&](const mlacp::ParameterInfo& info,
                                    const auto& gradient) { want[std::string("d") + info.name] = to_host(gradient); },
                                ref);
      std::cout << "  relative error vs single-rank full-sequence reference (tolerance " << tolerance << "):\n";
      worst = 0;
      double floor = 0;  // 1% of the largest reference tensor (the layer tests' floor, layer_reference_checks.hpp)
      for (const auto& [name, values] : want) floor = std::max(floor, 1e-2 * norm(values));
      for (const auto& [name, values] : got) {
        const double e = relative_error(values, want.at(name), floor);
        worst = std::max(worst, e);
        std::cout << "    " << std::left << std::setw(7) << name << std::scientific << std::setprecision(3) << e
                  << (e <= tolerance ? "" : "   <-- above tolerance") << std::defaultfloat << "\n";
      }
      verdict = worst <= tolerance ? 0 : 1;
      reference_status = verdict == 0 ? "PASS" : "FAIL";
      std::cout << reference_status << " (max relative error " << std::scientific << worst << ")\n"
                << std::defaultfloat;
    } else {
      std::cout << "  reference: skipped (--no-reference), no PASS/FAIL verdict\n";
    }
    if constexpr (bf16) {
      // Which backend the layer's bf16 plan chose per GEMM shape, and what oneDNN dispatches to on this CPU.
      std::map<std::string, int> backends;
      for (const auto& entry : layer.bf16_gemm_plan()->choices())
        ++backends[mlacp::bf16_gemm_backend_name(entry.second.backend)];
      std::cout << "  bf16 GEMM backends (shapes):";
      for (const auto& [name, n] : backends) std::cout << " " << name << " " << n;
      std::cout << "; oneDNN ISA " << mlacp::onednn_cpu_isa() << "\n";
      // How the layer computes (MlaConfig::bf16_compute), and the times an automatic choice took it by.
      const auto& choice = layer.bf16_compute_choice();
      std::cout << "  bf16 compute: " << mlacp::to_string(choice.chosen) << " (asked "
                << mlacp::to_string(choice.requested);
      if (choice.by_hardware)
        std::cout << "; bf16 matrix hardware on every rank, untimed";
      else if (choice.requested == mlacp::Bf16Compute::automatic)
        std::cout << "; timed pass bf16 " << choice.bf16_seconds * 1e3 << " ms, float " << choice.float_seconds * 1e3
                  << " ms";
      std::cout << ")\n";
    }

    if (!o.dump.empty()) {
      std::filesystem::create_directories(o.dump);
      const auto B = static_cast<std::size_t>(c.batch), S = static_cast<std::size_t>(c.seq),
                 D = static_cast<std::size_t>(c.hidden);
      dump<DumpT>(o.dump, "x", to_host(x_full), {B, S, D});
      dump<DumpT>(o.dump, "dy", to_host(dy_full), {B, S, D});
      if (!c.cu_seqlens.empty())
        mlacp::tools::write_npy(o.dump + "/cu_seqlens.npy", c.cu_seqlens, {c.cu_seqlens.size()});
      auto shape = [](const auto& v) {
        std::vector<std::size_t> e;
        for (unsigned d = 0; d < static_cast<unsigned>(std::decay_t<decltype(v)>::rank); ++d) e.push_back(v.extent(d));
        return e;
      };
      std::vector<std::pair<std::string, std::pair<std::vector<double>, std::vector<std::size_t>>>> params;
      mlacp::for_each_parameter(
          [&](const mlacp::ParameterInfo& info, const auto& weight) {
            params.emplace_back(info.name, std::make_pair(to_host(weight), shape(weight)));
          },
          weights);
      std::map<std::string, std::vector<std::size_t>> shapes = {{"y", {B, S, D}}, {"dx", {B, S, D}}};
      for (const auto& [name, p] : params) {
        if (p.first.empty()) continue;
        dump<DumpT>(o.dump, name, p.first, p.second);
        shapes["d" + name] = p.second;
      }
      for (const auto& [name, values] : got) dump<DumpT>(o.dump, name, values, shapes.at(name));
      const Json config = {{"batch", c.batch},
                           {"seq", c.seq},
                           {"hidden", c.hidden},
                           {"heads", c.heads},
                           {"qk_nope_head_dim", c.nope},
                           {"qk_rope_head_dim", c.rope},
                           {"v_head_dim", c.vdim},
                           {"kv_lora_rank", c.latent},
                           {"q_lora_rank", c.q_lora_rank},
                           {"softmax_scale", c.attention_scale()},
                           {"bias", c.bias},
                           {"dtype", o.dtype},
                           {"strategy", mlacp::to_string(c.strategy)},
                           {"wire_dtype", mlacp::to_string(c.wire_dtype)},
                           {"ulysses_size", mesh.ulysses_size()},
                           {"ring_size", mesh.ring_size()},
                           {"ring_layout", mlacp::to_string(c.ring_layout)},
                           {"seed", o.seed},
                           {"ranks", P},
                           {"overlap", c.overlap},
                           {"cu_seqlens", c.cu_seqlens},
                           {"rope_base", c.rope_base},
                           {"rope_factor", c.rope_factor},
                           {"rope_original_max_position", c.rope_original_max_position},
                           {"rope_beta_fast", c.rope_beta_fast},
                           {"rope_beta_slow", c.rope_beta_slow},
                           {"rope_mscale", c.rope_mscale},
                           {"rope_mscale_all_dim", c.rope_mscale_all_dim},
                           {"rope_attention_factor", c.rope_attention_factor}};
      std::ofstream(o.dump + "/config.json") << json_text(config, 2) << "\n";
      std::cout << "  dumped " << got.size() + 2 + params.size() + (c.cu_seqlens.empty() ? 0 : 1)
                << " .npy files and config.json to " << o.dump << "\n";
    }

    if (!o.json.empty()) {
      std::ofstream json(o.json);
      if (!json) throw std::runtime_error("cannot write " + o.json);
      Json config_json = mlacp::tools::config_dims_json(c);  // B, S, D, H, dn, dr, dv, R, Rq from the table
      config_json["softmax_scale"] = c.attention_scale();
      config_json["bias"] = c.bias;
      Json report = {{"tool", "mlacp-mla-block"},
                     {"status", "ok"},
                     {"config", config_json},
                     {"P", P},
                     {"dtype", o.dtype},
                     {"strategy", mlacp::to_string(c.strategy)},
                     {"wire_dtype", mlacp::to_string(c.wire_dtype)},
                     {"bf16_compute", bf16 ? mlacp::to_string(layer.bf16_compute_choice().chosen) : "n/a"},
                     {"overlap", c.overlap},
                     {"polling", describe_polling(mesh)},
                     {"warmup", o.warmup},
                     {"iters", o.iters},
                     {"ulysses_size", mesh.ulysses_size()},
                     {"ring_size", mesh.ring_size()},
                     {"ring_layout", mlacp::to_string(c.ring_layout)},
                     {"attention_pairs_max_over_min", balance.pairs_ratio()},
                     {"attention_cpu_max_over_min", balance.cpu_ratio()},
                     {"forward_workspace_bytes", layer.forward_workspace_bytes()},
                     {"collective_bytes_per_iteration", wire_bytes_per_iteration},
                     {"protocol", "per iteration: barrier, forward + backward, fence, time = max over ranks; median"},
                     {"time_median_s", median},
                     {"time_min_s", times.front()},
                     {"times_s", times},
                     {"peak_rss_bytes", peak_rss},
                     {"peak_view_bytes", view_peak}};
      if (!model.planned.empty()) report["planned"] = model.planned;
      if (model.prediction) {
        const mlacp::model::Prediction& p = *model.prediction;
        report["predicted"] = {
            {"machine", model.machine},         {"choice", p.choice.describe()}, {"forward_s", p.forward_s},
            {"backward_s", p.backward_s},       {"total_s", p.total_s()},        {"hidden_fraction", p.hidden_fraction},
            {"memory_bytes", p.memory.total()}, {"bytes_intra", p.bytes.intra},  {"bytes_inter", p.bytes.inter}};
      } else if (!model.machine.empty()) {
        // No "predicted" key then: the reports read its presence as "a prediction" (ring_report.py,
        // validate_report.py).
        report["prediction_unavailable"] = model.why_not;
      }
      report["roofline"] = {{"forward_flops", flops.forward},
                            {"backward_flops", flops.backward},
                            {"attention_forward_flops", flops.attention_forward},
                            {"attention_backward_flops", flops.attention_backward},
                            {"projections_forward_flops", flops.projections_forward},
                            {"projections_backward_flops", flops.projections_backward},
                            {"total_flops", flops.total()},
                            {"gemm_rate_flops_per_s", gemm.flops_per_s},
                            {"gemm_shape", gemm.shape},
                            {"flop_rate_per_s", flops.total() / median},
                            {"fraction_of_gemm_rate", fraction}};
      report["reference"] = reference_status;
      report["max_relative_error"] = worst;
      json << json_text(report) << "\n";
      std::cout << "  wrote " << o.json << "\n";
    }
  }
  // Watched: when rank 0 fails on its own (the reference's memory, a file it cannot write), it reports the failure on
  // the mesh, and the others raise it here instead of waiting.
  if (P > 1) {
    mlacp::CollectiveInfo info = tool_step("the verdict");
    info.operation = "MPI_Ibcast";
    mlacp::mpi::broadcast(mesh.comm(), &verdict, sizeof verdict, 0, info, "mlacp-mla-block: the verdict");
  }
  return verdict;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Options options;
  int code = parse_agreed(argc, argv, rank, options);
  if (code < 0 && asks_for_kokkos_help(argc, argv)) {
    Kokkos::ScopeGuard kokkos(argc, argv);  // prints Kokkos' own options
    code = 0;
  }
  if (code < 0) {
    Kokkos::ScopeGuard kokkos(argc, argv);
    std::optional<mlacp::Mesh> mesh;  // once it exists, a failure on one rank is reported on it (report_failure)
    try {
      namespace model = mlacp::model;
      ModelReport report;
      std::optional<model::MachineParams> machine;
      const model::Dtype dtype = model::parse_dtype(options.dtype);  // "double", "float", "bf16": the tool's names
      if (!options.machine.empty()) {
        // Read on rank 0 and broadcast: the same parameters, or the same error, on every rank.
        machine = model::read_machine(MPI_COMM_WORLD, options.machine);
        report.machine = machine->name.empty() ? options.machine : machine->name;
        // The machine's own rule for which collectives are polled beside compute (OverlapPolicy).
        mlacp::overlap_policy() = mlacp::overlap_policy_for(*machine);
      }
      if (options.plan_ring) {
        // The same choice on every rank, or the same InvalidArgument (nothing fits the budget) on every rank.
        const model::PlannedMesh pm =
            model::plan_mesh(MPI_COMM_WORLD, options.config, dtype, *machine, options.memory_per_rank);
        const model::PlanRow& best = *pm.plan.best();
        report.planned = pm.choice.describe();
        if (rank == 0) {
          std::ostringstream line;
          line << "mlacp-mla-block: --ring plan on " << pm.cluster.nodes << " node(s) x " << pm.cluster.ranks_per_node
               << " rank(s) (" << report.machine << "): " << pm.choice.describe() << ", predicted forward+backward "
               << std::setprecision(4) << best.prediction.total_s() * 1e3 << " ms, memory "
               << best.prediction.memory.total() / (1 << 20) << " MiB per rank";
          if (pm.plan.budget > 0) line << " (budget " << pm.plan.budget / (1 << 20) << " MiB)";
          line << ", first of " << pm.plan.rows.size() << " choices";
          if (options.strategy_given && options.config.strategy != pm.choice.strategy)
            line << "; overrides --strategy " << mlacp::to_string(options.config.strategy);
          else if (options.strategy_given)
            line << "; --strategy " << mlacp::to_string(options.config.strategy) << " is the plan's too";
          if (options.layout_given && pm.choice.ring == 1)
            line << "; overrides --ring-layout " << mlacp::to_string(options.config.ring_layout)
                 << " (a flat mesh has no ring layout)";
          else if (options.layout_given && options.config.ring_layout != pm.choice.layout)
            line << "; overrides --ring-layout " << mlacp::to_string(options.config.ring_layout);
          else if (options.layout_given)
            line << "; --ring-layout " << mlacp::to_string(options.config.ring_layout) << " is the plan's too";
          std::cout << line.str() << "\n" << std::flush;
        }
        options.config = model::apply(pm.choice, options.config);
        options.ring = mlacp::Ring(pm.choice.ring);
      }
      mesh.emplace(MPI_COMM_WORLD, options.ring);
      if (machine) {
        // The model's prediction for this run's own choice; a choice the model cannot place (or a machine without
        // this dtype's figures) is reported, on every rank alike, and the run goes on.
        const model::Choice choice{options.config.strategy, mesh->ulysses_size(), mesh->ring_size(),
                                   options.config.ring_layout};
        try {
          report.prediction =
              model::predict(options.config, dtype, choice, model::cluster_of(MPI_COMM_WORLD), *machine);
        } catch (const mlacp::InvalidArgument& e) {
          report.why_not = e.what();
        }
      }
      code = options.dtype == "float"  ? run<float>(options, *mesh, report)
             : options.dtype == "bf16" ? run<mlacp::bf16>(options, *mesh, report)
                                       : run<double>(options, *mesh, report);
    } catch (const std::exception& caught) {
      // mlacp raises its errors on every rank (an agreement, or the failure channel): every rank says so (a rank that
      // did not would be one left waiting in a collective), rank 0 prints the verdict. Anything else (an allocation
      // that did not fit, a file that cannot be written) happened on this rank alone: it is reported on the mesh, so
      // that the others' next wait raises it instead of hanging.
      std::string what = caught.what();
      if (auto out_of_memory = mlacp::detail::translate_allocation_failure(caught, "mlacp-mla-block"))
        what = out_of_memory->what();
      const bool agreed = dynamic_cast<const mlacp::InvalidArgument*>(&caught) != nullptr ||
                          dynamic_cast<const mlacp::UsageError*>(&caught) != nullptr;
      if (mesh && !agreed) mesh->report_failure("mlacp-mla-block: rank " + std::to_string(rank) + ": " + what);
      std::cerr << "mlacp-mla-block: rank " + std::to_string(rank) + ": " + what + "\n" << std::flush;
      if (rank == 0) std::cerr << "FAIL\n";
      code = 2;
    }
  }
  MPI_Finalize();
  return code;
}
