// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-block: the whole MLA block backward, the overlapped schedule (MlaConfig::overlap = true) against the same
// schedule with every collective waited right after its launch (overlap = false), for both strategies.
//
// Compute and communication totals come from the event recorder of the blocking runs: there each collective is waited
// as soon as it is launched, so T_comm = sum over the backward's collectives of (wait_end - launch) (the transfer and
// the unpack; the pack runs before the launch event and counts as compute, as it is CPU work on the same core), and
// T_compute = T_blocking - T_comm (every kernel, GEMM and pack). Both per rank, then the maximum over the ranks, then
// the median over the repeats. The ideal overlapped time is max(T_compute, T_comm); the report gives
// T_overlapped / max(T_compute, T_comm) (target <= 1.10) and T_overlapped / T_blocking.
//
// Every report also has a roofline line: the backward's FLOPs per rank (mlacp/mla/flop_count.hpp) against the rate of
// one GEMM of the layer's q_proj shape measured at the start of the same run, as the fraction of that rate the
// overlapped backward's time corresponds to.
//
// Packing's payoff: --pack-docs N documents (default 8; the longest --pack-longest L, default S, 64 in --quick; the
// others from a seeded spread over L/8..L, the total a multiple of P) packed into one sequence with
// MlaConfig::cu_seqlens, against the same documents padded to the longest (a batch of N rows of L rounded up to a
// multiple of P, causal attention per row, as without packing). Latent strategy, overlapped forward + backward, the two
// interleaved, median of the repeats; with the tokens computed and the bytes each rank hands to the collectives per
// step, counted from the configuration (the formula is printed; the collectives it counts are checked against the
// event record of one packed step).
//
// P > H (an even P): H = P/2 heads, so that flat Ulysses at P leaves P - H ranks without a head, against the two-level
// mesh P/2 x 2 (ring attention, zigzag), where every rank computes attention; overlapped forward + backward, both
// strategies, the four interleaved, median of the repeats (JSON "few_heads"; at P = 4: H = 2, 4 x 1 against 2 x 2).
//
// --timeline FILE writes the events of one overlapped backward per strategy, all ranks gathered on rank 0, for
// scripts/plot_timeline.py. --trace FILE writes the same backwards as a Chrome trace, one file per rank (FILE with the
// rank inserted: trace.json -> trace.rank0.json, ...; scripts/merge_traces.py joins them), for Perfetto or
// chrome://tracing; each strategy's backward is a compute slice "backward <strategy> (overlapped)" around its phases.
//
//   mpirun -n 2 mlacp-perf-block [--quick] [--json FILE] [--timeline FILE] [--trace FILE] [--repeats N]
//                                [--transport-label STR]
//                                [--rate-label STR] [--seq S] [--hidden D] [--heads H] [--latent R]
//                                [--pack-docs N] [--pack-longest L]
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/testing/synthetic.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>

#include "perf_common.hpp"

namespace {

using namespace mlacp::perf;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using T = double;
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
using Layer = mlacp::MlaAttention<T, Space>;

const char* usage =
    "usage: mlacp-perf-block [--quick] [--json FILE] [--timeline FILE] [--trace FILE] [--repeats N] [--warmup N]\n"
    "                        [--transport-label STR] [--rate-label STR] [--batch B] [--seq S] [--hidden D]\n"
    "                        [--heads H] [--nope dn] [--rope dr] [--vdim dv] [--latent R]\n"
    "                        [--pack-docs N] [--pack-longest L]\n";

// Sum over the collectives of (wait_end - launch) in `events` (a blocking backward).
double communication_time(const std::vector<mlacp::Event>& events) {
  std::map<std::string, double> launched;
  double total = 0;
  for (const auto& e : events) {
    if (e.kind == mlacp::EventKind::launch) launched[e.name] = e.time_s;
    if (e.kind == mlacp::EventKind::wait_end) {
      const auto it = launched.find(e.name);
      if (it != launched.end()) {
        total += e.time_s - it->second;
        launched.erase(it);
      }
    }
  }
  return total;
}

// The events of every rank as JSON on rank 0 (null elsewhere).
Json gather_events(const std::vector<mlacp::Event>& events, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  Json list = Json::array();
  for (const mlacp::Event& e : events)
    list.push_back(JsonObject().str("kind", mlacp::to_string(e.kind)).str("name", e.name).num("t", e.time_s).json());
  // Gathered as text: each rank's list, parsed again on rank 0.
  const std::string local = list.dump(-1, ' ', false, Json::error_handler_t::replace);
  int length = static_cast<int>(local.size());
  std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm);
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      offsets[static_cast<std::size_t>(r)] = total;
      total += lengths[static_cast<std::size_t>(r)];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  MPI_Gatherv(local.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, comm);
  if (rank != 0) return Json();
  Json ranks = Json::array();
  for (int r = 0; r < size; ++r) {
    const auto at = static_cast<std::size_t>(r);
    const std::string text = all.substr(static_cast<std::size_t>(offsets[at]), static_cast<std::size_t>(lengths[at]));
    ranks.push_back(JsonObject().num("rank", r).set("events", Json::parse(text)).json());
  }
  return ranks;
}

