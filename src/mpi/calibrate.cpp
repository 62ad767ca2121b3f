// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Calibration's MPI part (calibrate.hpp): the nodes, the network levels' alpha and beta, and the compute measurements
// (src/model/compute_rates.cpp) run on every rank at once and reduced; rank 0's result is broadcast as JSON, so that
// every rank returns the same parameters.
#include "../model/compute_rates.hpp"

#include <mlacp/error.hpp>
#include <mlacp/model/calibrate.hpp>
#include <mlacp/mpi/request_transport.hpp>

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mlacp::model {

namespace {

using mlacp::mpi::check_mpi;

/// A communicator freed when it goes out of scope.
class OwnedComm {
 public:
  OwnedComm() = default;
  ~OwnedComm() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;
  MPI_Comm comm = MPI_COMM_NULL;
};

int rank_of(MPI_Comm c) {
  int r = 0;
  check_mpi(MPI_Comm_rank(c, &r), "calibration: MPI_Comm_rank");
  return r;
}
int size_of(MPI_Comm c) {
  int s = 0;
  check_mpi(MPI_Comm_size(c, &s), "calibration: MPI_Comm_size");
  return s;
}

/// A barrier whose waiting ranks sleep between polls instead of spinning, so that ranks which share cores leave them
/// to the ranks still measuring.
void relaxed_barrier(MPI_Comm c) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(c, &request), "calibration: MPI_Ibarrier");
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "calibration: MPI_Test");
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

/// Each entry's maximum over the ranks of c.
std::vector<double> max_over(MPI_Comm c, std::vector<double> values) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_MAX, c),
            "calibration: MPI_Allreduce(max)");
  return values;
}

/// The mean over the ranks of c.
double mean_over(MPI_Comm c, double value) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, c), "calibration: MPI_Allreduce(sum)");
  return value / size_of(c);
}

/// Half the round trip of `bytes` between ranks a and b of c, averaged over `iterations` round trips; 0 on the
/// other ranks (which do nothing).
double pingpong(MPI_Comm c, int a, int b, std::vector<char>& buffer, int iterations) {
  const int me = rank_of(c);
  if (me != a && me != b) return 0;
  const int peer = me == a ? b : a;
  const int count = static_cast<int>(buffer.size());
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iterations; ++i) {
    if (me == a) {
      check_mpi(MPI_Send(buffer.data(), count, MPI_BYTE, peer, 0, c), "calibration: ping-pong MPI_Send");
      check_mpi(MPI_Recv(buffer.data(), count, MPI_BYTE, peer, 0, c, MPI_STATUS_IGNORE),
                "calibration: ping-pong MPI_Recv");
    } else {
      check_mpi(MPI_Recv(buffer.data(), count, MPI_BYTE, peer, 0, c, MPI_STATUS_IGNORE),
                "calibration: ping-pong MPI_Recv");
      check_mpi(MPI_Send(buffer.data(), count, MPI_BYTE, peer, 0, c), "calibration: ping-pong MPI_Send");
    }
  }
  return (MPI_Wtime() - t0) / (2.0 * iterations);
}

/// The median over `repeats` (after a warm-up) of the slowest rank's half round trip: ranks a and b of `pair_comm`
/// ping-pong (every such communicator at once); every rank of `all` calls it.
double pingpong_median(MPI_Comm all, MPI_Comm pair_comm, int a, int b, double bytes, int iterations, int repeats) {
  std::vector<char> buffer(static_cast<std::size_t>(bytes), 1);
  std::vector<double> times;
  for (int r = -1; r < repeats; ++r) {
    relaxed_barrier(all);
    const double t = pingpong(pair_comm, a, b, buffer, iterations);
    if (r >= 0) times.push_back(t);
  }
  relaxed_barrier(all);
  return model::detail::median(max_over(all, times));
}

/// The median over `repeats` (after a warm-up) of the slowest rank's time of one MPI_Alltoall of `bytes` per rank in
/// total over `group` (every such communicator at once); every rank of `all` calls it.
double alltoall_median(MPI_Comm all, MPI_Comm group, double bytes, int repeats) {
  const int n = size_of(group);
  const int per_peer = std::max(1, static_cast<int>(bytes / n));
  std::vector<char> send(static_cast<std::size_t>(per_peer) * n, 1), recv(send.size());
  std::vector<double> times;
  for (int r = -1; r < repeats; ++r) {
    relaxed_barrier(all);
    const double t0 = MPI_Wtime();
    check_mpi(MPI_Alltoall(send.data(), per_peer, MPI_BYTE, recv.data(), per_peer, MPI_BYTE, group),
              "calibration: MPI_Alltoall");
    if (r >= 0) times.push_back(MPI_Wtime() - t0);
  }
  relaxed_barrier(all);
  return model::detail::median(max_over(all, times));
}

