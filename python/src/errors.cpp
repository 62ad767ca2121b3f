// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// mlacp's exceptions as Python exceptions, with the same messages. Error derives from Exception; InvalidArgument is
// also a ValueError, UsageError and CommunicationError also RuntimeErrors, OutOfMemoryError also a MemoryError, so
// that code catching the builtin kinds keeps working.
#include <mlacp/error.hpp>

#include "bindings.hpp"

namespace mlacp::python {
namespace py = pybind11;

namespace {

// A new exception class `name` of module `m` deriving from `bases`; the module keeps it.
PyObject* new_exception(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  const std::string qualified = std::string("mlacp.") + name;  // as users import it
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(type));
  return type;
}

}  // namespace

void bind_errors(py::module_& m) {
  static PyObject* error = nullptr;
  static PyObject* invalid_argument = nullptr;
  static PyObject* usage_error = nullptr;
  static PyObject* communication_error = nullptr;
  static PyObject* out_of_memory = nullptr;
  error = new_exception(m, "Error", "Base of every mlacp exception.",
                        py::make_tuple(py::reinterpret_borrow<py::object>(PyExc_Exception)));
  const auto base = py::reinterpret_borrow<py::object>(error);
  invalid_argument = new_exception(
      m, "InvalidArgument",
      "An argument that cannot work (shape, dtype, device, configuration), raised on every rank before anything is "
      "sent.",
      py::make_tuple(base, py::reinterpret_borrow<py::object>(PyExc_ValueError)));
  usage_error =
      new_exception(m, "UsageError", "The API used in the wrong order (a backward before its forward, twice).",
                    py::make_tuple(base, py::reinterpret_borrow<py::object>(PyExc_RuntimeError)));
  communication_error = new_exception(m, "CommunicationError", "The transport (MPI) reported a failure.",
                                      py::make_tuple(base, py::reinterpret_borrow<py::object>(PyExc_RuntimeError)));
  out_of_memory = new_exception(
      m, "OutOfMemoryError",
      "An allocation that did not fit: the message names the View, the bytes asked for and what the rank had. Raised "
      "on every rank (the others' waits raise CommunicationError naming it where collectives were pending).",
      py::make_tuple(base, py::reinterpret_borrow<py::object>(PyExc_MemoryError)));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mlacp::InvalidArgument& e) {
      PyErr_SetString(invalid_argument, e.what());
    } catch (const mlacp::UsageError& e) {
      PyErr_SetString(usage_error, e.what());
    } catch (const mlacp::OutOfMemory& e) {
      PyErr_SetString(out_of_memory, e.what());
    } catch (const mlacp::CommunicationError& e) {
      PyErr_SetString(communication_error, e.what());
    } catch (const mlacp::Error& e) {
      PyErr_SetString(error, e.what());
    }
  });
}

}  // namespace mlacp::python
