// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the K/V layout kernels: the KV gradient assembled from received head blocks.
#include "kernel_test_support.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/kernels/detail/kv_layout.hpp>

namespace {

using namespace mlacp::test::kernels;

template <class T>
class KvLayout : public ::testing::Test {};
TYPED_TEST_SUITE(KvLayout, ValueTypes);

TYPED_TEST(KvLayout, KvGradientFromHeadBlocksMatchesUnpacked) {
  using T = TypeParam;
  const int parts = 2, n_b = 2, n = 3, h = 2, dn = 3, dr = 2, dv = 4, heads = parts * h;
  ExecSpace space;
  Kokkos::View<T*****, Kokkos::LayoutRight, MemSpace> dk_blocks("dk", parts, n_b, n, h, dn + dr),
      dv_blocks("dv", parts, n_b, n, h, dv);
  const Vec k0 = rounded<T>(random_vec(dk_blocks.size(), 45)), v0 = rounded<T>(random_vec(dv_blocks.size(), 46));
  from_vec(dk_blocks, k0);
  from_vec(dv_blocks, v0);
  // Unpack on the host: token-local head r*h + i of token (b, t) is block r's head i.
  View4<T> dk("dk local", n_b, n, heads, dn + dr), dv_local("dv local", n_b, n, heads, dv);
  Vec k_local(dk.size()), v_local(dv_local.size());
  for (int r = 0; r < parts; ++r)
    for (int tok = 0; tok < n_b * n; ++tok)
      for (int i = 0; i < h; ++i) {
        for (int c = 0; c < dn + dr; ++c)
          k_local[(tok * heads + r * h + i) * (dn + dr) + c] = k0[((r * n_b * n + tok) * h + i) * (dn + dr) + c];
        for (int c = 0; c < dv; ++c)
          v_local[(tok * heads + r * h + i) * dv + c] = v0[((r * n_b * n + tok) * h + i) * dv + c];
      }
  from_vec(dk, k_local);
  from_vec(dv_local, v_local);
  View4<T> dkv_blocks("dkv blocks", n_b, n, heads, dn + dv), dkv_plain("dkv plain", n_b, n, heads, dn + dv);
  View3<T> dkpe_blocks("dkpe blocks", n_b, n, dr), dkpe_plain("dkpe plain", n_b, n, dr);
  mlacp::detail::key_grad_from_blocks(space, dk_blocks.data(), parts, dkv_blocks, dkpe_blocks, dn);
  mlacp::detail::value_grad_from_blocks(space, dv_blocks.data(), parts, dkv_blocks, dn);
  mlacp::detail::disassemble_kv_grad(space, dk, dv_local, dkv_plain, dkpe_plain, dn);
  space.fence();
  EXPECT_EQ(to_vec(dkv_blocks), to_vec(dkv_plain));
  EXPECT_LT(rel_error(to_vec(dkpe_blocks), to_vec(dkpe_plain)), tol<T>());
  // dkpe is the sum over all heads of dk's last dr columns.
  Vec shared(n_b * n * dr, 0.0);
  for (int tok = 0; tok < n_b * n; ++tok)
    for (int head = 0; head < heads; ++head)
      for (int c = 0; c < dr; ++c) shared[tok * dr + c] += k_local[(tok * heads + head) * (dn + dr) + dn + c];
  EXPECT_LT(rel_error(to_vec(dkpe_plain), shared), tol<T>());
}

}  // namespace
