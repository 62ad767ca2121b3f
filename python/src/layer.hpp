// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MLA layer over storage that Python owns (torch tensors): weights, x, dy and the gradients are the caller's
// memory, wrapped as unmanaged Kokkos Views (no copy); y is the layer's own output View, handed to Python as a NumPy
// array that keeps it alive (for bf16, which NumPy lacks, an int16 array over the same bytes that Python views as
// torch.bfloat16). Runs on the host execution space (torch's CPU tensors).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kokkos_lifetime.hpp"

namespace mlacp::python {
namespace py = pybind11;

using HostExecutionSpace = Kokkos::DefaultHostExecutionSpace;
using Shape = std::vector<std::int64_t>;

/// An unmanaged View of type ViewType over `address` (a tensor's data_ptr()) with `shape`. The Python side has
/// checked dtype, device, contiguity and the number of dimensions (agreed by every rank); this repeats the last check
/// so that a wrong call cannot build a View of the wrong rank.
template <class ViewType>
ViewType wrap(std::uintptr_t address, const Shape& shape, const std::string& name) {
  constexpr std::size_t rank = static_cast<std::size_t>(ViewType::traits::rank);
  if (shape.size() != rank)
    throw InvalidArgument("mlacp: " + name + " has " + std::to_string(shape.size()) + " dimensions; expected " +
                          std::to_string(rank));
  for (auto n : shape)
    if (n < 0) throw InvalidArgument("mlacp: " + name + " has a negative extent");
  auto* data = reinterpret_cast<typename ViewType::value_type*>(address);
  auto n = [&](std::size_t d) { return static_cast<std::size_t>(shape[d]); };
  static_assert(rank >= 1 && rank <= 3, "wrap: Views of rank 1 to 3");
  if constexpr (rank == 1)
    return ViewType(data, n(0));
  else if constexpr (rank == 2)
    return ViewType(data, n(0), n(1));
  else
    return ViewType(data, n(0), n(1), n(2));
}

/// The parameters (or gradients) named in `tensors` ({"w_q": (data_ptr, shape), ...}, names from the parameter
/// table); names left out stay empty.
template <class Params>
void wrap_parameters(const py::dict& tensors, const char* what, Params& p) {
  for_each_parameter(
      [&](const ParameterInfo& info, auto& view) {
        using view_type = std::remove_reference_t<decltype(view)>;
        if (!tensors.contains(info.name)) return;
        const auto [address, shape] = tensors[info.name].template cast<std::pair<std::uintptr_t, Shape>>();
        view = wrap<view_type>(address, shape, std::string(what) + " " + info.name);
      },
      p);
}

/// The NumPy element type that shows storage of T: T itself; for mlacp::bf16 (NumPy has no bfloat16) its 2-byte bit
/// pattern as int16, which torch views as bfloat16 without a copy (layer_bfloat16.cpp checks that the layouts agree).
template <class T>
struct NumpyStorage {
  using type = T;
};
template <>
struct NumpyStorage<bf16> {
  using type = std::int16_t;
};

template <class T>
class PendingForward;

/// One mlacp::MlaAttention<T> over one set of parameter storages. Built once per (configuration, storage); the
/// Python module builds a new one when its parameters' storage changes. Held by shared_ptr: a pending forward keeps
/// its layer (and the layer its mesh) alive.
template <class T>
class Layer {
 public:
  using layer_type = MlaAttention<T, HostExecutionSpace>;
  using tensor3 = typename layer_type::tensor3;

  /// Collective over the mesh (the library checks the configuration and the weights' shapes on every rank).
  Layer(const MlaConfig& config, std::shared_ptr<Mesh> mesh, const py::dict& weights) : mesh_(std::move(mesh)) {
    wrap_parameters(weights, "weight", weights_);
    py::gil_scoped_release release;
    layer_ = std::make_unique<layer_type>(config, weights_, *mesh_);
  }

  const layer_type& layer() const { return *layer_; }

 private:
  KokkosUser user_;  // first: destroyed last
  std::shared_ptr<Mesh> mesh_;
  typename layer_type::weights_type weights_;
  std::unique_ptr<layer_type> layer_;
};

/// The layer's output y, kept alive by the NumPy array (and the torch tensor) that shows it.
template <class T>
struct HeldOutput {
  KokkosUser user;
  typename Layer<T>::tensor3 y;
};

/// One forward pass waiting for its backward (mlacp's Forward), with its layer.
template <class T>
class PendingForward {
 public:
  using layer_type = typename Layer<T>::layer_type;
  using tensor3 = typename Layer<T>::tensor3;

