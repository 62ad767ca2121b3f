// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// A bf16 layer that computes in float (MlaConfig::bf16_compute = float, or what "auto" chose where bf16 GEMMs are
// slow): a float MlaAttention over float copies of the bf16 weights, with bf16 on the wire. The weights are widened at
// each forward (the caller may have updated them), x and dy on the way in; y and dx are rounded to bf16 on the way
// out, once each. The storage at the layer's edges and on the wire is bf16 as in the bf16 schedule; the saved
// activations are float (the float layer's). Included at the end of mla/mla_attention.hpp, whose bf16 layer holds one.
#pragma once

#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/wire/cast.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mlacp::detail {

/// dst = src converted through float (bf16 widened or float rounded), two rank-3 Views of the same extents. (Free
/// functions: nvcc refuses a device lambda in a private member function.)
template <class ExecSpace, class Src, class Dst>
void convert_tensor3(const ExecSpace& space, const char* label, const Src& src, const Dst& dst) {
  using D = typename Dst::non_const_value_type;
  if (dst.size() == 0) return;
  Kokkos::parallel_for(
      label,
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>, Kokkos::IndexType<std::int64_t>>(
          space, {0, 0, 0},
          {static_cast<std::int64_t>(dst.extent(0)), static_cast<std::int64_t>(dst.extent(1)),
           static_cast<std::int64_t>(dst.extent(2))}),
      KOKKOS_LAMBDA(const std::int64_t a, const std::int64_t b, const std::int64_t c) {
        dst(a, b, c) = cast_value<D>(src(a, b, c));
      });
}

/// One forward of the float layer: its Forward, and the widened x it saved for its backward.
template <class ExecSpace, class Core>
struct WidenedPass {
  typename MlaAttention<float, ExecSpace, Core>::Forward forward;
  Tensor3<float, typename ExecSpace::memory_space> x;
};

/// The float layer of a bf16 layer that computes in float, and the buffers of its edges. Built collectively (its
/// float layer agrees on its configuration, as every layer does) by the bf16 layer's forward, on every rank at once.
template <class ExecSpace, class Core>
class Bf16AsFloat {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using float_layer = MlaAttention<float, ExecSpace, Core>;
  using bf16_tensor3 = Tensor3<compat::bf16, memory_space>;
  using float_tensor3 = Tensor3<float, memory_space>;
  using pass_type = WidenedPass<ExecSpace, Core>;

  Bf16AsFloat(const MlaConfig& config, MlaWeights<compat::bf16, memory_space> weights, const Mesh& mesh,
              const Core& core)
      : weights_(std::move(weights)),
        widened_(MlaWeights<float, memory_space>::allocate(config, "mlacp::widened ")),
        layer_(float_config(config, mesh), widened_, mesh, core) {}

  /// The float layer's configuration: the bf16 layer's, with bf16 on the wire (bf16_all where the bf16 layer asked
  /// for it and the float layer can sum bf16 partial sums; otherwise the reduce-scatter's partial sums are float).
  static MlaConfig float_config(MlaConfig c, const Mesh& mesh) {
    const bool mpi_sums =
        c.strategy == MlaStrategy::latent && mesh.size() > 1 && Backend<ExecSpace>::Transport::sums_with_mpi(mesh);
    c.wire_dtype = c.wire_dtype == WireDtype::bfloat16_all && !mpi_sums ? WireDtype::bfloat16_all : WireDtype::bfloat16;
    return c;
  }

  const float_layer& layer() const { return layer_; }
  float_layer& layer() { return layer_; }

  /// Bytes this path holds beyond the float layer's workspaces: the widened weights and the edge buffers.
  std::size_t own_bytes() const {
    std::size_t bytes = 0;
    for_each_parameter([&](const ParameterInfo&, const auto& v) { bytes += v.span() * sizeof(float); }, widened_);
    for (const auto& x : inputs_) bytes += x.span() * sizeof(float);
    for (const auto& y : outputs_) bytes += y.span() * sizeof(compat::bf16);
    return bytes + (dy_.span() + dx_.span()) * sizeof(float);
  }

