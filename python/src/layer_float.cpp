// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The float layer (its own translation unit: the two instantiations compile in parallel).
#include "bindings.hpp"
#include "layer.hpp"

void mlacp::python::bind_layer_float(pybind11::module_& m) { bind_layer<float>(m, "float32"); }
