// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MachineParams (include/mlacp/model/machine.hpp): the dtype names, the GEMM curve's reading (harmonic-mean key,
// log-linear between points, clamped at the ends), error(), and the JSON file: a round trip at full precision, a
// hand-written GPU cluster's file, and each parse error's message (file, key, what was expected, what was found).
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/error.hpp>
#include <mlacp/model/machine.hpp>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

namespace {

using mlacp::model::AttentionRate;
using mlacp::model::Dtype;
using mlacp::model::MachineParams;

MachineParams sample() {
  MachineParams m;
  m.name = "test \"machine\"\twith \\ escapes";
  m.source = "unit test";
  m.ranks_per_node = 4;
  m.intra = {1.2345678901234567e-6, 1.0 / 3.0e10};
  m.inter = {2.5e-5, 1.0 / 7.0e8};
  m.gemm["double"] = {{32, 1e9}, {64, 4e9}, {512, 1.6e10}};
  m.gemm["float"] = {{16, 2e9}, {1024, 3.3333333333333333e10}};
  m.attention["double"] = {1.5e9, 0.1e9 + 0.2e9};
  m.attention["float"] = {3e9, 2e9};
  m.attention_by_width["float"] = {{64, 1e9, 2e9}, {256, 4e9, 3e9}};
  m.memory_bandwidth = 1.23456789012345e10;
  m.elementwise_bandwidth["float"] = 2.5e9;
  m.memory_per_rank_bytes = 8.0 * (1ull << 30);
  m.overlap_efficiency = 0.75;
  return m;
}

/// The message of the InvalidArgument that parsing `text` throws ("" when it does not throw).
std::string parse_error(const std::string& text) {
  try {
    (void)mlacp::model::machine_from_json(text, "params.json");
  } catch (const mlacp::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Machine, DtypeNamesAndSizes) {
  for (const Dtype d : {Dtype::float64, Dtype::float32, Dtype::bfloat16}) {
    EXPECT_EQ(mlacp::model::parse_dtype(mlacp::model::to_string(d)), d);
  }
  EXPECT_STREQ(mlacp::model::to_string(Dtype::bfloat16), "bf16");
  EXPECT_EQ(mlacp::model::bytes_of(Dtype::float64), 8);
  EXPECT_EQ(mlacp::model::bytes_of(Dtype::float32), 4);
  EXPECT_EQ(mlacp::model::bytes_of(Dtype::bfloat16), 2);
  try {
    (void)mlacp::model::parse_dtype("half");
    FAIL() << "no throw";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "dtype \"half\": expected \"double\", \"float\" or \"bf16\"");
  }
}

TEST(Machine, GemmRateInterpolatesLogLinearlyAndClamps) {
  const MachineParams m = sample();
  // On the points: a cube n x n x n has effective size n.
  EXPECT_DOUBLE_EQ(m.gemm_rate(Dtype::float64, 32, 32, 32), 1e9);
  EXPECT_DOUBLE_EQ(m.gemm_rate(Dtype::float64, 64, 64, 64), 4e9);
  // Between 32 and 64 at the geometric mean: the geometric mean of the rates.
  const double mid = std::sqrt(32.0 * 64.0);
  EXPECT_NEAR(m.gemm_rate(Dtype::float64, mid, mid, mid), 2e9, 1e-6 * 2e9);
  // Between 64 (4e9) and 512 (1.6e10): n = 128 is a third of the way in log, so the rate is 4e9 * 4^(1/3).
  EXPECT_NEAR(m.gemm_rate(Dtype::float64, 128, 128, 128), 4e9 * std::cbrt(4.0), 1e-6 * 6e9);
  // Clamped at the ends.
  EXPECT_DOUBLE_EQ(m.gemm_rate(Dtype::float64, 4, 4, 4), 1e9);
  EXPECT_DOUBLE_EQ(m.gemm_rate(Dtype::float64, 4096, 4096, 4096), 1.6e10);
  // A skinny product reads the curve at the harmonic mean: 3 / (1/1024 + 1/64 + 1/512) = 3072/19 (about 161.7).
  const double h = 3.0 / (1.0 / 1024 + 1.0 / 64 + 1.0 / 512);
  EXPECT_DOUBLE_EQ(m.gemm_rate(Dtype::float64, 1024, 64, 512), m.gemm_rate(Dtype::float64, h, h, h));
  EXPECT_NEAR(m.gemm_rate(Dtype::float64, 1024, 64, 512), 4e9 * std::pow(4.0, std::log(h / 64) / std::log(8.0)), 1e3);
  // The order of the dimensions does not matter.
  EXPECT_DOUBLE_EQ(m.gemm_rate(Dtype::float64, 64, 512, 1024), m.gemm_rate(Dtype::float64, 1024, 64, 512));
  // gemm_time: 2mnk at the rate; 0 for an empty product.
  EXPECT_DOUBLE_EQ(m.gemm_time(Dtype::float64, 64, 64, 64), 2.0 * 64 * 64 * 64 / 4e9);
  EXPECT_EQ(m.gemm_time(Dtype::float64, 0, 64, 64), 0.0);
  EXPECT_EQ(m.gemm_time(Dtype::float32, 64, 64, 0), 0.0);
  // A single-point curve is flat.
  MachineParams one = m;
  one.gemm["float"] = {{100, 5e9}};
  EXPECT_DOUBLE_EQ(one.gemm_rate(Dtype::float32, 1, 1, 1), 5e9);
  EXPECT_DOUBLE_EQ(one.gemm_rate(Dtype::float32, 1e4, 1e4, 1e4), 5e9);
}

TEST(Machine, AttentionRateByWidthInterpolatesLogLinearlyAndClamps) {
  const MachineParams m = sample();
  // On the points, at the geometric mean of two widths (the geometric mean of their rates), clamped at the ends.
  EXPECT_DOUBLE_EQ(m.attention_forward_rate(Dtype::float32, 64), 1e9);
  EXPECT_DOUBLE_EQ(m.attention_backward_rate(Dtype::float32, 256), 3e9);
  EXPECT_NEAR(m.attention_forward_rate(Dtype::float32, 128), 2e9, 1e-6 * 2e9);
  EXPECT_NEAR(m.attention_backward_rate(Dtype::float32, 128), std::sqrt(6.0) * 1e9, 1e-6 * 3e9);
  EXPECT_DOUBLE_EQ(m.attention_forward_rate(Dtype::float32, 8), 1e9);
  EXPECT_DOUBLE_EQ(m.attention_forward_rate(Dtype::float32, 4096), 4e9);
  // A dtype without points: its one rate at every width.
  EXPECT_DOUBLE_EQ(m.attention_forward_rate(Dtype::float64, 64), 1.5e9);
  EXPECT_DOUBLE_EQ(m.attention_backward_rate(Dtype::float64, 4096), 0.1e9 + 0.2e9);
  EXPECT_THROW((void)m.attention_forward_rate(Dtype::bfloat16, 64), mlacp::InvalidArgument);
}

TEST(Machine, ElementwiseRateFallsBackToTheCopyBandwidth) {
  const MachineParams m = sample();
  EXPECT_EQ(m.elementwise_rate(Dtype::float32), 2.5e9);
  EXPECT_EQ(m.elementwise_rate(Dtype::float64), m.memory_bandwidth);
}

TEST(Machine, MissingDtypeIsNamed) {
  const MachineParams m = sample();
  try {
    (void)m.gemm_rate(Dtype::bfloat16, 8, 8, 8);
    FAIL() << "no throw";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("GEMM rate for dtype \"bf16\""), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)m.gemm_time(Dtype::bfloat16, 0, 8, 8), mlacp::InvalidArgument);
  EXPECT_DOUBLE_EQ(m.attention_rate(Dtype::float32).forward_flops, 3e9);
  try {
    (void)m.attention_rate(Dtype::bfloat16);
    FAIL() << "no throw";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("attention rate for dtype \"bf16\""), std::string::npos) << e.what();
  }
}

