// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// format_report (calibrate.hpp): a calibration's figures as text, for mlacp-plan --calibrate.
#include <mlacp/model/calibrate.hpp>

#include <cstdio>
#include <string>

namespace mlacp::model {

namespace {

std::string format(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c);
  return buf;
}

/// The link's figures: latency in microseconds and bandwidth (1/beta) in GB/s.
std::string link_line(const char* level, const LinkCost& l) {
  if (l.alpha_s == 0 && l.beta_s_per_byte == 0) return std::string(level) + ": not measured\n";
  return std::string(level) + format(": alpha %.2f us, beta %.4g s/B (%.3f GB/s)\n", l.alpha_s * 1e6, l.beta_s_per_byte,
                                     l.beta_s_per_byte > 0 ? 1e-9 / l.beta_s_per_byte : 0.0);
}

}  // namespace

std::string format_report(const CalibrationReport& report) {
  const MachineParams& m = report.machine;
  std::string out = "machine: " + m.name + "\nsource: " + m.source + "\n";
  out += "nodes: " + std::to_string(report.nodes) + ", ranks per node: " + std::to_string(m.ranks_per_node) + "\n";
  out += link_line("intra-node", m.intra);
  out += link_line("inter-node (per node link)", m.inter);
  if (report.inter_pingpong_bytes > 0) {
    out += format("cross-node ping-pong: %.0f bytes at %.3f GB/s\n", report.inter_pingpong_bytes,
                  report.inter_pingpong_bandwidth * 1e-9);
  }
  if (report.overlap_both_s > 0) {
    out += format("overlap: GEMM loop %.2f ms, all-to-all %.2f ms, both", report.overlap_alone_s * 1e3,
                  report.overlap_collective_s * 1e3) +
           format(" %.2f ms: efficiency %.2f\n", report.overlap_both_s * 1e3, m.overlap_efficiency);
  }
  out += format("synchronisation lag (max - mean over ranks after equal work): %.1f us\n", m.sync_s * 1e6);
  for (const auto& [dtype, points] : m.gemm) {
    out += "GEMM " + dtype + " (effective size: GFLOP/s per rank):";
    for (const auto& [n, rate] : points) out += format(" %.0f: %.2f", n, rate * 1e-9);
    out += "\n";
  }
  for (const auto& [dtype, rate] : m.attention) {
    out +=
        "attention " + dtype +
        format(": forward %.2f, backward %.2f GFLOP/s per rank", rate.forward_flops * 1e-9, rate.backward_flops * 1e-9);
    const auto points = m.attention_by_width.find(dtype);
    if (points != m.attention_by_width.end() && !points->second.empty()) {
      out += "; by head width dqk + dv (forward/backward):";
      for (const auto& p : points->second)
        out += format(" %.0f: %.1f/%.1f", p.width, p.forward_flops * 1e-9, p.backward_flops * 1e-9);
    }
    out += "\n";
  }
  out += format("memory bandwidth: %.2f GB/s per rank (copy)", m.memory_bandwidth * 1e-9);
  for (const auto& [dtype, rate] : m.elementwise_bandwidth)
    out += "; " + dtype + format(" element-wise %.2f GB/s", rate * 1e-9);
  out += "\n";
  if (!report.gemm_fit.empty()) {
    out += "GEMM fit (the curve without the shape's own point, against the measured time):\n";
    for (const auto& f : report.gemm_fit) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "  %-6s m=%d n=%d k=%d: measured %.3f ms, predicted %.3f ms (%+.1f%%)\n",
                    to_string(f.dtype), f.m, f.n, f.k, f.measured_s * 1e3, f.predicted_s * 1e3,
                    100.0 * f.relative_error());
      out += buf;
    }
  }
  out += format("calibration took %.1f s\n", report.seconds);
  return out;
}

}  // namespace mlacp::model
