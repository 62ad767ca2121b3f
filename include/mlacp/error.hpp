// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The exceptions mlacp throws. Every message names the offending value and what was expected.
#pragma once

#include <stdexcept>
#include <string>

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

}  // namespace mlacp