TEST(Machine, ErrorNamesEachProblem) {
  EXPECT_EQ(sample().error(), "");
  MachineParams m = sample();
  m.inter.beta_s_per_byte = -1;
  EXPECT_EQ(m.error(), "inter.beta_s_per_byte = -1 (expected >= 0)");
  m = sample();
  m.overlap_efficiency = 1.5;
  EXPECT_EQ(m.error(), "overlap_efficiency = 1.5 (expected 0 to 1)");
  m = sample();
  m.gemm["double"] = {{64, 1e9}, {32, 2e9}};
  EXPECT_EQ(m.error(), "gemm.double[1]: n = 32 (expected n increasing, after 64)");
  m = sample();
  m.attention.erase("float");
  EXPECT_EQ(
      m.error(),
      "attention.float: missing (gemm has \"float\"); attention.float.by_width: no attention.float rate beside it");
  m.attention_by_width.erase("float");
  EXPECT_EQ(m.error(), "attention.float: missing (gemm has \"float\")");
  m = sample();
  m.attention["double"].backward_flops = 0;
  EXPECT_EQ(m.error(), "attention.double.backward_flops = 0 (expected > 0)");
  m = MachineParams{};
  EXPECT_EQ(m.error(), "gemm: no GEMM curve (expected one per dtype)");
  m = sample();
  m.attention_by_width["float"] = {{64, 1e9, 2e9}, {64, 4e9, 3e9}};
  EXPECT_EQ(m.error(), "attention.float.by_width[1]: width = 64 (expected widths increasing, after 64)");
  m = sample();
  m.attention_by_width["double"] = {{64, 0, 2e9}};
  EXPECT_EQ(m.error(), "attention.double.by_width[0]: 0 (expected > 0)");
  m = sample();
  m.elementwise_bandwidth["half"] = 1e9;
  EXPECT_EQ(m.error(), "elementwise_bandwidth.half: unknown dtype (expected \"double\", \"float\" or \"bf16\")");
  m = sample();
  m.ranks_per_node = 0;
  m.memory_bandwidth = -2;
  EXPECT_EQ(m.error(), "ranks_per_node = 0 (expected >= 1); memory_bandwidth = -2 (expected >= 0)");
}

