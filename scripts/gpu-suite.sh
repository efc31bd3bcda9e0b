#!/usr/bin/env bash
# One call on the GPU machine: build with CUDA for sm_90 (or take the binaries
# in $TG_PREBUILT when they load there), run the CPU and GPU suites (also in
# TG_CUDA_SYNC=1 mode), compute-sanitizer over the GPU suite, the benchmarks
# with their PyTorch peers, and the demo. Logs go to $OUT (default
# /tmp/tg-out), eight files at most. TG_STEPS picks steps (default: all of
# "tests sync safetensors stress sanitizers bench_ops region_attention split_gemm wgmma_rate train_step kernel_times
# compare_torch demo");
# TG_SANITIZERS picks tools (default "memcheck racecheck synccheck initcheck");
# TG_RACECHECK_TESTS narrows racecheck (slow: over 6 minutes on the whole
# suite) to a doctest -tc filter, e.g. 'fused/*,cuda/gemm_fp16*'.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tg-out}
mkdir -p "$OUT"
STEPS=${TG_STEPS:-tests sync safetensors stress sanitizers bench_ops region_attention split_gemm wgmma_rate train_step kernel_times compare_torch demo}
status=0
wants() { [[ " $STEPS " == *" $1 "* ]]; }
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
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >>"$OUT/run.log" 2>&1  # appends: a later call with other TG_STEPS keeps the earlier log
bin=build-gpu
source scripts/binaries.sh
loads() { for b in $TG_BINARIES; do [ -e "$1/$b" ] && ! ldd "$1/$b" | grep -q "not found" || return 1; done; }
if [ -n "${TG_PREBUILT:-}" ] && loads "$TG_PREBUILT"; then
  bin=$TG_PREBUILT
  echo "using the binaries in $bin" | tee -a "$OUT/run.log"
else
  BUILD_DIR=build-gpu step build run.log bash scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES=90 -DTG_CUDA=ON
  # A failed build must not fall through to binaries left by an earlier call.
  [ $status -eq 0 ] || { echo "build failed"; tail -n 40 "$OUT/run.log"; exit 1; }
fi
if wants tests; then
  step "cpu tests" run.log "$bin/tg_tests"
  step "cuda tests" run.log "$bin/tg_cuda_tests"
fi
wants sync && step "cuda tests, TG_CUDA_SYNC=1" run.log env TG_CUDA_SYNC=1 "$bin/tg_cuda_tests"
# A safetensors file tapegrad wrote, opened by PyTorch's safetensors loader.
wants safetensors && step "safetensors in PyTorch" run.log bash -c "'$bin/tg_tests' -tc='checkpoint/writes tapegrad_written*' &&
  python3 tests/fixtures/check_safetensors.py check '${TMPDIR:-/tmp}/tapegrad_written.safetensors'"
# The benchmark interface on random sizes, masks, dropout and scales, against PyTorch (C API).
wants stress && step "C API on random configurations against PyTorch" run.log env PYTHONUNBUFFERED=1 \
  python3 tests/stress_capi.py --lib "$bin/libtapegrad.so"
# Under the sanitizers: the GPU suite without the fault probe (it faults on
# purpose, in a child), the benchmark-size fused case (the edge-shape case
# runs the same kernels at sizes the tools get through) and the overlap probe
# (it races on purpose, and the tools may serialize the kernels it times).
# racecheck reports hazards inside cuBLAS's fp16 GEMM kernels (nvjet_*: their
# asynchronous-copy barriers are beyond it; excluding them by name makes it
# fault), so its step fails on a failed suite or a hazard in any other kernel.
racecheck_ours() {
  local log=${TMPDIR:-/tmp}/racecheck.log
  compute-sanitizer --tool racecheck "$@" >"$log" 2>&1
  local rc=$?
  cat "$log"
  grep "Error: Race reported" "$log" | grep -v "nvjet_" && return 9
  return $rc
}
if wants sanitizers; then
  for tool in ${TG_SANITIZERS-memcheck racecheck synccheck initcheck}; do
    tests=("$bin/tg_cuda_tests" --test-case-exclude='cuda/sync debug mode*,fused/benchmark interface at benchmark sizes*,cuda/launch: a kernel overlaps*')
    if [ "$tool" = racecheck ]; then
      [ -n "${TG_RACECHECK_TESTS:-}" ] && tests+=(--test-case="$TG_RACECHECK_TESTS")
      step "$tool" sanitizer.log env TG_CUDA_NO_CACHING=1 bash -c "$(declare -f racecheck_ours); racecheck_ours \"\$@\"" _ "${tests[@]}"
    else
      step "$tool" sanitizer.log env TG_CUDA_NO_CACHING=1 compute-sanitizer --tool "$tool" --error-exitcode 9 "${tests[@]}"
    fi
  done
fi
wants bench_ops && step "bench ops" bench.txt "$bin/bench_ops" --json "$OUT/bench_ops.json"
wants region_attention && step "region attention (16 cases)" bench.txt "$bin/region_attention" --json "$OUT/region_attention.json"
wants split_gemm && step "split GEMM (warpgroup kernel, cuBLAS k slices)" bench.txt "$bin/split_gemm" --json "$OUT/split_gemm.json"
wants wgmma_rate && step "tensor-core rate from shared memory (mma.sync, wgmma)" bench.txt "$bin/wgmma_rate"
if wants train_step; then
  step "train step (tapegrad)" bench.txt "$bin/train_step" --json "$OUT/train_step.json"
  step "train step (PyTorch eager)" bench.txt env PYTHONUNBUFFERED=1 python3 bench/train_step.py --json "$OUT/train_step_torch.json"
fi
wants kernel_times && step "kernel times of one interface call (C API)" bench.txt env PYTHONUNBUFFERED=1 \
  python3 bench/kernel_times.py --lib "$bin/libtapegrad.so"
wants compare_torch && step "compare with PyTorch (C API)" bench.txt env PYTHONUNBUFFERED=1 python3 bench/compare_torch.py \
  --lib "$bin/libtapegrad.so" ${TG_COMPARE_ARGS:---rounds 10 --compile} --json "$OUT/compare_torch.json"
if wants demo; then
  step "attention demo" run.log "$bin/attention_demo"
  step "main demo on the GPU (fused attention)" run.log "$bin/train_edit_diffusion" --device cuda --attention fused \
    --out "${TMPDIR:-/tmp}/tg-demo"
fi
echo "== tables"
grep -E "^(ceilings|S=|mean of|impl|decomposed|fused|pytorch|correctness|mma.sync|wgmma)" "$OUT/bench.txt" 2>/dev/null
exit $status
