#!/usr/bin/env bash
# A/B timing of the fused "high" backward on the GPU machine, the way
# bench/NOTES.md compares versions: `region_attention --high-only` (or
# $AB_ARGS, e.g. --fused-only for "highest" too) from each folder of prebuilt
# binaries, or with AB_CAPI=1 `bench/capi_times.py` on the folder's
# libtapegrad.so (the C API, replayed from CUDA graphs), alternated for
# ROUNDS rounds (default 2) in one call (AB_ARGS goes to region_attention
# only), then each case's "high" times side by side and the means (and
# "highest"'s means).
# Usage: bash scripts/ab.sh DIR_A DIR_B [DIR ...]   (folders with distinct names;
# logs under $OUT, default /tmp/tg-out)
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash scripts/ab.sh DIR_A DIR_B [DIR ...]" >&2; exit 2; }
OUT=${OUT:-/tmp/tg-out}
mkdir -p "$OUT"
logs=()
for round in $(seq "${ROUNDS:-2}"); do
  for dir in "$@"; do
    log="$OUT/ab_$(basename "$dir")_$round.txt"
    if [ "${AB_CAPI:-0}" = 1 ]; then
      python3 "$(dirname "$0")/../bench/capi_times.py" --lib "$dir/libtapegrad.so" >"$log" 2>&1
    else
      "$dir/region_attention" ${AB_ARGS:---high-only} >"$log" 2>&1
    fi || { echo "failed: $dir (see $log)" >&2; exit 1; }
    logs+=("$log")
  done
done
# One row per case, one column per run; the last two rows are the means.
awk 'function after(word,   i) { for (i = 1; i <= NF; ++i) if ($i == word) return $(i + 1) }
     FNR == 1 { name = FILENAME; sub(/.*\/ab_/, "", name); sub(/\.txt$/, "", name); names = names "\t" name }
     /^S=/ { match($0, /S= *[0-9]+ +B= *[0-9]+/); key = substr($0, RSTART, RLENGTH); gsub(/= +/, "=", key)
             if (!(key in row)) order[n++] = key; row[key] = row[key] "\t" after("high") }
     /^mean of/ { means = means "\t" after("high"); highest = highest "\t" after("highest") }
     END { print "case" names; for (i = 0; i < n; ++i) print order[i] row[order[i]]; print "mean" means
           print "highest" highest }' \
  "${logs[@]}" | tee "$OUT/ab.txt"