TEST(Machine, JsonRoundTripKeepsEveryBit) {
  const MachineParams m = sample();
  const std::string text = mlacp::model::machine_to_json(m);
  const MachineParams back = mlacp::model::machine_from_json(text, "round trip");
  EXPECT_EQ(back.name, m.name);
  EXPECT_EQ(back.source, m.source);
  EXPECT_EQ(back.ranks_per_node, m.ranks_per_node);
  EXPECT_EQ(back.intra.alpha_s, m.intra.alpha_s);
  EXPECT_EQ(back.intra.beta_s_per_byte, m.intra.beta_s_per_byte);
  EXPECT_EQ(back.inter.alpha_s, m.inter.alpha_s);
  EXPECT_EQ(back.inter.beta_s_per_byte, m.inter.beta_s_per_byte);
  EXPECT_EQ(back.gemm, m.gemm);
  ASSERT_EQ(back.attention.size(), m.attention.size());
  for (const auto& [dtype, rate] : m.attention) {
    EXPECT_EQ(back.attention.at(dtype).forward_flops, rate.forward_flops);
    EXPECT_EQ(back.attention.at(dtype).backward_flops, rate.backward_flops);
  }
  ASSERT_EQ(back.attention_by_width.size(), 1u);
  const auto& points = back.attention_by_width.at("float");
  ASSERT_EQ(points.size(), 2u);
  for (std::size_t i = 0; i < points.size(); ++i) {
    EXPECT_EQ(points[i].width, m.attention_by_width.at("float")[i].width);
    EXPECT_EQ(points[i].forward_flops, m.attention_by_width.at("float")[i].forward_flops);
    EXPECT_EQ(points[i].backward_flops, m.attention_by_width.at("float")[i].backward_flops);
  }
  EXPECT_EQ(back.memory_bandwidth, m.memory_bandwidth);
  EXPECT_EQ(back.elementwise_bandwidth, m.elementwise_bandwidth);
  EXPECT_EQ(back.memory_per_rank_bytes, m.memory_per_rank_bytes);
  EXPECT_EQ(back.overlap_efficiency, m.overlap_efficiency);
  EXPECT_EQ(mlacp::model::machine_to_json(back), text);

  // Through a file.
  const std::string path = "test_machine_" + std::to_string(::getpid()) + ".json";
  mlacp::model::write_machine(m, path);
  EXPECT_EQ(mlacp::model::machine_to_json(mlacp::model::read_machine(path)), text);
  std::remove(path.c_str());
  try {
    (void)mlacp::model::read_machine(path);
    FAIL() << "no throw";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "machine parameters file \"" + path + "\": cannot be read (expected a JSON file)");
  }
  EXPECT_THROW(mlacp::model::write_machine(m, "/nonexistent-dir/x.json"), mlacp::Error);
}

