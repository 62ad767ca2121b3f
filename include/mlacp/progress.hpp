// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Progress of in-flight collectives while the caller computes.
//
// MPI libraries such as Open MPI move a nonblocking collective forward only inside MPI calls. Every launched MPI
// collective registers here until it is waited, and mlacp's own GEMMs call progress() between panels while any is
// pending, so communication proceeds during compute without a progress thread. Users' own long compute between a
// launch and a wait can call mlacp::progress() too.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mlacp {

class Mesh;

namespace detail {
class PendingTransport;
/// Whether a collective on `mesh` of which this rank sends `bytes` is worth polling under overlap_policy()
/// (panelled_gemm.hpp, OverlapPolicy): each launch sets it on its transport (PendingTransport::set_polled) before the
/// handle registers it. A per-rank answer changes only how this rank's GEMMs are split, never what is computed.
bool worth_polling(const Mesh& mesh, std::int64_t bytes);
void register_pending(PendingTransport* transport);
void unregister_pending(PendingTransport* transport) noexcept;
/// transport->test() under the registry's lock, so that it never runs at the same time as progress() on the same
/// request (MPI_Test on one request from two threads at once is erroneous even with MPI_THREAD_MULTIPLE).
bool test_pending(PendingTransport* transport);
/// Counts `blocks` that a running sum (running_block_sum.hpp) added before its collective's wait.
void count_blocks_summed_on_arrival(std::size_t blocks) noexcept;
/// Blocks (this rank's own included) that the running sums of this process's reduce-scatters added before their
/// collective's wait, since the start: what a test or a report reads to see the sum overlap the exchange.
std::size_t blocks_summed_on_arrival() noexcept;
}  // namespace detail

/// Tests every pending collective once (MPI_Test), which lets the MPI library progress them. Cheap when none is
/// pending. Thread-safe.
void progress();

/// Number of launched, not yet waited collectives of this process.
std::size_t pending_collectives() noexcept;

/// Those of them worth polling (OverlapPolicy: their bytes do not move through shared memory, and there are enough of
/// them): mlacp's GEMMs panel and poll only while at least one is pending; beside the others a GEMM is one call, as in
/// a blocking schedule.
std::size_t polled_collectives() noexcept;

/// Number of progress() calls that tested at least one collective since the start (for tests and reports).
std::size_t progress_calls() noexcept;

}  // namespace mlacp
