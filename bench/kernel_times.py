"""Where one call of the benchmark interface spends its GPU time, kernel by
kernel (nsys is not on the GPU machine; PyTorch's profiler reads the same
CUPTI activity records): for each chosen case, tapegrad's backward through
its C API at each precision, the L2 flushed before every call as the
benchmark does, 3 warm-up calls, then `--calls` profiled ones. Prints per
kernel name its GPU time per call (mean over the calls), its share of the
kernels' sum, and launches per call; the PyTorch kernels of the flush are
left out.

With --timeline, also each kernel of the last profiled call in start order:
its start after the call's first kernel, its duration and stream, and the
call's span with the time in it when no kernel ran (the gaps a chain of
dependent launches leaves).

Usage: python3 bench/kernel_times.py --lib build/libtapegrad.so [--case 1 --case 14] [--calls 5] [--timeline]
(a case is its 1-based place in bench/compare_torch.py's CASES, as for
region_attention --case: 1 = (S 128, B 64), 14 = (S 773, B 32))
"""
import argparse
import json
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import CASES, Tapegrad, flush_l2, make_inputs, reference_backward  # noqa: E402

PRECISIONS = {"highest": 0, "high": 1}


def kernel_times(tg, inputs, outputs, precision, calls):
    for _ in range(3):
        tg.backward(inputs, outputs, precision)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            flush_l2(i)
            tg.backward(inputs, outputs, precision)
        torch.cuda.synchronize()
    total, count = {}, {}
    for ev in prof.key_averages():
        us = self_device_us(ev)
        if us > 0 and "at::native" not in ev.key:  # a kernel, memset or copy; not the flush
            total[ev.key] = us / calls
            count[ev.key] = ev.count
    return total, count, prof


def print_timeline(prof):
    """The last call's kernels (those after the last flush's), in start order."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace_file:
            trace = json.load(trace_file)["traceEvents"]
    device_work = ("kernel", "gpu_memset", "gpu_memcpy")
    kernels = sorted((e for e in trace if e.get("cat") in device_work), key=lambda e: e["ts"])
    last_flush = max((i for i, e in enumerate(kernels) if "at::native" in e["name"]), default=None)
    call = kernels[last_flush + 1:] if last_flush is not None else []
    if not call:
        raise RuntimeError("kernel_times --timeline: the trace holds no kernel after an L2 flush (PyTorch's fill)")
    t0 = call[0]["ts"]
    busy_until, idle = t0, 0.0
    for e in call:
        idle += max(0.0, e["ts"] - busy_until)
        busy_until = max(busy_until, e["ts"] + e["dur"])
        stream = e.get("args", {}).get("stream", "?")
        print(f"    {e['ts'] - t0:8.1f} +{e['dur']:7.1f} us  stream {stream:>3}  {e['name'][:100]}")
    print(f"    span {busy_until - t0:.1f} us, of which no kernel running {idle:.1f} us")


def self_device_us(ev):
    """The GPU time of an averaged event, under the attribute name of this PyTorch's version."""
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(ev, attr):
            return getattr(ev, attr)
    raise RuntimeError("kernel_times: this PyTorch's profiler events carry no self device time")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libtapegrad.so")
    ap.add_argument("--case", type=int, action="append", choices=range(1, len(CASES) + 1), metavar="N",
                    help="1-based place in bench/compare_torch.py's CASES (repeatable; default 1 and 14)")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--timeline", action="store_true", help="print the last call's kernels in start order")
    args = ap.parse_args()
    tg = Tapegrad(args.lib)
    for n in args.case or [1, 14]:
        S, B = CASES[n - 1]
        inputs = make_inputs(B, S)
        outputs = [torch.empty_like(r) for r in reference_backward(*inputs)]  # the 8 gradients' shapes
        for name, precision in PRECISIONS.items():
            total, count, prof = kernel_times(tg, inputs, outputs, precision, args.calls)
            whole = sum(total.values())
            print(f"S={S} B={B} {name}: kernels {whole:.1f} us per call")
            for kernel, us in sorted(total.items(), key=lambda kv: -kv[1]):
                print(f"  {us:9.1f} us {100 * us / whole:5.1f}%  x{count[kernel] / args.calls:4.1f}  {kernel[:110]}")
            if args.timeline:
                print(f"S={S} B={B} {name}: the last call's kernels (start after its first, duration, stream)")
                print_timeline(prof)


if __name__ == "__main__":
    main()
