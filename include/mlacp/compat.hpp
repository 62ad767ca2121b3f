// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The one place where mlacp adapts to differences between Kokkos / Kokkos Kernels versions: Debian's
// Trilinos-packaged 3.4.01 and upstream 4.x/5.x. Nothing else in mlacp branches on a version.
#pragma once

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>
#include <mlacp/bfloat16.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#define MLACP_KOKKOS_VERSION_AT_LEAST(major, minor) (KOKKOS_VERSION >= (major)*10000 + (minor)*100)

// Kokkos Kernels 4.x defines KOKKOSKERNELS_VERSION in KokkosKernels_config.h; 3.4 does not define it at all.
#if defined(KOKKOSKERNELS_VERSION)
#define MLACP_KOKKOSKERNELS_VERSION KOKKOSKERNELS_VERSION
#else
#define MLACP_KOKKOSKERNELS_VERSION 0
#endif

namespace mlacp::compat {

/// mlacp's bfloat16 value type (bfloat16.hpp): Kokkos' bhalf_t where it is a native 2-byte type (Kokkos 4.x on
/// CUDA/HIP/SYCL: KOKKOS_BHALF_T_IS_FLOAT is false), mlacp::bfloat16 elsewhere (host builds, where bhalf_t is float,
/// and Kokkos 3.4, which has no bhalf_t). Two bytes either way.
#if defined(KOKKOS_BHALF_T_IS_FLOAT) && !KOKKOS_BHALF_T_IS_FLOAT
using bf16 = Kokkos::Experimental::bhalf_t;
#else
using bf16 = mlacp::bfloat16;
#endif
static_assert(sizeof(bf16) == 2, "mlacp's bf16 is two bytes on every build");
}  // namespace mlacp::compat

namespace mlacp {
/// The bf16 value type of this build (compat::bf16).
using bf16 = compat::bf16;
}  // namespace mlacp

namespace mlacp::compat {

/// Widening and rounding between bf16 and float, for both kinds of bf16.
KOKKOS_INLINE_FUNCTION float to_float(const bf16& v) { return static_cast<float>(v); }
KOKKOS_INLINE_FUNCTION bf16 to_bf16(float v) { return static_cast<bf16>(v); }

/// The type in which sums of T are accumulated: float for bf16 (each value widened, the sum rounded once where it is
/// stored), T itself for float and double.
template <class T>
struct accumulation {
  using type = T;
};
template <>
struct accumulation<bf16> {
  using type = float;
};
template <class T>
using accumulation_t = typename accumulation<T>::type;

/// Number of dimensions of a View type, as an int, in a constant expression. (`View::rank` is an enum in 3.4 and an
/// integral_constant in 4.x; both convert.)
template <class ViewType>
inline constexpr int view_rank_v = static_cast<int>(ViewType::rank);

/// Fences one execution-space instance, with a label where Kokkos supports labelled fences (3.6 and later).
template <class ExecSpace>
void fence(const ExecSpace& space, [[maybe_unused]] const std::string& label) {
#if MLACP_KOKKOS_VERSION_AT_LEAST(3, 6)
  space.fence(label);
#else
  space.fence();
#endif
}

/// C = beta*C + alpha*op(A)*op(B) on the given execution-space instance, for rank-2 Views.
/// Kokkos Kernels 3.6 and later take the instance; before that, the instance is fenced first and the plain
/// overload (which runs on the default instance and fences after itself) is called, which is still ordered.
/// Zero extents (a rank that holds no token or no head) follow the BLAS definition on every Kokkos Kernels version: an
/// empty C is left alone, and an empty inner dimension (k = 0) gives C = beta*C (0 where beta is 0: C is not read);
/// no BLAS call is made with m, n or k = 0. (Kokkos Kernels 3.4 returns at k = 0 without applying beta.)
template <class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecSpace& space, const char* trans_a, const char* trans_b, typename CView::const_value_type alpha,
          const AView& a, const BView& b, typename CView::const_value_type beta, const CView& c) {
  using T = typename CView::non_const_value_type;
  const std::size_t rows = c.extent(0), cols = c.extent(1);
  if (rows == 0 || cols == 0) return;
  const bool a_transposed = !(trans_a[0] == 'N' || trans_a[0] == 'n');
  if ((a_transposed ? a.extent(0) : a.extent(1)) == 0) {
    const T scale = beta;
    Kokkos::parallel_for(
        "mlacp::gemm k = 0: C = beta*C",
        Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
            space, {0, 0}, {static_cast<std::int64_t>(rows), static_cast<std::int64_t>(cols)}),
        KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
          c(i, j) = scale == T(0) ? T(0) : T(scale * c(i, j));
        });
    return;
  }
