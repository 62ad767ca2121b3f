// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The one list of an MLA block's parameters (docs/spec.md "Weights"): for each, its name, its member of MlaParameters,
// its shape as a function of the configuration, when it is present, its gradient flag (member of MlaRequiresGrad) and
// its gradient's value type. Everything that lists parameters iterates it: MlaParameters::allocate, weights_error, the
// backward's gradient checks and allocation, the gradient flag word, the check tool's dumps, the synthetic test data
// and the Python package (mlacp._mlacp.parameter_table, from which python/mlacp derives its names, shapes and flags).
// Adding a weight (as q-LoRA's w_qa / g_q / w_qb were) is one member of MlaParameters, one flag of MlaRequiresGrad
// and one entry in parameter_entries() below. What derives from the table (parameter_table(), for_each_parameter,
// flag_word) is in weights.hpp, after MlaParameters.
#pragma once

#include <mlacp/mla/mla_config.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>

namespace mlacp {

/// A parameter's extents: rank 1 (a vector) or 2 (a matrix, nn.Linear's [out, in]).
struct ParameterShape {
  int rank = 0;
  std::array<std::size_t, 2> extents{};

  std::size_t operator[](std::size_t d) const { return extents[d]; }
  std::size_t size() const { return rank == 1 ? extents[0] : extents[0] * extents[1]; }
  /// "[a]" or "[a, b]".
  std::string str() const {
    return "[" + std::to_string(extents[0]) + (rank == 2 ? ", " + std::to_string(extents[1]) : std::string()) + "]";
  }
  friend bool operator==(const ParameterShape& a, const ParameterShape& b) {
    return a.rank == b.rank && a.extents[0] == b.extents[0] && (a.rank < 2 || a.extents[1] == b.extents[1]);
  }
  friend bool operator!=(const ParameterShape& a, const ParameterShape& b) { return !(a == b); }
};

/// What a parameter is (how it is initialised: a weight's scale is 1/sqrt(fan in), a bias's that of its weight, an
/// RMSNorm gain starts at 1).
enum class ParameterKind { weight, bias, norm_gain };

/// The value type of a parameter's gradient. Every gradient is in the accumulation type of its weight's value type
/// (compat::accumulation_t, weights.hpp's gradient_value_t): float for bf16 weights (float gradient Views beside bf16
/// weights, as a float master copy needs), the weight's own type for float and double. Python checks the gradient
/// tensors against it before the C++ backward writes them.
enum class GradientType { accumulation_type };

inline const char* to_string(GradientType g) noexcept {
  switch (g) {
    case GradientType::accumulation_type:
      return "the accumulation type of the weight's value type (float for bf16, else the weight's)";
  }
  return "?";
}

/// One row of the table, without its member (the same for every value type and memory space).
struct ParameterInfo {
  // The pointer-to-member types are named: nvcc passes a declarator `bool MlaRequiresGrad::*flag` on to the host
  // compiler as `bool (MlaRequiresGrad::*flag)`, which g++ warns about (-Wparentheses).
  using flag_type = bool MlaRequiresGrad::*;
  const char* name;                           ///< docs/spec.md's name (state_dict key, dump file name)
  int rank;                                   ///< 1 or 2
  ParameterKind kind;                         ///< weight, bias or RMSNorm gain
  flag_type flag;                             ///< its gradient flag
  ParameterShape (*shape)(const MlaConfig&);  ///< its shape for a configuration (valid or not: no check)
  bool (*present)(const MlaConfig&);          ///< whether the configuration has it (biases: config.bias)
  GradientType gradient;                      ///< its gradient's value type
};

/// A row of the table with its member of Params (an MlaParameters<T, MemSpace>).
template <class Owner, class View>
struct ParameterEntry {
  using member_type = View Owner::*;  // named: see ParameterInfo::flag_type
  ParameterInfo info;
  member_type member;
};

namespace detail {

template <class Owner, class View>
constexpr ParameterEntry<Owner, View> parameter_entry(const ParameterInfo& info, View Owner::*member) {
  return {info, member};
}
inline std::size_t extent_of(int n) { return static_cast<std::size_t>(n); }
inline ParameterShape vector_shape(std::size_t n) { return {1, {n, 0}}; }
inline ParameterShape matrix_shape(std::size_t rows, std::size_t cols) { return {2, {rows, cols}}; }
inline bool always_present(const MlaConfig&) { return true; }
inline bool with_bias(const MlaConfig& c) { return c.bias; }
inline bool dense_q(const MlaConfig& c) { return !c.q_lora(); }
inline bool factored_q(const MlaConfig& c) { return c.q_lora(); }

}  // namespace detail

/// THE parameter table (docs/spec.md "Weights"), in the order the parameters are registered in Python (state_dict
/// order), allocated, filled with synthetic data and checked. q-LoRA's rows come last, so that the synthetic data of
/// the rows before them (seeded by their place in the table) is what it was before they were added. Params is
/// MlaParameters<T, MemSpace> (or a type derived from it, e.g. MlaGradients): the members are named through it.
template <class Params>
constexpr auto parameter_entries() {
  using P = std::remove_cv_t<Params>;
  using detail::extent_of;
  using detail::matrix_shape;
  using detail::vector_shape;
  constexpr auto weight = ParameterKind::weight, bias = ParameterKind::bias, gain = ParameterKind::norm_gain;
  constexpr auto same = GradientType::accumulation_type;
  constexpr auto always = &detail::always_present, with_bias = &detail::with_bias;
  constexpr auto dense_q = &detail::dense_q, q_lora = &detail::factored_q;
  return std::make_tuple(
      detail::parameter_entry(
          {"w_q", 2, weight, &MlaRequiresGrad::w_q,
           [](const MlaConfig& c) { return matrix_shape(extent_of(c.heads * c.qk_dim()), extent_of(c.hidden)); },
           dense_q, same},
          &P::w_q),
      detail::parameter_entry(
          {"b_q", 1, bias, &MlaRequiresGrad::b_q,
           [](const MlaConfig& c) { return vector_shape(extent_of(c.heads * c.qk_dim())); }, with_bias, same},
          &P::b_q),
      detail::parameter_entry(
          {"w_kva", 2, weight, &MlaRequiresGrad::w_kva,
           [](const MlaConfig& c) { return matrix_shape(extent_of(c.latent + c.rope), extent_of(c.hidden)); }, always,
           same},
          &P::w_kva),
      detail::parameter_entry({"g_kv", 1, gain, &MlaRequiresGrad::g_kv,
                               [](const MlaConfig& c) { return vector_shape(extent_of(c.latent)); }, always, same},
                              &P::g_kv),
      detail::parameter_entry(
          {"w_kvb", 2, weight, &MlaRequiresGrad::w_kvb,
           [](const MlaConfig& c) { return matrix_shape(extent_of(c.heads * (c.nope + c.vdim)), extent_of(c.latent)); },
           always, same},
          &P::w_kvb),
      detail::parameter_entry(
          {"b_kvb", 1, bias, &MlaRequiresGrad::b_kvb,
           [](const MlaConfig& c) { return vector_shape(extent_of(c.heads * (c.nope + c.vdim))); }, with_bias, same},
          &P::b_kvb),
      detail::parameter_entry(
          {"w_o", 2, weight, &MlaRequiresGrad::w_o,
           [](const MlaConfig& c) { return matrix_shape(extent_of(c.hidden), extent_of(c.heads * c.vdim)); }, always,
           same},
          &P::w_o),
      detail::parameter_entry({"b_o", 1, bias, &MlaRequiresGrad::b_o,
                               [](const MlaConfig& c) { return vector_shape(extent_of(c.hidden)); }, with_bias, same},
                              &P::b_o),
      // q-LoRA (DeepSeek's q_a_proj, q_a_layernorm, q_b_proj) in w_q's place.
      detail::parameter_entry(
          {"w_qa", 2, weight, &MlaRequiresGrad::w_qa,
           [](const MlaConfig& c) { return matrix_shape(extent_of(c.q_lora_rank), extent_of(c.hidden)); }, q_lora,
           same},
          &P::w_qa),
      detail::parameter_entry({"g_q", 1, gain, &MlaRequiresGrad::g_q,
                               [](const MlaConfig& c) { return vector_shape(extent_of(c.q_lora_rank)); }, q_lora, same},
                              &P::g_q),
      detail::parameter_entry(
          {"w_qb", 2, weight, &MlaRequiresGrad::w_qb,
           [](const MlaConfig& c) { return matrix_shape(extent_of(c.heads * c.qk_dim()), extent_of(c.q_lora_rank)); },
           q_lora, same},
          &P::w_qb));
}

}  // namespace mlacp
