// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-attention: the attention core alone (forward + backward on head-local q, k, v), against the machine's
// GEMM rate measured in the same run, for each tiling of the flash core (the measurement its default tiles come from),
// and the reference core (one thread per row) where it is fast enough to time. "gemms-only" is the BLAS path's ceiling:
// the same tile GEMM calls at its default tiles, on the same Views, with nothing else (time_gemms_only).
//
// FLOPs per (batch, head): E = S(S+1)/2 causal score elements; forward 2E(dqk+dv), backward 2E(3dqk+2dv) (score
// recompute, dP, dV, dQ, dK). GEMM rate: a square 512 x 512 x 512 GEMM of the same value type through Kokkos
// Kernels (the BLAS TPL on host builds; perf_common.hpp's measure_gemm_rate), median of the repeats; bf16 (--dtype bf16
// or all) through the Bf16GemmPlan the core's tiles use, which the run installs as the layer does. "fraction" =
// (FLOPs / GEMM rate) / measured time. Every rank runs the same work (P ranks load P cores, as the layer does); times
// are the max over ranks.
//
// Packed documents: the flash core at the largest S with a DocumentLayout of 8 documents of mixed lengths summing to S
// against the same S as one document (default tiles, first head shape): forward and backward times, the tile pairs
// visited (FlashAttentionCore::tile_pairs) and the causal score elements left (sum L(L+1)/2 over S(S+1)/2).
//
//   mpirun -n 2 mlacp-perf-attention [--quick] [--json FILE] [--repeats N] [--dtype float|double|bf16|both|all]
//                                    [--seq S[,S...]] [--heads h] [--tiles QxK[,QxK...]] [--shapes small,deepseek]
//                                    [--path blas|team]
#include <mpi.h>
#include <mlacp/compat.hpp>
#include <mlacp/mla/kernels/attention_core.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_blas.hpp>
#include <mlacp/mla/kernels/flash_attention.hpp>

#include <mlacp/bf16_gemm.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "perf_common.hpp"

namespace {

using namespace mlacp::perf;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

const char* usage =
    "usage: mlacp-perf-attention [--quick] [--json FILE] [--repeats N] [--warmup N] [--dtype "
    "float|double|bf16|both|all]\n"
    "                            [--seq S[,S...]] [--heads h] [--tiles QxK[,QxK...]] [--shapes small,deepseek]\n"
    "                            [--path blas|team] [--reference-max-seq S]\n";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

struct HeadShape {
  std::string name;
  int dqk, dv;
};

using bf16 = mlacp::compat::bf16;

template <class T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, double>) return "double";
  if constexpr (std::is_same_v<T, float>) return "float";
  return "bf16";
}

template <class T>
struct Problem {
  Kokkos::View<T****, Kokkos::LayoutRight, Mem> q, k, v, o, d_o, dq, dk, dv;
  Kokkos::View<mlacp::compat::accumulation_t<T>***, Kokkos::LayoutRight, Mem> lse;
  Problem(int s, int h, const HeadShape& hs)
      : q("q", 1, s, h, hs.dqk),
        k("k", 1, s, h, hs.dqk),
        v("v", 1, s, h, hs.dv),
        o("o", 1, s, h, hs.dv),
        d_o("d_o", 1, s, h, hs.dv),
        dq("dq", 1, s, h, hs.dqk),
        dk("dk", 1, s, h, hs.dqk),
        dv("dv", 1, s, h, hs.dv),
        lse("lse", 1, h, s) {
    std::mt19937 gen(7);
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    for (const auto& view : {q, k, v, d_o}) {
      auto host = Kokkos::create_mirror_view(view);
      for (std::size_t i = 0; i < host.span(); ++i) host.data()[i] = static_cast<T>(static_cast<float>(dist(gen)));
      Kokkos::deep_copy(view, host);
    }
  }
};

struct Row {
  std::string dtype, shape, core;
  int seq, heads, tq, tk;
  double forward_s, backward_s, flops, rate;
};