struct Result {
  std::string strategy;
  Samples overlapped, blocking, compute, comm;
  Json timeline;                    // rank 0's gathered events (null elsewhere and without --timeline)
  std::vector<mlacp::Event> trace;  // this rank's events of the timeline's backward, inside one enclosing slice
};

Result run_strategy(const mlacp::MlaConfig& base, mlacp::MlaStrategy strategy, const mlacp::Mesh& mesh, int warmup,
                    int repeats, bool want_timeline, bool want_trace) {
  const Space space;
  const MPI_Comm comm = mesh.comm();
  mlacp::MlaConfig c = base;
  c.strategy = strategy;
  const auto weights = mlacp::testing::synthetic::weights<T, Mem>(c, 7);
  mlacp::MlaConfig blocking_config = c;
  blocking_config.overlap = false;
  c.overlap = true;
  const Layer overlapped(c, weights, mesh), blocking(blocking_config, weights, mesh);
  const int s = overlapped.local_seq();
  Tensor3 x("x", c.batch, s, c.hidden), dy("dy", c.batch, s, c.hidden);
  mlacp::testing::synthetic::fill(x, 100 + static_cast<std::uint64_t>(mesh.rank()), 1.0);
  mlacp::testing::synthetic::fill(dy, 200 + static_cast<std::uint64_t>(mesh.rank()), 1.0);

  Result result;
  result.strategy = mlacp::to_string(strategy);
  Region region(std::string("block ") + result.strategy);
  mlacp::events::enable(true);
  for (int it = 0; it < warmup + repeats; ++it) {
    for (int k = 0; k < 2; ++k) {
      const bool is_blocking = (k + it) % 2 == 1;
      const Layer& layer = is_blocking ? blocking : overlapped;
      auto forward = layer.forward(space, x);
      Kokkos::fence();
      MPI_Barrier(comm);
      mlacp::events::clear();
      double t = 0;
      {
        Region r(is_blocking ? "backward blocking" : "backward overlapped");
        const double start = now();
        auto grads = layer.backward(space, forward, dy);
        Kokkos::fence();
        t = now() - start;
      }
      double times[3] = {t, 0, 0};
      if (is_blocking) {
        times[2] = communication_time(mlacp::events::snapshot());
        times[1] = t - times[2];
      }
      MPI_Allreduce(MPI_IN_PLACE, times, 3, MPI_DOUBLE, MPI_MAX, comm);
      if (it < warmup) continue;
      if (is_blocking) {
        result.blocking.times.push_back(times[0]);
        result.compute.times.push_back(times[1]);
        result.comm.times.push_back(times[2]);
      } else {
        result.overlapped.times.push_back(times[0]);
      }
    }
  }
  if (want_timeline || want_trace) {
    Region r("timeline");
    auto forward = overlapped.forward(space, x);
    Kokkos::fence();
    MPI_Barrier(comm);
    mlacp::events::clear();
    const auto begin = std::chrono::steady_clock::now();
    auto grads = overlapped.backward(space, forward, dy);
    Kokkos::fence();
    const auto end = std::chrono::steady_clock::now();
    const auto events = mlacp::events::snapshot();
    if (want_timeline) result.timeline = gather_events(events, comm);
    if (want_trace) {
      const std::string name = "backward " + result.strategy + " (overlapped)";
      const auto ns = [](std::chrono::steady_clock::time_point t) {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
      };
      result.trace.push_back({mlacp::EventKind::compute_begin, name, 0.0, ns(begin)});
      result.trace.insert(result.trace.end(), events.begin(), events.end());
      result.trace.push_back({mlacp::EventKind::compute_end, name, 0.0, ns(end)});
    }
  }
  mlacp::events::enable(false);
  return result;
}

