// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Communication buffers reused across iterations: a training loop launches the same collectives with the same shapes
// every step, so after the first step no send, receive or staging buffer is allocated again.
#pragma once

#include <mlacp/allocation.hpp>
#include <mlacp/detail/transport.hpp>
#include <mlacp/diagnostics.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::detail {

/// The execution-space instance that last used a pooled buffer: its pack, unpack or staging copy may still be queued
/// there after the handle is gone. `stream` identifies CUDA instances (their stream), so that a launch on the same
/// stream reuses the buffer in stream order; other instances have none and are fenced before the buffer is reused
/// (free for host instances, whose kernels have completed when their launch returns).
struct BufferUser {
  const void* stream = nullptr;
  std::function<void()> fence;  ///< fences that instance
};

template <class ExecSpace>
BufferUser buffer_user(const ExecSpace& space) {
  BufferUser user;
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) user.stream = space.cuda_stream();
#endif
  user.fence = [space]() { space.fence(); };
  return user;
}

/// A process-wide pool of byte buffers in MemSpace, keyed by size. A buffer is free when the pool holds the only
/// reference to it (its handle was destroyed). Reuse is ordered by the instance that last used the buffer: a launch on
/// the same device stream reuses it in stream order; any other instance first fences the last user. The pool is
/// bounded: a free buffer that no launch took for trim_after() acquisitions is returned to Kokkos (varying shapes
/// would otherwise grow it without bound). Everything left is returned at Kokkos::finalize.
template <class MemSpace>
class BufferPool {
 public:
  using bytes_view = Kokkos::View<char*, MemSpace>;
  /// Default of trim_after(): well above the collectives of one training step, so that a steady state never trims.
  static constexpr std::uint64_t default_trim_after = 256;

  static BufferPool& instance() {
    static BufferPool* pool = [] {
      auto* p = new BufferPool();  // never destroyed: it is emptied at Kokkos::finalize, before its memory space goes
      Kokkos::push_finalize_hook([p] { p->clear(); });
      return p;
    }();
    return *pool;
  }

  /// A buffer of exactly `bytes` bytes that no handle is using, allocating one only if none is free; `user` is the
  /// instance that will use it.
  bytes_view acquire(std::size_t bytes, const std::string& label, BufferUser user) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++clock_;
    trim();
    Entry* chosen = nullptr;
    for (auto& entry : entries_) {
      if (entry.view.extent(0) != bytes || entry.view.use_count() != 1) continue;
      const bool same_stream = user.stream != nullptr && entry.user.stream == user.stream;
      if (chosen == nullptr || same_stream) chosen = &entry;
      if (same_stream) break;
    }
    if (chosen == nullptr) {
      bytes_view storage;
      refuse_beyond_available<MemSpace>("mlacp: the collectives' staging buffer pool", "mlacp pool: " + label,
                                        static_cast<std::int64_t>(bytes));
      try {
        storage = bytes_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp pool: " + label), bytes);
      } catch (const std::exception& e) {
        if (translate_allocation_failure(e, "")) {
          throw out_of_memory("mlacp: the collectives' staging buffer pool", "mlacp pool: " + label,
                              static_cast<std::int64_t>(bytes), e.what());
        }
        throw;
      }
      entries_.push_back(Entry{storage, {}, 0});
      diagnostics::detail::count_buffer_allocation(bytes);
      chosen = &entries_.back();
    } else if (chosen->user.fence && (user.stream == nullptr || chosen->user.stream != user.stream)) {
      chosen->user.fence();  // its last user may still read or write it in its own order
    }
    chosen->user = std::move(user);
    chosen->last_used = clock_;
    return chosen->view;
  }

  /// Acquisitions after which an unused free buffer is returned to Kokkos.
  std::uint64_t trim_after() {
    std::lock_guard<std::mutex> lock(mutex_);
    return trim_after_;
  }
  void set_trim_after(std::uint64_t acquisitions) {
    std::lock_guard<std::mutex> lock(mutex_);
    trim_after_ = acquisitions;
  }

  std::size_t buffers() {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }
  /// Bytes the pool holds (in use or free).
  std::size_t bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t total = 0;
    for (const auto& entry : entries_) total += entry.view.extent(0);
    return total;
  }

 private:
  struct Entry {
    bytes_view view;
    BufferUser user;
    std::uint64_t last_used;
  };

  BufferPool() = default;
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.clear();
  }
  void trim() {
    std::vector<Entry> kept;
    kept.reserve(entries_.size());
    for (auto& entry : entries_) {
      const bool idle = entry.view.use_count() == 1 && clock_ - entry.last_used > trim_after_;
      if (!idle) {
        kept.push_back(std::move(entry));
      } else if (entry.user.fence) {
        entry.user.fence();  // its last user may still use it in its own order (free on host instances)
      }
    }
    entries_.swap(kept);
  }

  std::mutex mutex_;
  std::vector<Entry> entries_;
  std::uint64_t clock_ = 0;
  std::uint64_t trim_after_ = default_trim_after;
};

/// A communication buffer of n values from the pool: an unmanaged View, plus the pooled allocation that must be kept
/// alive (by the handle) for as long as the View is used.
template <class T, class MemSpace>
struct PooledBuffer {
  Vector<T, MemSpace> view;
  typename BufferPool<MemSpace>::bytes_view storage;
};

template <class T, class MemSpace, class ExecSpace>
PooledBuffer<T, MemSpace> allocate_buffer(const ExecSpace& space, const std::string& label, std::size_t n) {
  auto storage = BufferPool<MemSpace>::instance().acquire(n * sizeof(T), label, buffer_user(space));
  return {Vector<T, MemSpace>(reinterpret_cast<T*>(storage.data()), n), storage};
}

}  // namespace mlacp::detail
