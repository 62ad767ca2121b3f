// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the collectives' tests share (test_all_to_all, test_all_gather, test_reduce_scatter, test_async_collective,
// test_collectives): tensors of known values, Views over them, and references built by gathering full tensors to
// every rank, computed from the definitions on the host.
#pragma once

#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/partition.hpp>
#include <mlacp/progress.hpp>
#include <mlacp/watchdog.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::test::collectives {

using Extents = std::vector<std::int64_t>;

inline std::int64_t product(const Extents& e) {
  return std::accumulate(e.begin(), e.end(), std::int64_t{1}, std::multiplies<>());
}

inline Extents unravel(std::int64_t flat, const Extents& e) {
  Extents idx(e.size());
  for (std::size_t d = e.size(); d-- > 0;) {
    idx[d] = flat % e[d];
    flat /= e[d];
  }
  return idx;
}

inline std::int64_t ravel(const Extents& idx, const Extents& e) {
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < e.size(); ++d) flat = flat * e[d] + idx[d];
  return flat;
}

template <class T, int Rank>
struct ViewOf;
template <class T>
struct ViewOf<T, 3> {
  using type = Kokkos::View<T***, Kokkos::LayoutRight>;
};
template <class T>
struct ViewOf<T, 4> {
  using type = Kokkos::View<T****, Kokkos::LayoutRight>;
};
template <class T>
struct ViewOf<T, 5> {
  using type = Kokkos::View<T*****, Kokkos::LayoutRight>;
};

// A device View holding `values` with the given extents.
template <class T, int Rank>
typename ViewOf<T, Rank>::type make_view(const Extents& e, const std::vector<T>& values) {
  std::size_t n[5] = {1, 1, 1, 1, 1};
  for (int d = 0; d < Rank; ++d) n[d] = static_cast<std::size_t>(e[static_cast<std::size_t>(d)]);
  typename ViewOf<T, Rank>::type view;
  if constexpr (Rank == 3) view = decltype(view)("v", n[0], n[1], n[2]);
  if constexpr (Rank == 4) view = decltype(view)("v", n[0], n[1], n[2], n[3]);
  if constexpr (Rank == 5) view = decltype(view)("v", n[0], n[1], n[2], n[3], n[4]);
  Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(values.data(), values.size());
  Kokkos::View<T*, Kokkos::LayoutRight, typename decltype(view)::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      flat(view.data(), view.size());
  Kokkos::deep_copy(flat, host);
  return view;
}

template <class ViewType>
std::vector<typename ViewType::non_const_value_type> to_host(const ViewType& view) {
  using T = typename ViewType::non_const_value_type;
  Kokkos::fence();
  std::vector<T> out(view.size());
  Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(out.data(), out.size());
  Kokkos::View<const T*, Kokkos::LayoutRight, typename ViewType::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      flat(view.data(), view.size());
  Kokkos::deep_copy(host, flat);
  return out;
}

template <class ViewType>
Extents extents_of(const ViewType& v) {
  Extents e;
  for (int d = 0; d < static_cast<int>(ViewType::rank); ++d) e.push_back(static_cast<std::int64_t>(v.extent(d)));
  return e;
}

// Distinct values for every (rank, element), exact in float. bf16 (8 significant bits): distinct bit patterns instead,
// finite, nonzero, of both signs and of magnitudes from 2^-119 to 2^67 (rank r's element i: magnitude bits 0x0400 +
// 0x1800 r + i, for up to 0x1800 elements a rank), so that a value in the wrong place is seen.
template <class T>
std::vector<T> local_values(const Extents& e, int rank) {
  std::vector<T> v(static_cast<std::size_t>(product(e)));
  if constexpr (std::is_same_v<T, mlacp::bf16>) {
    if (v.size() > 0x1800) throw std::invalid_argument("local_values<bf16>: at most 6144 elements a rank");
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto bits = static_cast<std::uint16_t>((i % 2 == 0 ? 0 : 0x8000) | (0x0400 + 0x1800 * rank + i));
      std::memcpy(static_cast<void*>(&v[i]), &bits, sizeof bits);
    }
  } else {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(rank * 100000 + static_cast<int>(i) + 1);
  }
  return v;
}