#if MLACP_KOKKOSKERNELS_VERSION >= 30600
  KokkosBlas::gemm(space, trans_a, trans_b, alpha, a, b, beta, c);
#else
  space.fence();
  KokkosBlas::gemm(trans_a, trans_b, alpha, a, b, beta, c);
#endif
}

/// A Kokkos Tools profiling region for the lifetime of the object (Kokkos::Profiling::ScopedRegion is 4.x only).
class ScopedRegion {
 public:
  explicit ScopedRegion(const std::string& name) { Kokkos::Profiling::pushRegion(name); }
  ~ScopedRegion() { Kokkos::Profiling::popRegion(); }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;
};

}  // namespace mlacp::compat

// ---- math: device-callable math functions (begin) ------------------------------------------------------------------
// Kokkos 3.7 and later define them in namespace Kokkos; before that they live in Kokkos::Experimental. Kernels call
// mlacp::compat::math::sqrt etc., never std:: math.
namespace mlacp::compat::math {
#if MLACP_KOKKOS_VERSION_AT_LEAST(3, 7)
using Kokkos::cos;
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::fmax;
using Kokkos::log;
using Kokkos::pow;
using Kokkos::sin;
using Kokkos::sqrt;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::fmax;
using Kokkos::Experimental::log;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sqrt;
#endif
}  // namespace mlacp::compat::math
// ---- math (end) ----------------------------------------------------------------------------------------------------