TEST(Machine, JsonWritesBytesThatAreNotUtf8AsReplacementCharacters) {
  // A name set in code may hold any bytes; the file is UTF-8, so the writer replaces them (U+FFFD) instead of failing.
  MachineParams m = sample();
  m.name = "bad \xFF byte";
  const MachineParams back = mlacp::model::machine_from_json(mlacp::model::machine_to_json(m), "round trip");
  EXPECT_EQ(back.name, "bad \xEF\xBF\xBD byte");
}

TEST(Machine, HandWrittenGpuClusterParses) {
  // A cluster described by hand: 8 GPUs per node on NVLink, 4 x 400 Gb/s InfiniBand per node; optional keys left out
  // (memory_bandwidth) take their defaults; JSON's own spellings (exponents, escapes, spacing) are accepted.
  const std::string text = R"({
    "name": "8 x H100 SXM per node, NVLink 4, 4 x NDR400",
    "source": "datasheet \u2014 hand-written",
    "ranks_per_node": 8,
    "intra": { "alpha_s": 3e-6, "beta_s_per_byte": 2.2222e-12 },
    "inter": { "alpha_s": 5.0E-6, "beta_s_per_byte": 5e-12 },
    "gemm": {
      "bf16":  [[128, 5.0e13], [1024, 4.0e14], [8192, 7.0e14]],
      "float": [[128, 1e13], [8192, 5e13]]
    },
    "attention": {
      "bf16": { "forward_flops": 4.5e14, "backward_flops": 3.0e14 },
      "float": { "forward_flops": 2e13, "backward_flops": 1.5e13 }
    },
    "memory_per_rank_bytes": 85899345920,
    "overlap_efficiency": 1
  })";
  const MachineParams m = mlacp::model::machine_from_json(text, "h100.json");
  EXPECT_EQ(m.error(), "");
  EXPECT_EQ(m.name, "8 x H100 SXM per node, NVLink 4, 4 x NDR400");
  EXPECT_EQ(m.source, "datasheet \xE2\x80\x94 hand-written");
  EXPECT_EQ(m.ranks_per_node, 8);
  EXPECT_EQ(m.inter.alpha_s, 5e-6);
  EXPECT_EQ(m.inter.beta_s_per_byte, 5e-12);
  EXPECT_EQ(m.memory_bandwidth, 0.0);  // the default
  EXPECT_EQ(m.memory_per_rank_bytes, 80.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(m.gemm_rate(Dtype::bfloat16, 1024, 1024, 1024), 4e14);
  EXPECT_DOUBLE_EQ(m.attention_rate(Dtype::bfloat16).backward_flops, 3e14);
  EXPECT_EQ(m.gemm.count("double"), 0u);
  EXPECT_EQ(m.inter.time(1e6, 2), 2 * 5e-6 + 1e6 * 5e-12);
  // An empty object is a valid document of defaults (error() then says what is missing).
  const MachineParams empty = mlacp::model::machine_from_json("{}");
  EXPECT_EQ(empty.ranks_per_node, 1);
  EXPECT_EQ(empty.overlap_efficiency, 1.0);
}

