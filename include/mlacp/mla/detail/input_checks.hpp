// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The checks the MLA layer runs on every rank before any collective of a call: the settings the ranks agree on, the
// input's shape and values, the caller's gradient Views, and (after the agreement) the allocation of the gradient
// Views the caller left empty. A failure on one rank is raised on every rank (agree_or_throw), so nothing hangs.
#pragma once

#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/detail/finite_check.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/config_fields.hpp>
#include <mlacp/mla/kernels/attention_core.hpp>
#include <mlacp/mla/mla_config.hpp>
#include <mlacp/mla/parameter_table.hpp>
#include <mlacp/mla/weights.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::detail {

/// FNV-1a over the bytes of the offsets: equal layouts hash equally; a differing one is caught with overwhelming
/// probability (the sizes are compared too).
inline std::int64_t hash_offsets(const std::vector<std::int64_t>& offsets) {
  std::uint64_t h = 14695981039346656037ull;
  for (const std::int64_t v : offsets) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (u >> (8 * byte)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  std::int64_t out = 0;
  std::memcpy(&out, &h, sizeof out);
  return out;
}

/// Every field of the configuration (config_fields.hpp's table) but the rank-local ones (max_documents, which sizes an
/// allocation only), since each changes which collective runs or which numbers come out: integers, flags and enums as
/// they are, doubles as their bit patterns (equal settings have equal bits), the document offsets as their count and
/// hash. The message names the field.
inline AgreementFields config_fields(const MlaConfig& c) {
  AgreementFields fields;
  for_each_config_field(c, [&](const ConfigField& field, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if (field.local) return;
    const std::string name = field.name;
    if constexpr (std::is_same_v<T, double>) {
      std::int64_t bits = 0;
      std::memcpy(&bits, &value, sizeof bits);
      fields.emplace_back(name + " (bit pattern of the double)", bits);
    } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
      fields.emplace_back(name + ".size()", static_cast<std::int64_t>(value.size()));
      fields.emplace_back(name + " (FNV-1a hash of the offsets)", hash_offsets(value));
    } else {
      fields.emplace_back(name, static_cast<std::int64_t>(value));
    }
  });
  return fields;
}

/// The caller's gradient Views that are provided (allocated) must have exactly their weight's shape (dx: x's), else
/// a message naming the first that does not; "" when all fit. Empty Views are allocated later where needed.
template <class Context, class G>
std::string gradients_error(const Context& ctx,
                            const MlaGradients<typename Context::value_type, typename Context::memory_space, G>& g) {
  using memory_space = typename Context::memory_space;
  const MlaConfig& c = ctx.config();
  std::string error;
  auto mismatch = [&](const char* name, const std::string& got, const std::string& expected) {
    error = std::string("mlacp::MlaAttention::backward: gradient ") + name + " has shape " + got + "; expected " +
            expected + " on rank " + std::to_string(ctx.whole_mesh().rank());
  };
  // The parameters' gradients, with the table's shapes (parameter_table.hpp).
  for_each_parameter(
      [&](const ParameterInfo& info, const auto& view) {
        if (!error.empty() || view.data() == nullptr) return;
        const ParameterShape expected = info.shape(c), got = shape_of(view);
        if (got != expected) mismatch(info.name, got.str(), expected.str());
      },
      static_cast<const MlaParameters<G, memory_space>&>(g));
  if (error.empty() && g.dx.data() != nullptr) {
    const std::array<std::size_t, 3> expected{static_cast<std::size_t>(c.batch),
                                              static_cast<std::size_t>(ctx.local_seq()),
                                              static_cast<std::size_t>(c.hidden)};
    const std::array<std::size_t, 3> got{g.dx.extent(0), g.dx.extent(1), g.dx.extent(2)};
    if (got != expected) mismatch("dx", extents_string(got), extents_string(expected));
  }
  return error;
}

