// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// DocumentLayout::assign waits only for the execution-space instance it is given (the one whose kernels read the
// offsets), never for every instance (a global Kokkos::fence() would also wait for other instances' work in flight).
//
// How a global fence is seen: where Kokkos reports fences to Kokkos Tools (3.5 and later,
// MLACP_KOKKOS_REPORTS_FENCES), by the fence callbacks, whose device id tells a global fence from an instance's; before
// that (Debian's 3.4), by wrapping Kokkos::fence() at link time (-Wl,--wrap=_ZN6Kokkos5fenceEv, see
// unit_tests/CMakeLists.txt): every call of this test's code (DocumentLayout is a header) lands in the wrapper below.
// 3.4 reports no instance fence, so there only the absence of the global one is checked.
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/compat.hpp>
#include <mlacp/mla/document_layout.hpp>

#include <cstdint>
#include <vector>

namespace {
struct Fences {
  int global = 0;
  int instance = 0;
};
bool counting = false;
Fences counted;

void count_begin_fence(const char*, std::uint32_t device_id, std::uint64_t* handle) {
  if (counting) ++(mlacp::compat::tools::is_global_fence(device_id) ? counted.global : counted.instance);
  *handle = 0;
}
void count_end_fence(std::uint64_t) {}
}  // namespace

// Kokkos::fence() (Kokkos before 4.0 has this overload); weak: Kokkos 4.x has none, and nothing calls the wrapper.
extern "C" void __real__ZN6Kokkos5fenceEv() __attribute__((weak));
extern "C" void __wrap__ZN6Kokkos5fenceEv() {
  if (counting && !MLACP_KOKKOS_REPORTS_FENCES) ++counted.global;  // else the fence callbacks count it
  __real__ZN6Kokkos5fenceEv();
}

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;

TEST(DocumentLayout, AssignFencesOnlyTheInstanceItIsGiven) {
  const auto before = mlacp::compat::tools::current_callbacks();
  mlacp::compat::tools::set_fence_callbacks(count_begin_fence, count_end_fence);
  const std::int64_t n_s = 40;
  const std::size_t capacity = 4;
  const ExecSpace space;
  mlacp::DocumentLayout layout;
  // Offsets beyond the capacity on first use (allocated for them), fewer (the Views reused), one document, the empty
  // layout. (Growing past what the Views hold later frees them, and Kokkos 4 fences every instance itself when it
  // frees host memory: not a case of this test.)
  for (const std::vector<std::int64_t>& cu :
       {std::vector<std::int64_t>{0, 5, 9, 17, 30, 40}, {0, 10, 25, 40}, {0, 40}, std::vector<std::int64_t>{}}) {
    counted = {};
    counting = true;
    const bool changed = layout.assign(space, cu, n_s, capacity);
    const bool again = layout.assign(space, cu, n_s, capacity);
    counting = false;
    EXPECT_TRUE(changed);
    EXPECT_FALSE(again);
    EXPECT_EQ(counted.global, 0) << cu.size() << " offsets: assign fenced every instance (Kokkos::fence)";
    if (MLACP_KOKKOS_REPORTS_FENCES) {
      EXPECT_GE(counted.instance, 1) << cu.size() << " offsets: the instance is fenced before its offsets change";
    }
  }
  mlacp::compat::tools::set_callbacks(before);
}

}  // namespace