// Packing's payoff: a batch of documents of mixed lengths packed into one sequence with MlaConfig::cu_seqlens against
// the same documents padded to the longest (a batch of one row per document, causal attention per row, the pad tokens
// computed and moved), latent strategy, overlapped forward + backward, interleaved.
struct Packing {
  std::vector<std::int64_t> lengths;  // per document
  int longest = 0, padded_seq = 0;    // padded_seq: the longest rounded up to a multiple of P
  std::int64_t packed_seq = 0;        // sum of the lengths, a multiple of P
  Samples packed, padded;
  double packed_bytes = 0, padded_bytes = 0;  // per rank per step, in the collectives' send buffers
  std::vector<std::string> collectives;       // the launches of one packed step, from the event record
};

// `documents` lengths from a seeded spread over [longest/8, longest], the first one the longest, the shortest grown
// so that the total is a multiple of P (the same on every rank: mt19937's raw output is specified by the standard).
std::vector<std::int64_t> document_lengths(int documents, int longest, int P) {
  std::mt19937 engine(13);
  std::vector<std::int64_t> lengths{longest};
  for (int d = 1; d < documents; ++d) {
    const double u = static_cast<double>(engine()) / 4294967296.0;  // [0, 1)
    lengths.push_back(std::max<std::int64_t>(1, std::llround(longest * (0.125 + 0.875 * u))));
  }
  std::int64_t total = 0;
  for (const auto l : lengths) total += l;
  auto shortest = std::min_element(lengths.begin(), lengths.end());
  *shortest += (P - total % P) % P;
  return lengths;
}

// Elements a rank hands to the collectives in one latent forward + backward: Q and dQ all-to-alls B*s*H*dqk each, O
// and dO B*s*H*dv each, the payload all-gather B*s*(R+dr), the latent reduce-scatter B*S*(R+dr); s = S/P.
double latent_step_elements(const mlacp::MlaConfig& c, int P) {
  const double B = c.batch, S = c.seq, s = S / P, H = c.heads;
  return B * s * (2 * H * c.qk_dim() + 2 * H * c.vdim + (c.latent + c.rope)) + B * S * (c.latent + c.rope);
}

Packing measure_packing(const mlacp::MlaConfig& base, const mlacp::Mesh& mesh, int documents, int longest, int warmup,
                        int repeats) {
  const Space space;
  const int P = mesh.size();
  Packing result;
  result.lengths = document_lengths(documents, longest, P);
  // The longest after the shortest was grown (it may pass `longest` when P is large).
  result.longest = static_cast<int>(*std::max_element(result.lengths.begin(), result.lengths.end()));
  result.padded_seq = (result.longest + P - 1) / P * P;
  mlacp::MlaConfig packed = base, padded = base;
  packed.strategy = padded.strategy = mlacp::MlaStrategy::latent;
  packed.overlap = padded.overlap = true;
  packed.batch = 1;
  packed.cu_seqlens = {0};
  for (const auto l : result.lengths) packed.cu_seqlens.push_back(packed.cu_seqlens.back() + l);
  result.packed_seq = packed.cu_seqlens.back();
  packed.seq = static_cast<int>(result.packed_seq);
  padded.batch = documents;
  padded.seq = result.padded_seq;
  for (const auto* c : {&packed, &padded})
    if (const std::string error = c->error(P); !error.empty())
      throw std::invalid_argument("the packing measurement's configuration: " + error);
  const Layer packed_layer(packed, mlacp::testing::synthetic::weights<T, Mem>(packed, 7), mesh);
  const Layer padded_layer(padded, mlacp::testing::synthetic::weights<T, Mem>(padded, 7), mesh);
  Tensor3 xp("x packed", 1, packed_layer.local_seq(), base.hidden);
  Tensor3 xd("x padded", documents, padded_layer.local_seq(), base.hidden);
  mlacp::testing::synthetic::fill(xp, 400 + static_cast<std::uint64_t>(mesh.rank()), 1.0);
  mlacp::testing::synthetic::fill(xd, 500 + static_cast<std::uint64_t>(mesh.rank()), 1.0);
  const auto step = [&space](const Layer& layer, const Tensor3& x) {
    auto forward = layer.forward(space, x);
    layer.backward(space, forward, x);
  };
  // The collectives one packed step launches, to hold the analytic count to what the layer does.
  mlacp::events::enable(true);
  mlacp::events::clear();
  step(packed_layer, xp);
  Kokkos::fence();
  // (The call's shape, 4 integers per rank gathered before the pass, is no data of the layer's: not counted.)
  for (const auto& e : mlacp::events::snapshot())
    if (e.kind == mlacp::EventKind::launch && e.name != mlacp::names::call_shape) result.collectives.push_back(e.name);
  mlacp::events::enable(false);
  namespace names = mlacp::names;
  const std::vector<std::string> expected{names::q_a2a,  names::payload_all_gather,   names::o_a2a, names::do_a2a,
                                          names::dq_a2a, names::latent_reduce_scatter};
  std::vector<std::string> seen = result.collectives, wanted = expected;
  // (The O exchange is per peer: P - 1 launches of one name.)
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  std::sort(wanted.begin(), wanted.end());
  if (seen != wanted) {
    std::string list;
    for (const auto& n : result.collectives) list += (list.empty() ? "" : ", ") + n;
    throw std::runtime_error(
        "the packing measurement counts the bytes of Q a2a, payload all-gather, O a2a, dO a2a, dQ "
        "a2a and latent reduce-scatter, but one latent step launched: " +
        list);
  }
  const auto samples = measure_interleaved(mesh.comm(), warmup, repeats,
                                           {[&] { step(packed_layer, xp); }, [&] { step(padded_layer, xd); }});
  result.packed = samples[0];
  result.padded = samples[1];
  result.packed_bytes = 8.0 * latent_step_elements(packed, P);
  result.padded_bytes = 8.0 * latent_step_elements(padded, P);
  return result;
}

