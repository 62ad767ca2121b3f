// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mlacp-perf-overlap: what the forward's two pairs share (pair_o.cpp, pair_o_attention.cpp): the O exchange's buffers,
// its w_o GEMMs and the OutputProjection invocation that runs them, and the Pair fields that follow from them.
#pragma once

#include <mlacp/mla/pieces/output_projection.hpp>

#include <memory>
#include <optional>

#include "pair.hpp"

namespace mlacp::perf::overlap {

using OutputProjection = mlacp::OutputProjection<T, Space>;

// The forward's O exchange at B == 1 over S tokens and H heads split as the layer splits them, with w_o [D, H*dv].
struct OutputExchangeState {
  OutputExchangeState(const mlacp::Mesh& mesh, std::int64_t S, int H, int dv, int D);
  Split split;
  int dv;
  Tensor4 attention_output;  // [1, S, h, dv], head-local: the forward's input
  Tensor4 local_output;      // [1, s, H, dv]: the exchange's result (empty at P == 1)
  Tensor4 tokens;            // [1, s, H, dv]: the compute alone's operand
  Tensor4 received;          // [1, s, H, dv]: the collective alone's destination
  Tensor3 y;                 // [1, s, D]
  Matrix w_o;                // [D, H*dv]
  OutputProjection::buffers_type buffers;
  std::optional<OutputProjection> invocation;
  // y = tokens w_o^T as one GEMM: the w_o part of the compute alone.
  void w_o_gemm(const Space& space) const;
};

// The Pair fields the O exchange gives (comm_name, panel_rows, prepare, collective, launch_raw): the collective alone
// is the per-peer sends and receives as OutputProjection::forward launches them at B == 1 (each destination's tokens
// sent where they lie), launched and waited; the raw ceiling an MPI_Ialltoall of the same bytes.
void set_output_exchange(Pair& p, const std::shared_ptr<OutputExchangeState>& st, const mlacp::Mesh& mesh);

}  // namespace mlacp::perf::overlap
