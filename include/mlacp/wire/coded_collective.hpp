// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// A collective whose payload travels through a wire codec (codecs.hpp): the input is encoded on the launch's
// instance into a staging buffer from the buffer pool, the collective moves the wire values (into a second pooled
// buffer shaped as `into`, or into a result it allocates), and the handle's wait() decodes them into the caller's
// destination once they arrived. The codec owns its staging (the handle keeps the pooled buffers until it is
// destroyed); callers, pieces and schedules hold no wire state. The identity codec and P == 1 launch the plain
// collective. The events recorded (launch, wait, completion) are the collective's own, under its name, whatever the
// codec.
#pragma once

#include <mlacp/async_collective.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/detail/buffer_pool.hpp>
#include <mlacp/detail/launch.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/wire/codecs.hpp>
#include <mlacp/wire/rows.hpp>

#include <Kokkos_Core.hpp>
#include <array>
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

/// The View of W with ViewType's rank and memory space (LayoutRight, managed type): what a codec moves for it.
template <class W, class ViewType>
using wire_view_t = Kokkos::View<typename add_pointers<W, compat::view_rank_v<ViewType>>::type, Kokkos::LayoutRight,
                                 typename ViewType::memory_space>;

/// The rows of a View: the product of its extents but the innermost one.
template <class View>
std::int64_t rows_of(const View& v) {
  std::int64_t rows = 1;
  for (unsigned d = 0; d + 1 < compat::view_rank_v<View>; ++d) rows *= static_cast<std::int64_t>(v.extent(d));
  return rows;
}

/// A View of type V over `data` (unmanaged) or, `data` null, allocated (label), with `like`'s extents but the
/// innermost one, which is `width`.
template <class V, class Like>
V view_like(typename V::pointer_type data, const std::string& label, const Like& like, std::int64_t width) {
  std::array<std::size_t, 8> n = extents_of(like);
  n[compat::view_rank_v<Like> - 1] = static_cast<std::size_t>(width);
  if (data != nullptr) return V(data, n[0], n[1], n[2], n[3], n[4]);
  return V(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n[0], n[1], n[2], n[3], n[4]);
}

/// What the collective does with the values: moves them (all-to-all, all-gather, send/receive) or sums them
/// (reduce-scatter), which only a codec whose `sums` is true may carry.
enum class CodecUse { move, sum };

/// Launches one collective of `input` into `into` (empty: allocated) through `launch(view, into)`, a callable that
/// starts it on a View of any value type (a generic lambda around a launch_* without codec), with the payload encoded
/// by Codec. `dim_a`, `dim_b`: the dimensions the collective splits or concatenates (-1: none), which a row-scaled
/// codec refuses to be the innermost one. Refusals (InvalidArgument, before anything is encoded or launched, alike on
/// every rank that passes the same codec): a value type the codec does not carry, a sum through a codec that cannot
/// sum, rows cut by the collective.
template <class Codec, CodecUse Use, class ExecSpace, class Input, class Launch>
AsyncCollective<collective_result_t<Input>> launch_with_codec(const ExecSpace& space, const Mesh& mesh,
                                                              const Input& input,
                                                              const collective_result_t<Input>& into,
                                                              const std::string& name, int dim_a, int dim_b,
                                                              Launch& launch) {
  using T = typename Input::non_const_value_type;
  using Result = collective_result_t<Input>;
  using MemSpace = typename Input::memory_space;
  constexpr int rank = compat::view_rank_v<Input>;
  // The refusals' opening, built only where one is raised (a launch that goes ahead builds no message).
  const auto refused = [&name] { return "mlacp: collective '" + name + "': the wire codec " + Codec::name; };
  if constexpr (std::is_same_v<Codec, SameCodec>) {
    return launch(input, into);
  } else if constexpr (!Codec::template carries<T>) {
    throw InvalidArgument(refused() + " carries float Views only; expected the codec same for this View's value type");
  } else if constexpr (Use == CodecUse::sum && !Codec::sums) {
    throw InvalidArgument(refused() +
                          " cannot carry a reduce-scatter's partial sums (they cannot be added in its format); "
                          "expected a codec that sums: same or bf16");
  } else {
    if constexpr (Codec::row_scaled) {
      if (dim_a == rank - 1 || dim_b == rank - 1)
        throw InvalidArgument(refused() + " scales each row of the innermost dimension (" + std::to_string(rank - 1) +
                              "), which this collective splits or concatenates; expected dimensions below " +
                              std::to_string(rank - 1));
    }
    if (mesh.size() == 1) return launch(input, into);
    using W = typename Codec::template wire_t<T>;
    using WireView = wire_view_t<W, Input>;
    const auto width = static_cast<std::int64_t>(input.extent(rank - 1));
    const std::int64_t wide = Codec::wire_width(width);
    const std::int64_t rows = rows_of(input);
    auto send =
        allocate_buffer<W, MemSpace>(space, "mlacp::" + name + " wire send", static_cast<std::size_t>(rows * wide));
    const auto wire_input = view_like<WireView>(send.view.data(), "", input, wide);
    encode_rows<Codec, T>(space, "mlacp::round onto the wire", rows, width,
                          ContiguousRows<const T>{input.data(), width}, wire_input.data());
    WireView wire_into;
    PooledBuffer<W, MemSpace> recv;
    if (into.data() != nullptr) {
      recv = allocate_buffer<W, MemSpace>(space, "mlacp::" + name + " wire recv",
                                          static_cast<std::size_t>(rows_of(into) * wide));
      wire_into = view_like<WireView>(recv.view.data(), "", into, wide);
    }
    auto handle = adopt_collective<Result>(launch(wire_input, wire_into), [&](const WireView& arrived) {
      const Result destination =
          into.data() != nullptr ? into : view_like<Result>(nullptr, "mlacp::" + name + " (decoded)", arrived, width);
      const std::int64_t arrived_rows = rows_of(arrived);
      std::function<void()> decode = [space, arrived, destination, arrived_rows, width]() {
        decode_rows<Codec, T>(space, "mlacp::widen from the wire", arrived_rows, width, arrived.data(),
                              ContiguousRows<T>{destination.data(), width});
      };
      return std::make_pair(destination, std::move(decode));
    });
    handle.extend_lifetime(input);  // read by the encode kernel queued on `space`
    handle.extend_lifetime(send.storage);
    if (recv.storage.data() != nullptr) handle.extend_lifetime(recv.storage);
    return handle;
  }
}

/// launch_with_codec for the codec registered as `codec`.
template <CodecUse Use, class ExecSpace, class Input, class Launch>
AsyncCollective<collective_result_t<Input>> launch_coded(const ExecSpace& space, const Mesh& mesh, const Input& input,
                                                         const collective_result_t<Input>& into,
                                                         const std::string& name, int dim_a, int dim_b, WireCodec codec,
                                                         Launch&& launch) {
  return visit_codec(codec, [&](auto tag) {
    return launch_with_codec<typename decltype(tag)::type, Use>(space, mesh, input, into, name, dim_a, dim_b, launch);
  });
}

}  // namespace mlacp::detail