// P > H: H = P/2 heads (fewer heads than ranks), so flat Ulysses at P leaves P - H ranks without a head (they
// project and move their tokens but compute no attention), against the two-level mesh U = P/2 x C = 2 (ring attention,
// zigzag), where every rank computes the attention of its heads over its ring chunk. Overlapped forward + backward,
// both strategies, the four interleaved in one run, median of the repeats.
struct FewHeads {
  int heads = 0, ulysses = 0, ring = 0;
  std::vector<std::string> labels;  // "<strategy> <U>x<C>"
  std::vector<Samples> samples;     // in `labels`' order
};

FewHeads measure_few_heads(const mlacp::MlaConfig& base, const mlacp::Mesh& flat, int warmup, int repeats) {
  const Space space;
  const int P = flat.size();
  FewHeads result;
  result.heads = std::max(1, P / 2);
  result.ring = 2;
  result.ulysses = P / 2;
  mlacp::Mesh two_level(flat.comm(), mlacp::Ring(result.ring));
  two_level.set_checked(false);
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<Tensor3> xs;
  for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    for (const mlacp::Mesh* mesh : {&flat, static_cast<const mlacp::Mesh*>(&two_level)}) {
      mlacp::MlaConfig c = base;
      c.heads = result.heads;
      c.strategy = strategy;
      c.overlap = true;
      c.ring_layout = mlacp::RingLayout::zigzag;
      layers.push_back(std::make_unique<Layer>(c, mlacp::testing::synthetic::weights<T, Mem>(c, 7), *mesh));
      xs.emplace_back("x few heads", c.batch, layers.back()->local_seq(), c.hidden);
      mlacp::testing::synthetic::fill(xs.back(), 600 + static_cast<std::uint64_t>(flat.rank()), 1.0);
      result.labels.push_back(std::string(mlacp::to_string(strategy)) + " " + std::to_string(mesh->ulysses_size()) +
                              "x" + std::to_string(mesh->ring_size()));
    }
  }
  std::vector<std::function<void()>> bodies;
  for (std::size_t i = 0; i < layers.size(); ++i)
    bodies.emplace_back([&, i] {
      auto forward = layers[i]->forward(space, xs[i]);
      layers[i]->backward(space, forward, xs[i]);
    });
  result.samples = measure_interleaved(flat.comm(), warmup, repeats, bodies);
  return result;
}

