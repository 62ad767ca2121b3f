// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// detail::Buffer: a pass's View over an allocation sized by the largest pass seen (include/mlacp/detail/buffer.hpp).
#include <gtest/gtest.h>
#include <mlacp/detail/buffer.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/view_types.hpp>

#include <Kokkos_Core.hpp>
#include <cstdint>

namespace {

using Mem = Kokkos::DefaultExecutionSpace::memory_space;
using Tensor3 = mlacp::detail::Tensor3<double, Mem>;

std::uint64_t allocations() { return mlacp::diagnostics::view_allocations(); }

TEST(Buffer, GrowsToTheLargestPassAndLaysSmallerOnesOverIt) {
  ASSERT_TRUE(mlacp::diagnostics::count_view_allocations());
  mlacp::detail::Buffer<Tensor3> buffer;
  EXPECT_FALSE(buffer.laid_out());
  EXPECT_EQ(buffer.capacity(), 0u);

  auto before = allocations();
  const Tensor3 first = ensure(buffer, "mlacp::test buffer", 2, 3, 4);
  EXPECT_EQ(allocations() - before, 1u) << "the first use allocates";
  EXPECT_EQ(buffer.capacity(), 24u);
  EXPECT_EQ(first.extent(0), 2u);
  EXPECT_EQ(first.extent(1), 3u);
  EXPECT_EQ(first.extent(2), 4u);
  const double* storage = first.data();

  before = allocations();
  EXPECT_EQ(ensure(buffer, "mlacp::test buffer", 2, 3, 4).data(), storage) << "the same extents: the same View";
  const Tensor3 smaller = ensure(buffer, "mlacp::test buffer", 1, 5, 4);
  EXPECT_EQ(allocations() - before, 0u) << "a smaller pass is laid over the allocation";
  EXPECT_EQ(smaller.data(), storage);
  EXPECT_EQ(smaller.extent(1), 5u);
  EXPECT_EQ(smaller.span(), 20u);
  EXPECT_TRUE(smaller.span_is_contiguous());
  // Row-major, as the kernels expect: element (0, 1, 0) follows row (0, 0, *).
  EXPECT_EQ(&smaller(0, 1, 0), storage + 4);
  EXPECT_EQ(buffer.capacity(), 24u) << "the allocation never shrinks";

  before = allocations();
  const Tensor3 larger = ensure(buffer, "mlacp::test buffer", 3, 3, 4);
  EXPECT_EQ(allocations() - before, 1u) << "a larger pass grows the allocation";
  EXPECT_EQ(buffer.capacity(), 36u);
  EXPECT_EQ(buffer.bytes(), 36u * sizeof(double));
  before = allocations();
  ensure(buffer, "mlacp::test buffer", 2, 3, 4);
  ensure(buffer, "mlacp::test buffer", 3, 3, 4);
  EXPECT_EQ(allocations() - before, 0u) << "alternating shapes reuse the largest";
}

TEST(Buffer, AnEmptyPassPointsSomewhere) {
  // The layer reads an empty View as "not needed": a needed View of a rank with no token must not be one.
  ASSERT_TRUE(mlacp::diagnostics::count_view_allocations());
  mlacp::detail::Buffer<Tensor3> buffer;
  auto before = allocations();
  const Tensor3 empty = ensure(buffer, "mlacp::test buffer", 2, 0, 4);
  EXPECT_EQ(allocations() - before, 1u);
  EXPECT_TRUE(buffer.laid_out());
  EXPECT_NE(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.extent(2), 4u);
  before = allocations();
  EXPECT_NE(ensure(buffer, "mlacp::test buffer", 0, 0, 0).data(), nullptr);
  EXPECT_EQ(ensure(buffer, "mlacp::test buffer", 1, 1, 1).data(), empty.data()) << "one value fits the allocation";
  EXPECT_EQ(allocations() - before, 0u);
}

TEST(Buffer, CopiesShareTheAllocationAndBytesCountIt) {
  mlacp::detail::Buffer<Tensor3> buffer;
  const Tensor3 view = ensure(buffer, "mlacp::test buffer", 2, 2, 2);
  const mlacp::detail::Buffer<Tensor3> copy = buffer;  // what keeps a parked request's memory alive
  buffer.release();
  EXPECT_FALSE(buffer.laid_out());
  EXPECT_EQ(buffer.capacity(), 0u);
  EXPECT_EQ(copy.view().data(), view.data());
  EXPECT_EQ(copy.capacity(), 8u);
  const Tensor3 plain("plain", 1, 1, 3);
  EXPECT_EQ(mlacp::detail::bytes_of(copy, plain), (8u + 3u) * sizeof(double));
}

}  // namespace
