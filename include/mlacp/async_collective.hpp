// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The handle of one launched collective.
#pragma once

#include <mlacp/compat.hpp>
#include <mlacp/detail/pending_transport.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/error.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/progress.hpp>

#include <any>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mlacp {

template <class ResultView>
class AsyncCollective;

namespace detail {
template <class Result, class Inner, class Then>
AsyncCollective<Result> adopt_collective(AsyncCollective<Inner>&& inner, Then&& then);
}  // namespace detail

/// A collective in flight: returned by launch_all_to_all / launch_all_gather / launch_reduce_scatter.
///
/// Move-only. It owns the transport request and keeps what it reads or writes alive (extend_lifetime) until it is
/// destroyed. wait() is called exactly once and returns the result View, ready in the order of the execution-space
/// instance given at launch (its unpack kernel is enqueued there); a second wait() throws UsageError "... cannot be
/// waited twice". test() makes progress without blocking, so compute loops can drive the transport. A handle destroyed
/// (or assigned over) while launched and not waited completes the operation first, so that no request leaks and no
/// buffer is freed while the transport may still write it, and reports the misuse (stderr and
/// diagnostics::unwaited_handles()). On a broken mesh (Mesh::report_failure) the destructor does not block: the
/// request and what the handle keeps alive are parked for the life of the process (diagnostics::parked_handles()).
///
/// Seen by Kokkos Tools (when a tool is loaded or a callback set): a mark event "mlacp::launch <name>" when the
/// collective is handed to the transport, the wait as a region "mlacp::wait <name>", and a mark event
/// "mlacp::complete <name>" when its result is available; with the compute phases' "mlacp::<phase>" regions a
/// connector shows which collective was in flight during which compute, and how long each wait blocked.
template <class ResultView>
class AsyncCollective {
 public:
  using result_type = ResultView;

  /// An empty handle: nothing launched.
  AsyncCollective() = default;

  /// Used by the launch functions. `transport` may be null (nothing to wait for: P == 1); `finish` runs once when the
  /// transport completed and enqueues the unpack. What the transport reads or writes is kept alive with
  /// extend_lifetime().
  AsyncCollective(std::string name, std::unique_ptr<detail::PendingTransport> transport, ResultView result,
                  std::function<void()> finish)
      : state_(std::make_unique<State>()) {
    state_->name = std::move(name);
    state_->transport = std::move(transport);
    state_->result = std::move(result);
    state_->finish = std::move(finish);
    if (state_->transport) detail::register_pending(state_->transport.get());
    events::record(EventKind::launch, state_->name);
    if (compat::tools::active()) compat::tools::mark_event("mlacp::launch " + state_->name);
  }

