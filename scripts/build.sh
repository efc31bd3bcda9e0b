#!/usr/bin/env bash
# Configures and builds into ${BUILD_DIR:-build} (only ${TARGET} when set);
# extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" ${TARGET:+--target "$TARGET"}
