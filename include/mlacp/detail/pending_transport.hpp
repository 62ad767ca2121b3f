// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// One in-flight transport operation (an MPI request, an NCCL collective on a stream), seen by the handle that owns it.
#pragma once

namespace mlacp::detail {

class PendingTransport {
 public:
  virtual ~PendingTransport() = default;
  /// Makes progress without blocking; true once the operation is complete (then the receive buffer may be read in
  /// the order wait() establishes).
  virtual bool test() = 0;
  /// Completes the operation. For MPI this blocks the host until the data has arrived; for NCCL it makes the compute
  /// stream wait on the completion event without blocking the host.
  virtual void wait() = 0;
  /// Completes the operation, never throws; used by destructors of handles that were not waited.
  virtual void complete_noexcept() noexcept = 0;
  /// True when complete_noexcept() could not complete the operation because its mesh is broken (a rank reported a
  /// failure): the request was parked, and what the operation reads or writes must stay alive for good.
  virtual bool parked() const noexcept { return false; }
  /// Lets the transport advance without blocking and without reporting (called by mlacp::progress()); errors are
  /// left for test() / wait() to report.
  virtual void progress() noexcept = 0;

  /// Whether mlacp's GEMMs panel and poll while this operation is pending (detail::worth_polling, progress.hpp, decides
  /// it at the launch, before the handle registers the operation): false for one that polling cannot speed up, so that
  /// it costs nothing beside the compute. Either way the wait completes it.
  bool polled() const noexcept { return polled_; }
  void set_polled(bool polled) noexcept { polled_ = polled; }

 private:
  bool polled_ = true;
};

}  // namespace mlacp::detail
