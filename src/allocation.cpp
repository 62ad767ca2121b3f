// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <sys/resource.h>
#include <mlacp/allocation.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <new>
#include <regex>
#include <sstream>
#include <string>

namespace mlacp {

namespace {

// A "Key:   123 kB" line of a /proc file, in bytes; -1 when absent.
std::int64_t proc_kib_field(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    std::int64_t kib = -1;
    fields >> kib;
    return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

// Kokkos' rounded sizes ("8192 G" in 3.x, "8.00 GiB" in 4.x) in bytes; -1 when the text has none.
std::int64_t kokkos_size(const std::string& text) {
  static const std::regex pattern(
      R"((?:Allocation of size|failed to allocate) ([0-9.]+) ?(B|K|M|G|T|KiB|MiB|GiB|TiB)\b)");
  std::smatch m;
  if (!std::regex_search(text, m, pattern)) return -1;
  double value = std::stod(m[1].str());
  const std::string units = "BKMGT";
  for (std::size_t k = 0; k < units.find(m[2].str()[0]); ++k) value *= 1024;
  return static_cast<std::int64_t>(value);
}

// The View label in Kokkos' message: `label "x"` (3.x) or `label="x"` (4.x).
std::string kokkos_label(const std::string& text) {
  static const std::regex pattern(R"|(label ?=? ?"([^"]*)")|");
  std::smatch m;
  return std::regex_search(text, m, pattern) ? m[1].str() : std::string();
}

std::string first_line(const std::string& text) {
  const std::string line = text.substr(0, text.find('\n'));
  return line.size() > 300 ? line.substr(0, 300) + "..." : line;
}

}  // namespace

std::int64_t available_memory_bytes() {
  std::int64_t available = proc_kib_field("/proc/meminfo", "MemAvailable");
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const std::int64_t used = proc_kib_field("/proc/self/status", "VmSize");
    const auto cap = static_cast<std::int64_t>(limit.rlim_cur) - (used > 0 ? used : 0);
    const std::int64_t room = cap > 0 ? cap : 0;
    available = available < 0 ? room : std::min(available, room);
  }
  return available;
}

std::string bytes_string(std::int64_t bytes) {
  if (bytes < 0) return "an unknown number of bytes";
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  std::ostringstream out;
  if (unit == 0) {
    out << bytes << " bytes";
  } else {
    out << std::fixed << std::setprecision(2) << value << " " << units[unit] << " (" << bytes << " bytes)";
  }
  return out.str();
}

namespace detail {

namespace {
thread_local std::string last_message;
thread_local std::uint64_t made = 0;
}  // namespace

const std::string& last_out_of_memory() { return last_message; }
std::uint64_t out_of_memory_count() { return made; }

OutOfMemory out_of_memory(const std::string& where, const std::string& label, std::int64_t bytes,
                          const std::string& cause) {
  const std::int64_t available = available_memory_bytes();
  std::ostringstream out;
  out << where << ": could not allocate " << bytes_string(bytes) << " for \"" << label << "\"; this rank has "
      << bytes_string(available) << " available (MemAvailable, within its address-space limit)";
  if (!cause.empty()) out << " [" << first_line(cause) << "]";
  last_message = out.str();
  ++made;
  return OutOfMemory(out.str(), label, bytes, available);
}

std::optional<OutOfMemory> translate_allocation_failure(const std::exception& e, const std::string& where) {
  if (const auto* known = dynamic_cast<const OutOfMemory*>(&e)) return *known;
  if (dynamic_cast<const Error*>(&e) != nullptr) return std::nullopt;  // mlacp's own errors are what they say
  const std::string text = e.what() ? e.what() : "";
  const bool bad_alloc = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
  if (!bad_alloc && text.find("failed to allocate") == std::string::npos) return std::nullopt;
  const std::string label = kokkos_label(text);
  return out_of_memory(where, label.empty() ? "(unnamed)" : label, kokkos_size(text),
                       bad_alloc && text == "std::bad_alloc" ? "" : text);
}

}  // namespace detail
}  // namespace mlacp
