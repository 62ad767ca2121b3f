// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// One execution space's backend, in one place: Backend<ExecSpace> names what carries its collectives, which bf16
// GEMMs it has, how the attention core runs its tiles and whether compute polls MPI for progress. The code that uses
// one of these asks Backend; a new execution space (HIP, SYCL) is one specialisation here.
//
//   Transport          carries the collectives launched on instances of ExecSpace: mpi::Transport
//                      (mpi/transport.hpp), or on CUDA with NCCL nccl::CudaTransport (nccl/transport.hpp: NCCL where
//                      the mesh has an NCCL communicator, else MPI). It provides
//                        static bool reduces_natively(const Mesh&)  reduce_scatter_sum is the transport's own (else
//                                                                   the collective exchanges blocks and sums them)
//                        static bool sums_with_mpi(const Mesh&)     that reduction is MPI's, which cannot sum bf16
//                        static detail::StartedTransport start(const ExecSpace&, const Mesh&,
//                                                              const detail::TransportRequest<T, MemSpace>&)
//   has_bf16_gemm(b)   whether Bf16GemmPlan<ExecSpace> can run backend b (bf16_gemm.hpp): oneDNN on host spaces of
//                      builds with oneDNN, cuBLAS's cublasGemmEx on CUDA in builds with cuBLAS, float_blas everywhere
//   attention_on_blas  the attention core's tile products go through the BLAS (host: FlashAttentionPath::blas is its
//                      automatic choice) or one team kernel per tile (devices: FlashAttentionPath::team)
//   polls_progress     compute calls mlacp::progress() while collectives are pending (host: MPI moves a
//                      nonblocking collective only inside MPI calls, progress.hpp); device spaces do not poll (NCCL
//                      progresses on its own stream)
//
// The transports are declared here, not included: this header stays light (the bf16 GEMM and the attention core
// include it), and the collectives include the transports they start.
#pragma once

#include <mlacp/bf16_gemm_backend.hpp>
#include <mlacp/build_config.hpp>

#include <Kokkos_Core.hpp>

namespace mlacp {

namespace mpi {
struct Transport;
}
#if MLACP_HAVE_NCCL && defined(KOKKOS_ENABLE_CUDA)
namespace nccl {
struct CudaTransport;
}
#endif

namespace detail {
/// Whether the host can read ExecSpace's memory (Serial, OpenMP, Threads; not CUDA or HIP).
template <class ExecSpace>
inline constexpr bool host_space =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;

/// The bf16 GEMM backends of a space with oneDNN's and cuBLAS's availability as given: automatic and float_blas
/// always, kokkos_kernels where its GEMM takes bf16, onednn and cublas where available.
constexpr bool has_bf16_gemm(Bf16GemmBackend backend, bool onednn, bool cublas) {
  switch (backend) {
    case Bf16GemmBackend::automatic:
    case Bf16GemmBackend::float_blas:
      return true;
    case Bf16GemmBackend::onednn:
      return onednn;
    case Bf16GemmBackend::cublas:
      return cublas;
    case Bf16GemmBackend::kokkos_kernels:
      return kokkos_kernels_gemm_takes_bf16;
  }
  return false;
}
}  // namespace detail

/// Host execution spaces, and any other space without a specialisation below: MPI carries the collectives; host
/// spaces run the attention core's tiles on the BLAS and poll MPI during compute.
template <class ExecSpace, class Enable = void>
struct Backend {
  static constexpr bool host = detail::host_space<ExecSpace>;
  using Transport = mpi::Transport;
  static constexpr bool has_bf16_gemm(Bf16GemmBackend backend) {
    return detail::has_bf16_gemm(backend, MLACP_HAVE_ONEDNN && host, false);
  }
  static constexpr bool attention_on_blas = host;
  static constexpr bool polls_progress = host;
};

#if defined(KOKKOS_ENABLE_CUDA)
/// CUDA: NCCL (where built with it) or MPI carries the collectives, cuBLAS runs the bf16 GEMM (where built with it),
/// the attention core runs team kernels, and nothing polls.
template <>
struct Backend<Kokkos::Cuda> {
  static constexpr bool host = false;
#if MLACP_HAVE_NCCL
  using Transport = nccl::CudaTransport;
#else
  using Transport = mpi::Transport;
#endif
  static constexpr bool has_bf16_gemm(Bf16GemmBackend backend) {
    return detail::has_bf16_gemm(backend, false, MLACP_HAVE_CUBLAS);
  }
  static constexpr bool attention_on_blas = false;
  static constexpr bool polls_progress = false;
};
#endif

}  // namespace mlacp