/// beta from an all-to-all of `bytes` per rank over groups of n ranks whose link carries `sharers` ranks' bytes, and
/// the level's latency alpha (the 8-byte ping-pong): t = (n-1) alpha + sharers (n-1)/n m beta, solved for beta. Not
/// the slope between two sizes: on a shaped link the smaller size passes within the shaper's burst, faster than the
/// rate, and the slope overstated beta (tbf at 500 Mbit/s: 0.35 Gbit/s from 64 KiB to 1 MiB, 0.45 from 1 MiB alone,
/// and the layer's collectives ran at 0.45). Where alpha leaves nothing, the time over the bytes (an upper bound).
double alltoall_beta(MPI_Comm all, MPI_Comm group, double sharers, double alpha, double bytes, int repeats) {
  const double n = size_of(group);
  const double t = alltoall_median(all, group, bytes, repeats);
  const double per_byte = sharers * (n - 1) / n * bytes;
  const double transfer = t - (n - 1) * alpha;
  return transfer > 0 ? transfer / per_byte : t / per_byte;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown host";
  return buf;
}

/// The rate curve of (size, rate) points, sorted by size, points of equal size merged (their rates averaged).
std::vector<std::pair<double, double>> curve_of(std::vector<std::pair<double, double>> points) {
  std::sort(points.begin(), points.end());
  std::vector<std::pair<double, double>> out;
  std::vector<int> counts;
  for (const auto& p : points) {
    if (!out.empty() && std::abs(p.first - out.back().first) <= 1e-9 * p.first) {
      out.back().second += p.second;
      ++counts.back();
    } else {
      out.push_back(p);
      counts.push_back(1);
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i) out[i].second /= counts[i];
  return out;
}

/// Broadcasts a string from rank 0 of c.
std::string broadcast_string(MPI_Comm c, std::string s) {
  std::uint64_t n = s.size();
  check_mpi(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, c), "calibration: MPI_Bcast(length)");
  s.resize(n);
  check_mpi(MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, 0, c), "calibration: MPI_Bcast(text)");
  return s;
}

}  // namespace