int run(int argc, char** argv) {
  const Options o = parse_options(argc, argv,
                                  {"--timeline", "--trace", "--batch", "--seq", "--hidden", "--heads", "--nope",
                                   "--rope", "--vdim", "--latent", "--pack-docs", "--pack-longest"});
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mesh.set_checked(false);
  const int P = mesh.size(), rank = mesh.rank();
  const int repeats = o.repeats_or(3, 9), warmup = o.quick ? 1 : o.warmup;
  mlacp::MlaConfig c;
  c.batch = o.get_int("batch", 1);
  c.seq = o.get_int("seq", o.quick ? 256 : 512);
  c.hidden = o.get_int("hidden", o.quick ? 64 : 1024);
  c.heads = o.get_int("heads", o.quick ? 16 : 8);
  c.nope = o.get_int("nope", o.quick ? 8 : 16);
  c.rope = o.get_int("rope", o.quick ? 4 : 16);
  c.vdim = o.get_int("vdim", o.quick ? 8 : 32);
  c.latent = o.get_int("latent", o.quick ? 32 : 512);
  if (const std::string error = c.error(P); !error.empty()) throw std::invalid_argument(error);
  const std::string timeline_path = o.get("timeline", "");
  const std::string trace_path = o.get("trace", "");
  // Before any layer runs: the machine's GEMM rate at q_proj's forward shape, [B*s, D] x [D, H*dqk].
  const GemmRate gemm = measure_gemm_rate<T>(mesh.comm(), c.batch * c.seq / P, c.hidden, c.heads * c.qk_dim());
  const mlacp::MlaFlops flops = mlacp::mla_flops(c, P);

  JsonObject doc = header("mlacp-perf-block", o, P, repeats);
  doc.obj("config", config_json(c).str("dtype", "double"))
      .str("method",
           "T_comm = sum over collectives of (wait_end - launch) in the blocking backward's event record (transfer and "
           "unpack); T_compute = T_blocking - T_comm; per rank, max over ranks, median over repeats");
  Json docs = Json::array(), timelines = Json::array();
  std::vector<Result> results;
  for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    Result r = run_strategy(c, strategy, mesh, warmup, repeats, !timeline_path.empty(), !trace_path.empty());
    const double tov = r.overlapped.median(), tb = r.blocking.median(), tc = r.compute.median(), tm = r.comm.median();
    docs.push_back(JsonObject()
                       .str("strategy", r.strategy)
                       .samples("backward_overlapped", r.overlapped)
                       .samples("backward_blocking", r.blocking)
                       .samples("compute_total", r.compute)
                       .samples("communication_total", r.comm)
                       .num("overlapped_over_max_compute_comm", tov / std::max(tc, tm))
                       .num("overlapped_over_blocking", tov / tb)
                       .num("comm_over_compute", tm / tc)
                       .num("hidden_fraction_of_comm", (tb - tov) / tm)
                       .obj("roofline", roofline_json(flops, gemm, flops.backward, tov))
                       .json());
    if (!r.timeline.empty())
      timelines.push_back(
          JsonObject().str("strategy", r.strategy).set("overlap", true).set("ranks", r.timeline).json());
    results.push_back(std::move(r));
  }
  doc.set("strategies", docs);
  if (!trace_path.empty()) {
    std::vector<mlacp::Event> trace;
    for (const Result& r : results) trace.insert(trace.end(), r.trace.begin(), r.trace.end());
    mlacp::events::write_chrome_trace(trace_path, trace, rank);
  }

  // What the default configuration's checked mode costs: the overlapped forward + backward with checked mode on (the
  // default, one small agreement per collective and per layer call) and off, interleaved, latent strategy.
  Samples checked_on, checked_off;
  {
    const Space space;
    mlacp::MlaConfig lc = c;
    lc.strategy = mlacp::MlaStrategy::latent;
    const Layer layer(lc, mlacp::testing::synthetic::weights<T, Mem>(lc, 7), mesh);
    Tensor3 x("x", lc.batch, layer.local_seq(), lc.hidden);
    mlacp::testing::synthetic::fill(x, 300 + static_cast<std::uint64_t>(rank), 1.0);
    for (int it = 0; it < warmup + repeats; ++it) {
      for (const bool checked : {true, false}) {
        mesh.set_checked(checked);
        const Samples one = measure(mesh.comm(), 0, 1, [&] {
          auto forward = layer.forward(space, x);
          layer.backward(space, forward, x);
        });
        if (it >= warmup) (checked ? checked_on : checked_off).times.push_back(one.times.front());
      }
    }
    mesh.set_checked(false);
  }
  doc.obj("checked_mode_cost", JsonObject()
                                   .str("what", "latent forward + backward, overlapped, checked mode on vs off")
                                   .samples("checked_on", checked_on)
                                   .samples("checked_off", checked_off)
                                   .num("on_over_off", checked_on.median() / checked_off.median()));

  // Packing's payoff: N documents (longest L, the others from a seeded spread over L/8..L) packed with cu_seqlens
  // against the same documents padded to the longest as a batch of N rows.
  const int pack_docs = o.get_int("pack-docs", 8);
  const int pack_longest = o.get_int("pack-longest", o.quick ? 64 : c.seq);
  if (pack_docs < 1 || pack_longest < 1)
    throw std::invalid_argument("--pack-docs " + std::to_string(pack_docs) + " and --pack-longest " +
                                std::to_string(pack_longest) + ": expected both >= 1");
  const Packing pack = measure_packing(c, mesh, pack_docs, pack_longest, warmup, repeats);
  // P > H (needs an even P): H = P/2, flat Ulysses P x 1 against the two-level mesh P/2 x 2.
  const bool few_heads_wanted = P >= 2 && P % 2 == 0;
  FewHeads few;
  if (few_heads_wanted) few = measure_few_heads(c, mesh, warmup, repeats);
  const double real_tokens = static_cast<double>(pack.packed_seq);
  const double padded_tokens = static_cast<double>(pack_docs) * pack.padded_seq;
  double real_pairs = 0;
  std::vector<double> lengths;
  for (const auto l : pack.lengths) {
    real_pairs += 0.5 * static_cast<double>(l) * static_cast<double>(l + 1);
    lengths.push_back(static_cast<double>(l));
  }
  const double padded_pairs = pack_docs * 0.5 * pack.padded_seq * (pack.padded_seq + 1.0);
  const char* bytes_formula =
      "8 * (B*s*(2*H*(dn+dr) + 2*H*dv + (R+dr)) + B*S*(R+dr)) per rank, s = S/P: Q and dQ all-to-alls, O and dO "
      "all-to-alls, payload all-gather (send), latent reduce-scatter (send)";
  doc.obj("packing", JsonObject()
                         .str("what",
                              "latent forward + backward, overlapped: documents packed with cu_seqlens (B=1) vs "
                              "padded to the longest (B = documents, S = longest rounded up to a multiple of P)")
                         .num("documents", pack_docs)
                         .set("lengths", lengths)
                         .num("packed_S", real_tokens)
                         .num("padded_S", pack.padded_seq)
                         .num("tokens_real", real_tokens)
                         .num("tokens_padded", padded_tokens)
                         .num("score_pairs_real", real_pairs)
                         .num("score_pairs_padded", padded_pairs)
                         .samples("packed", pack.packed)
                         .samples("padded", pack.padded)
                         .num("padded_over_packed", pack.padded.median() / pack.packed.median())
                         .num("bytes_per_rank_packed", pack.packed_bytes)
                         .num("bytes_per_rank_padded", pack.padded_bytes)
                         .num("bytes_padded_over_packed", pack.padded_bytes / pack.packed_bytes)
                         .str("bytes_formula", bytes_formula)
                         .set("collectives_per_step", pack.collectives));
  if (few_heads_wanted) {
    Json cells = Json::array();
    for (std::size_t i = 0; i < few.labels.size(); ++i)
      cells.push_back(JsonObject().str("config", few.labels[i]).samples("forward_backward", few.samples[i]).json());
    doc.obj("few_heads",
            JsonObject()
                .str("what",
                     "P > H: H = P/2 heads, overlapped forward + backward, flat Ulysses P x 1 (P - H ranks "
                     "compute no attention) vs the two-level mesh P/2 x 2 (ring attention, zigzag), "
                     "interleaved")
                .num("H", few.heads)
                .num("U", few.ulysses)
                .num("C", few.ring)
                .set("cells", cells)
                .num("latent_ring_over_flat", few.samples[1].median() / few.samples[0].median())
                .num("expanded_ring_over_flat", few.samples[3].median() / few.samples[2].median()));
  }

  if (rank == 0) {
    std::cout << "mlacp-perf-block: P=" << P << " transport=" << o.transport << " rate=" << o.rate << " "
              << c.describe() << " repeats=" << repeats << " (median of max over ranks)\n";
    std::cout << std::left << std::setw(10) << "strategy" << std::right << std::setw(12) << "overlapped"
              << std::setw(12) << "blocking" << std::setw(11) << "compute" << std::setw(11) << "comm" << std::setw(10)
              << "ovl/max" << std::setw(11) << "ovl/block" << std::setw(10) << "hidden"
              << "\n";
    for (const Result& r : results) {
      const double tov = r.overlapped.median(), tb = r.blocking.median(), tc = r.compute.median(), tm = r.comm.median();
      std::cout << std::left << std::setw(10) << r.strategy << std::right << std::setw(10) << ms(tov) << "ms"
                << std::setw(10) << ms(tb) << "ms" << std::setw(9) << ms(tc) << "ms" << std::setw(9) << ms(tm) << "ms"
                << std::setw(10) << fixed(tov / std::max(tc, tm), 3) << std::setw(11) << fixed(tov / tb, 3)
                << std::setw(10) << fixed((tb - tov) / tm, 2) << "\n";
    }
    std::cout << "compute/comm from the blocking runs' event record (comm = sum of wait_end - launch); hidden = "
                 "(blocking - overlapped) / comm\n";
    std::cout << "roofline per rank: backward " << fixed(flops.backward * 1e-9, 3) << " GFLOP (attention core "
              << fixed(flops.attention_backward * 1e-9, 3) << "), forward " << fixed(flops.forward * 1e-9, 3)
              << " GFLOP; GEMM rate " << fixed(gemm.flops_per_s * 1e-9, 2) << " GFLOP/s (" << gemm.shape
              << ", double, median of " << gemm.repeats
              << "); fraction of the machine's GEMM rate (overlapped backward):";
    for (const Result& r : results)
      std::cout << " " << r.strategy << " " << fixed(flops.backward / gemm.flops_per_s / r.overlapped.median(), 3);
    std::cout << "\n";
    std::cout << "checked mode (the default) on / off, latent forward + backward: " << ms(checked_on.median())
              << "ms / " << ms(checked_off.median()) << "ms = " << fixed(checked_on.median() / checked_off.median(), 3)
              << "\n";
    std::cout << "packing (latent forward + backward, " << pack_docs << " documents, lengths";
    for (const auto l : pack.lengths) std::cout << " " << l;
    std::cout << "): packed S=" << pack.packed_seq << " B=1 " << ms(pack.packed.median())
              << "ms, padded S=" << pack.padded_seq << " B=" << pack_docs << " " << ms(pack.padded.median())
              << "ms, padded/packed = " << fixed(pack.padded.median() / pack.packed.median(), 2) << "\n";
    std::cout << "  tokens computed: real " << pack.packed_seq << ", padded " << fixed(padded_tokens, 0) << " ("
              << fixed(padded_tokens / real_tokens, 2) << "x); causal score pairs "
              << fixed(padded_pairs / real_pairs, 2) << "x\n";
    std::cout << "  collective bytes per rank per step: packed " << fixed(pack.packed_bytes / 1048576.0, 2)
              << " MiB, padded " << fixed(pack.padded_bytes / 1048576.0, 2)
              << " MiB = " << fixed(pack.padded_bytes / pack.packed_bytes, 2) << "x; " << bytes_formula << "\n";
    if (few_heads_wanted) {
      std::cout << "P > H (H=" << few.heads << ", forward + backward, overlapped): ";
      for (std::size_t i = 0; i < few.labels.size(); ++i)
        std::cout << (i ? ", " : "") << few.labels[i] << " " << ms(few.samples[i].median()) << "ms";
      std::cout << "; ring/flat latent " << fixed(few.samples[1].median() / few.samples[0].median(), 2) << ", expanded "
                << fixed(few.samples[3].median() / few.samples[2].median(), 2) << "\n";
    }
    write_json(o.json, doc.json());
    if (!timeline_path.empty()) {
      JsonObject t = header("mlacp-perf-block timeline", o, P, 1);
      t.set("timelines", timelines);
      write_json(timeline_path, t.json());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return mlacp::perf::run_main(argc, argv, usage, run); }