// The bits of bf16 values, to compare results exactly (-0 and +0 differ, as do NaN payloads).
inline std::vector<std::uint16_t> bits_of(const std::vector<mlacp::bf16>& values) {
  std::vector<std::uint16_t> bits(values.size());
  if (!values.empty()) std::memcpy(bits.data(), values.data(), values.size() * sizeof(std::uint16_t));
  return bits;
}

// What results are compared as: the values themselves, bf16 as bits.
template <class T>
auto exact(const std::vector<T>& values) {
  if constexpr (std::is_same_v<T, mlacp::bf16>) {
    return bits_of(values);
  } else {
    return values;
  }
}

// Every rank's local tensor, gathered to every rank with plain MPI_Allgather.
template <class T>
std::vector<std::vector<T>> gather_all(const std::vector<T>& local) {
  const int size = mlacp::test::world_size();
  std::vector<T> all(local.size() * static_cast<std::size_t>(size));
  MPI_Allgather(local.data(), static_cast<int>(local.size() * sizeof(T)), MPI_BYTE, all.data(),
                static_cast<int>(local.size() * sizeof(T)), MPI_BYTE, MPI_COMM_WORLD);
  std::vector<std::vector<T>> per_rank;
  for (int r = 0; r < size; ++r)
    per_rank.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(local.size()) * r,
                          all.begin() + static_cast<std::ptrdiff_t>(local.size()) * (r + 1));
  return per_rank;
}

// What rank `me` must receive from all_to_all(gather, scatter): directly from the definition, element by element.
template <class T>
std::vector<T> reference_all_to_all(const std::vector<std::vector<T>>& all, const Extents& e, int gather, int scatter,
                                    int me) {
  const int parts = static_cast<int>(all.size());
  Extents out_e = e;
  out_e[static_cast<std::size_t>(gather)] *= parts;
  out_e[static_cast<std::size_t>(scatter)] /= parts;
  std::vector<T> out(static_cast<std::size_t>(product(out_e)));
  for (std::int64_t k = 0; k < product(out_e); ++k) {
    Extents idx = unravel(k, out_e);
    const auto g = static_cast<std::size_t>(gather), s = static_cast<std::size_t>(scatter);
    const auto source = static_cast<std::size_t>(idx[g] / e[g]);
    idx[g] %= e[g];
    idx[s] += me * out_e[s];
    out[static_cast<std::size_t>(k)] = all[source][static_cast<std::size_t>(ravel(idx, e))];
  }
  return out;
}

template <class T, int Rank>
void check_all_to_all_against_reference(const Extents& e) {
  const int me = mlacp::test::world_rank();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto values = local_values<T>(e, me);
  const auto all = gather_all(values);
  auto view = make_view<T, Rank>(e, values);
  for (int g = 0; g < Rank; ++g) {
    for (int s = 0; s < Rank; ++s) {
      if (g == s) continue;
      auto handle = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), view, g, s, mesh);
      auto result = handle.wait();
      Extents expected_e = e;
      expected_e[static_cast<std::size_t>(g)] *= mesh.size();
      expected_e[static_cast<std::size_t>(s)] /= mesh.size();
      EXPECT_EQ(extents_of(result), expected_e) << "gather " << g << " scatter " << s;
      EXPECT_EQ(exact(to_host(result)), exact(reference_all_to_all(all, e, g, s, me)))
          << "gather " << g << " scatter " << s;
    }
  }
}

// ---- The uneven (v) collectives, against references computed directly from the definition on the host. ----

// Uneven partitions of a dimension for a group of p ranks: the even rule with a remainder, and counts with zeros
// (every other rank holds nothing, the last rank the most).
inline std::vector<mlacp::Partition> uneven_partitions(int p) {
  std::vector<mlacp::Partition> parts{mlacp::Partition(2 * p + 1, p), mlacp::Partition(3 * p - 1, p)};
  std::vector<std::int64_t> counts(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) counts[static_cast<std::size_t>(r)] = r % 2 == 0 ? 0 : r + 1;
  counts.back() += 2;
  parts.push_back(mlacp::Partition::from_counts(counts));
  return parts;
}

