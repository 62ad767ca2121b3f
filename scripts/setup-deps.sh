#!/usr/bin/env bash
# Installs the Debian packages mlacp builds, tests and benchmarks with. Idempotent: packages already installed are
# skipped, and apt is not touched at all when nothing is missing. Needs root (or sudo), runs non-interactively.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git clang-format
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev libopenblas-dev libdnnl-dev
  libopenmpi-dev openmpi-bin
  nlohmann-json3-dev
  libgtest-dev
  python3 python3-numpy python3-matplotlib
  python3-torch python3-mpi4py pybind11-dev python3-pytest
  iproute2 util-linux
  munge slurmctld slurmd slurm-client
)
if [[ $# -gt 0 ]]; then packages+=("$@"); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then missing+=("$p"); fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup-deps: not root and no sudo; install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