/// A row of the table: `fwd` and `bwd` timed (median of max over ranks) and the core's FLOPs (the file's head).
template <class T>
Row timed_row(MPI_Comm comm, const std::string& name, int tq, int tk, int s, int h, const HeadShape& hs, int warmup,
              int repeats, double rate, const std::function<void()>& fwd, const std::function<void()>& bwd) {
  const Samples f = measure(comm, warmup, repeats, fwd);
  const Samples b = measure(comm, warmup, repeats, bwd);
  const double e = static_cast<double>(h) * s * (s + 1.0) / 2.0;
  return {dtype_name<T>(),
          hs.name,
          name,
          s,
          h,
          tq,
          tk,
          f.median(),
          b.median(),
          2.0 * e * (hs.dqk + hs.dv) + 2.0 * e * (3.0 * hs.dqk + 2.0 * hs.dv),
          rate};
}

template <class T, class Core>
Row time_core(MPI_Comm comm, const Core& core, const std::string& name, int tq, int tk, int s, int h,
              const HeadShape& hs, int warmup, int repeats, double rate) {
  Problem<T> p(s, h, hs);
  const Space space;
  const auto fwd = [&] { core.forward(space, mlacp::attention_problem(p.q, p.k, p.v, p.o, p.lse)); };
  const auto bwd = [&] {
    core.backward(space, mlacp::attention_problem(p.q, p.k, p.v, p.o, p.lse, p.d_o, p.dq, p.dk, p.dv));
  };
  return timed_row<T>(comm, name, tq, tk, s, h, hs, warmup, repeats, rate, fwd, bwd);
}

/// The ceiling of the BLAS path: the very GEMM calls its forward and backward make at tiles tq x tk (one document:
/// the tile pairs up to the diagonal, cut into row blocks by for_each_row_block as the core cuts them), on the same
/// Views and strides, without the softmax, the probabilities, dS or any other pass. Its fraction is what the core
/// would reach if everything but its tile products cost nothing.
template <class T>
Row time_gemms_only(MPI_Comm comm, int tq, int tk, int s, int h, const HeadShape& hs, int warmup, int repeats,
                    double rate) {
  Problem<T> p(s, h, hs);
  const Space space;
  // Scores in the accumulation type; bf16: P and dS as the bf16 operands the core rounds them to.
  using A = mlacp::compat::accumulation_t<T>;
  Kokkos::View<A**, Kokkos::LayoutRight, Mem> scores("scores", tq, tk), grads("grads", tq, tk);
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> scores_t("scores operand", tq, tk), grads_t("grads operand", tq, tk);
  auto operand = [](const auto& acc, const auto& narrow) {
    if constexpr (std::is_same_v<A, T>) {
      (void)narrow;
      return acc;
    } else {
      (void)acc;
      return narrow;
    }
  };
  const mlacp::DocumentLayout one;
  const auto docs = one.host(s);
  using mlacp::detail::head_rows;
  using mlacp::detail::rows_cols;
  auto tiles = [&](auto&& block) {
    for (int hd = 0; hd < h; ++hd)
      for (std::int64_t i0 = 0; i0 < s; i0 += tq)
        for (std::int64_t j0 = 0; j0 <= std::min<std::int64_t>(i0 + tq, s) - 1; j0 += tk) {
          const std::int64_t nq = std::min<std::int64_t>(tq, s - i0), nk = std::min<std::int64_t>(tk, s - j0);
          mlacp::detail::for_each_row_block(docs, i0, nq, j0, nk, mlacp::detail::flash_diagonal_rows<T>,
                                            [&](std::int64_t a, std::int64_t na, std::int64_t ka, std::int64_t n) {
                                              block(hd, i0 + a, na, j0 + ka, n);
                                            });
        }
  };
  using mlacp::detail::gemm_values;
  const auto fwd = [&] {
    tiles([&](int hd, std::int64_t r0, std::int64_t na, std::int64_t k0, std::int64_t nk) {
      const auto sc = rows_cols(scores, 0, na, nk), p_op = operand(sc, rows_cols(scores_t, 0, na, nk));
      gemm_values(space, "N", "T", A(1), head_rows(p.q, 0, hd, r0, na), head_rows(p.k, 0, hd, k0, nk), A(0), sc);
      gemm_values(space, "N", "N", A(1), p_op, head_rows(p.v, 0, hd, k0, nk), A(1), head_rows(p.o, 0, hd, r0, na));
    });
  };
  const auto bwd = [&] {
    tiles([&](int hd, std::int64_t r0, std::int64_t na, std::int64_t k0, std::int64_t nk) {
      const auto sc = rows_cols(scores, 0, na, nk), ds = rows_cols(grads, 0, na, nk);
      const auto p_op = operand(sc, rows_cols(scores_t, 0, na, nk)), ds_op = operand(ds, rows_cols(grads_t, 0, na, nk));
      const auto q_a = head_rows(p.q, 0, hd, r0, na), do_a = head_rows(p.d_o, 0, hd, r0, na);
      const auto k_j = head_rows(p.k, 0, hd, k0, nk);
      gemm_values(space, "N", "T", A(1), q_a, k_j, A(0), sc);
      gemm_values(space, "T", "N", A(1), p_op, do_a, A(1), head_rows(p.dv, 0, hd, k0, nk));
      gemm_values(space, "N", "T", A(1), do_a, head_rows(p.v, 0, hd, k0, nk), A(0), ds);
      gemm_values(space, "T", "N", A(1), ds_op, q_a, A(1), head_rows(p.dk, 0, hd, k0, nk));
      gemm_values(space, "N", "N", A(1), ds_op, k_j, A(1), head_rows(p.dq, 0, hd, r0, na));
    });
  };
  return timed_row<T>(comm, "gemms-only", tq, tk, s, h, hs, warmup, repeats, rate, fwd, bwd);
}

