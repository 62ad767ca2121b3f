// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Kokkos inside a Python interpreter: initialised when the extension is imported, finalised at interpreter exit once
// no Python object holds a Kokkos allocation any more.
#pragma once

namespace mlacp::python {

/// Initialises Kokkos unless something in the process already did (then it is not ours to finalise).
void initialize_kokkos();

/// Called at interpreter exit (atexit): finalises Kokkos now if no KokkosUser is alive, else as soon as the last one
/// is destroyed. An object that outlives the interpreter's teardown leaves Kokkos unfinalised, which at process exit
/// is harmless; finalising under it would free its memory twice.
void request_kokkos_finalize();

/// Held (as the first member, so destroyed last) by every object that owns Kokkos Views: a layer, a pending forward,
/// an output array. Counts them, so that Kokkos is never finalised under one of them.
class KokkosUser {
 public:
  KokkosUser() noexcept;
  KokkosUser(const KokkosUser&) noexcept;
  KokkosUser& operator=(const KokkosUser&) noexcept { return *this; }
  ~KokkosUser();
};

}  // namespace mlacp::python