  /// Drops the edge buffers nobody holds (the float layer's release_memory drops its workspaces).
  void release_memory() {
    drop_free(inputs_);
    drop_free(outputs_);
    dy_ = float_tensor3();
    dx_ = float_tensor3();
    layer_.release_memory();
  }

  /// The forward of x [B, s, D] in float: y (rounded to bf16) into `y`; the pass its backward needs (null where the
  /// call needs no gradient: the float layer gave its workspace back).
  std::shared_ptr<pass_type> forward(const ExecSpace& space, const bf16_tensor3& x, const MlaRequiresGrad& flags,
                                     const std::vector<std::int64_t>& cu_seqlens, bf16_tensor3& y) {
    for_each_parameter(
        [&](const ParameterInfo&, const auto& from, const auto& to) {
          // The parameter table's Views: one layout, the same extents, contiguous.
          if (from.data() != nullptr) cast_span(space, "mlacp::widen the bf16 weights", from, to);
        },
        weights_, widened_);
    auto pass = std::make_shared<pass_type>();
    pass->x = free_or_new(inputs_, x, "mlacp::widened x");
    convert_tensor3(space, "mlacp::widen x", x, pass->x);
    pass->forward = layer_.forward(space, pass->x, flags, cu_seqlens);
    const float_tensor3& yf = pass->forward.output();
    y = free_or_new(outputs_, yf, "mlacp::y");
    convert_tensor3(space, "mlacp::round y", yf, y);
    if (!pass->forward.holds_workspace()) return nullptr;
    return pass;
  }

  /// The backward of `pass`: weight gradients accumulated (+=) into the caller's float Views; dx (where held) gets
  /// the float layer's sum added in float and rounded once.
  void backward(const ExecSpace& space, pass_type& pass, const bf16_tensor3& dy,
                MlaGradients<compat::bf16, memory_space, float>& grads) {
    MlaGradients<float, memory_space> g;
    static_cast<MlaParameters<float, memory_space>&>(g) = static_cast<const MlaParameters<float, memory_space>&>(grads);
    resize(dy_, dy, "mlacp::widened dy");
    convert_tensor3(space, "mlacp::widen dy", dy, dy_);
    if (grads.dx.data() != nullptr) {
      resize(dx_, grads.dx, "mlacp::widened dx");
      convert_tensor3(space, "mlacp::widen dx", grads.dx, dx_);
      g.dx = dx_;
    }
    layer_.backward(space, pass.forward, dy_, g);
    if (grads.dx.data() != nullptr) convert_tensor3(space, "mlacp::round dx", dx_, grads.dx);
  }

 private:
  template <class A, class B>
  static bool same_extents(const A& a, const B& b) {
    return a.extent(0) == b.extent(0) && a.extent(1) == b.extent(1) && a.extent(2) == b.extent(2);
  }

  // A buffer of `like`'s extents that only `pool` holds (the caller dropped it), or a new one added to the pool.
  template <class Pool, class Like>
  static typename Pool::value_type free_or_new(Pool& pool, const Like& like, const char* label) {
    using View = typename Pool::value_type;
    for (const auto& v : pool)
      if (v.use_count() == 1 && same_extents(v, like)) return v;
    drop_free(pool);  // those of other shapes that nobody holds
    pool.push_back(View(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), like.extent(0),
                        like.extent(1), like.extent(2)));
    return pool.back();
  }

  template <class Pool>
  static void drop_free(Pool& pool) {
    std::vector<typename Pool::value_type> held;
    for (auto& v : pool)
      if (v.use_count() > 1) held.push_back(v);
    pool = std::move(held);
  }

  template <class Like>
  static void resize(float_tensor3& buffer, const Like& like, const char* label) {
    if (buffer.data() != nullptr && same_extents(buffer, like)) return;
    buffer = float_tensor3(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), like.extent(0),
                           like.extent(1), like.extent(2));
  }

  MlaWeights<compat::bf16, memory_space> weights_;  // the bf16 layer's (shared Views: the caller's updates show)
  MlaWeights<float, memory_space> widened_;         // their float copies, written at each forward
  float_layer layer_;
  std::vector<float_tensor3> inputs_;  // widened x, saved by pending passes
  std::vector<bf16_tensor3> outputs_;  // y, held by callers
  float_tensor3 dy_, dx_;
};

}  // namespace mlacp::detail
