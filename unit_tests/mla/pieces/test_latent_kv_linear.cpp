// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// LatentKVLinear's backward split at its reduce-scatter's wait (launch_backward / wait_backward, what the latent
// schedule runs the Q branch's backward between): the same result as backward in one call, the payload gradient and
// the weight gradient against a host computation, with an uneven token split, and the misuse errors.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/pieces/latent_kv_linear.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Linear = mlacp::LatentKVLinear<double, Space>;
using Tensor3 = Linear::tensor3;
using Matrix = Linear::matrix;
using mlacp::test::host_values;
using mlacp::test::relative_error;

constexpr int R = 5, dr = 3, width = 7;  // latent, shared key, the rank's head rows h*(dn+dv)

// The same inputs on every rank, S = 3P + 1 tokens split unevenly.
struct Inputs {
  explicit Inputs(const mlacp::Mesh& mesh)
      : seq(3 * mesh.size() + 1, mesh.size()),
        gathered("gathered", 1, seq.total(), R + dr),
        grad_kv("grad_kv", 1, seq.total(), width),
        grad_shared("grad_shared", 1, seq.total(), dr),
        w("w_sel", width, R) {
    mlacp::test::fill(gathered, 1, 1.0);
    mlacp::test::fill(grad_kv, 2, 1.0);
    mlacp::test::fill(grad_shared, 3, 1.0);
    mlacp::test::fill(w, 4, 0.5);
  }
  mlacp::Partition seq;
  Tensor3 gathered, grad_kv, grad_shared;
  Matrix w;
};

Linear::weight_rows rows(const Matrix& m) { return Linear::weight_rows(m.data(), m.extent(0), m.extent(1)); }

// One forward, then the backward in one call (`split` false) or as launch_backward + wait_backward: the payload
// gradient of this rank's tokens, and dw_sel in `dw`.
Tensor3 run(const mlacp::Mesh& mesh, const Inputs& in, bool split, bool overlap, const Matrix& dw) {
  const Space space;
  const auto S = in.seq.total();
  Linear linear;
  Tensor3 kv("kv", 1, S, width);
  linear.forward(space, in.gathered, rows(in.w), Linear::bias_part(), mesh, in.seq, kv, Tensor3());
  if (!split) return linear.backward(space, in.grad_kv, in.grad_shared, true, rows(dw), Linear::bias_part(), overlap);
  linear.launch_backward(space, in.grad_kv, in.grad_shared, true, rows(dw), Linear::bias_part(), overlap);
  return linear.wait_backward();
}

TEST(LatentKVLinear, SplitBackwardEqualsOneCallAndTheHostComputation) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const Inputs in(mesh);
  const int P = mesh.size(), rank = mesh.rank();
  const auto S = in.seq.total(), s = in.seq.count(rank), first = in.seq.offset(rank);

  // Host: payload gradient [grad_kv w_sel, grad_shared] summed over the P ranks (all hold the same), this rank's rows;
  // dw_sel = grad_kv^T latent with latent = gathered's first R columns (a local gradient, not reduced).
  const auto g = host_values(in.grad_kv), k = host_values(in.grad_shared), w = host_values(in.w),
             x = host_values(in.gathered);
  std::vector<double> want_payload(static_cast<std::size_t>(s * (R + dr))), want_dw(width * R, 0.0);
  for (std::int64_t t = 0; t < s; ++t)
    for (int c = 0; c < R + dr; ++c) {
      double v = 0;
      if (c < R)
        for (int j = 0; j < width; ++j) v += g[(first + t) * width + j] * w[j * R + c];
      else
        v = k[(first + t) * dr + (c - R)];
      want_payload[t * (R + dr) + c] = P * v;
    }
  for (int j = 0; j < width; ++j)
    for (int c = 0; c < R; ++c)
      for (std::int64_t t = 0; t < S; ++t) want_dw[j * R + c] += g[t * width + j] * x[t * (R + dr) + c];

  for (const bool overlap : {true, false}) {
    const Matrix dw_one("dw one call", width, R), dw_split("dw split", width, R);
    const auto one = run(mesh, in, false, overlap, dw_one);
    const auto split = run(mesh, in, true, overlap, dw_split);
    ASSERT_EQ(split.extent(1), static_cast<std::size_t>(s)) << "overlap " << overlap;
    EXPECT_EQ(host_values(split), host_values(one)) << "overlap " << overlap;
    EXPECT_EQ(host_values(dw_split), host_values(dw_one)) << "overlap " << overlap;
    EXPECT_LE(relative_error(host_values(split), want_payload), 1e-13) << "overlap " << overlap;
    EXPECT_LE(relative_error(host_values(dw_split), want_dw), 1e-13) << "overlap " << overlap;
  }
}

TEST(LatentKVLinear, NoPayloadGradientLaunchesNothingAndWaitsForNothing) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const Inputs in(mesh);
  const Space space;
  Linear linear;
  Tensor3 kv("kv", 1, in.seq.total(), width);
  linear.forward(space, in.gathered, rows(in.w), Linear::bias_part(), mesh, in.seq, kv, Tensor3());
  const Matrix dw("dw", width, R);
  mlacp::events::clear();
  mlacp::events::enable(true);
  linear.launch_backward(space, in.grad_kv, in.grad_shared, false, rows(dw), Linear::bias_part());
  const auto payload = linear.wait_backward();
  mlacp::events::enable(false);
  EXPECT_EQ(payload.data(), nullptr);
  EXPECT_LT(
      mlacp::events::find(mlacp::events::snapshot(), mlacp::EventKind::launch, mlacp::names::latent_reduce_scatter), 0);
  double sum = 0;
  for (const double v : host_values(dw)) sum += std::abs(v);
  EXPECT_GT(sum, 0.0) << "dw_sel is still computed";
}

TEST(LatentKVLinear, MisuseOfTheSplitBackwardIsRefused) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const Inputs in(mesh);
  const Space space;
  const Matrix dw("dw", width, R);
  Linear linear;
  mlacp::test::expect_error<mlacp::UsageError>([&] { linear.wait_backward(); }, "wait_backward before launch_backward");
  Tensor3 kv("kv", 1, in.seq.total(), width);
  linear.forward(space, in.gathered, rows(in.w), Linear::bias_part(), mesh, in.seq, kv, Tensor3());
  mlacp::test::expect_error<mlacp::UsageError>([&] { linear.wait_backward(); }, "wait_backward before launch_backward");
  linear.launch_backward(space, in.grad_kv, in.grad_shared, true, rows(dw), Linear::bias_part());
  mlacp::test::expect_error<mlacp::UsageError>(
      [&] { linear.launch_backward(space, in.grad_kv, in.grad_shared, true, rows(dw), Linear::bias_part()); },
      "a second backward of the same forward");
  EXPECT_NE(linear.wait_backward().data(), nullptr);
  mlacp::test::expect_error<mlacp::UsageError>([&] { linear.wait_backward(); }, "wait_backward called twice");
}

}  // namespace
