// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The library's only reader of its MLACP_* environment variables (settings.hpp).
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/settings.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace mlacp {

namespace {

std::size_t index_of(const char* variable) {
  for (std::size_t i = 0; i < setting_table.size(); ++i)
    if (std::string(setting_table[i].variable) == variable) return i;
  throw std::logic_error(std::string("mlacp::Settings: ") + variable + " is not in setting_table");
}

std::string refusal(std::size_t i, const std::string& value) {
  return std::string(setting_table[i].variable) + "='" + value + "'; expected " + setting_table[i].expected;
}

/// A whole decimal integer >= 1 (no sign, no trailing text), or 0.
int positive_integer(const std::string& s) {
  if (s.empty() || s.size() > 9) return 0;
  int v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return 0;
    v = v * 10 + (c - '0');
  }
  return v;
}

/// QxK as {Q, K}, two positive integers; {0, 0} when malformed.
std::array<int, 2> parse_tiles(const std::string& s) {
  const auto x = s.find('x');
  if (x == std::string::npos) return {0, 0};
  const int q = positive_integer(s.substr(0, x)), k = positive_integer(s.substr(x + 1));
  if (q <= 0 || k <= 0) return {0, 0};
  return {q, k};
}

/// A finite number >= 0 (strtod syntax, the whole text), or -1.
double parse_seconds(const std::string& s) {
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0' || errno != 0 || !std::isfinite(seconds) || seconds < 0) return -1;
  return seconds;
}

}  // namespace

namespace detail {
bool any_setting(const std::string&) { return true; }
bool reduce_scatter_setting(const std::string& value) { return value == "pairwise" || value == "mpi"; }
bool tiles_setting(const std::string& value) { return parse_tiles(value)[0] > 0; }
bool bf16_gemm_setting(const std::string& value) {
  try {
    parse_bf16_gemm_backend(value);
    return true;
  } catch (const InvalidArgument&) {
    return false;
  }
}
bool bf16_compute_setting(const std::string& value) {
  try {
    parse_bf16_compute(value);
    return true;
  } catch (const InvalidArgument&) {
    return false;
  }
}
bool positive_integer_setting(const std::string& value) { return positive_integer(value) > 0; }
bool seconds_setting(const std::string& value) { return parse_seconds(value) >= 0; }
}  // namespace detail

Settings Settings::from_environment() {
  Settings s;
  for (std::size_t i = 0; i < setting_table.size(); ++i) {
    const char* value = std::getenv(setting_table[i].variable);
    s.values[i] = value != nullptr ? value : "";
  }
  return s;
}

std::string Settings::value(const char* variable) const { return values[index_of(variable)]; }

bool Settings::checked() const { return value("MLACP_CHECKED") != "0"; }

bool Settings::check_finite() const {
  const std::string v = value("MLACP_CHECK_FINITE");
  return !v.empty() && v != "0";
}

std::string Settings::reduce_scatter() const { return value("MLACP_REDUCE_SCATTER"); }

std::array<int, 2> Settings::attention_tiles() const {
  const std::size_t i = index_of("MLACP_ATTENTION_TILES");
  const std::string& s = values[i];
  if (s.empty()) return {0, 0};
  const std::array<int, 2> tiles = parse_tiles(s);
  if (tiles[0] <= 0) throw InvalidArgument("mlacp: " + refusal(i, s));
  return tiles;
}

std::string Settings::bf16_gemm() const { return value("MLACP_BF16_GEMM"); }

std::string Settings::bf16_compute() const { return value("MLACP_BF16_COMPUTE"); }

int Settings::wgrad_panels() const {
  const std::size_t i = index_of("MLACP_WGRAD_PANELS");
  if (values[i].empty()) return 0;
  const int panels = positive_integer(values[i]);
  if (panels <= 0) throw InvalidArgument("mlacp: " + refusal(i, values[i]));
  return panels;
}

std::string Settings::trace() const { return value("MLACP_TRACE"); }

double Settings::wait_timeout_s(double fallback) const {
  const std::string s = value("MLACP_WAIT_TIMEOUT_S");
  if (s.empty()) return fallback;
  const double seconds = parse_seconds(s);
  return seconds < 0 ? fallback : seconds;
}

int Settings::first_malformed() const {
  for (std::size_t i = 0; i < setting_table.size(); ++i)
    if (!values[i].empty() && !setting_table[i].well_formed(values[i])) return static_cast<int>(i);
  return -1;
}

std::string Settings::error() const {
  const int i = first_malformed();
  return i < 0 ? std::string() : refusal(static_cast<std::size_t>(i), values[static_cast<std::size_t>(i)]);
}

}  // namespace mlacp
