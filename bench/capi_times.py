"""tapegrad's benchmark-interface backward through its C API alone: the 16
cases of bench/compare_torch.py on the same inputs (seeded per case), "high"
and "highest" timed by the spec's rules (time_us: L2 flushed, 10 warm-up, 50
timed, median), no PyTorch timings and no correctness rounds. The C API
replays its calls from a CUDA graph (core/cuda.h, GraphReplay), which the C++
benchmark bench/region_attention does not: what changes in graph replay
alone (such as the graph's node priorities) shows here. scripts/ab.sh runs
it from each folder of binaries with AB_CAPI=1.

Usage: python3 bench/capi_times.py --lib build/libtapegrad.so [--case N ...]
(a case is its 1-based place in CASES, as for bench/kernel_times.py)
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import CASES, Tapegrad, make_inputs, reference_backward, time_us  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libtapegrad.so")
    ap.add_argument("--case", type=int, action="append", choices=range(1, len(CASES) + 1), metavar="N")
    args = ap.parse_args()
    tg = Tapegrad(args.lib)
    print(tg.lib.tg_version().decode(), "|", torch.cuda.get_device_name())
    high, highest = [], []
    for n in args.case or range(1, len(CASES) + 1):
        S, B = CASES[n - 1]
        torch.manual_seed(S)
        inputs = make_inputs(B, S)
        out = [torch.empty_like(r) for r in reference_backward(*inputs)]
        high.append(time_us(lambda: tg.backward(inputs, out, 1)))
        highest.append(time_us(lambda: tg.backward(inputs, out, 0)))
        print(f"S={S:4d} B={B:3d}  high {high[-1]:8.1f} us  highest {highest[-1]:8.1f} us", flush=True)
    print(f"mean of {len(high)} cases: high {statistics.mean(high):.1f} us, highest {statistics.mean(highest):.1f} us")


if __name__ == "__main__":
    main()
