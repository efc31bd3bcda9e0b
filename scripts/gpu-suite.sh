#!/usr/bin/env bash
# One call on the GPU machine: build with CUDA for sm_90, run the CPU and GPU
# suites, compute-sanitizer memcheck, racecheck and synccheck over the GPU
# suite, the op benchmarks and the demo. Logs go to $OUT (default /tmp/tg-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tg-out}
mkdir -p "$OUT"
status=0
step() {  # step NAME LOG COMMAND...: runs, logs, remembers a failure
  local name=$1 log=$2
  shift 2
  echo "== $name" | tee -a "$OUT/$log"
  "$@" >>"$OUT/$log" 2>&1
  local rc=$?
  echo "== $name: exit $rc" | tee -a "$OUT/$log"
  tail -n 4 "$OUT/$log"
  [ $rc -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/build.log" 2>&1
BUILD_DIR=build-gpu step build build.log bash scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES=90 -DTG_CUDA=ON
# A failed build must not fall through to binaries left by an earlier call.
[ $status -eq 0 ] || { echo "build failed"; tail -n 40 "$OUT/build.log"; exit 1; }
step "cpu tests" tests.log ./build-gpu/tg_tests
step "cuda tests" tests.log ./build-gpu/tg_cuda_tests
step "cuda tests, TG_CUDA_SYNC=1" tests.log env TG_CUDA_SYNC=1 ./build-gpu/tg_cuda_tests
step "memcheck" sanitizer.log env TG_CUDA_NO_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 ./build-gpu/tg_cuda_tests
step "racecheck" sanitizer.log env TG_CUDA_NO_CACHING=1 compute-sanitizer --tool racecheck --error-exitcode 9 ./build-gpu/tg_cuda_tests
step "synccheck" sanitizer.log env TG_CUDA_NO_CACHING=1 compute-sanitizer --tool synccheck --error-exitcode 9 ./build-gpu/tg_cuda_tests
step "bench ops" bench.txt ./build-gpu/bench_ops --json "$OUT/bench_ops.json"
step "demo" demo.log ./build-gpu/attention_demo
echo "== bench table"
sed -n '/^ceilings/,$p' "$OUT/bench.txt"
exit $status