TEST(Machine, ParseErrorsNameFileKeyAndExpectation) {
  EXPECT_EQ(parse_error(R"({"inter": {"beta_s_per_byte": "abc"}})"),
            "params.json: \"inter.beta_s_per_byte\": expected a non-negative number, got \"abc\"");
  EXPECT_EQ(parse_error(R"({"intra": {"alpha_s": -1}})"),
            "params.json: \"intra.alpha_s\": expected a non-negative number, got -1");
  EXPECT_EQ(parse_error(R"({"intra": 5})"),
            "params.json: \"intra\": expected an object {\"alpha_s\", \"beta_s_per_byte\"}, got 5");
  EXPECT_EQ(parse_error(R"({"intra": {"alpha": 1}})"),
            "params.json: \"intra.alpha\": unknown key (expected one of \"alpha_s\", \"beta_s_per_byte\")");
  EXPECT_EQ(parse_error(R"({"nodes": 2})"),
            "params.json: \"nodes\": unknown key (expected one of \"name\", \"source\", \"ranks_per_node\", "
            "\"intra\", \"inter\", \"gemm\", \"attention\", \"memory_bandwidth\", \"elementwise_bandwidth\", "
            "\"memory_per_rank_bytes\", \"overlap_efficiency\", \"sync_s\")");
  EXPECT_EQ(parse_error(R"({"attention": {"float": {"forward_flops": 1, "backward_flops": 1, "by_width": 3}}})"),
            "params.json: \"attention.float.by_width\": expected an array of [width, forward_flops, backward_flops], "
            "got 3");
  EXPECT_EQ(
      parse_error(R"({"attention": {"float": {"forward_flops": 1, "backward_flops": 1, "by_width": [[1, 2]]}}})"),
      "params.json: \"attention.float.by_width[0]\": expected [width, forward_flops, backward_flops], got [1, 2]");
  EXPECT_EQ(parse_error(R"({"elementwise_bandwidth": {"half": 1}})"),
            "params.json: \"elementwise_bandwidth.half\": unknown dtype (expected \"double\", \"float\" or \"bf16\")");
  EXPECT_EQ(parse_error(R"({"name": 3})"), "params.json: \"name\": expected a string, got 3");
  EXPECT_EQ(parse_error(R"({"ranks_per_node": 2.5})"),
            "params.json: \"ranks_per_node\": expected a positive integer, got 2.5");
  EXPECT_EQ(parse_error(R"({"ranks_per_node": 0})"),
            "params.json: \"ranks_per_node\": expected a positive integer, got 0");
  EXPECT_EQ(parse_error(R"({"overlap_efficiency": 2})"),
            "params.json: \"overlap_efficiency\": expected a number from 0 to 1, got 2");
  EXPECT_EQ(parse_error(R"({"memory_bandwidth": null})"),
            "params.json: \"memory_bandwidth\": expected a non-negative number, got null");
  EXPECT_EQ(parse_error(R"({"gemm": [1]})"),
            "params.json: \"gemm\": expected an object: dtype -> [[n, flops], ...], got [1]");
  EXPECT_EQ(parse_error(R"({"gemm": {"half": [[1, 1]]}})"),
            "params.json: \"gemm.half\": unknown dtype (expected \"double\", \"float\" or \"bf16\")");
  EXPECT_EQ(parse_error(R"({"gemm": {"float": []}})"),
            "params.json: \"gemm.float\": expected a non-empty array of [n, flops] pairs, got []");
  EXPECT_EQ(parse_error(R"({"gemm": {"float": [[1, 2], [3]]}})"),
            "params.json: \"gemm.float[1]\": expected a pair [n, flops] of positive numbers, got [3]");
  EXPECT_EQ(parse_error(R"({"gemm": {"float": [[1, 2], [3, 0]]}})"),
            "params.json: \"gemm.float[1]\": expected a pair [n, flops] of positive numbers, got 0");
  EXPECT_EQ(parse_error(R"({"gemm": {"float": [[64, 2], [32, 3]]}})"),
            "params.json: \"gemm.float[1]\": expected n increasing (after n = 64), got [32, 3]");
  EXPECT_EQ(parse_error(R"({"attention": {"float": {"forward_flops": 1, "backward": 2}}})"),
            "params.json: \"attention.float.backward\": unknown key (expected one of \"forward_flops\", "
            "\"backward_flops\", \"by_width\")");
  EXPECT_EQ(parse_error(R"({"attention": {"float": [1, 2]}})"),
            "params.json: \"attention.float\": expected an object {\"forward_flops\", \"backward_flops\"[, "
            "\"by_width\"]}, got [1, 2]");
  EXPECT_EQ(parse_error(R"({"attention": {"bf16": {"forward_flops": true}}})"),
            "params.json: \"attention.bf16.forward_flops\": expected a non-negative number, got true");
  // A key twice in one object (JSON's grammar allows it; which value would count?), at any depth.
  EXPECT_EQ(parse_error(R"({"name": "x", "name": "y"})"),
            "params.json: \"name\": expected each key once, got it again with \"y\"");
  EXPECT_EQ(parse_error(R"({"gemm": {"float": [[1, 2]], "float": [[3, 4]]}})"),
            "params.json: \"gemm.float\": expected each key once, got it again with [[3, 4]]");
  EXPECT_EQ(parse_error(R"({"a": [{"b": 1, "b": {}}]})"),
            "params.json: \"a[0].b\": expected each key once, got it again with {}");
  EXPECT_NE(parse_error(std::string(100, '[') + std::string(100, ']')).find("expected nesting at most 64 deep"),
            std::string::npos);
  // Syntax errors name the line and column (nlohmann/json's words).
  EXPECT_EQ(parse_error("{\n  \"name\": \"x\",\n  \"source\" \"y\"\n}"),
            "params.json: parse error at line 3, column 14: syntax error while parsing object separator - unexpected "
            "string literal; expected ':' (not valid JSON)");
  EXPECT_EQ(parse_error(R"({"name": "x",})"),
            "params.json: parse error at line 1, column 14: syntax error while parsing object key - unexpected '}'; "
            "expected string literal (not valid JSON)");
  EXPECT_EQ(parse_error(R"({"name": "x"} extra)"),
            "params.json: parse error at line 1, column 15: syntax error while parsing value - invalid literal; last "
            "read: '\"x\"} e'; expected end of input (not valid JSON)");
  EXPECT_EQ(parse_error(R"({"memory_bandwidth": 1e999})"),
            "params.json: number overflow parsing '1e999' (not valid JSON)");
  EXPECT_EQ(parse_error(R"({"name": "x)"),
            "params.json: parse error at line 1, column 12: syntax error while parsing value - invalid string: "
            "missing closing quote; last read: '\"x' (not valid JSON)");
  EXPECT_EQ(parse_error("[1, 2]"), "params.json: expected a JSON object at the top level, got [1, 2]");
  EXPECT_EQ(parse_error(""),
            "params.json: parse error at line 1, column 1: syntax error while parsing value - unexpected end of "
            "input; expected '[', '{', or a literal (not valid JSON)");
}

}  // namespace
