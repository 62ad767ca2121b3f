// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The performance model's dimensions (layer_shape.hpp).
#include "layer_shape.hpp"

#include <mlacp/mla/wire_policy.hpp>
#include <mlacp/model/machine.hpp>
#include <mlacp/wire/codecs.hpp>

#include <cstdint>
#include <type_traits>

namespace mlacp::model::internal {

double codec_element_bytes(WireCodec codec, double e, double width) {
  return mlacp::detail::visit_codec(codec, [&](auto tag) {
    using Codec = typename decltype(tag)::type;
    if constexpr (std::is_same_v<Codec, mlacp::detail::SameCodec>) {
      return e;
    } else {
      const auto n = static_cast<std::int64_t>(width);
      return n <= 0 ? 0.0
                    : static_cast<double>(Codec::wire_width(n) *
                                          static_cast<std::int64_t>(sizeof(typename Codec::template wire_t<float>))) /
                          width;
    }
  });
}

Shape shape_of(const MlaConfig& c, Dtype dtype, const Choice& choice, const Cluster& cluster, int q_lora,
               const TokenMap& map) {
  Shape x{};
  x.B = c.batch;
  x.S = c.seq;
  x.D = c.hidden;
  x.H = c.heads;
  x.dn = c.nope;
  x.dr = c.rope;
  x.dv = c.vdim;
  x.R = c.latent;
  x.Rq = q_lora;
  x.dqk = x.dn + x.dr;
  x.P = cluster.ranks();
  x.U = choice.ulysses;
  x.C = choice.ring;
  x.G = cluster.ranks_per_node;
  x.nodes = cluster.nodes;
  x.h = ceil_div(x.H, x.U);
  x.s = static_cast<double>(map.max_count());
  x.Sa = static_cast<double>(map.max_chunk_size());
  x.e = bytes_of(dtype);
  x.acc = dtype == Dtype::bfloat16 ? 4 : x.e;
  // The wire (mla/wire_policy.hpp) is a float layer's, on the Ulysses group's collectives (the ring's hops keep the
  // type): each kind of exchange in its codec.
  x.wire = x.U > 1 && dtype == Dtype::float32 && c.wire_dtype != WireDtype::same;
  x.wire_dtype = c.wire_dtype;
  x.w = x.wire ? codec_element_bytes(wire_codec(c.wire_dtype, WireExchange::backward), x.e, 1) : x.e;
  x.wr = x.wire ? codec_element_bytes(wire_codec(c.wire_dtype, WireExchange::reduce), x.e, 1) : x.e;
  x.bias = c.bias;
  return x;
}

}  // namespace mlacp::model::internal