CalibrationReport calibrate_report(MPI_Comm comm, const CalibrationOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.repeats < 1) {
    throw InvalidArgument("calibrate: repeats = " + std::to_string(options.repeats) + ", expected at least 1");
  }
  if (options.dtypes.empty()) throw InvalidArgument("calibrate: no dtype given, expected at least one");
  if (options.ranks_per_node < 0) {
    throw InvalidArgument("calibrate: ranks_per_node = " + std::to_string(options.ranks_per_node) +
                          ", expected 0 (by shared memory) or a positive count");
  }
  const int rank = rank_of(comm), size = size_of(comm);

  // ---- nodes --------------------------------------------------------------------------------------------------
  OwnedComm node;
  if (options.ranks_per_node > 0) {
    check_mpi(MPI_Comm_split(comm, rank / options.ranks_per_node, rank, &node.comm), "calibration: MPI_Comm_split");
  } else {
    check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node.comm),
              "calibration: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  }
  const int local = rank_of(node.comm), node_size = size_of(node.comm);
  // Node numbers: the order of the nodes' local rank 0 in comm.
  int node_id = 0;
  {
    OwnedComm leaders;
    check_mpi(MPI_Comm_split(comm, local == 0 ? 0 : MPI_UNDEFINED, rank, &leaders.comm),
              "calibration: MPI_Comm_split(leaders)");
    if (local == 0) node_id = rank_of(leaders.comm);
    check_mpi(MPI_Bcast(&node_id, 1, MPI_INT, 0, node.comm), "calibration: MPI_Bcast(node)");
  }
  std::vector<int> node_of(size), local_of(size), sizes(size);
  check_mpi(MPI_Allgather(&node_id, 1, MPI_INT, node_of.data(), 1, MPI_INT, comm), "calibration: MPI_Allgather");
  check_mpi(MPI_Allgather(&local, 1, MPI_INT, local_of.data(), 1, MPI_INT, comm), "calibration: MPI_Allgather");
  check_mpi(MPI_Allgather(&node_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm), "calibration: MPI_Allgather");
  const int nodes = *std::max_element(node_of.begin(), node_of.end()) + 1;
  std::vector<int> per_node(nodes, 0);
  for (int r = 0; r < size; ++r) per_node[node_of[r]] = sizes[r];
  if (std::any_of(per_node.begin(), per_node.end(), [&](int g) { return g != per_node[0]; })) {
    std::string counts;
    for (int i = 0; i < nodes; ++i) counts += (i ? ", " : "") + std::to_string(per_node[i]);
    throw InvalidArgument("calibrate: the nodes hold different numbers of ranks (" + counts + " on nodes 0 to " +
                          std::to_string(nodes - 1) + "), expected the same number of ranks on every node");
  }
  const int g = per_node[0];
  // One rank per node, the ranks of one local rank: the inter-node level's groups.
  OwnedComm cross;
  check_mpi(MPI_Comm_split(comm, local, node_id, &cross.comm), "calibration: MPI_Comm_split(cross)");

  const bool quick = options.quick;
  const int repeats = options.repeats;
  // The all-to-all size per rank for beta: the layer's messages (tens of KiB to a few MiB per peer).
  const double large = quick ? 256.0 * 1024 : 1024.0 * 1024;
  const int latency_iterations = quick ? 5 : 20;

  MachineParams m;
  m.ranks_per_node = g;
  std::vector<std::string> notes;

  // ---- intra level ----------------------------------------------------------------------------------------------
  if (g >= 2) {
    m.intra.alpha_s = pingpong_median(comm, node.comm, 0, 1, 8, latency_iterations, repeats);
    m.intra.beta_s_per_byte = alltoall_beta(comm, node.comm, 1.0, m.intra.alpha_s, large, repeats);
  } else {
    notes.push_back("intra-node level not measured (one rank per node)");
  }

  // ---- inter level ----------------------------------------------------------------------------------------------
  CalibrationReport report;
  report.nodes = nodes;
  if (nodes >= 2) {
    int a = -1, b = -1;
    for (int r = 0; r < size; ++r) {
      if (local_of[r] == 0 && node_of[r] == 0) a = r;
      if (local_of[r] == 0 && node_of[r] == 1) b = r;
    }
    m.inter.alpha_s = pingpong_median(comm, comm, a, b, 8, latency_iterations, repeats);
    m.inter.beta_s_per_byte = alltoall_beta(comm, cross.comm, g, m.inter.alpha_s, large, repeats);
    const double bytes = quick ? 256.0 * 1024 : 4.0 * 1024 * 1024;
    const double half_trip = pingpong_median(comm, comm, a, b, bytes, 1, repeats);
    report.inter_pingpong_bytes = bytes;
    report.inter_pingpong_bandwidth = half_trip > 0 ? bytes / half_trip : 0;
  } else {
    notes.push_back("inter-node level not measured (one node)");
  }

  // ---- compute ----------------------------------------------------------------------------------------------------
  const std::function<void()> sync = [&] { relaxed_barrier(comm); };
  const double min_run_s = quick ? 0.001 : 0.1;  // a timed run's least length: the ranks' runs overlap over many
                                                 // scheduler time slices where ranks share cores
  const auto squares = model::detail::calibration_squares(quick);
  const auto skinny = model::detail::calibration_skinny(quick);
  std::vector<model::detail::GemmShape> shapes = squares;
  shapes.insert(shapes.end(), skinny.begin(), skinny.end());
  for (const Dtype dtype : options.dtypes) {
    const std::string name = to_string(dtype);
    if (m.gemm.count(name)) continue;
    std::vector<std::pair<double, double>> points;  // (effective size, rate), one per shape
    std::vector<double> seconds;
    for (const auto& s : shapes) {
      const double t = mean_over(comm, model::detail::time_gemm(dtype, s, repeats, min_run_s, sync));
      seconds.push_back(t);
      points.emplace_back(s.effective_size(), 2.0 * s.m * s.n * s.k / t);
    }
    m.gemm[name] = curve_of(points);
    for (std::size_t i = squares.size(); i < shapes.size(); ++i) {
      MachineParams others;
      auto rest = points;
      rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(i));
      others.gemm[name] = curve_of(rest);
      const auto& s = shapes[i];
      report.gemm_fit.push_back({dtype, s.m, s.n, s.k, seconds[i], others.gemm_time(dtype, s.m, s.n, s.k)});
    }
    // The attention core at three head widths (its rate per FLOP falls with thin heads); the middle one is the
    // problem whose rates stand for every width where a machine file has no points.
    const auto default_problem = model::detail::attention_problem(quick);
    for (const auto& problem : model::detail::attention_width_problems(quick)) {
      const auto times = model::detail::time_attention(dtype, problem, repeats, min_run_s, sync);
      const AttentionWidthRate point{static_cast<double>(problem.nope + problem.rope + problem.vdim),
                                     problem.forward_flops() / mean_over(comm, times.forward_s),
                                     problem.backward_flops() / mean_over(comm, times.backward_s)};
      m.attention_by_width[name].push_back(point);
      if (problem.nope == default_problem.nope && problem.rope == default_problem.rope &&
          problem.vdim == default_problem.vdim)
        m.attention[name] = {point.forward_flops, point.backward_flops};
    }
    const auto elementwise = model::detail::time_elementwise(dtype, quick, repeats, min_run_s, sync);
    m.elementwise_bandwidth[name] = elementwise.bytes / mean_over(comm, elementwise.seconds);
  }
  // ---- synchronisation lag and overlap ---------------------------------------------------------------------------
  // A float GEMM loop of about 5 ms (quick: 1 ms) on every rank at once, then the spread of its end over the ranks:
  // max minus mean (the lag a collective absorbs after equal work). Then the loop with an all-to-all over all ranks
  // in flight, polled between GEMMs as the layer polls, against each alone: the share of the collective the compute
  // does not hide.
  {
    const model::detail::GemmShape shape{128, 128, 128};
    const model::detail::GemmLoop loop(shape);
    loop.run(2, {});
    const double one = std::max(1e-6, max_over(comm, {loop.run(4, {}) / 4})[0]);
    const int calls = std::max(2, static_cast<int>((quick ? 1e-3 : 5e-3) / one));
    std::vector<double> lags;
    for (int r = 0; r < repeats; ++r) {
      relaxed_barrier(comm);
      const double t = loop.run(calls, {});
      double mx = t, sum = t;
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, &mx, 1, MPI_DOUBLE, MPI_MAX, comm), "calibration: MPI_Allreduce(lag)");
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, comm), "calibration: MPI_Allreduce(lag)");
      lags.push_back(mx - sum / size);
    }
    m.sync_s = model::detail::median(lags);
    if (size > 1) {
      const int per_peer = std::max(1, static_cast<int>(large / size));
      std::vector<char> send(static_cast<std::size_t>(per_peer) * size, 1), recv(send.size());
      const double t_m = alltoall_median(comm, comm, large, repeats);
      const int overlap_calls = std::max(2, static_cast<int>(2 * t_m / one));
      std::vector<double> alone, both;
      for (int r = 0; r < repeats; ++r) {
        relaxed_barrier(comm);
        alone.push_back(max_over(comm, {loop.run(overlap_calls, {})})[0]);
        relaxed_barrier(comm);
        const double t0 = MPI_Wtime();
        MPI_Request request = MPI_REQUEST_NULL;
        check_mpi(MPI_Ialltoall(send.data(), per_peer, MPI_BYTE, recv.data(), per_peer, MPI_BYTE, comm, &request),
                  "calibration: MPI_Ialltoall");
        loop.run(overlap_calls, [&] {
          int done = 0;
          MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        });
        check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "calibration: MPI_Wait");
        both.push_back(max_over(comm, {MPI_Wtime() - t0})[0]);
      }
      const double t_c = model::detail::median(alone), t_o = model::detail::median(both);
      const double hidden_part = std::min(t_c, t_m);
      m.overlap_efficiency = hidden_part > 0 ? std::clamp(1 - (t_o - std::max(t_c, t_m)) / hidden_part, 0.0, 1.0) : 1.0;
      report.overlap_alone_s = t_c;
      report.overlap_collective_s = t_m;
      report.overlap_both_s = t_o;
    }
  }

  const double bytes = model::detail::copy_bytes(quick);
  m.memory_bandwidth = mean_over(comm, 2.0 * bytes / model::detail::time_copy(bytes, repeats, min_run_s, sync));

  // ---- name, source; rank 0's figures to every rank ---------------------------------------------------------------
  m.name = std::to_string(g) + " x " + std::to_string(nodes) + " ranks on " + model::detail::cpu_model();
  m.source = "mlacp-plan --calibrate, " + utc_now() + ", " + host_name();
  for (const auto& note : notes) m.source += "; " + note;
  const std::string json = broadcast_string(comm, rank == 0 ? machine_to_json(m) : std::string());
  report.machine = machine_from_json(json, "calibration broadcast");

  std::vector<double> figures{report.inter_pingpong_bytes, report.inter_pingpong_bandwidth, report.overlap_alone_s,
                              report.overlap_collective_s, report.overlap_both_s};
  for (const auto& f : report.gemm_fit) {
    figures.push_back(f.measured_s);
    figures.push_back(f.predicted_s);
  }
  check_mpi(MPI_Bcast(figures.data(), static_cast<int>(figures.size()), MPI_DOUBLE, 0, comm),
            "calibration: MPI_Bcast(report)");
  report.inter_pingpong_bytes = figures[0];
  report.inter_pingpong_bandwidth = figures[1];
  report.overlap_alone_s = figures[2];
  report.overlap_collective_s = figures[3];
  report.overlap_both_s = figures[4];
  for (std::size_t i = 0; i < report.gemm_fit.size(); ++i) {
    report.gemm_fit[i].measured_s = figures[5 + 2 * i];
    report.gemm_fit[i].predicted_s = figures[6 + 2 * i];
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm), "calibration: MPI_Allreduce(time)");
  report.seconds = seconds;
  return report;
}

MachineParams calibrate(MPI_Comm comm, const CalibrationOptions& options) {
  return calibrate_report(comm, options).machine;
}

}  // namespace mlacp::model