  /// x [B, s, D] at `x_address` -> the pending forward and y as a NumPy array over the layer's output View.
  /// `cu_seqlens`: this call's packed documents (MlaAttention::forward's per-call packing; None: the configuration's).
  static std::pair<std::shared_ptr<PendingForward>, py::array> run(
      const std::shared_ptr<Layer<T>>& layer, std::uintptr_t x_address, const Shape& x_shape,
      const MlaRequiresGrad& flags, const std::optional<std::vector<std::int64_t>>& cu_seqlens) {
    auto pending = std::make_shared<PendingForward>();
    pending->layer_ = layer;
    const auto x = wrap<tensor3>(x_address, x_shape, "x");
    {
      py::gil_scoped_release release;
      HostExecutionSpace space;
      pending->forward_ =
          cu_seqlens ? layer->layer().forward(space, x, flags, *cu_seqlens) : layer->layer().forward(space, x, flags);
      space.fence();
    }
    const tensor3& y = pending->forward_.output();
    auto* held = new HeldOutput<T>{KokkosUser(), y};
    py::capsule owner(held, [](void* p) { delete static_cast<HeldOutput<T>*>(p); });
    using shown = typename NumpyStorage<T>::type;
    static_assert(sizeof(shown) == sizeof(T), "the NumPy element shows T's bytes one to one");
    std::vector<py::ssize_t> shape, strides;
    for (std::size_t d = 0; d < 3; ++d) {
      shape.push_back(static_cast<py::ssize_t>(y.extent(d)));
      strides.push_back(static_cast<py::ssize_t>(y.stride(d) * sizeof(T)));
    }
    return {pending, py::array_t<shown>(shape, strides, reinterpret_cast<const shown*>(y.data()), owner)};
  }

  /// dy [B, s, D] -> gradients accumulated (+=) into the caller's zeroed tensors: `grads` {"w_q": (data_ptr, shape)}
  /// for the weights whose flag was set at forward, dx at `dx_address` (0: none) with x's shape.
  void backward(std::uintptr_t dy_address, const Shape& dy_shape, const py::dict& grads, std::uintptr_t dx_address,
                const Shape& dx_shape) {
    typename layer_type::gradients_type g;
    wrap_parameters(grads, "gradient", g);
    if (dx_address != 0) g.dx = wrap<decltype(g.dx)>(dx_address, dx_shape, "dx");
    const auto dy = wrap<tensor3>(dy_address, dy_shape, "dy");
    py::gil_scoped_release release;
    HostExecutionSpace space;
    layer_->layer().backward(space, forward_, dy, g);
    space.fence();
  }

  bool backward_done() const { return forward_.backward_done(); }

  PendingForward() = default;
  PendingForward(const PendingForward&) = delete;
  PendingForward& operator=(const PendingForward&) = delete;
  /// Destroying a Forward may complete collectives it left pending (or, on a broken mesh, park them): that happens
  /// with the GIL released, so that a rank blocked there (Python's error path drops a pending forward) does not stop
  /// every other Python thread of the process meanwhile.
  ~PendingForward() {
    if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
      py::gil_scoped_release release;
      forward_ = typename layer_type::Forward();
    }
  }

 private:
  KokkosUser user_;                  // first: destroyed last
  std::shared_ptr<Layer<T>> layer_;  // before forward_: the Forward gives its workspace back to the layer
  typename layer_type::Forward forward_;
};

/// Registers Layer<T> and PendingForward<T> as _mlacp.Layer_<suffix> and _mlacp.PendingForward_<suffix>. A layer's
/// forward returns y as a NumPy array of NumpyStorage<T>::type.
template <class T>
void bind_layer(py::module_& m, const std::string& suffix) {
  py::class_<Layer<T>, std::shared_ptr<Layer<T>>>(m, ("Layer_" + suffix).c_str(),
                                                  "mlacp::MlaAttention over caller-owned weights (internal; use "
                                                  "mlacp.MlaAttention).")
      .def(py::init<const MlaConfig&, std::shared_ptr<Mesh>, const py::dict&>(), py::arg("config"), py::arg("mesh"),
           py::arg("weights"))
      .def("forward", &PendingForward<T>::run, py::arg("x_address"), py::arg("x_shape"), py::arg("flags"),
           py::arg("cu_seqlens") = py::none())
      .def_property_readonly("local_seq", [](const Layer<T>& l) { return l.layer().local_seq(); })
      .def_property_readonly("local_heads", [](const Layer<T>& l) { return l.layer().local_heads(); })
      .def_property_readonly("forward_workspaces", [](const Layer<T>& l) { return l.layer().forward_workspaces(); })
      .def_property_readonly("forward_workspaces_in_use",
                             [](const Layer<T>& l) { return l.layer().forward_workspaces_in_use(); });
  py::class_<PendingForward<T>, std::shared_ptr<PendingForward<T>>>(m, ("PendingForward_" + suffix).c_str())
      .def("backward", &PendingForward<T>::backward, py::arg("dy_address"), py::arg("dy_shape"), py::arg("grads"),
           py::arg("dx_address"), py::arg("dx_shape"))
      .def_property_readonly("backward_done", &PendingForward<T>::backward_done);
}

}  // namespace mlacp::python