struct PackedRow {
  std::string dtype, shape, path;
  int seq, heads, documents, tq, tk;
  double one_forward_s, one_backward_s, packed_forward_s, packed_backward_s, element_fraction;
  std::int64_t tiles_visited, tiles_causal;
};

/// cu_seqlens of 8 documents of mixed lengths (in proportion 5:1:3:2:8:1:4:2, each at least one token) summing to S.
std::vector<std::int64_t> mixed_packing(int s) {
  const int weights[] = {5, 1, 3, 2, 8, 1, 4, 2};
  const int n_docs = static_cast<int>(sizeof(weights) / sizeof(weights[0])), total = 26;
  std::vector<std::int64_t> cu = {0};
  for (int d = 0; d + 1 < n_docs && cu.back() + (n_docs - d) <= s; ++d)
    cu.push_back(cu.back() + std::max<std::int64_t>(1, static_cast<std::int64_t>(s) * weights[d] / total));
  if (cu.back() < s) cu.push_back(s);
  return cu;
}

template <class T>
PackedRow time_packed(MPI_Comm comm, const mlacp::FlashAttentionOptions& fo, const std::string& path, int s, int h,
                      const HeadShape& hs, int warmup, int repeats) {
  const mlacp::FlashAttentionCore core(fo);
  const std::vector<std::int64_t> cu = mixed_packing(s);
  const mlacp::DocumentLayout packed(cu, s), one;
  Problem<T> p(s, h, hs);
  const Space space;
  auto time = [&](const mlacp::DocumentLayout& docs) {
    const Samples f = measure(comm, warmup, repeats,
                              [&] { core.forward(space, mlacp::attention_problem(p.q, p.k, p.v, p.o, p.lse, docs)); });
    const Samples b = measure(comm, warmup, repeats, [&] {
      core.backward(space, mlacp::attention_problem(p.q, p.k, p.v, p.o, p.lse, p.d_o, p.dq, p.dk, p.dv, docs));
    });
    return std::make_pair(f.median(), b.median());
  };
  const auto [one_f, one_b] = time(one);
  const auto [packed_f, packed_b] = time(packed);
  constexpr bool narrow = std::is_same_v<T, bf16>;
  const auto [tq, tk] = core.tiles_for<Space>(s, hs.dqk, narrow);
  const auto [visited, causal] = core.tile_pairs<Space>(s, packed, hs.dqk, narrow);
  double elements = 0;
  for (std::size_t d = 0; d + 1 < cu.size(); ++d) {
    const double len = static_cast<double>(cu[d + 1] - cu[d]);
    elements += len * (len + 1.0) / 2.0;
  }
  return {dtype_name<T>(),
          hs.name,
          "flash-" + path,
          s,
          h,
          static_cast<int>(cu.size()) - 1,
          tq,
          tk,
          one_f,
          one_b,
          packed_f,
          packed_b,
          elements / (static_cast<double>(s) * (s + 1.0) / 2.0),
          visited,
          causal};
}

