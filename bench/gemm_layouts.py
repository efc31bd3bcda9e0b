"""TF32 and fp16 GEMM rates on this GPU by operand layout, for the shapes of
the attention layer's projections (bench/NOTES.md, "projection GEMMs").

Each product C [n, m] = A [n, k] B [k, m] is timed with A and B either
"k-major" (k contiguous: A row-major, B column-major) or "mn-major" (k
strided), through torch.mm on transposed views, which hands cuBLAS the layout
without a copy. CUDA events, 5 warm-up and 20 timed runs, the median.

Usage: python3 bench/gemm_layouts.py [--tokens 8192] [--hidden 1024]
"""
import argparse

import torch


def median_ms(fn, warmup=5, runs=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def operand(rows, cols, k_major_rows, dtype):
    """A [rows, cols] matrix stored so that its k dim (cols when k_major_rows, else rows) is contiguous."""
    if k_major_rows:
        return torch.randn(rows, cols, device="cuda", dtype=dtype)
    return torch.randn(cols, rows, device="cuda", dtype=dtype).t()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192])
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    for T in args.tokens:
        run(T, args.hidden)


def run(T, C):
    shapes = {  # name: (n, k, m)
        "dWqkv = dqkv^T x": (3 * C, T, C),
        "dWo = dy^T o": (C, T, C),
        "dx = dqkv Wqkv": (T, 3 * C, C),
        "do = dy Wo": (T, C, C),
    }
    print(f"tokens {T}, hidden {C}; TFLOP/s by layout of A and B (k = k-major, mn = mn-major)")
    for dtype, label in ((torch.float32, "tf32"), (torch.float16, "fp16")):
        for name, (n, k, m) in shapes.items():
            row = []
            for a_k in (True, False):
                for b_k in (True, False):
                    a = operand(n, k, a_k, dtype)
                    b = operand(m, k, b_k, dtype).t()  # B [k, m]: k-major means k contiguous
                    ms = median_ms(lambda: torch.mm(a, b))
                    row.append(f"A {'k ' if a_k else 'mn'} B {'k ' if b_k else 'mn'}: {2 * n * k * m / ms / 1e9:6.1f}")
            print(f"{label} {name:18s} " + " | ".join(row))
    x = torch.randn(T, C, device="cuda")
    ms = median_ms(lambda: x.t().contiguous())
    print(f"transpose [{T}, {C}] fp32: {ms * 1e3:.1f} us, {2 * 4 * T * C / ms / 1e9:.0f} GB/s")
    for n, k, m in ((3 * C, T, C), (C, T, C)):  # weight gradients with k cut into s slices, then summed
        a, b = torch.randn(k, n, device="cuda").t(), torch.randn(k, m, device="cuda")
        for s in (1, 2, 4, 8):
            if k % s:
                continue
            sa, sb = a.reshape(n, s, k // s).permute(1, 0, 2), b.reshape(s, k // s, m)
            ms = median_ms(lambda: torch.bmm(sa, sb).sum(0))
            print(f"tf32 [{n}x{k}]@[{k}x{m}] mn,mn in {s} k-slices: {2 * n * k * m / ms / 1e9:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