// Every rank's local tensor (of any size), gathered to every rank.
template <class T>
std::vector<std::vector<T>> gather_all_v(const std::vector<T>& local) {
  const int size = mlacp::test::world_size();
  const int bytes = static_cast<int>(local.size() * sizeof(T));
  std::vector<int> sizes(static_cast<std::size_t>(size)), displs(static_cast<std::size_t>(size));
  MPI_Allgather(&bytes, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 1; r < size; ++r)
    displs[static_cast<std::size_t>(r)] =
        displs[static_cast<std::size_t>(r - 1)] + sizes[static_cast<std::size_t>(r - 1)];
  std::vector<char> all(static_cast<std::size_t>(displs.back() + sizes.back()));
  MPI_Allgatherv(local.data(), bytes, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD);
  std::vector<std::vector<T>> per_rank;
  for (int r = 0; r < size; ++r) {
    std::vector<T> v(static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)]) / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), all.data() + displs[static_cast<std::size_t>(r)], v.size() * sizeof(T));
    per_rank.push_back(std::move(v));
  }
  return per_rank;
}

// The rank holding index x of a partition.
inline int owner_of(const mlacp::Partition& part, std::int64_t x) {
  for (int r = 0; r < part.parts(); ++r)
    if (x < part.offset(r + 1)) return r;
  return part.parts();
}

// Rank r's input of an uneven all-to-all: `base` with extent(g) = gather.count(r), extent(s) = scatter.total().
inline Extents a2a_input_extents(Extents base, int g, int s, const mlacp::Partition& gather,
                                 const mlacp::Partition& scatter, int r) {
  base[static_cast<std::size_t>(g)] = gather.count(r);
  base[static_cast<std::size_t>(s)] = scatter.total();
  return base;
}

// What rank `me` must receive from the uneven all-to-all, element by element from the definition.
template <class T>
std::vector<T> reference_all_to_all_v(const std::vector<std::vector<T>>& all, const Extents& base, int g, int s,
                                      const mlacp::Partition& gather, const mlacp::Partition& scatter, int me) {
  Extents out_e = base;
  out_e[static_cast<std::size_t>(g)] = gather.total();
  out_e[static_cast<std::size_t>(s)] = scatter.count(me);
  std::vector<T> out(static_cast<std::size_t>(product(out_e)));
  for (std::int64_t k = 0; k < product(out_e); ++k) {
    Extents idx = unravel(k, out_e);
    const int source = owner_of(gather, idx[static_cast<std::size_t>(g)]);
    idx[static_cast<std::size_t>(g)] -= gather.offset(source);
    idx[static_cast<std::size_t>(s)] += scatter.offset(me);
    out[static_cast<std::size_t>(k)] =
        all[static_cast<std::size_t>(source)]
           [static_cast<std::size_t>(ravel(idx, a2a_input_extents(base, g, s, gather, scatter, source)))];
  }
  return out;
}

template <class T, int Rank>
void check_all_to_all_v(const Extents& base, int g, int s, const mlacp::Partition& gather,
                        const mlacp::Partition& scatter, const mlacp::Mesh& mesh, bool with_into) {
  const int me = mesh.rank();
  const Extents e = a2a_input_extents(base, g, s, gather, scatter, me);
  const auto values = local_values<T>(e, me);
  const auto all = gather_all_v(values);
  auto view = make_view<T, Rank>(e, values);
  Extents expected_e = base;
  expected_e[static_cast<std::size_t>(g)] = gather.total();
  expected_e[static_cast<std::size_t>(s)] = scatter.count(me);
  typename ViewOf<T, Rank>::type into;
  if (with_into) into = make_view<T, Rank>(expected_e, std::vector<T>(static_cast<std::size_t>(product(expected_e))));
  auto result =
      mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), view, g, s, gather, scatter, mesh, "a2a v", into)
          .wait();
  const std::string where = "gather " + std::to_string(g) + " " + gather.str() + " scatter " + std::to_string(s) + " " +
                            scatter.str() + (with_into ? " into" : "");
  ASSERT_EQ(extents_of(result), expected_e) << where;
  if (with_into && mesh.size() > 1 && product(expected_e) > 0) {
    EXPECT_EQ(result.data(), into.data()) << where;
  }
  EXPECT_EQ(exact(to_host(result)), exact(reference_all_to_all_v(all, base, g, s, gather, scatter, me))) << where;
}

