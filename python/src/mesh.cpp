// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// mlacp.Mesh over an mpi4py communicator. The only MPI this extension touches is reading the MPI_Comm handle out of
// the mpi4py object (mpi4py's C API); everything else goes through mlacp::Mesh. The mesh borrows the communicator:
// mlacp never frees it, and the Python object keeps the mpi4py communicator alive while the mesh lives.
#include <mpi4py/mpi4py.h>
#include <pybind11/stl.h>

#include <memory>
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>

#include "bindings.hpp"

namespace mlacp::python {
namespace py = pybind11;

namespace {

// ring: an int C, or "node" (one Ulysses group per node).
Ring ring_of(const py::handle& ring) {
  if (py::isinstance<py::str>(ring)) {
    const auto text = ring.cast<std::string>();
    if (text == "node") return Ring::node();
    throw mlacp::InvalidArgument("mlacp.Mesh: ring='" + text + "'; expected a positive int C or 'node'");
  }
  if (py::isinstance<py::bool_>(ring) || !py::isinstance<py::int_>(ring))
    throw mlacp::InvalidArgument("mlacp.Mesh: ring=" + py::repr(ring).cast<std::string>() +
                                 "; expected a positive int C or 'node'");
  return Ring(ring.cast<int>());
}

MPI_Comm comm_of(const py::handle& comm) {
  MPI_Comm* handle = PyMPIComm_Get(comm.ptr());
  if (handle == nullptr) throw py::error_already_set();  // mpi4py's TypeError: not an mpi4py.MPI.Comm
  if (*handle == MPI_COMM_NULL) throw mlacp::InvalidArgument("mlacp.Mesh: the communicator is MPI.COMM_NULL");
  return *handle;
}

}  // namespace

void bind_mesh(py::module_& m) {
  if (import_mpi4py() < 0) throw py::error_already_set();

  py::enum_<ReduceScatterAlgorithm>(m, "ReduceScatterAlgorithm",
                                    "How the reduce-scatter moves data over MPI (mlacp::ReduceScatterAlgorithm).")
      .value("pairwise", ReduceScatterAlgorithm::pairwise)
      .value("mpi", ReduceScatterAlgorithm::mpi);

  py::class_<Mesh, std::shared_ptr<Mesh>>(m, "Mesh", py::dynamic_attr(),
                                          "A Ulysses group over an mpi4py communicator (borrowed, never freed). "
                                          "Construction is collective over the communicator.")
      .def(py::init([](const py::handle& comm, const py::handle& ring) {
             const MPI_Comm c = comm_of(comm);
             const Ring r = ring_of(ring);
             py::gil_scoped_release release;
             return std::make_shared<Mesh>(c, r, Mesh::Ownership::borrow);
           }),
           py::arg("comm"), py::arg("ring") = 1, py::keep_alive<1, 2>())
      .def_property_readonly("ulysses_size", &Mesh::ulysses_size, "U: ranks per Ulysses group (P / C).")
      .def_property_readonly("ring_size", &Mesh::ring_size, "C: Ulysses groups, ranks per ring (1: flat Ulysses).")
      .def_property_readonly("ulysses_rank", &Mesh::ulysses_rank, "This rank's rank in its Ulysses group.")
      .def_property_readonly("ring_rank", &Mesh::ring_rank, "This rank's rank in its ring (its Ulysses group).")
      .def_property_readonly(
          "ulysses_group", [](const Mesh& mesh) -> const Mesh& { return mesh.ulysses_group(); },
          py::return_value_policy::reference_internal,
          "The Ulysses group's mesh (U ranks; the mesh itself when ring = 1).")
      .def_property_readonly(
          "ring_group", [](const Mesh& mesh) -> const Mesh& { return mesh.ring_group(); },
          py::return_value_policy::reference_internal,
          "The ring's mesh (C ranks, ordered by Ulysses group); UsageError when ring = 1.")
      .def_property_readonly("rank", &Mesh::rank)
      .def_property_readonly("size", &Mesh::size)
      .def_property_readonly("owns_communicator", &Mesh::owns_communicator)
      .def_property_readonly("has_nccl", &Mesh::has_nccl)
      .def_property(
          "checked", &Mesh::checked,
          [](Mesh& mesh, bool on) {
            py::gil_scoped_release release;
            mesh.set_checked(on);
          },
          "Checked mode: every call agrees on shapes across ranks and raises a rank's error on every rank "
          "(setting it is collective: every rank must set the same value).")
      .def_property("check_finite", &Mesh::check_finite, &Mesh::set_check_finite,
                    "The layer checks that x and dy hold no NaN or Inf, on every rank, before any collective.")
      .def_property("host_staging", &Mesh::host_staging, &Mesh::set_host_staging,
                    "MPI collectives copy through host buffers even where MPI could read the memory directly.")
      .def_property(
          "reduce_scatter_algorithm", &Mesh::reduce_scatter_algorithm,
          [](Mesh& mesh, ReduceScatterAlgorithm algorithm) {
            py::gil_scoped_release release;
            mesh.set_reduce_scatter_algorithm(algorithm);
          },
          "ReduceScatterAlgorithm.pairwise (default) or .mpi (setting it is collective).")
      .def("report_failure", &Mesh::report_failure, py::arg("what"),
           "Marks the mesh broken because this rank failed with `what` and tells the other ranks, whose current wait "
           "or next call raises mlacp.CommunicationError naming this rank (non-blocking, local).")
      .def_property_readonly("broken", &Mesh::broken,
                             "Whether a rank (this one or another) reported a failure: every call on the mesh raises.")
      .def("__repr__", [](const Mesh& mesh) {
        return "mlacp.Mesh(rank=" + std::to_string(mesh.rank()) + ", size=" + std::to_string(mesh.size()) +
               (mesh.ring_size() > 1 ? ", ring=" + std::to_string(mesh.ring_size()) : std::string()) +
               ", checked=" + (mesh.checked() ? "True" : "False") + ")";
      });

  // One host thread at a time per communicator: Mesh._entered (mesh.py) holds this over a whole Python-side call
  // (its own agreements included); a second thread entering meanwhile raises UsageError.
  py::class_<detail::EntryGuard>(m, "_EntryGuard")
      .def(py::init<const Mesh&, const std::string&>(), py::arg("mesh"), py::arg("where"), py::keep_alive<1, 2>())
      .def("release", &detail::EntryGuard::release);

  m.def(
      "_agree",
      [](const Mesh& mesh, const std::string& where, const std::string& local_error,
         const std::vector<std::pair<std::string, std::int64_t>>& fields, const std::string& context, bool usage) {
        const detail::EntryGuard entry(mesh, where);  // not while another thread is inside on this communicator
        py::gil_scoped_release release;
        detail::agree_or_throw(mesh, where, local_error, fields, context, usage);
      },
      py::arg("mesh"), py::arg("where"), py::arg("local_error"), py::arg("fields") = detail::AgreementFields{},
      py::arg("context") = "", py::arg("usage") = false,
      "The library's agreement (mlacp::detail::agree_or_throw): on a checked mesh every rank raises the lowest failing "
      "rank's InvalidArgument, or one naming a field whose value differs across ranks; unchecked, this rank's own "
      "error only.");
}

}  // namespace mlacp::python
