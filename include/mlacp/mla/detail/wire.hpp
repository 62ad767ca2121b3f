// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// bf16 on the wire for a float layer (MlaConfig::wire_dtype): a collective whose float payload is rounded into a bf16
// send buffer before its launch and whose bf16 result is widened into the float destination after its wait. The
// pieces (InputA2APair, OutputProjection, LatentKVLinear) and the latent schedule's all-gather launch through
// launch_wire(); with no wire slot (wire_dtype same, a double or bf16 layer, P == 1) it is the plain collective.
#pragma once

#include <mlacp/async_collective.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/detail/launch.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace mlacp::detail {

template <class V, int Rank>
struct add_pointers {
  using type = typename add_pointers<V*, Rank - 1>::type;
};
template <class V>
struct add_pointers<V, 0> {
  using type = V;
};

/// The bf16 View of ViewType's rank and memory space (LayoutRight, managed): what goes on the wire.
template <class ViewType>
using wire_view_t = Kokkos::View<typename add_pointers<bf16, compat::view_rank_v<ViewType>>::type, Kokkos::LayoutRight,
                                 typename ViewType::memory_space>;

/// The bf16 buffers of one collective on the wire: `send` (the rounded payload, read by the transport until the wait)
/// and `recv` (the collective's bf16 result). Owned by a schedule's scratch, allocated on first use with the shapes
/// the configuration gives and reused by every later call (as forward_workspace.hpp's ensure).
template <class ViewType>
struct WireSlot {
  wire_view_t<ViewType> send, recv;
  std::size_t bytes() const { return (send.span() + recv.span()) * sizeof(bf16); }
};

/// `slot` itself when it already has `like`'s extents, else a new uninitialised View of them (assigned to `slot`).
template <class Slot, class Like>
const Slot& ensure_like(Slot& slot, const std::string& label, const Like& like) {
  bool same = slot.use_count() > 0;  // allocated (also with no element: a rank that holds no token or head)
  for (unsigned d = 0; same && d < compat::view_rank_v<Like>; ++d) same = slot.extent(d) == like.extent(d);
  if (!same) {
    std::size_t n[8] = {KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX,
                        KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX};
    for (unsigned d = 0; d < compat::view_rank_v<Like>; ++d) n[d] = like.extent(d);
    slot = Slot(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n[0], n[1], n[2], n[3], n[4]);
  }
  return slot;
}

/// One value of the wire's conversion to D: float -> bf16 (round-to-nearest-even), bf16 -> float, or a copy (the same
/// type: Kokkos' native bhalf_t, mlacp::bf16 on CUDA, converts to float only explicitly). (A function of its own: nvcc
/// refuses a device lambda whose captures are first used inside an `if constexpr`.)
template <class D, class S>
KOKKOS_INLINE_FUNCTION D wire_value(const S& x) {
  if constexpr (std::is_same_v<D, S>)
    return x;
  else if constexpr (std::is_same_v<D, bf16>)
    return compat::to_bf16(x);
  else
    return compat::to_float(x);
}

/// dst[i] = src[i] converted (float -> bf16 round-to-nearest-even, or bf16 -> float), over the contiguous spans of
/// two Views of the same size, on `space`.
template <class ExecSpace, class Src, class Dst>
void convert_wire(const ExecSpace& space, const char* label, const Src& src, const Dst& dst) {
  using D = typename Dst::non_const_value_type;
  const auto n = static_cast<std::int64_t>(src.size());
  if (n == 0) return;
  const auto* in = src.data();
  D* out = dst.data();
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { out[i] = wire_value<D>(in[i]); });
}

/// A launched collective whose result is a float View: either the plain collective, or its bf16 form on the wire,
/// whose result wait() widens into the float destination (on the launch's instance, after the transport completed).
/// launched(), pending() and wait() as AsyncCollective's; the launch, wait and complete events are the collective's
/// own (same name), so the recorded schedule is the same either way.
template <class ExecSpace, class Result>
class WireCollective {
 public:
  using wire_type = wire_view_t<Result>;

  WireCollective() = default;
  explicit WireCollective(AsyncCollective<Result>&& direct) : direct_(std::move(direct)) {}
  WireCollective(const ExecSpace& space, AsyncCollective<wire_type>&& narrow, Result destination)
      : space_(space), narrow_(std::move(narrow)), destination_(std::move(destination)) {}

  bool launched() const noexcept { return direct_.launched() || narrow_.launched(); }
  bool pending() const noexcept { return direct_.pending() || narrow_.pending(); }

  /// Completes the collective and returns its float result (exactly once, as AsyncCollective::wait).
  Result wait() {
    if (!narrow_.launched()) return direct_.wait();
    const wire_type arrived = narrow_.wait();
    if (destination_.data() == nullptr)
      destination_ = ensure_like(destination_, narrow_.name() + " (widened)", arrived);
    convert_wire(space_, "mlacp::widen from the wire", arrived, destination_);
    return std::exchange(destination_, Result());
  }

 private:
  ExecSpace space_{};
  AsyncCollective<Result> direct_;
  AsyncCollective<wire_type> narrow_;
  Result destination_;
};

/// Launches one collective of `input` into `into` (empty: allocated by the collective) through `launch`, a callable
/// `launch(view, into)` that starts it on a View of either value type (a generic lambda around launch_all_to_all /
/// launch_all_gather / launch_reduce_scatter). `slot` null: the plain collective. `slot` given (float input only):
/// `input` is rounded into slot->send on `space`, the collective moves bf16 into slot->recv (shaped as `into`; the
/// collective allocates it when `into` is empty), and wait() widens it into `into`.
template <class ExecSpace, class Input, class Launch>
WireCollective<ExecSpace, collective_result_t<Input>> launch_wire(const ExecSpace& space, const Input& input,
                                                                  const collective_result_t<Input>& into,
                                                                  WireSlot<Input>* slot, const std::string& name,
                                                                  Launch&& launch) {
  using Result = collective_result_t<Input>;
  if constexpr (std::is_same_v<typename Input::non_const_value_type, float>) {
    if (slot != nullptr) {
      const auto& send = ensure_like(slot->send, "mlacp::" + name + " wire send", input);
      convert_wire(space, "mlacp::round onto the wire", input, send);
      const wire_view_t<Input> recv = into.data() != nullptr
                                          ? ensure_like(slot->recv, "mlacp::" + name + " wire recv", into)
                                          : wire_view_t<Input>();
      return WireCollective<ExecSpace, Result>(space, launch(send, recv), into);
    }
  }
  return WireCollective<ExecSpace, Result>(launch(input, into));
}

}  // namespace mlacp::detail
