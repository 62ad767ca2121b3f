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
#include <mlacp/mla/names.hpp>
#include <mlacp/mla/parameter_table.hpp>
#include <mlacp/mla/weights.hpp>
#include <mlacp/token_map.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
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

/// The shape of one forward call: its B and S, or why it cannot run (`error`, the same text on every rank), and what
/// every rank brought ((ring rank, Ulysses rank, B, s) per rank, in rank order) for shard_error.
struct CallShape {
  int batch = 0;
  int seq = 0;
  std::string error;
  std::vector<std::int64_t> ranks;
};

/// The call's shape from every rank's x [B, s, D]: S is the sum of the ranks' s (each token is held by exactly one
/// rank). One gather of every rank's (ring rank, Ulysses rank, B, s) on `mesh` (the layer's whole mesh; none when it
/// has one rank), whatever its checked mode, so every rank derives the same S and the same verdict: the ranks' B
/// differ, no token, a B or S past the configuration's maxima (`c.batch`, `c.seq` when set), or a shape whose products
/// do not fit the layer's int (MlaConfig::int_products_error with the call's B and S). Whether each rank's s is its
/// share of S is shard_error's, against the token map of S that the pass builds anyway (ScheduleContext::set_shape).
inline CallShape call_shape(const Mesh& mesh, const MlaConfig& c, std::size_t batch, std::size_t tokens,
                            const std::string& where) {
  CallShape out;
  out.ranks = gather_from_every_rank(
      mesh,
      {mesh.ring_rank(), mesh.ulysses_rank(), static_cast<std::int64_t>(batch), static_cast<std::int64_t>(tokens)},
      names::call_shape, where);
  const std::vector<std::int64_t>& all = out.ranks;
  const std::size_t P = all.size() / 4;
  std::int64_t S = 0, lo = all[2], hi = all[2];
  for (std::size_t r = 0; r < P; ++r) {
    S += all[4 * r + 3];
    lo = std::min(lo, all[4 * r + 2]);
    hi = std::max(hi, all[4 * r + 2]);
  }
  const std::string prefix = where + ": x";
  const std::string ranks = P > 1 ? " over the " + std::to_string(P) + " ranks" : "";
  if (lo != hi) {
    out.error = prefix + ".extent(0) (B) differs across ranks (from " + std::to_string(lo) + " to " +
                std::to_string(hi) + "; this rank passed " + std::to_string(batch) +
                "); expected the same batch on every rank";
  } else if (hi < 1 || S < 1) {
    out.error = prefix + " brings B = " + std::to_string(hi) + " and " + std::to_string(S) + " tokens" + ranks +
                "; expected at least one batch row and one token";
  } else if (c.batch > 0 && hi > c.batch) {
    out.error = prefix + " brings B = " + std::to_string(hi) + " but the configuration bounds batch at " +
                std::to_string(c.batch) + "; expected B <= " + std::to_string(c.batch) +
                " (MlaConfig::batch: the largest a call brings; 0 for any)";
  } else if (c.seq > 0 && S > c.seq) {
    out.error = prefix + " brings S = " + std::to_string(S) + " tokens" + ranks +
                " but the configuration bounds seq at " + std::to_string(c.seq) +
                "; expected S <= " + std::to_string(c.seq) + " (MlaConfig::seq: the longest a call brings; 0 for any)";
  } else if (hi > std::numeric_limits<int>::max() || S > std::numeric_limits<int>::max()) {
    out.error = prefix + " brings B = " + std::to_string(hi) + " and S = " + std::to_string(S) + " tokens" + ranks +
                "; expected each at most INT_MAX = " + std::to_string(std::numeric_limits<int>::max());
  } else if (const std::string e = c.int_products_error(hi, S); !e.empty()) {
    out.error = prefix + " brings B = " + std::to_string(hi) + " and S = " + std::to_string(S) + ": " + e;
  }
  out.batch = static_cast<int>(std::min<std::int64_t>(hi, std::numeric_limits<int>::max()));
  out.seq = static_cast<int>(std::min<std::int64_t>(S, std::numeric_limits<int>::max()));
  return out;
}

/// Whether every rank's s in `shape` (call_shape's, without error) is what `map`, the token map of the call's S, gives
/// it: "" when it is, else the message naming the first rank that is not.
inline std::string shard_error(const CallShape& shape, const TokenMap& map, const std::string& where) {
  const std::vector<std::int64_t>& all = shape.ranks;
  for (std::size_t r = 0; 4 * r < all.size(); ++r) {
    const auto g = static_cast<int>(all[4 * r]), u = static_cast<int>(all[4 * r + 1]);
    const std::int64_t expected = map.count(g, u);
    if (all[4 * r + 3] != expected)
      return where + ": x of rank " + std::to_string(r) + " holds " + std::to_string(all[4 * r + 3]) +
             " tokens, but the ranks bring S = " + std::to_string(shape.seq) +
             " and the token map of that S gives rank " + std::to_string(r) + " (ring " + std::to_string(g) +
             ", Ulysses " + std::to_string(u) + ") " + std::to_string(expected) + " (" + map.describe() +
             "); expected every rank's shard of the token map of S (MlaAttention::token_map_for(S))";
  }
  return "";
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
