// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Setting an environment variable for one test's scope: the tests' one way to change an MLACP_* setting.
#pragma once

#include <cstdlib>
#include <string>

namespace mlacp::test {

/// Sets `variable` to `value` for the life of the object, on this rank only (nullptr: unsets it), and restores what
/// was there before (the suite pins some settings, e.g. MLACP_BF16_COMPUTE=bf16, that a test must give back).
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* variable, const char* value) : variable_(variable) {
    if (const char* old = std::getenv(variable)) old_ = old, had_ = true;
    if (value != nullptr) {
      ::setenv(variable, value, 1);
    } else {
      ::unsetenv(variable);
    }
  }
  ~ScopedEnvironment() {
    if (had_) {
      ::setenv(variable_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(variable_.c_str());
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  std::string variable_, old_;
  bool had_ = false;
};

}  // namespace mlacp::test
