// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The parameters of an MLA block (docs/spec.md "Weights", nn.Linear form: W is [out, in]) and their gradients.
#pragma once

#include <mlacp/allocation.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/mla/parameter_table.hpp>
#include <mlacp/view_types.hpp>

#include <Kokkos_Core.hpp>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace mlacp {

namespace detail {

/// A View of ViewType (rank 1 or 2) with `label` and `shape` (the table's, parameter_table.hpp), zero-initialised;
/// OutOfMemory (allocation.hpp) naming the label and the bytes when it does not fit.
template <class ViewType>
ViewType allocate_view(const std::string& label, const ParameterShape& shape) {
  if constexpr (compat::view_rank_v<ViewType> == 1)
    return allocate_view_or_throw<ViewType>("mlacp: a parameter", label, shape[0]);
  else
    return allocate_view_or_throw<ViewType>("mlacp: a parameter", label, shape[0], shape[1]);
}

/// A View's extents as a ParameterShape (rank 1 or 2).
template <class ViewType>
ParameterShape shape_of(const ViewType& v) {
  constexpr int rank = compat::view_rank_v<ViewType>;
  static_assert(rank == 1 || rank == 2, "parameters are vectors or matrices");
  if constexpr (rank == 1)
    return {1, {v.extent(0), 0}};
  else
    return {2, {v.extent(0), v.extent(1)}};
}

}  // namespace detail

/// Weights and biases, as Views in MemSpace. Views are reference-counted: a layer built from Views the caller keeps
/// borrows them (the caller's updates to their values are seen), and allocate() makes owned ones. Biases are empty
/// without config.bias. The same struct type holds the gradients (MlaGradients). The members are those of
/// parameter_entries() (parameter_table.hpp), which says each one's shape, presence and gradient flag.
///
/// A layer holds the Views it was built with: assigning a new View to a member of the caller's copy (a new
/// allocation, e.g. after resizing or resharding) is not seen by a layer built earlier, which keeps reading the old
/// allocation (kept alive by its reference count). Build a new layer over the new Views.
template <class T, class MemSpace = Kokkos::DefaultExecutionSpace::memory_space>
struct MlaParameters {
  using matrix_type = detail::Matrix<T, MemSpace>;
  using vector_type = detail::Vector<T, MemSpace>;

  matrix_type w_q;    ///< [H*dqk, D] (q_lora_rank == 0)
  matrix_type w_qa;   ///< [Rq, D] (q-LoRA: q_lora_rank = Rq > 0)
  vector_type g_q;    ///< [Rq] (q-LoRA)
  matrix_type w_qb;   ///< [H*dqk, Rq] (q-LoRA)
  vector_type b_q;    ///< [H*dqk]
  matrix_type w_kva;  ///< [R + dr, D]
  vector_type g_kv;   ///< [R]
  matrix_type w_kvb;  ///< [H*(dn+dv), R]
  vector_type b_kvb;  ///< [H*(dn+dv)]
  matrix_type w_o;    ///< [D, H*dv]
  vector_type b_o;    ///< [D]

  /// Zero-initialised parameters of the shapes `config` asks for, those it has (parameter_table.hpp: biases only
  /// with config.bias), labelled prefix + name.
  static MlaParameters allocate(const MlaConfig& c, const std::string& prefix = "");
};

// ---- what derives from the parameter table (parameter_table.hpp) ----

namespace detail {

template <class Tuple, std::size_t... I>
std::array<ParameterInfo, sizeof...(I)> infos_of(const Tuple& t, std::index_sequence<I...>) {
  return {std::get<I>(t).info...};
}

}  // namespace detail

/// The number of parameters in the table (present or not).
inline constexpr std::size_t parameter_count =
    std::tuple_size_v<decltype(parameter_entries<MlaParameters<double, Kokkos::HostSpace>>())>;

/// The table's rows (names, shapes, presence, flags, gradient types), for code that needs no member: messages, the
/// Python binding.
inline const std::array<ParameterInfo, parameter_count>& parameter_table() {
  static const auto rows = detail::infos_of(parameter_entries<MlaParameters<double, Kokkos::HostSpace>>(),
                                            std::make_index_sequence<parameter_count>());
  return rows;
}

// Every flag of MlaRequiresGrad is x's or a table entry's: a flag added without its entry (or the reverse) fails here.
static_assert(sizeof(MlaRequiresGrad) == 1 + parameter_count && std::is_same_v<decltype(MlaRequiresGrad::x), bool>,
              "MlaRequiresGrad must hold x's flag and one bool per entry of parameter_entries()");

namespace detail {

template <std::size_t I, class F, class P, class... Ps>
void visit_parameter(F& f, P& p, Ps&... ps) {
  // The row handed over is parameter_table()'s (one address per entry, for all Params types).
  f(parameter_table()[I], p.*(std::get<I>(parameter_entries<std::remove_cv_t<P>>()).member),
    ps.*(std::get<I>(parameter_entries<std::remove_cv_t<Ps>>()).member)...);
}
template <class F, std::size_t... I, class P, class... Ps>
void for_each_parameter(F& f, std::index_sequence<I...>, P& p, Ps&... ps) {
  (visit_parameter<I>(f, p, ps...), ...);
}

}  // namespace detail

/// Calls f(info, p.member, ps.member...) for every entry of the table, in its order, present or not (check
/// info.present(config) where it matters). `p` and `ps` are MlaParameters (of any value type and memory space, e.g. a
/// layer's weights and their gradients, or a device set and its host copy), const or not.
template <class F, class P, class... Ps>
void for_each_parameter(F&& f, P& p, Ps&... ps) {
  detail::for_each_parameter(f, std::make_index_sequence<parameter_count>(), p, ps...);
}