/// Checks t's shape and agrees with the other ranks on it and on the flags; `usage_error` (misuse found by the caller)
/// takes precedence and is raised as UsageError, then t's shape, then `other_error` (e.g. the gradients'), then the
/// finite check (on the caller's instance `space`, which orders it after whatever wrote t). `extra`: more fields
/// agreed in the same agreement (forward: the call's packed documents).
template <class Context>
void check_input(const Context& ctx, const typename Context::execution_space& space, const char* where,
                 const char* name, const typename Context::tensor3& t, const MlaRequiresGrad& r,
                 const std::string& usage_error, const std::string& other_error, const AgreementFields& extra = {}) {
  const MlaConfig& c = ctx.config();
  const Mesh& mesh = ctx.whole_mesh();
  const auto B = static_cast<std::size_t>(c.batch), s = static_cast<std::size_t>(ctx.local_seq());
  const auto D = static_cast<std::size_t>(c.hidden);
  std::string error = usage_error;
  if (error.empty() &&
      (t.extent(0) != B || t.extent(1) != s || t.extent(2) != D || (t.data() == nullptr && t.size() != 0)))
    error = std::string("mlacp::MlaAttention::") + where + ": " + name + " has shape [" + std::to_string(t.extent(0)) +
            ", " + std::to_string(t.extent(1)) + ", " + std::to_string(t.extent(2)) + "]" +
            (t.data() == nullptr ? " (unallocated)" : "") + "; expected [B, s, D] = [" + std::to_string(B) + ", " +
            std::to_string(s) + ", " + std::to_string(D) + "] (s: this rank's tokens of S = " + std::to_string(c.seq) +
            " split as " + ctx.seq_partition().str() + ") on rank " + std::to_string(mesh.rank()) +
            " of a group of P = " + std::to_string(mesh.size());
  if (error.empty()) error = other_error;
  if (error.empty() && mesh.check_finite()) {
    const auto bad = count_non_finite(space, t);
    if (bad > 0)
      error = std::string("mlacp::MlaAttention::") + where + ": " + name + " holds " + std::to_string(bad) +
              " non-finite value(s) (NaN or Inf) on rank " + std::to_string(mesh.rank()) + " (finite check on)";
  }
  AgreementFields fields{{std::string(name) + ".extent(0)", static_cast<std::int64_t>(t.extent(0))},
                         // The token extents differ across ranks on an uneven split: agreed as the excess over this
                         // rank's count (0 everywhere when every rank passes its own).
                         {std::string(name) + ".extent(1) - this rank's token count",
                          static_cast<std::int64_t>(t.extent(1)) - static_cast<std::int64_t>(s)},
                         {std::string(name) + ".extent(2)", static_cast<std::int64_t>(t.extent(2))},
                         // Bit 0: x, bit i + 1: the parameter table's entry i (parameter_table.hpp).
                         {"the gradient flags (MlaRequiresGrad)", flag_word(r)}};
  fields.insert(fields.end(), extra.begin(), extra.end());
  agree_or_throw(mesh, std::string("mlacp::MlaAttention::") + where, error, fields,
                 std::string(name) + " [" + std::to_string(t.extent(0)) + ", " + std::to_string(t.extent(1)) + ", " +
                     std::to_string(t.extent(2)) + "]",
                 !usage_error.empty());
}

/// Gradient Views the caller did not provide and that are needed are allocated (zeroed) with their shapes; provided
/// ones (checked with every rank before anything ran, gradients_error) are used as they are.
template <class Context, class G>
void allocate_missing(const Context& ctx,
                      MlaGradients<typename Context::value_type, typename Context::memory_space, G>& g,
                      const MlaRequiresGrad& r) {
  const MlaConfig& c = ctx.config();
  for_each_parameter(
      [&](const ParameterInfo& info, auto& view) {
        if (r.*(info.flag) && info.present(c) && view.data() == nullptr)
          view = allocate_view<std::remove_reference_t<decltype(view)>>(std::string("mlacp::grad ") + info.name,
                                                                        info.shape(c));
      },
      static_cast<MlaParameters<G, typename Context::memory_space>&>(g));
  if (r.x && g.dx.data() == nullptr)
    g.dx = typename Context::tensor3("mlacp::dx", static_cast<std::size_t>(c.batch),
                                     static_cast<std::size_t>(ctx.local_seq()), static_cast<std::size_t>(c.hidden));
}

}  // namespace mlacp::detail
