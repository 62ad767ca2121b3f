// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/panelled_gemm.hpp>

#include <cstdlib>

namespace mlacp {

OverlapPolicy& overlap_policy() {
  static OverlapPolicy policy = [] {
    OverlapPolicy p;
    if (const char* value = std::getenv("MLACP_WGRAD_PANELS")) {
      const int panels = std::atoi(value);
      if (panels >= 1) p.panels = panels;
    }
    return p;
  }();
  return policy;
}

}  // namespace mlacp
