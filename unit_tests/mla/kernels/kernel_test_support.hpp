// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the kernel tests under unit_tests/mla/ share: View aliases, host copies of Views, random inputs, errors,
// finite differences, and a run of the reference attention core on host vectors.
#pragma once

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/kernels/attention_core.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::test::kernels {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
template <class T>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace>;
template <class T>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;
template <class T>
using View3 = Kokkos::View<T***, Kokkos::LayoutRight, MemSpace>;
template <class T>
using View4 = Kokkos::View<T****, Kokkos::LayoutRight, MemSpace>;
using Vec = std::vector<double>;

/// Relative tolerance where the result is exact up to rounding.
template <class T>
double tol() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

/// The View's elements (contiguous, LayoutRight order) as doubles.
template <class V>
Vec to_vec(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  Vec out(h.span());
  for (std::size_t i = 0; i < h.span(); ++i) out[i] = static_cast<double>(h.data()[i]);
  return out;
}

/// Writes a flat vector (LayoutRight order) into the View.
template <class V>
void from_vec(const V& v, const Vec& values) {
  auto h = Kokkos::create_mirror_view(v);
  EXPECT_EQ(h.span(), values.size());
  for (std::size_t i = 0; i < h.span(); ++i) h.data()[i] = static_cast<typename V::non_const_value_type>(values[i]);
  Kokkos::deep_copy(v, h);
}

inline Vec random_vec(std::size_t n, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

/// Rounds every value through T (so that float and double runs see the same inputs).
template <class T>
Vec rounded(Vec v) {
  for (auto& x : v) x = static_cast<double>(static_cast<T>(x));
  return v;
}

/// ||a - ref|| / ||ref|| (Frobenius).
inline double rel_error(const Vec& a, const Vec& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Central finite differences of a scalar function of a vector, in double.
inline Vec finite_difference(const Vec& x0, const std::function<double(const Vec&)>& f, double h = 1e-5) {
  Vec g(x0.size());
  Vec x = x0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = x0[i] + h;
    const double fp = f(x);
    x[i] = x0[i] - h;
    const double fm = f(x);
    x[i] = x0[i];
    g[i] = (fp - fm) / (2.0 * h);
  }
  return g;
}

/// The message of the mlacp::InvalidArgument that fn throws ("" when it throws none).
inline std::string invalid_argument_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const mlacp::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

struct AttnShape {
  int n_b, n_s, n_h, d_qk, d_v;
  std::size_t qk_size() const { return static_cast<std::size_t>(n_b) * n_s * n_h * d_qk; }
  std::size_t v_size() const { return static_cast<std::size_t>(n_b) * n_s * n_h * d_v; }
  std::size_t at(int b, int t, int hd, int c, int d) const {
    return ((static_cast<std::size_t>(b) * n_s + t) * n_h + hd) * d + c;
  }
};

template <class U>
struct AttnRun {
  View4<U> q, k, v, o;
  View3<U> lse;
  AttnRun(const AttnShape& sh, const Vec& q0, const Vec& k0, const Vec& v0,
          const mlacp::DocumentLayout& documents = mlacp::DocumentLayout())
      : q("q", sh.n_b, sh.n_s, sh.n_h, sh.d_qk),
        k("k", sh.n_b, sh.n_s, sh.n_h, sh.d_qk),
        v("v", sh.n_b, sh.n_s, sh.n_h, sh.d_v),
        o("o", sh.n_b, sh.n_s, sh.n_h, sh.d_v),
        lse("lse", sh.n_b, sh.n_h, sh.n_s) {
    from_vec(q, q0);
    from_vec(k, k0);
    from_vec(v, v0);
    ExecSpace space;
    mlacp::CausalAttentionCore{}.forward(space, mlacp::attention_problem(q, k, v, o, lse, documents));
    space.fence();
  }
};

using ValueTypes = ::testing::Types<float, double>;

}  // namespace mlacp::test::kernels
