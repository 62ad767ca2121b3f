// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Every MLACP_* environment setting the library reads, in one table and one object. Settings::from_environment() is
// the only place that calls getenv for them (src/settings.cpp); the code that uses a setting takes it from there.
//
// Two kinds:
// - agreed: they change what is computed, checked or sent, so that ranks holding different values would run different
//   collectives. Checked mode, the finiteness check and the reduce-scatter algorithm are agreed by every Mesh at
//   construction; the attention tiles and the bf16 GEMM backend by every MlaAttention (with its other choices). The
//   error names the setting and which ranks hold which value.
// - per process: the wgrad panels (how a GEMM is split, not what it computes), the trace file and the wait timeout
//   may differ from rank to rank.
// Every Mesh also refuses a value that does not parse, on every rank, naming the variable, the value and the ranks.
//
// Test-bed settings (MLACP_TESTBED_*) are the tools' and scripts', not the library's.
#pragma once

#include <array>
#include <string>

namespace mlacp {

/// Whether a non-empty value of one variable parses (settings.cpp defines one per kind of value).
namespace detail {
bool any_setting(const std::string& value);             ///< every value means something (e.g. "0" or not)
bool reduce_scatter_setting(const std::string& value);  ///< 'pairwise' or 'mpi'
bool tiles_setting(const std::string& value);           ///< QxK, two positive integers
bool bf16_gemm_setting(const std::string& value);       ///< a Bf16GemmBackend's name
bool bf16_compute_setting(const std::string& value);    ///< a Bf16Compute's name: 'auto', 'bf16' or 'float'
bool positive_integer_setting(const std::string& value);
bool seconds_setting(const std::string& value);  ///< a finite number >= 0
}  // namespace detail

/// One MLACP_* variable the library reads: one row of the table.
struct SettingInfo {
  const char* variable;                     ///< e.g. "MLACP_CHECKED"
  bool agreed;                              ///< must hold the same value on every rank of a mesh
  const char* expected;                     ///< the values it takes, for error messages
  bool (*well_formed)(const std::string&);  ///< whether a set (non-empty) value parses
};

/// The variables, in the order of Settings' fields.
inline constexpr std::array<SettingInfo, 9> setting_table{{
    {"MLACP_CHECKED", true, "0 (off) or anything else (on, the default)", &detail::any_setting},
    {"MLACP_CHECK_FINITE", true, "0 (off, the default) or anything else (on)", &detail::any_setting},
    {"MLACP_REDUCE_SCATTER", true, "'pairwise' or 'mpi'", &detail::reduce_scatter_setting},
    {"MLACP_ATTENTION_TILES", true, "QxK with two positive integers, e.g. 128x256", &detail::tiles_setting},
    {"MLACP_BF16_GEMM", true, "auto, onednn, float_blas, kokkos_kernels or cublas", &detail::bf16_gemm_setting},
    {"MLACP_BF16_COMPUTE", true, "auto, bf16 or float", &detail::bf16_compute_setting},
    {"MLACP_WGRAD_PANELS", false, "a positive integer (1: no panels)", &detail::positive_integer_setting},
    {"MLACP_TRACE", false, "a writable file path", &detail::any_setting},
    {"MLACP_WAIT_TIMEOUT_S", false, "seconds, 0 to turn the watchdog off", &detail::seconds_setting},
}};

/// The settings as the environment holds them now. Each field is the variable's text ("" where unset or empty); the
/// typed readers below parse it and name the variable and its value where it does not parse.
struct Settings {
  std::array<std::string, setting_table.size()> values{};

  /// Reads every variable of setting_table (the library's only getenv of them).
  static Settings from_environment();

  /// The variable's text (by value: a Settings is often a temporary).
  std::string value(const char* variable) const;

  bool checked() const;                ///< MLACP_CHECKED: on unless "0"
  bool check_finite() const;           ///< MLACP_CHECK_FINITE: off unless set and not "0"
  std::string reduce_scatter() const;  ///< MLACP_REDUCE_SCATTER's text ("" where unset: pairwise)
  /// MLACP_ATTENTION_TILES as {query tile, key tile}; {0, 0} where unset. Throws InvalidArgument where malformed.
  std::array<int, 2> attention_tiles() const;
  std::string bf16_gemm() const;  ///< "" where unset (the automatic choice)
  /// MLACP_BF16_COMPUTE: what a bf16 layer configured with Bf16Compute::automatic does ("" where unset: it times both).
  std::string bf16_compute() const;
  /// MLACP_WGRAD_PANELS; 0 where unset. Throws InvalidArgument where it is not a positive integer.
  int wgrad_panels() const;
  std::string trace() const;  ///< "" where unset
  /// MLACP_WAIT_TIMEOUT_S; `fallback` where unset or malformed (it is read where nothing may throw: Mesh
  /// construction reports a malformed value through error()).
  double wait_timeout_s(double fallback) const;

  /// setting_table's index of the first setting that does not parse; -1 when all parse.
  int first_malformed() const;
  /// The first setting that does not parse, as "MLACP_X='value'; expected ..."; "" when all parse.
  std::string error() const;
};

}  // namespace mlacp