/// The square 512 x 512 x 512 GEMM rate of T: perf_common.hpp's for float and double; bf16 the core's way, bf16
/// operands through the installed plan (gemm_values), accumulated in float and rounded to bf16 (C of bf16).
template <class T>
double gemm_rate(MPI_Comm comm, int repeats) {
  if constexpr (!std::is_same_v<T, bf16>) {
    return measure_gemm_rate<T>(comm, 512, 512, 512, repeats).flops_per_s;
  } else {
    using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
    Matrix a("gemm a", 512, 512), b("gemm b", 512, 512), c("gemm c", 512, 512);
    Kokkos::deep_copy(a, T(0.5f));
    Kokkos::deep_copy(b, T(0.25f));
    const Space space;
    const Samples t =
        measure(comm, 1, repeats, [&] { mlacp::detail::gemm_values(space, "N", "T", 1.0f, a, b, 0.0f, c); });
    return 2.0 * 512 * 512 * 512 / t.median();
  }
}

template <class T>
void run_dtype(MPI_Comm comm, const Options& o, std::vector<Row>& rows, std::vector<PackedRow>& packed_rows) {
  const int repeats = o.repeats_or(2, 5), warmup = o.quick ? 1 : o.warmup;
  // bf16: one plan for the whole dtype, as the layer holds one (its backend chosen on the first, untimed calls).
  std::optional<mlacp::Bf16GemmPlan<Space>> plan;
  std::optional<mlacp::ScopedBf16GemmPlan<Space>> installed;
  if constexpr (std::is_same_v<T, bf16>) {
    plan.emplace();
    installed.emplace(*plan);
  }
  const double rate = gemm_rate<T>(comm, std::max(repeats, 5));
  const int h = o.get_int("heads", 4);
  const std::vector<std::string> seqs = split(o.get("seq", o.quick ? "256" : "512,2048"), ',');
  const std::vector<std::string> tiles = split(o.get("tiles", o.quick ? "0x0,32x64" : "0x0"), ',');
  std::vector<HeadShape> shapes;
  for (const auto& name : split(o.get("shapes", "small,deepseek"), ',')) {
    if (name == "small")
      shapes.push_back({"dqk=32 dv=32", 32, 32});
    else if (name == "deepseek")
      shapes.push_back({"dqk=192 dv=128", 192, 128});
    else
      throw std::invalid_argument("--shapes " + name + ": expected small or deepseek");
  }
  const std::string path = o.get("path", "blas");
  const int reference_max = o.get_int("reference-max-seq", o.quick ? 256 : 512);
  for (const auto& hs : shapes) {
    for (const auto& seq : seqs) {
      const int s = std::stoi(seq);
      for (const auto& t : tiles) {
        const auto x = t.find('x');
        if (x == std::string::npos) throw std::invalid_argument("--tiles " + t + ": expected QxK");
        mlacp::FlashAttentionOptions fo;
        fo.query_tile = std::stoi(t.substr(0, x));
        fo.key_tile = std::stoi(t.substr(x + 1));
        fo.path = path == "team" ? mlacp::FlashAttentionPath::team : mlacp::FlashAttentionPath::blas;
        const mlacp::FlashAttentionCore core(fo);
        const auto [tq, tk] = core.tiles_for<Space>(s, hs.dqk, std::is_same_v<T, bf16>);
        rows.push_back(time_core<T>(comm, core, "flash-" + path, tq, tk, s, h, hs, warmup, repeats, rate));
      }
      if (path != "team") {  // the BLAS path's own tile products alone, at its default tiles (by shape)
        const auto [tq, tk] = mlacp::FlashAttentionCore{}.tiles_for<Space>(s, hs.dqk, std::is_same_v<T, bf16>);
        rows.push_back(time_gemms_only<T>(comm, std::min(tq, s), std::min(tk, s), s, h, hs, warmup, repeats, rate));
      }
      if (s <= reference_max && !std::is_same_v<T, bf16>)
        rows.push_back(time_core<T>(comm, mlacp::CausalAttentionCore{}, "reference", 0, 0, s, h, hs, warmup,
                                    std::min(repeats, 3), rate));
    }
  }
  // Packed documents: the largest S, the first head shape, default tiles of the path.
  int s_max = 0;
  for (const auto& seq : seqs) s_max = std::max(s_max, std::stoi(seq));
  if (s_max > 0 && !shapes.empty()) {
    mlacp::FlashAttentionOptions fo;
    fo.path = path == "team" ? mlacp::FlashAttentionPath::team : mlacp::FlashAttentionPath::blas;
    packed_rows.push_back(time_packed<T>(comm, fo, path, s_max, h, shapes.front(), warmup, repeats));
  }
}

