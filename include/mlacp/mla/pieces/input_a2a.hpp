// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// One input all-to-all (Q, K or V: token-local to head-local) and its inverse in backward, paired so that independent
// compute runs between each launch and its wait (the reference's MLAInputA2AState and its paired nodes).
#pragma once

#include <mlacp/all_to_all.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/partition.hpp>
#include <mlacp/view_types.hpp>

#include <string>

namespace mlacp {

template <class T, class ExecSpace>
class InputA2APair {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using tensor4 = detail::Tensor4<T, memory_space>;
  using tensor5 = detail::Tensor5<T, memory_space>;

  InputA2APair() = default;
  /// `name` names the collectives: "<name> a2a" forward, "d<name> a2a" backward (e.g. "Q" -> "Q a2a", "dQ a2a").
  /// `seq` and `heads`: how the tokens and the heads are split over the ranks (they outlive the pair: the layer's).
  /// The even split (every extent divisible by the group size).
  InputA2APair(const Mesh& mesh, std::string name) : mesh_(&mesh), name_(std::move(name)) {}
  InputA2APair(const Mesh& mesh, std::string name, const Partition& seq, const Partition& heads)
      : mesh_(&mesh), name_(std::move(name)), seq_(&seq), heads_(&heads) {}

  /// Launches the token-to-head all-to-all of `token_local` [B, s, H, d]. `needs_send_grad`: whether the input needs
  /// its gradient, i.e. whether backward will launch the inverse. `into` [B, S, h, d]: where the result goes (a
  /// layer's workspace); empty: allocated by the collective. `codec`: what the payload travels as (wire/codecs.hpp;
  /// the result decoded into `into` at the wait).
  void launch_forward(const ExecSpace& space, const tensor4& token_local, bool needs_send_grad,
                      const tensor4& into = {}, WireCodec codec = WireCodec::same) {
    require_mesh();
    if (forward_.launched()) throw UsageError("mlacp::InputA2APair '" + name_ + "': forward launched twice");
    needs_send_grad_ = needs_send_grad;
    const std::string name = names::forward_a2a(name_);
    forward_ = seq_ == nullptr ? launch_all_to_all(space, token_local, 1, 2, *mesh_, name, into, codec)
                               : launch_all_to_all(space, token_local, 1, 2, *seq_, *heads_, *mesh_, name, into, codec);
  }

  /// Waits for the forward all-to-all (exactly once) and returns the head-local tensor [B, S, h, d].
  tensor4 wait_forward() {
    if (!forward_.launched())
      throw UsageError("mlacp::InputA2APair '" + name_ + "': wait_forward before launch_forward");
    return forward_.wait();
  }

  bool needs_send_grad() const noexcept { return needs_send_grad_; }

  /// Launches the head-to-token inverse all-to-all of the gradient [B, S, h, d] when the input needs its gradient;
  /// otherwise nothing is launched. The gradient is read until the wait (the pair keeps it alive): with B == 1 its
  /// token blocks are sent as they are, and the rank-ordered head blocks are received as they arrive (no pack, no
  /// unpack; see wait_backward_blocks). `into` [P, B, s, h, d]: where the blocks are received; empty: allocated. Heads
  /// split unevenly: the head dimension is gathered instead, into one block [1, B, s, H, d]. `codec`: as
  /// launch_forward's.
  void launch_backward(const ExecSpace& space, const tensor4& head_local_grad, const tensor5& into = {},
                       WireCodec codec = WireCodec::same) {
    require_mesh();
    if (!needs_send_grad_) return;
    if (backward_.launched()) throw UsageError("mlacp::InputA2APair '" + name_ + "': backward launched twice");
    backward_input_ = head_local_grad;
    // [1, B, S, h, d]: scattering the tokens (dim 2) and gathering a new leading dim of the P head blocks (dim 0).
    const tensor5 view(head_local_grad.data(), 1, head_local_grad.extent(0), head_local_grad.extent(1),
                       head_local_grad.extent(2), head_local_grad.extent(3));
    // Uneven heads: rank blocks of different head counts cannot stack; the heads (dim 3) are gathered into one block.
    const std::string name = names::backward_a2a(name_);
    backward_ = seq_ == nullptr     ? launch_all_to_all(space, view, 0, 2, *mesh_, name, into, codec)
                : heads_->uniform() ? launch_all_to_all(space, view, 0, 2, Partition(mesh_->size(), mesh_->size()),
                                                        *seq_, *mesh_, name, into, codec)
                                    : launch_all_to_all(space, view, 3, 2, *heads_, *seq_, *mesh_, name, into, codec);
  }

  /// The token-local gradient as the P head blocks [P, B, s, h, d] received from the ranks (block r holds heads
  /// [r*h, (r+1)*h) of the token-local [B, s, H, d]; heads split unevenly: one block [1, B, s, H, d]), exactly once; an
  /// empty View when the input needs no gradient. Throws UsageError "MLA input consumer did not submit its inverse A2A"
  /// when the gradient is needed and the consumer never launched it.
  tensor5 wait_backward_blocks() {
    if (!needs_send_grad_) return tensor5();
    if (!backward_.launched())
      throw UsageError("mlacp::InputA2APair '" + name_ + "': MLA input consumer did not submit its inverse A2A");
    tensor5 blocks = backward_.wait();
    if (blocks.data() != backward_input_.data()) backward_input_ = tensor4();  // P == 1: blocks alias the input
    return blocks;
  }

  /// The token-local gradient [B, s, H, d] (wait_backward_blocks, with the head blocks unpacked on `space` into
  /// `destination` when given, e.g. a layer's workspace, else into a new View).
  tensor4 wait_backward(const ExecSpace& space, tensor4 destination = {}) {
    const tensor5 blocks = wait_backward_blocks();
    if (!needs_send_grad_) return tensor4();  // (a needed gradient of no element keeps its shape)
    const auto parts = static_cast<int>(blocks.extent(0));
    const auto B = blocks.extent(1), s = blocks.extent(2), h = blocks.extent(3), d = blocks.extent(4);
    if (parts == 1) return Kokkos::subview(blocks, 0, Kokkos::ALL(), Kokkos::ALL(), Kokkos::ALL(), Kokkos::ALL());
    tensor4 local = destination.data() != nullptr
                        ? destination
                        : tensor4(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::d" + name_ + " local"), B, s,
                                  h * parts, d);
    detail::AroundDim block;
    block.outer = static_cast<std::int64_t>(B * s);
    block.mid = static_cast<std::int64_t>(h);
    block.inner = static_cast<std::int64_t>(d);
    detail::unpack_blocks(space, blocks.data(), local.data(), block, parts, names::backward_a2a(name_) + " unpack");
    return local;
  }

 private:
  void require_mesh() const {
    if (mesh_ == nullptr) throw UsageError("mlacp::InputA2APair: default-constructed pair has no mesh");
  }

  const Mesh* mesh_ = nullptr;
  std::string name_;
  const Partition* seq_ = nullptr;
  const Partition* heads_ = nullptr;
  bool needs_send_grad_ = false;
  AsyncCollective<tensor4> forward_;
  tensor4 backward_input_;
  AsyncCollective<tensor5> backward_;
};

}  // namespace mlacp
