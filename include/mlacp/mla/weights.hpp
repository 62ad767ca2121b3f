// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The parameters of an MLA block (MLA_SPEC "Weights", nn.Linear form: W is [out, in]) and their gradients.
#pragma once

#include <mlacp/error.hpp>
#include <mlacp/mla/config.hpp>
#include <mlacp/view_types.hpp>

#include <Kokkos_Core.hpp>
#include <string>

namespace mlacp {

/// Weights and biases, as Views in MemSpace. Views are reference-counted: a layer built from Views the caller keeps
/// borrows them (the caller's updates are seen), and allocate() makes owned ones. Biases are empty without
/// config.bias. The same struct type holds the gradients (MlaGradients).
template <class T, class MemSpace = Kokkos::DefaultExecutionSpace::memory_space>
struct MlaParameters {
  using matrix_type = detail::Matrix<T, MemSpace>;
  using vector_type = detail::Vector<T, MemSpace>;

  matrix_type w_q;    ///< [H*dqk, D]
  vector_type b_q;    ///< [H*dqk]
  matrix_type w_kva;  ///< [R + dr, D]
  vector_type g_kv;   ///< [R]
  matrix_type w_kvb;  ///< [H*(dn+dv), R]
  vector_type b_kvb;  ///< [H*(dn+dv)]
  matrix_type w_o;    ///< [D, H*dv]
  vector_type b_o;    ///< [D]

  /// Zero-initialised parameters of the shapes `config` asks for (biases only with config.bias).
  static MlaParameters allocate(const MlaConfig& c, const std::string& prefix = "") {
    MlaParameters p;
    const auto H = static_cast<std::size_t>(c.heads);
    const auto D = static_cast<std::size_t>(c.hidden);
    const auto qk = static_cast<std::size_t>(c.qk_dim());
    const auto kv = static_cast<std::size_t>(c.nope + c.vdim);
    p.w_q = matrix_type(prefix + "w_q", H * qk, D);
    p.w_kva = matrix_type(prefix + "w_kva", static_cast<std::size_t>(c.latent + c.rope), D);
    p.g_kv = vector_type(prefix + "g_kv", static_cast<std::size_t>(c.latent));
    p.w_kvb = matrix_type(prefix + "w_kvb", H * kv, static_cast<std::size_t>(c.latent));
    p.w_o = matrix_type(prefix + "w_o", D, H * static_cast<std::size_t>(c.vdim));
    if (c.bias) {
      p.b_q = vector_type(prefix + "b_q", H * qk);
      p.b_kvb = vector_type(prefix + "b_kvb", H * kv);
      p.b_o = vector_type(prefix + "b_o", D);
    }
    return p;
  }
};

template <class T, class MemSpace = Kokkos::DefaultExecutionSpace::memory_space>
using MlaWeights = MlaParameters<T, MemSpace>;

/// Gradients of the weights (this rank's partial sums, MLA_SPEC "Weights") and of the input x [B, s, D].
template <class T, class MemSpace = Kokkos::DefaultExecutionSpace::memory_space>
struct MlaGradients : MlaParameters<T, MemSpace> {
  detail::Tensor3<T, MemSpace> dx;  ///< [B, s, D]
};

namespace detail {

/// "" if `weights` match `config`, else a message naming the first View whose shape differs from what is expected.
template <class T, class MemSpace>
std::string weights_error(const MlaConfig& c, const MlaParameters<T, MemSpace>& w, const char* what) {
  const auto H = static_cast<std::size_t>(c.heads);
  const std::size_t qk = static_cast<std::size_t>(c.qk_dim()), kv = static_cast<std::size_t>(c.nope + c.vdim);
  const auto D = static_cast<std::size_t>(c.hidden), R = static_cast<std::size_t>(c.latent);
  auto matrix = [&](const char* name, const auto& m, std::size_t rows, std::size_t cols) -> std::string {
    if (m.extent(0) == rows && m.extent(1) == cols && (m.data() != nullptr || m.size() == 0)) return {};
    return std::string("mlacp::MlaAttention: ") + what + " " + name + " has shape [" + std::to_string(m.extent(0)) +
           ", " + std::to_string(m.extent(1)) + "]" + (m.data() == nullptr ? " (unallocated)" : "") + "; expected [" +
           std::to_string(rows) + ", " + std::to_string(cols) + "] for " + c.describe();
  };
  auto vector = [&](const char* name, const auto& v, std::size_t n, bool present) -> std::string {
    const bool has = v.data() != nullptr;
    if (present && has && v.extent(0) == n) return {};
    if (!present && !has) return {};
    return std::string("mlacp::MlaAttention: ") + what + " " + name +
           (has ? " has extent " + std::to_string(v.extent(0)) : std::string(" is missing")) + "; expected " +
           (present ? "extent " + std::to_string(n) : std::string("none (bias = false)")) + " for " + c.describe();
  };
  std::string e;
  if (!(e = matrix("w_q", w.w_q, H * qk, D)).empty()) return e;
  if (!(e = matrix("w_kva", w.w_kva, R + static_cast<std::size_t>(c.rope), D)).empty()) return e;
  if (!(e = vector("g_kv", w.g_kv, R, true)).empty()) return e;
  if (!(e = matrix("w_kvb", w.w_kvb, H * kv, R)).empty()) return e;
  if (!(e = matrix("w_o", w.w_o, D, H * static_cast<std::size_t>(c.vdim))).empty()) return e;
  if (!(e = vector("b_q", w.b_q, H * qk, c.bias)).empty()) return e;
  if (!(e = vector("b_kvb", w.b_kvb, H * kv, c.bias)).empty()) return e;
  if (!(e = vector("b_o", w.b_o, D, c.bias)).empty()) return e;
  return {};
}

}  // namespace detail
}  // namespace mlacp
