// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// mlacp._mlacp: the compiled half of the Python package mlacp (python/mlacp holds the torch half).
//
// Design: the extension never links libtorch. Python passes each tensor as its data pointer and shape (after
// checking dtype, device and contiguity, agreed by every rank), the extension wraps that storage in unmanaged Kokkos
// Views and runs mlacp's layer on it; the layer's output View comes back as a NumPy array that keeps the View alive
// (torch.from_numpy shares it). So the extension depends only on pybind11, NumPy's array protocol and mpi4py's C API,
// not on torch's C++ ABI.
#include "bindings.hpp"

PYBIND11_MODULE(_mlacp, m) {
  m.doc() = "mlacp: MLA under Ulysses context parallelism (compiled part; use the mlacp package)";
  mlacp::python::bind_errors(m);
  mlacp::python::bind_runtime(m);
  mlacp::python::bind_mesh(m);
  mlacp::python::bind_config(m);
  mlacp::python::bind_token_map(m);
  mlacp::python::bind_layer_float(m);
  mlacp::python::bind_layer_double(m);
  mlacp::python::bind_layer_bfloat16(m);
  mlacp::python::bind_plan(m);
}
