// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The pieces of the Python extension mlacp._mlacp, one binding per concept (see module.cpp for the order).
#pragma once

#include <pybind11/pybind11.h>

#include <mlacp/mla/mla_config.hpp>

namespace mlacp::python {

/// mlacp's exception hierarchy as Python exceptions (Error, InvalidArgument, UsageError, CommunicationError).
void bind_errors(pybind11::module_& m);
/// Kokkos' lifetime in the interpreter, the process-wide settings (overlap policy, wait watchdog) and the event
/// recorder.
void bind_runtime(pybind11::module_& m);
/// mlacp::Mesh over an mpi4py communicator, and the agreement the Python layer uses for its own checks.
void bind_mesh(pybind11::module_& m);
/// MlaConfig, MlaStrategy, RingLayout and MlaRequiresGrad.
void bind_config(pybind11::module_& m);
/// A RingLayout or its name ("contiguous" / "zigzag"; InvalidArgument naming the value otherwise).
RingLayout ring_layout_of(const pybind11::handle& value);
/// TokenMap: which global tokens each rank of a two-level mesh holds.
void bind_token_map(pybind11::module_& m);
/// The MLA layer over caller-owned (torch) storage, one class per value type.
void bind_layer_float(pybind11::module_& m);
void bind_layer_double(pybind11::module_& m);
void bind_layer_bfloat16(pybind11::module_& m);  // mixed precision: bf16 storage, float weight gradients
/// The planner (plan, format_plan, plan_to_json) and the machine file, for mlacp.plan and mlacp.read_machine.
void bind_plan(pybind11::module_& m);

}  // namespace mlacp::python
