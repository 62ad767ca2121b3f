// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The oneDNN backend of the bf16 GEMM: one matmul primitive (bf16 x bf16 -> float or bf16, float accumulation) per
// call signature, created on first use and kept in the cache the plan owns. Transposes are strides of the memory
// descriptors, alpha is an output scale, beta a sum post-op (dst = beta*dst + alpha*A*B, rounded once where dst is
// bf16). oneDNN picks its kernel at primitive creation from the CPU it runs on (AVX512-BF16 / AMX instructions where
// present, emulation or a reference kernel elsewhere; ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA caps it).
#include <mlacp/bf16_gemm.hpp>

#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

namespace mlacp {
namespace detail::onednn {

namespace {

using Key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       bool, float, float>;

Key key_of(const MatmulCall& call) {
  return Key(call.trans_a, call.trans_b, call.m, call.n, call.k, call.lda, call.ldb, call.ldc, call.c_bf16, call.alpha,
             call.beta);
}

struct Entry {
  bool supported = false;  // false: oneDNN has no implementation for the call on this CPU (or under its ISA cap)
  dnnl::matmul primitive;
  dnnl::memory a, b, c;
  std::string impl;
};

}  // namespace

struct MatmulCache {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Entry> entries;

  Entry& entry(const MatmulCall& call) {
    const Key key = key_of(call);
    auto it = entries.find(key);
    if (it != entries.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // A is [m, k]: stored [m, lda] ("N") or [k, lda] ("T"); B is [k, n]: stored [k, ldb] ("N") or [n, ldb] ("T").
    const dnnl::memory::desc a_md(dims{call.m, call.k}, dt::bf16, call.trans_a ? dims{1, call.lda} : dims{call.lda, 1});
    const dnnl::memory::desc b_md(dims{call.k, call.n}, dt::bf16, call.trans_b ? dims{1, call.ldb} : dims{call.ldb, 1});
    const dnnl::memory::desc c_md(dims{call.m, call.n}, call.c_bf16 ? dt::bf16 : dt::f32, dims{call.ldc, 1});
    dnnl::primitive_attr attr;
    if (call.alpha != 1.0f) attr.set_output_scales(0, {call.alpha});
    if (call.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(call.beta);
      attr.set_post_ops(ops);
    }
    Entry e;
    dnnl::matmul::primitive_desc pd;
    try {
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
    } catch (const dnnl::error& err) {
      // oneDNN 2.6 has no bf16 matmul below AVX512 (e.g. under ONEDNN_MAX_CPU_ISA=AVX2): remembered as unsupported,
      // and the plan takes another backend for the call.
      if (err.status != dnnl_unimplemented) throw;
      return entries.emplace(key, std::move(e)).first->second;
    }
    e.supported = true;
    e.primitive = dnnl::matmul(pd);
    e.a = dnnl::memory(a_md, engine, DNNL_MEMORY_NONE);
    e.b = dnnl::memory(b_md, engine, DNNL_MEMORY_NONE);
    e.c = dnnl::memory(c_md, engine, DNNL_MEMORY_NONE);
    e.impl = pd.impl_info_str();
    return entries.emplace(key, std::move(e)).first->second;
  }
};

void MatmulCacheDeleter::operator()(MatmulCache* cache) const { delete cache; }

std::unique_ptr<MatmulCache, MatmulCacheDeleter> make_matmul_cache() {
  try {
    return std::unique_ptr<MatmulCache, MatmulCacheDeleter>(new MatmulCache());
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("mlacp: oneDNN CPU engine could not be created: ") + e.what());
  }
}

void matmul(MatmulCache& cache, const MatmulCall& call) {
  try {
    Entry& e = cache.entry(call);
    if (!e.supported) throw std::logic_error("mlacp: oneDNN bf16 matmul called for a call it has no implementation of");
    e.a.set_data_handle(const_cast<void*>(call.a));
    e.b.set_data_handle(const_cast<void*>(call.b));
    e.c.set_data_handle(call.c);
    e.primitive.execute(cache.stream, {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}});
    cache.stream.wait();
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("mlacp: oneDNN bf16 matmul failed: ") + e.what());
  }
}

bool supported(MatmulCache& cache, const MatmulCall& call) {
  try {
    return cache.entry(call).supported;
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("mlacp: oneDNN bf16 matmul could not be created: ") + e.what());
  }
}

std::string impl_info(MatmulCache& cache, const MatmulCall& call) {
  return supported(cache, call) ? cache.entry(call).impl : "";
}

std::size_t primitives(const MatmulCache& cache) {
  std::size_t n = 0;
  for (const auto& [key, e] : cache.entries) n += e.supported ? 1 : 0;
  return n;
}

}  // namespace detail::onednn

std::string onednn_cpu_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

bool onednn_has_amx() { return dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx; }

}  // namespace mlacp
