// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// A schedule context over a sample configuration and its weights, with what it refers to kept alive: what the tests
// of the schedules' parts (unit_tests/mla/detail/) build on.
#pragma once

#include "mla_test_data.hpp"

#include <mlacp/mesh.hpp>
#include <mlacp/mla/mla_attention.hpp>

#include <functional>
#include <string>

namespace mlacp::test {

using ScheduleSpace = Kokkos::DefaultExecutionSpace;
using Context = mlacp::detail::ScheduleContext<double, ScheduleSpace, mlacp::FlashAttentionCore>;

// S = 2P + 1 (uneven) and H = P + 1 heads, with biases.
inline mlacp::MlaConfig context_sample(int P) { return make_config(2, 2 * P + 1, 8, P + 1, 4, 2, 3, 5, true); }

struct ContextSetup {
  explicit ContextSetup(const mlacp::Mesh& m) : ContextSetup(m, context_sample(m.size())) {}
  /// The context of `c` (which it copies: a context's configuration is fixed, but for the shape of its passes).
  ContextSetup(const mlacp::Mesh& m, const mlacp::MlaConfig& c)
      : config(c),
        weights(make_weights<double, ScheduleSpace::memory_space>(config, 3)),
        ctx(config, weights, m, core, documents) {}
  mlacp::MlaConfig config;
  mlacp::MlaWeights<double, ScheduleSpace::memory_space> weights;
  mlacp::FlashAttentionCore core;
  mlacp::DocumentLayout documents;
  Context ctx;
};

// The message of the exception `f` throws as E ("" when it throws none; other exceptions propagate).
template <class E>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace mlacp::test
