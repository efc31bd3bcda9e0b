#!/usr/bin/env bash
# Installs what tapegrad needs on Debian (as root), skipping what is there.
# CUDA (nvcc, cuBLAS, cuDNN) is optional: when nvcc is found the CUDA backend is built too.
set -euo pipefail
need=()
for pkg in cmake ninja-build g++ libeigen3-dev doctest-dev nlohmann-json3-dev libcli11-dev libstb-dev gnuplot-nox; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