/// The gradient flags as one word (bit 0: x, bit i + 1: the table's entry i), for agreement across ranks.
inline std::int64_t flag_word(const MlaRequiresGrad& r) {
  std::int64_t word = r.x ? 1 : 0;
  for (std::size_t i = 0; i < parameter_count; ++i)
    if (r.*(parameter_table()[i].flag)) word |= std::int64_t{1} << (i + 1);
  return word;
}

/// `r` with the flags of the parameters `c` lacks cleared (b_q's without bias, w_q's with q-LoRA, w_qa's, g_q's and
/// w_qb's without): what a pass computes.
inline MlaRequiresGrad flags_for(const MlaConfig& c, MlaRequiresGrad r) {
  for (const auto& info : parameter_table())
    if (!info.present(c)) r.*(info.flag) = false;
  return r;
}

/// The table's entry called `name`, or nullptr.
inline const ParameterInfo* find_parameter(const std::string& name) {
  for (const auto& info : parameter_table())
    if (name == info.name) return &info;
  return nullptr;
}

template <class T, class MemSpace>
MlaParameters<T, MemSpace> MlaParameters<T, MemSpace>::allocate(const MlaConfig& c, const std::string& prefix) {
  // The sizes the parameters take from the configuration get its own check first (MlaConfig::error's rules for
  // hidden, heads, nope, rope, vdim, latent and q_lora_rank, and the products of them it bounds): a negative or
  // overflowing size is that error, not a wrapped or impossible allocation. Batch and sequence are not theirs.
  MlaConfig sizes;
  sizes.batch = sizes.seq = 1;
  sizes.hidden = c.hidden;
  sizes.heads = c.heads;
  sizes.nope = c.nope;
  sizes.rope = c.rope > 0 && c.rope % 2 != 0 ? (c.rope > 1 ? c.rope - 1 : 2) : c.rope;  // parity: the layer's check
  sizes.vdim = c.vdim;
  sizes.latent = c.latent;
  sizes.q_lora_rank = c.q_lora_rank;
  if (const std::string error = sizes.error(1); !error.empty()) throw InvalidArgument(error);
  MlaParameters p;
  for_each_parameter(
      [&](const ParameterInfo& info, auto& view) {
        if (info.present(c))
          view = detail::allocate_view<std::remove_reference_t<decltype(view)>>(prefix + info.name, info.shape(c));
      },
      p);
  return p;
}

template <class T, class MemSpace = Kokkos::DefaultExecutionSpace::memory_space>
using MlaWeights = MlaParameters<T, MemSpace>;

/// The value type of the weight gradients of a layer of T: compat::accumulation_t<T> (GradientType::accumulation_type
/// in the parameter table): float for bf16 weights, as the float master copy of mixed-precision training needs (and
/// as sums over micro-batches need: they accumulate in it), the weight's own type for float and double.
template <class T>
using gradient_value_t = compat::accumulation_t<T>;

/// Gradients of the weights (this rank's partial sums, docs/spec.md "Weights"), in G (by default gradient_value_t<T>; a
/// bf16 layer also takes bf16 weight gradients on request, MlaAttention::backward), and of the input x [B, s, D], in T
/// (the input's own type).
template <class T, class MemSpace = Kokkos::DefaultExecutionSpace::memory_space, class G = gradient_value_t<T>>
struct MlaGradients : MlaParameters<G, MemSpace> {
  using input_value_type = T;
  detail::Tensor3<T, MemSpace> dx;  ///< [B, s, D]
};

namespace detail {

/// Why the configuration lacks a parameter of the table: its bias flag, or its q_lora_rank.
inline std::string absent_because(const ParameterInfo& info) {
  if (info.kind == ParameterKind::bias) return "bias = false";
  if (std::string(info.name) == "w_q") return "q_lora_rank > 0 factors the query into w_qa, g_q, w_qb";
  return "q_lora_rank = 0: the query has one dense w_q";
}

/// "" if `weights` match `config` (every parameter the configuration has, allocated with the table's shape; none of
/// those it does not have), else a message naming the first (in the table's order) that does not.
template <class T, class MemSpace>
std::string weights_error(const MlaConfig& c, const MlaParameters<T, MemSpace>& w, const char* what) {
  std::string e;
  for_each_parameter(
      [&](const ParameterInfo& info, const auto& v) {
        if (!e.empty()) return;
        const bool present = info.present(c), has = v.data() != nullptr;
        const ParameterShape expected = info.shape(c), got = shape_of(v);
        const std::string head = std::string("mlacp::MlaAttention: ") + what + " " + info.name;
        if (!present) {
          if (has)
            e = head + " has " + (info.rank == 2 ? "shape " + got.str() : "extent " + std::to_string(got[0])) +
                "; expected none (" + absent_because(info) + ") for " + c.describe();
          return;
        }
        if (info.rank == 1) {
          if (has && got == expected) return;
          e = head + (has ? " has extent " + std::to_string(got[0]) : std::string(" is missing")) +
              "; expected extent " + std::to_string(expected[0]) + " for " + c.describe();
          return;
        }
        if (got == expected && (has || v.size() == 0)) return;
        e = head + " has shape " + got.str() + (has ? "" : " (unallocated)") + "; expected " + expected.str() +
            " for " + c.describe();
      },
      w);
  return e;
}

}  // namespace detail
}  // namespace mlacp
