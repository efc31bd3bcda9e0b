#!/usr/bin/env bash
# Packs the binaries of a build folder (built on a machine without a GPU: nvcc
# compiles for sm_90 there too) into .prebuilt/TAG.tar.gz, which a call on the
# GPU machine unpacks (tar -xzf .prebuilt/TAG.tar.gz -C DIR) and runs instead
# of building, saving its device time: DIR as scripts/gpu-suite.sh's
# TG_PREBUILT or as one of scripts/ab.sh's folders. .prebuilt is ignored by
# git; the device tool carries it when asked to.
# Usage: bash scripts/pack.sh TAG [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/binaries.sh
[ $# -ge 1 ] || { echo "usage: bash scripts/pack.sh TAG [BUILD_DIR]" >&2; exit 2; }
tag=$1
build=${2:-build}
files=()
for b in $TG_BINARIES; do
  [ -e "$build/$b" ] && files+=("$b")
done
[ ${#files[@]} -gt 0 ] || { echo "no binaries in $build" >&2; exit 1; }
mkdir -p .prebuilt
tar -czf ".prebuilt/$tag.tar.gz" -C "$build" "${files[@]}"
echo ".prebuilt/$tag.tar.gz: ${files[*]}"