// ---- Kokkos Tools: the allocate- and deallocate-data callbacks (begin) ----------------------------------------------
// Kokkos 3.4 and 4.x spell them the same (Kokkos::Tools::Experimental::set_allocate_data_callback /
// set_deallocate_data_callback / get_callbacks, C function pointers (SpaceHandle, label, pointer, bytes)); kept here so
// that a future difference has one place.
namespace mlacp::compat::tools {
using allocate_data_callback = Kokkos_Profiling_allocateDataFunction;  // the C interface type: same in 3.4 and 4.x
using space_handle = Kokkos_Profiling_SpaceHandle;
/// The allocate-data callback currently installed (a loaded tool's, ours, or null).
inline allocate_data_callback current_allocate_data_callback() {
  return Kokkos::Tools::Experimental::get_callbacks().allocate_data;
}
inline void set_allocate_data_callback(allocate_data_callback callback) {
  Kokkos::Tools::Experimental::set_allocate_data_callback(callback);
}
using deallocate_data_callback = Kokkos_Profiling_deallocateDataFunction;  // same in 3.4 and 4.x
/// The deallocate-data callback currently installed (a loaded tool's, ours, or null).
inline deallocate_data_callback current_deallocate_data_callback() {
  return Kokkos::Tools::Experimental::get_callbacks().deallocate_data;
}
inline void set_deallocate_data_callback(deallocate_data_callback callback) {
  Kokkos::Tools::Experimental::set_deallocate_data_callback(callback);
}

// Events and regions: Kokkos::Tools::markEvent / pushRegion / popRegion / profileLibraryLoaded, the EventSet of
// callbacks (get_callbacks / set_callbacks) and the profile-event and region callback setters exist, spelled the same,
// in 3.4 and 4.x.
/// True when a Kokkos Tools library is loaded or a callback was set in process: callers skip building event names
/// otherwise.
inline bool active() { return Kokkos::Tools::profileLibraryLoaded(); }
/// A Kokkos Tools mark event (a tool's profile_event callback gets `name`).
inline void mark_event(const std::string& name) { Kokkos::Tools::markEvent(name); }
using callbacks = Kokkos::Tools::Experimental::EventSet;
inline callbacks current_callbacks() { return Kokkos::Tools::Experimental::get_callbacks(); }
inline void set_callbacks(const callbacks& all) { Kokkos::Tools::Experimental::set_callbacks(all); }
using profile_event_callback = Kokkos_Profiling_profileEventFunction;
using push_region_callback = Kokkos_Profiling_pushFunction;
using pop_region_callback = Kokkos_Profiling_popFunction;
inline void set_profile_event_callback(profile_event_callback callback) {
  Kokkos::Tools::Experimental::set_profile_event_callback(callback);
}
inline void set_push_region_callback(push_region_callback callback) {
  Kokkos::Tools::Experimental::set_push_region_callback(callback);
}
inline void set_pop_region_callback(pop_region_callback callback) {
  Kokkos::Tools::Experimental::set_pop_region_callback(callback);
}
/// True when a region callback is installed: the cheap test callers make before building a region's name (a loaded
/// tool that ignores regions, or the diagnostics' allocation callbacks alone, leave it false).
inline bool regions_active() { return current_callbacks().push_region != nullptr; }
// Kernel callbacks (begin: label, device id, kernel id out; end: kernel id), the same in 3.4 and 4.x.
using begin_kernel_callback = Kokkos_Profiling_beginFunction;
using end_kernel_callback = Kokkos_Profiling_endFunction;
/// Installs `begin` and `end` for parallel_for, parallel_reduce and parallel_scan alike.
inline void set_kernel_callbacks(begin_kernel_callback begin, end_kernel_callback end) {
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(begin);
  Kokkos::Tools::Experimental::set_end_parallel_for_callback(end);
  Kokkos::Tools::Experimental::set_begin_parallel_reduce_callback(begin);
  Kokkos::Tools::Experimental::set_end_parallel_reduce_callback(end);
  Kokkos::Tools::Experimental::set_begin_parallel_scan_callback(begin);
  Kokkos::Tools::Experimental::set_end_parallel_scan_callback(end);
}
using begin_deep_copy_callback = Kokkos_Profiling_beginDeepCopyFunction;  // same in 3.4 and 4.x
using end_deep_copy_callback = Kokkos_Profiling_endDeepCopyFunction;
inline void set_deep_copy_callbacks(begin_deep_copy_callback begin, end_deep_copy_callback end) {
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(begin);
  Kokkos::Tools::Experimental::set_end_deep_copy_callback(end);
}
// Fence callbacks (begin: name, device id, handle out; end: handle): the setters exist in 3.4 and 4.x, but only 3.5 and
// later call them, for every fence, with a device id whose instance part is 0 for a global fence (Kokkos::fence(),
// every instance) and an instance's own otherwise. 3.4 reports no fence at all.
#define MLACP_KOKKOS_REPORTS_FENCES MLACP_KOKKOS_VERSION_AT_LEAST(3, 5)
using begin_fence_callback = Kokkos_Profiling_beginFenceFunction;
using end_fence_callback = Kokkos_Profiling_endFenceFunction;
inline void set_fence_callbacks(begin_fence_callback begin, end_fence_callback end) {
  Kokkos::Tools::Experimental::set_begin_fence_callback(begin);
  Kokkos::Tools::Experimental::set_end_fence_callback(end);
}
/// Whether the fence a begin-fence callback was given `device_id` for is global (waits for every instance), where
/// Kokkos reports fences (MLACP_KOKKOS_REPORTS_FENCES); false elsewhere.
inline bool is_global_fence([[maybe_unused]] std::uint32_t device_id) {
#if MLACP_KOKKOS_REPORTS_FENCES
  return Kokkos::Tools::Experimental::identifier_from_devid(device_id).instance_id == 0;
#else
  return false;
#endif
}
}  // namespace mlacp::compat::tools
// ---- Kokkos Tools (end) --------------------------------------------------------------------------------------------
