// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// A test hook for allocation failures: caps this process's address space (RLIMIT_AS) at what it uses now plus
// `headroom` bytes, so that a larger allocation fails as it would on a rank that ran out of memory, and restores the
// previous limit when it goes out of scope. Armed on one rank, it makes that rank alone fail. Not under
// AddressSanitizer, which reserves terabytes of address space (sanitized() says whether this build is).
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace mlacp::testing {

/// Whether this build runs under AddressSanitizer (where an address-space cap cannot work).
constexpr bool sanitized() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

/// Bytes of address space the process uses now (VmSize of /proc/self/status).
inline std::int64_t address_space_in_use() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmSize:", 0) != 0) continue;
    std::istringstream fields(line.substr(7));
    std::int64_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  throw std::runtime_error("address_space_in_use: no VmSize in /proc/self/status");
}

class AddressSpaceCap {
 public:
  /// Caps the address space at address_space_in_use() + headroom (when `armed`; else does nothing).
  explicit AddressSpaceCap(std::int64_t headroom, bool armed = true) : armed_(armed) {
    if (!armed_) return;
    if (getrlimit(RLIMIT_AS, &previous_) != 0) throw std::runtime_error("AddressSpaceCap: getrlimit failed");
    rlimit cap = previous_;
    cap.rlim_cur = static_cast<rlim_t>(address_space_in_use() + headroom);
    if (previous_.rlim_max != RLIM_INFINITY && cap.rlim_cur > previous_.rlim_max) cap.rlim_cur = previous_.rlim_max;
    if (setrlimit(RLIMIT_AS, &cap) != 0) throw std::runtime_error("AddressSpaceCap: setrlimit failed");
  }
  ~AddressSpaceCap() {
    if (armed_) setrlimit(RLIMIT_AS, &previous_);
  }
  AddressSpaceCap(const AddressSpaceCap&) = delete;
  AddressSpaceCap& operator=(const AddressSpaceCap&) = delete;

 private:
  bool armed_;
  rlimit previous_{};
};

}  // namespace mlacp::testing
