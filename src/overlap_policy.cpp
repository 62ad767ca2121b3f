// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/panelled_gemm.hpp>
#include <mlacp/settings.hpp>

namespace mlacp {

OverlapPolicy& overlap_policy() {
  static OverlapPolicy policy = [] {
    OverlapPolicy p;
    // A malformed value keeps the default here (a GEMM must not throw halfway through a pass); every Mesh refuses
    // it at construction, naming it.
    try {
      if (const int panels = Settings::from_environment().wgrad_panels(); panels >= 1) p.panels = panels;
    } catch (const InvalidArgument&) {
    }
    return p;
  }();
  return policy;
}

}  // namespace mlacp
