// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The exceptions mlacp throws. Every message names the offending value and what was expected.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace mlacp {

/// Base of every mlacp exception.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An argument that cannot work: a dimension out of range, a size not divisible by the group, shapes that differ
/// across ranks. Raised before anything is sent; in checked mode raised on every rank of the mesh.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// The API used in the wrong order: a handle waited twice, a backward before its forward.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// The transport (MPI, NCCL, CUDA) reported a failure.
class CommunicationError : public Error {
 public:
  using Error::Error;
};

/// An allocation that did not fit: names what was being allocated (the View's label), the bytes asked for and the
/// bytes the rank had available. Raised on every rank: where it happens before a collective the ranks agree on it,
/// where collectives may be pending the failing rank reports it on the mesh's failure channel (the others raise
/// CommunicationError naming it). Python: mlacp.OutOfMemoryError, also a MemoryError.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& what, std::string label, std::int64_t bytes, std::int64_t available)
      : Error(what), label_(std::move(label)), bytes_(bytes), available_(available) {}
  /// The View's label ("" when unknown).
  const std::string& label() const { return label_; }
  /// Bytes asked for (-1 when unknown); as Kokkos reports it, rounded, when the failure came from inside Kokkos.
  std::int64_t bytes() const { return bytes_; }
  /// Bytes the rank had available when it failed (MemAvailable, bounded by the address-space limit; -1 unknown).
  std::int64_t available() const { return available_; }

 private:
  std::string label_;
  std::int64_t bytes_;
  std::int64_t available_;
};

}  // namespace mlacp