// The uneven all-gather and reduce-scatter along every dimension of a rank-3 and a rank-4 View, with and without a
// destination, and the reduce-scatter by both MPI algorithms and through host staging.
template <class T, int Rank>
void check_all_gather_and_reduce_scatter_v(const Extents& base, int dim, const mlacp::Partition& part,
                                           mlacp::Mesh& mesh, bool with_into) {
  const int me = mesh.rank();
  const int p = mesh.size();
  const auto d = static_cast<std::size_t>(dim);
  const auto space = Kokkos::DefaultExecutionSpace();
  const std::string where = "dim " + std::to_string(dim) + " partition " + part.str() + (with_into ? " into" : "") +
                            (mesh.host_staging() ? " staged" : "") +
                            (mesh.reduce_scatter_algorithm() == mlacp::ReduceScatterAlgorithm::mpi ? " mpi" : "");
  // All-gather: rank r contributes count(r) rows.
  Extents e = base;
  e[d] = part.count(me);
  const auto values = local_values<T>(e, me);
  const auto all = gather_all_v(values);
  Extents ge = base;
  ge[d] = part.total();
  typename ViewOf<T, Rank>::type into;
  if (with_into) into = make_view<T, Rank>(ge, std::vector<T>(static_cast<std::size_t>(product(ge))));
  auto gathered = mlacp::launch_all_gather(space, make_view<T, Rank>(e, values), dim, part, mesh, "ag v", into).wait();
  ASSERT_EQ(extents_of(gathered), ge) << where;
  std::vector<T> expected(static_cast<std::size_t>(product(ge)));
  for (std::int64_t k = 0; k < product(ge); ++k) {
    Extents idx = unravel(k, ge);
    const int r = owner_of(part, idx[d]);
    idx[d] -= part.offset(r);
    Extents re = base;
    re[d] = part.count(r);
    expected[static_cast<std::size_t>(k)] = all[static_cast<std::size_t>(r)][static_cast<std::size_t>(ravel(idx, re))];
  }
  EXPECT_EQ(exact(to_host(gathered)), exact(expected)) << "all_gather " << where;

  // Reduce-scatter: every rank passes total() rows and keeps its count(me) rows of the sum.
  const auto full_values = local_values<T>(ge, me);
  const auto full_all = gather_all(full_values);
  Extents se = base;
  se[d] = part.count(me);
  typename ViewOf<T, Rank>::type into_rs;
  if (with_into) into_rs = make_view<T, Rank>(se, std::vector<T>(static_cast<std::size_t>(product(se))));
  auto reduced =
      mlacp::launch_reduce_scatter(space, make_view<T, Rank>(ge, full_values), dim, part, mesh, "rs v", into_rs).wait();
  ASSERT_EQ(extents_of(reduced), se) << where;
  // The sum in rank order, accumulated as the collective does (bf16: in float, rounded once).
  using Acc = mlacp::compat::accumulation_t<T>;
  std::vector<T> sum(static_cast<std::size_t>(product(se)), T(0));
  for (std::int64_t k = 0; k < product(se); ++k) {
    Extents idx = unravel(k, se);
    idx[d] += part.offset(me);
    Acc acc = Acc(0);
    for (int r = 0; r < p; ++r)
      acc += static_cast<Acc>(full_all[static_cast<std::size_t>(r)][static_cast<std::size_t>(ravel(idx, ge))]);
    sum[static_cast<std::size_t>(k)] = static_cast<T>(acc);
  }
  EXPECT_EQ(exact(to_host(reduced)), exact(sum)) << "reduce_scatter " << where;
}

/// The value types every collective test runs with.
using ValueTypes = ::testing::Types<float, double>;

}  // namespace mlacp::test::collectives