int run(int argc, char** argv) {
  const Options o = parse_options(
      argc, argv, {"--dtype", "--seq", "--heads", "--tiles", "--shapes", "--path", "--reference-max-seq"});
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string dtype = o.get("dtype", "both");
  if (dtype != "double" && dtype != "float" && dtype != "bf16" && dtype != "both" && dtype != "all")
    throw std::invalid_argument("--dtype " + dtype + ": expected float, double, bf16, both (double and float) or all");
  std::vector<Row> rows;
  std::vector<PackedRow> packed_rows;
  if (dtype == "double" || dtype == "both" || dtype == "all") run_dtype<double>(MPI_COMM_WORLD, o, rows, packed_rows);
  if (dtype == "float" || dtype == "both" || dtype == "all") run_dtype<float>(MPI_COMM_WORLD, o, rows, packed_rows);
  if (dtype == "bf16" || dtype == "all") run_dtype<bf16>(MPI_COMM_WORLD, o, rows, packed_rows);
  if (rank != 0) return 0;
  std::cout << "mlacp-perf-attention: attention core forward + backward, B=1, per rank (P = " << size
            << " ranks run the same work), median of max over ranks\n";
  std::cout << std::left << std::setw(8) << "dtype" << std::setw(16) << "head shape" << std::setw(14) << "core"
            << std::right << std::setw(7) << "S" << std::setw(4) << "h" << std::setw(10) << "tiles" << std::setw(11)
            << "fwd ms" << std::setw(11) << "bwd ms" << std::setw(10) << "GFLOP/s" << std::setw(10) << "GEMM"
            << std::setw(10) << "fraction\n";
  Json json_rows = Json::array();
  for (const auto& r : rows) {
    const double total = r.forward_s + r.backward_s, achieved = r.flops / total;
    const std::string tiles = r.tq ? std::to_string(r.tq) + "x" + std::to_string(r.tk) : "-";
    std::cout << std::left << std::setw(8) << r.dtype << std::setw(16) << r.shape << std::setw(14) << r.core
              << std::right << std::setw(7) << r.seq << std::setw(4) << r.heads << std::setw(10) << tiles
              << std::setw(11) << ms(r.forward_s) << std::setw(11) << ms(r.backward_s) << std::setw(10)
              << fixed(achieved / 1e9, 2) << std::setw(10) << fixed(r.rate / 1e9, 2) << std::setw(10)
              << fixed(achieved / r.rate, 3) << "\n";
    json_rows.push_back(JsonObject()
                            .str("dtype", r.dtype)
                            .str("head_shape", r.shape)
                            .str("core", r.core)
                            .num("seq", r.seq)
                            .num("heads", r.heads)
                            .num("query_tile", r.tq)
                            .num("key_tile", r.tk)
                            .num("forward_s", r.forward_s)
                            .num("backward_s", r.backward_s)
                            .num("flops", r.flops)
                            .num("gemm_rate_flops", r.rate)
                            .num("fraction_of_gemm_rate", achieved / r.rate)
                            .json());
  }
  std::cout << "\npacked documents (cu_seqlens) against the same S as one document, default tiles:\n";
  std::cout << std::left << std::setw(8) << "dtype" << std::setw(16) << "head shape" << std::setw(14) << "core"
            << std::right << std::setw(7) << "S" << std::setw(6) << "docs" << std::setw(10) << "tiles" << std::setw(13)
            << "one fwd ms" << std::setw(13) << "one bwd ms" << std::setw(13) << "packed fwd" << std::setw(13)
            << "packed bwd" << std::setw(15) << "tiles visited" << std::setw(10) << "skipped" << std::setw(11)
            << "elements" << std::setw(9) << "speedup\n";
  Json json_packed = Json::array();
  for (const auto& r : packed_rows) {
    const double skipped = 1.0 - static_cast<double>(r.tiles_visited) / static_cast<double>(r.tiles_causal);
    const double speedup = (r.one_forward_s + r.one_backward_s) / (r.packed_forward_s + r.packed_backward_s);
    std::cout << std::left << std::setw(8) << r.dtype << std::setw(16) << r.shape << std::setw(14) << r.path
              << std::right << std::setw(7) << r.seq << std::setw(6) << r.documents << std::setw(10)
              << (std::to_string(r.tq) + "x" + std::to_string(r.tk)) << std::setw(13) << ms(r.one_forward_s)
              << std::setw(13) << ms(r.one_backward_s) << std::setw(13) << ms(r.packed_forward_s) << std::setw(13)
              << ms(r.packed_backward_s) << std::setw(15)
              << (std::to_string(r.tiles_visited) + "/" + std::to_string(r.tiles_causal)) << std::setw(10)
              << fixed(skipped, 3) << std::setw(11) << fixed(r.element_fraction, 3) << std::setw(8) << fixed(speedup, 2)
              << "\n";
    json_packed.push_back(JsonObject()
                              .str("dtype", r.dtype)
                              .str("head_shape", r.shape)
                              .str("core", r.path)
                              .num("seq", r.seq)
                              .num("heads", r.heads)
                              .num("documents", r.documents)
                              .num("query_tile", r.tq)
                              .num("key_tile", r.tk)
                              .num("one_document_forward_s", r.one_forward_s)
                              .num("one_document_backward_s", r.one_backward_s)
                              .num("packed_forward_s", r.packed_forward_s)
                              .num("packed_backward_s", r.packed_backward_s)
                              .num("tiles_visited", static_cast<double>(r.tiles_visited))
                              .num("tiles_causal", static_cast<double>(r.tiles_causal))
                              .num("fraction_of_tiles_skipped", skipped)
                              .num("fraction_of_causal_elements", r.element_fraction)
                              .num("speedup", speedup)
                              .json());
  }
  JsonObject doc = header("mlacp-perf-attention", o, size, o.repeats_or(2, 5));
  doc.set("results", json_rows);
  doc.set("packed_documents", json_packed);
  write_json(o.json, doc.json());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_main(argc, argv, usage, run); }
