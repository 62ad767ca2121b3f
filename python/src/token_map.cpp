// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// mlacp::TokenMap (token_map.hpp): which global tokens each rank of a U x C mesh holds. Host logic only; the torch
// copies (indices, shard, unshard) are in python/mlacp/token_map.py.
#include <pybind11/stl.h>

#include <mlacp/mla/document_layout.hpp>
#include <mlacp/token_map.hpp>

#include "bindings.hpp"

namespace mlacp::python {
namespace py = pybind11;

namespace {

py::list tuples(const std::vector<TokenRange>& ranges) {
  py::list out;
  for (const TokenRange& r : ranges) out.append(py::make_tuple(r.begin, r.count));
  return out;
}

}  // namespace

void bind_token_map(py::module_& m) {
  py::class_<TokenMap>(m, "TokenMap",
                       "Which global tokens each rank (g, u) of a U x C mesh holds (mlacp::TokenMap; ranges are "
                       "(begin, count) tuples of global tokens, ascending).")
      .def(py::init([](std::int64_t seq, int ulysses_size, int ring_size, const py::handle& layout) {
             return TokenMap(seq, ulysses_size, ring_size, ring_layout_of(layout));
           }),
           py::arg("seq"), py::arg("ulysses_size"), py::arg("ring_size"), py::arg("layout") = "zigzag")
      .def_property_readonly("seq", &TokenMap::seq, "S: the global sequence length.")
      .def_property_readonly("ulysses_size", &TokenMap::ulysses_size, "U: ranks per Ulysses group.")
      .def_property_readonly("ring_size", &TokenMap::ring_size, "C: Ulysses groups (ring chunks).")
      .def_property_readonly("layout", &TokenMap::layout, "RingLayout.contiguous or RingLayout.zigzag.")
      .def_property_readonly("max_chunk_size", &TokenMap::max_chunk_size)
      .def_property_readonly("max_count", &TokenMap::max_count, "The largest count over the ranks.")
      .def(
          "chunk", [](const TokenMap& map, int g) { return tuples(map.chunk(g)); }, py::arg("g"),
          "Chunk g's global ranges [(begin, count), ...] (at most 2).")
      .def("chunk_size", &TokenMap::chunk_size, py::arg("g"))
      .def(
          "chunk_counts", [](const TokenMap& map, int g) { return map.chunk_partition(g).counts(); }, py::arg("g"),
          "How chunk g is split over its U ranks: Partition(chunk_size(g), U)'s counts.")
      .def(
          "ranges", [](const TokenMap& map, int g, int u) { return tuples(map.ranges(g, u)); }, py::arg("g"),
          py::arg("u"), "Rank (g, u)'s global ranges [(begin, count), ...] (at most 2; [] when it holds no token).")
      .def("count", &TokenMap::count, py::arg("g"), py::arg("u"), "Tokens held by rank (g, u).")
      .def("chunk_token", &TokenMap::chunk_token, py::arg("g"), py::arg("t"),
           "The global index of chunk g's chunk-local token t.")
      .def("global_token", &TokenMap::global_token, py::arg("g"), py::arg("u"), py::arg("i"),
           "The global index of rank (g, u)'s local token i.")
      .def(
          "owner",
          [](const TokenMap& map, std::int64_t t) {
            const TokenOwner o = map.owner(t);
            return py::make_tuple(o.g, o.u, o.index);
          },
          py::arg("t"), "(g, u, local index) of the rank that holds global token t.")
      .def(
          "causal_pairs",
          [](const TokenMap& map, int g, std::vector<std::int64_t> cu_seqlens) {
            if (cu_seqlens.empty()) return causal_pairs(map, g);
            return causal_pairs(map, g, DocumentLayout(std::move(cu_seqlens), map.seq()));
          },
          py::arg("g"), py::arg("cu_seqlens") = std::vector<std::int64_t>{},
          "Visible (query, key) pairs of chunk g's queries under causal attention (within documents when "
          "cu_seqlens is given): the chunk's attention work.")
      .def("describe", &TokenMap::describe)
      .def("__repr__", [](const TokenMap& map) { return "mlacp." + map.describe(); });
}

}  // namespace mlacp::python
