// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The registry of wire codecs: what a collective's payload may travel as (launch_all_to_all, launch_all_gather,
// launch_reduce_scatter and launch_send_recv take a WireCodec). A codec is one file in this folder, a type with:
//   name                      its name (messages, JSON)
//   carries<T>                the value types it carries (others are refused before anything is launched)
//   wire_t<T>                 what travels for a T (T, bf16, std::uint8_t, ...)
//   sums                      whether a reduce-scatter may move it (the transport sums wire values)
//   wire_width(width)         the wire values of a row of `width` values (the View's innermost dimension)
//   row_scaled false:         encode_value(x) and decode_value<T>(w), element by element;
//   row_scaled true:          encode_row(team, in, out, width) and decode_row(team, in, out, width), a row per team
//                             (a collective that splits or concatenates the innermost dimension is refused).
// Adding one: its file, its WireCodec value (wire_codec.hpp) and its line in `wire_codecs` below.
#pragma once

#include <mlacp/error.hpp>
#include <mlacp/wire/bf16_codec.hpp>
#include <mlacp/wire/fp8_e4m3_codec.hpp>
#include <mlacp/wire/same_codec.hpp>
#include <mlacp/wire/wire_codec.hpp>

#include <string>

namespace mlacp {

namespace detail {

template <WireCodec Id, class Codec>
struct codec_entry {
  static constexpr WireCodec id = Id;
  using type = Codec;
};
template <class... Entries>
struct codec_list {};

using wire_codecs = codec_list<codec_entry<WireCodec::same, SameCodec>,          //
                               codec_entry<WireCodec::bfloat16, Bf16Codec>,      //
                               codec_entry<WireCodec::fp8_e4m3, Fp8E4M3Codec>>;  //

/// A codec type as a value (what visit_codec passes).
template <class Codec>
struct codec_tag {
  using type = Codec;
};

template <class F, class Entry, class... Rest>
auto visit_codec_in(WireCodec id, F& f, codec_list<Entry, Rest...>) -> decltype(f(codec_tag<typename Entry::type>{})) {
  if (Entry::id == id) return f(codec_tag<typename Entry::type>{});
  if constexpr (sizeof...(Rest) > 0) {
    return visit_codec_in(id, f, codec_list<Rest...>{});
  } else {
    throw InvalidArgument("mlacp: wire codec " + std::to_string(static_cast<int>(id)) +
                          " is not registered; expected one of wire/codecs.hpp's wire_codecs");
  }
}

/// f(codec_tag<Codec>{}) for the codec registered as `id` (every codec's call must return the same type).
template <class F>
decltype(auto) visit_codec(WireCodec id, F&& f) {
  return visit_codec_in(id, f, wire_codecs{});
}

}  // namespace detail

/// The codec's name ("same", "bf16", "fp8_e4m3"): its registered type's `name`.
inline const char* to_string(WireCodec codec) {
  return detail::visit_codec(codec, [](auto tag) -> const char* { return decltype(tag)::type::name; });
}

}  // namespace mlacp
