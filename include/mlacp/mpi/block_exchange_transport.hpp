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
/// MPI_REQUEST_NULL). `block_arrived(i)` is called once per peer i, once its block has arrived, in the order the
/// arrivals are seen: by test() and wait() (which waits for the receives in rank order), and by progress() when
/// mlacp::progress() runs on the thread that created the transport (the one that launched the collective: the
/// callback launches kernels on its execution-space instance). An arrival seen by another thread's progress() is
/// reported at the next call on that thread. An exception of the callback in progress() is kept and raised by the next
/// test() or wait(). Failures, the watchdog and parking as make_request_transport.
std::unique_ptr<detail::PendingTransport> make_block_exchange_transport(std::vector<MPI_Request> sends,
                                                                        std::vector<MPI_Request> recvs, MPI_Comm comm,
                                                                        CollectiveInfo info,
                                                                        std::function<void(int)> block_arrived);

}  // namespace mlacp::mpi
