// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI backend's transport of a pairwise reduce-scatter's exchange as one message per peer
// (start_block_messages), which reports each block as it arrives so that the collective can sum it while the others
// are in flight.
#pragma once

#include <mpi.h>
#include <mlacp/detail/pending_transport.hpp>
#include <mlacp/watchdog.hpp>

#include <functional>
#include <memory>
#include <vector>

namespace mlacp::mpi {

/// Owns the per-peer requests of start_block_messages on `comm` (`sends` and `recvs`, comm-size each, this rank's own
/// MPI_REQUEST_NULL). `block_arrived(i)` is called at most once per peer i, in rank order of the arrivals seen, by
/// wait() only and only while another block is still in flight: wait() waits for the receives in rank order and, after
/// each, reports the blocks that are in if one is not. A block not reported is left to the collective's finish.
/// test() and progress() only test (a sum during the compute that hides the transfer would take the compute's time).
/// Failures, the watchdog and parking as make_request_transport.
std::unique_ptr<detail::PendingTransport> make_block_exchange_transport(std::vector<MPI_Request> sends,
                                                                        std::vector<MPI_Request> recvs, MPI_Comm comm,
                                                                        CollectiveInfo info,
                                                                        std::function<void(int)> block_arrived);

}  // namespace mlacp::mpi
