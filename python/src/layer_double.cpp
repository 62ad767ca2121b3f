// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The double layer (its own translation unit: the two instantiations compile in parallel).
#include "bindings.hpp"
#include "layer.hpp"

void mlacp::python::bind_layer_double(pybind11::module_& m) { bind_layer<double>(m, "float64"); }
