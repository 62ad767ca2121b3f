// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// One input all-to-all (Q, K or V: token-local to head-local) and its inverse in backward, paired so that independent
// compute runs between each launch and its wait (the reference's MLAInputA2AState and its paired nodes).
#pragma once

#include <mlacp/all_to_all.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/kv_layout.hpp>

#include <string>

namespace mlacp {

template <class T, class ExecSpace>
class InputA2APair {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using tensor4 = detail::Tensor4<T, memory_space>;

  InputA2APair() = default;
  /// `name` names the collectives: "<name> a2a" forward, "d<name> a2a" backward (e.g. "Q" -> "Q a2a", "dQ a2a").
  InputA2APair(const Mesh& mesh, std::string name) : mesh_(&mesh), name_(std::move(name)) {}

  /// Launches the token-to-head all-to-all of `token_local` [B, s, H, d]. `needs_send_grad`: whether the input needs
  /// its gradient, i.e. whether backward will launch the inverse.
  void launch_forward(const ExecSpace& space, const tensor4& token_local, bool needs_send_grad) {
    require_mesh();
    if (forward_.launched()) throw UsageError("mlacp::InputA2APair '" + name_ + "': forward launched twice");
    needs_send_grad_ = needs_send_grad;
    forward_ = launch_all_to_all(space, token_local, 1, 2, *mesh_, name_ + " a2a");
  }

  /// Waits for the forward all-to-all (exactly once) and returns the head-local tensor [B, S, h, d].
  tensor4 wait_forward() {
    if (!forward_.launched())
      throw UsageError("mlacp::InputA2APair '" + name_ + "': wait_forward before launch_forward");
    return forward_.wait();
  }

  bool needs_send_grad() const noexcept { return needs_send_grad_; }

  /// Launches the head-to-token inverse all-to-all of the gradient [B, S, h, d] when the input needs its gradient;
  /// otherwise nothing is launched.
  void launch_backward(const ExecSpace& space, const tensor4& head_local_grad) {
    require_mesh();
    if (!needs_send_grad_) return;
    if (backward_.launched()) throw UsageError("mlacp::InputA2APair '" + name_ + "': backward launched twice");
    backward_ = launch_all_to_all(space, head_local_grad, 2, 1, *mesh_, "d" + name_ + " a2a");
  }

  /// The token-local gradient [B, s, H, d] (exactly once), or an empty View when the input needs no gradient.
  /// Throws UsageError "MLA input consumer did not submit its inverse A2A" when the gradient is needed and the
  /// consumer never launched it.
  tensor4 wait_backward() {
    if (!needs_send_grad_) return tensor4();
    if (!backward_.launched())
      throw UsageError("mlacp::InputA2APair '" + name_ + "': MLA input consumer did not submit its inverse A2A");
    return backward_.wait();
  }

 private:
  void require_mesh() const {
    if (mesh_ == nullptr) throw UsageError("mlacp::InputA2APair: default-constructed pair has no mesh");
  }

  const Mesh* mesh_ = nullptr;
  std::string name_;
  bool needs_send_grad_ = false;
  AsyncCollective<tensor4> forward_;
  AsyncCollective<tensor4> backward_;
};

}  // namespace mlacp