  ~AsyncCollective() { abandon(); }
  AsyncCollective(AsyncCollective&& other) noexcept = default;
  AsyncCollective& operator=(AsyncCollective&& other) noexcept {
    if (this != &other) {
      abandon();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  AsyncCollective(const AsyncCollective&) = delete;
  AsyncCollective& operator=(const AsyncCollective&) = delete;

  /// True when a collective was launched into this handle (and it was not moved away), waited or not.
  bool launched() const noexcept { return state_ != nullptr; }
  /// True once wait() returned.
  bool waited() const noexcept { return state_ && state_->waited; }
  /// True when launched and not yet waited: wait() is still owed.
  bool pending() const noexcept { return state_ && !state_->waited; }
  const std::string& name() const {
    static const std::string empty;
    return state_ ? state_->name : empty;
  }

  /// Keeps `owner` (a View, a pooled buffer, any copyable object that owns memory the transport uses) alive until the
  /// handle is destroyed, that is, after the transport completed. Throws UsageError on an empty handle.
  template <class Owner>
  void extend_lifetime(const Owner& owner) {
    require_launched("extend_lifetime");
    state_->lifetimes.emplace_back(owner);
  }

  /// Progresses the transport without blocking; true when the data has arrived (wait() will not block on the
  /// network). Throws UsageError on an empty handle. Safe against a concurrent mlacp::progress() (another thread's
  /// progress loop tests the same request under the registry's lock; so does this).
  bool test() {
    require_launched("test");
    if (state_->waited) return true;
    return !state_->transport || detail::test_pending(state_->transport.get());
  }

  /// Completes the collective and returns its result. Exactly once: a second call throws UsageError.
  ResultView wait() {
    require_launched("wait");
    if (state_->waited) throw UsageError("mlacp: collective '" + state_->name + "' cannot be waited twice");
    events::record(EventKind::wait_begin, state_->name);
    const bool tools = compat::tools::active();
    {
      std::optional<compat::ScopedRegion> region;
      if (tools) region.emplace("mlacp::wait " + state_->name);
      if (state_->transport) {
        detail::unregister_pending(state_->transport.get());
        state_->transport->wait();
      }
      if (state_->finish) state_->finish();
    }
    state_->waited = true;
    state_->finish = nullptr;
    events::record(EventKind::wait_end, state_->name);
    if (tools) compat::tools::mark_event("mlacp::complete " + state_->name);
    return state_->result;
  }

 private:
  template <class Result, class Inner, class Then>
  friend AsyncCollective<Result> detail::adopt_collective(AsyncCollective<Inner>&& inner, Then&& then);
  struct Adopted {};
  explicit AsyncCollective(Adopted);

  // Members are destroyed in reverse order: the transport (whose destructor completes it) before what it uses.
  struct State {
    std::string name;
    std::vector<std::any> lifetimes;
    ResultView result;
    std::function<void()> finish;
    std::unique_ptr<detail::PendingTransport> transport;
    bool waited = false;
  };

  void require_launched(const char* what) const {
    if (!state_)
      throw UsageError(std::string("mlacp: ") + what +
                       "() on an empty collective handle (nothing was launched into it, or it was moved from)");
  }

  void abandon() noexcept {
    if (!state_) return;
    if (!state_->waited) {
      if (state_->transport) {
        detail::unregister_pending(state_->transport.get());
        state_->transport->complete_noexcept();
        if (state_->transport->parked()) {
          // Its mesh is broken (a rank reported a failure) and the collective may never complete: the state, and the
          // buffers it keeps alive, are leaked on purpose instead of freed under a request MPI may still write.
          diagnostics::detail::park_handle(state_.release());
          return;
        }
      }
      diagnostics::detail::report_unwaited_handle(state_->name);
    }
    state_.reset();
  }

  std::unique_ptr<State> state_;
};

template <class ResultView>
AsyncCollective<ResultView>::AsyncCollective(Adopted) : state_(std::make_unique<State>()) {}

namespace detail {
/// A launched collective `inner` taken over by a handle of another result type (a wire codec's: the collective moves
/// wire values, the caller waits for its Views' type). `then(arrived)`, called now with the View the inner collective
/// will have filled at its wait, returns {the result the new handle's wait() returns, what runs after the inner
/// collective's own finish at that wait (the decode)}. The transport, its registration, what the inner handle keeps
/// alive and its name move over unchanged: the launch was recorded once (by `inner`), and the new handle's wait
/// records the wait and completion under the same name, so that the recorded schedule does not depend on the codec.
/// `inner` is left empty.
template <class Result, class Inner, class Then>
AsyncCollective<Result> adopt_collective(AsyncCollective<Inner>&& inner, Then&& then) {
  inner.require_launched("adopt");
  auto& from = *inner.state_;
  std::pair<Result, std::function<void()>> next = then(static_cast<const Inner&>(from.result));
  AsyncCollective<Result> adopted{typename AsyncCollective<Result>::Adopted{}};
  auto& to = *adopted.state_;
  to.name = std::move(from.name);
  to.lifetimes = std::move(from.lifetimes);
  to.lifetimes.emplace_back(from.result);
  to.result = std::move(next.first);
  to.finish = [first = std::move(from.finish), second = std::move(next.second)]() {
    if (first) first();
    if (second) second();
  };
  to.transport = std::move(from.transport);
  to.waited = from.waited;
  inner.state_.reset();
  return adopted;
}
}  // namespace detail

}  // namespace mlacp
