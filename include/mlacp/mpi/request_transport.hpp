// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI backend's transport: one nonblocking-collective request.
#pragma once

#include <mpi.h>
#include <mlacp/detail/pending_transport.hpp>
#include <mlacp/watchdog.hpp>

#include <memory>
#include <string>
#include <vector>

namespace mlacp::mpi {

/// Owns an MPI request from MPI_Ialltoall / MPI_Iallgather / MPI_Ireduce_scatter_block on `comm`. test() calls
/// MPI_Test (which also progresses Open MPI's engine); wait() polls (wait_watched) and throws CommunicationError on
/// failure, or when the mesh of `comm` is broken (a rank reported a failure, Mesh::report_failure). A handle abandoned
/// on a broken mesh parks its request instead of waiting for it (parked()).
std::unique_ptr<detail::PendingTransport> make_request_transport(MPI_Request request, MPI_Comm comm,
                                                                 CollectiveInfo info);

/// The same for a point-to-point exchange (launch_send_recv): its MPI_Isend and MPI_Irecv requests, completed together;
/// wait() raises the first MPI error among them (e.g. MPI_ERR_TRUNCATE of the receive) once both completed.
std::unique_ptr<detail::PendingTransport> make_request_pair_transport(MPI_Request send, MPI_Request recv, MPI_Comm comm,
                                                                      CollectiveInfo info);

/// Completes `request` on `comm` by polling: returns MPI's error code once it completed. Every poll also tests the
/// failure channels of `comm`: when one is broken, sets `*mesh_failed` (when given) and returns MPI_SUCCESS with the
/// request still active (the caller raises or parks it); without `mesh_failed` a broken mesh is not looked at. Past
/// the wait timeout (watchdog.hpp; never when it is 0) prints the watchdog report for `info` on stderr and aborts the
/// communicator.
int wait_watched(MPI_Request* request, MPI_Comm comm, const CollectiveInfo& info, bool* mesh_failed = nullptr) noexcept;

/// wait_watched, then: CommunicationError naming `what` when MPI failed, and CommunicationError naming the failed
/// rank (broken_mesh_message) when the mesh is broken, after parking the request and `keep_alive` (communicator.hpp).
void wait_or_throw(MPI_Request* request, MPI_Comm comm, const CollectiveInfo& info, const std::string& what,
                   std::shared_ptr<void> keep_alive);

/// MPI_Test of every active request of `requests` (a completed one becomes MPI_REQUEST_NULL); CommunicationError
/// naming `info` on an MPI error. Returns whether all have completed.
bool test_requests(std::vector<MPI_Request>& requests, const CollectiveInfo& info);

/// The same without raising, for progress(): MPI's errors are left for test() and wait() to report.
void progress_requests(std::vector<MPI_Request>& requests) noexcept;

/// Waits `request` (wait_watched) as a transport's wait() does: raises CommunicationError naming the failed rank when
/// the mesh of `comm` broke (the request left active, for the handle's destructor to park); an MPI error is kept in
/// `first_error` (when it holds none yet) and the request is set to MPI_REQUEST_NULL. Returns whether the request
/// completed without error (false for MPI_REQUEST_NULL).
bool wait_request(MPI_Request& request, MPI_Comm comm, const CollectiveInfo& info, int& first_error);

/// Completes every request of `requests` without throwing (a handle destroyed unwaited), each in turn by wait_watched.
/// When the mesh of `comm` is broken, sets `parked` and parks the requests still active (what they use must then stay
/// alive for good); once `parked` is set, the remaining requests are parked without waiting. After MPI_Finalize
/// nothing is waited. Every request is MPI_REQUEST_NULL afterwards.
void complete_requests_noexcept(std::vector<MPI_Request>& requests, MPI_Comm comm, const CollectiveInfo& info,
                                bool& parked) noexcept;

/// MPI_Abort on `comm` (the watchdog's end): never returns.
[[noreturn]] void abort_communicator(MPI_Comm comm) noexcept;

/// Throws CommunicationError naming `what` and MPI's error string when `code` is not MPI_SUCCESS.
void check_mpi(int code, const std::string& what);

}  // namespace mlacp::mpi
