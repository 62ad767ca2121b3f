// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/event_recorder.hpp>
#include <mlacp/settings.hpp>
#include <mlacp/watchdog.hpp>

#include <atomic>
#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace mlacp {
namespace {
std::atomic<double>& timeout_value() {
  static std::atomic<double> value{[] {
    const double seconds = Settings::from_environment().wait_timeout_s(default_wait_timeout_s);
    return seconds > 0 ? seconds : 0.0;
  }()};
  return value;
}
}  // namespace

double wait_timeout() { return timeout_value().load(); }

void set_wait_timeout(double seconds) {
  timeout_value().store(seconds > 0 ? seconds : 0.0);
  events::detail::keep_recent(seconds > 0);  // the report's "what this rank did last"
}

namespace detail {

std::string watchdog_report(const CollectiveInfo& info, int rank, int size, double waited_s) {
  const double since_launch = std::chrono::duration<double>(std::chrono::steady_clock::now() - info.launched).count();
  std::ostringstream out;
  out << std::fixed << std::setprecision(3);
  out << "mlacp watchdog: rank " << rank << " of " << size << ": collective '" << info.name
      << "' did not complete within the wait timeout (" << waited_s << " s waited, launched " << since_launch
      << " s ago)\n"
      << "  operation: " << info.operation << "\n"
      << "  shape: " << info.shape << ", " << info.bytes << " bytes sent by this rank\n"
      << "  what this rank did last (most recent last):\n";
  // The last mlacp events of this rank (collective launches and waits always; compute phases while recording).
  const auto recent = events::recent();
  const auto now = std::chrono::steady_clock::now();
  const std::size_t first = recent.size() > 16 ? recent.size() - 16 : 0;
  for (std::size_t i = first; i < recent.size(); ++i) {
    const double ago = std::chrono::duration<double>(now - recent[i].when).count();
    out << "    " << ago << " s ago  " << to_string(recent[i].kind) << " " << recent[i].name << "\n";
  }
  out << "  aborting the communicator (a rank that never entered this collective, or failed before it, is the usual "
         "cause; look for its error above)\n";
  return out.str();
}

void watch(const std::function<bool()>& poll, double timeout_s, const std::function<void(double waited_s)>& expire) {
  const auto start = std::chrono::steady_clock::now();
  while (!poll()) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s > 0 && waited > timeout_s) {
      expire(waited);
      throw std::logic_error("mlacp watchdog: the expiry handler returned");  // never continue past a lost collective
    }
    // The first millisecond spins (as MPI_Wait does: a short wait returns without a sleep's latency), then each poll
    // sleeps briefly, so that a long wait does not hold a core.
    if (waited > 1e-3) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace detail
}  // namespace mlacp
