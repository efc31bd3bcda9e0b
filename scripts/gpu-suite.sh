#!/usr/bin/env bash
# One call on the GPU machine: build with CUDA for sm_90 (or take the binaries
# in $TG_PREBUILT when they load there), run the CPU and GPU suites (also in
# TG_CUDA_SYNC=1 mode), compute-sanitizer over the GPU suite, the benchmarks
# with their PyTorch peers, and the demo. Logs go to $OUT (default /tmp/tg-out),
# at most 8 files. TG_SANITIZERS="memcheck racecheck synccheck initcheck" picks tools.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tg-out}
mkdir -p "$OUT"
status=0
step() {  # step NAME LOG COMMAND...: runs, logs, remembers a failure
  local name=$1 log=$2
  shift 2
  echo "== $name" | tee -a "$OUT/$log"
  local t0=$SECONDS
  "$@" >>"$OUT/$log" 2>&1
  local rc=$?
  echo "== $name: exit $rc ($((SECONDS - t0)) s)" | tee -a "$OUT/$log"
  tail -n 4 "$OUT/$log"
  [ $rc -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/build.log" 2>&1
bin=build-gpu
binaries="tg_tests tg_cuda_tests bench_ops train_step attention_demo"
loads() { for b in $binaries; do [ -x "$1/$b" ] && ! ldd "$1/$b" | grep -q "not found" || return 1; done; }
if [ -n "${TG_PREBUILT:-}" ] && loads "$TG_PREBUILT"; then
  bin=$TG_PREBUILT
  echo "using the binaries in $bin" | tee -a "$OUT/build.log"
else
  BUILD_DIR=build-gpu step build build.log bash scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES=90 -DTG_CUDA=ON
  # A failed build must not fall through to binaries left by an earlier call.
  [ $status -eq 0 ] || { echo "build failed"; tail -n 40 "$OUT/build.log"; exit 1; }
fi
step "cpu tests" tests.log "$bin/tg_tests"
step "cuda tests" tests.log "$bin/tg_cuda_tests"
step "cuda tests, TG_CUDA_SYNC=1" tests.log env TG_CUDA_SYNC=1 "$bin/tg_cuda_tests"
# The fault probe faults on purpose (in a child process): not a sanitizer finding.
for tool in ${TG_SANITIZERS-memcheck racecheck synccheck}; do
  step "$tool" sanitizer.log env TG_CUDA_NO_CACHING=1 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$bin/tg_cuda_tests" --test-case-exclude='cuda/sync debug mode*'
done
step "bench ops" bench.txt "$bin/bench_ops" --json "$OUT/bench_ops.json"
step "train step (tapegrad)" train_step.txt "$bin/train_step" --json "$OUT/train_step_tapegrad.json"
step "train step (PyTorch eager)" train_step.txt env PYTHONUNBUFFERED=1 python3 bench/train_step.py --json "$OUT/train_step_torch.json"
step "demo" tests.log "$bin/attention_demo"
echo "== bench table"
sed -n '/^ceilings/,$p' "$OUT/bench.txt"
echo "== train step"
grep -E "^(impl|decomposed|pytorch|fused|tapegrad)" "$OUT/train_step.txt"
exit $status
