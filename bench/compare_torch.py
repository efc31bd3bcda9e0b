"""The benchmark interface of shared/spec/region-attention.md, tapegrad against
PyTorch in one process on the same inputs.

For each of the 16 cases: inputs drawn with PyTorch from the spec's
distribution, the forward that makes the saved tensors (fp32), then
  - the PyTorch reference backward (the spec's formulas): eager fp32, eager
    TF32, and torch.compile with TF32 (--compile);
  - tapegrad through its C API (libtapegrad.so via ctypes), "high" and "highest";
tapegrad's outputs checked with the benchmark's rule (per-case atol, rtol 1e-5,
>= 99% of every output's elements, no NaN/Inf) against the fp32 reference, for
--rounds rounds of fresh inputs; latencies timed by the spec's rules (L2
flushed, 10 warm-up, 50 timed, median, CUDA events around the call).

Prints per case and on average: latency, speed-up against each PyTorch
variant, fraction of the floor, and the benchmark score
1 / (1 + (T - T_sol) / (T_base - T_sol)) with T_base = eager fp32 measured here.

Usage: python3 bench/compare_torch.py --lib build/libtapegrad.so [--rounds 10] [--compile] [--json FILE]
"""
import argparse
import ctypes
import json
import statistics

import torch

C, H, M, D = 1024, 16, 1024, 64
CASES = [(128, 64), (176, 16), (211, 16), (256, 64), (288, 4), (293, 32), (352, 2), (373, 1),
         (448, 8), (449, 2), (640, 4), (691, 16), (768, 2), (773, 32), (853, 1), (1024, 1)]
ATOL = {(128, 64): 0.089, (176, 16): 0.052, (211, 16): 0.06, (256, 64): 0.11, (288, 4): 0.031, (293, 32): 0.092,
        (352, 2): 0.03, (373, 1): 0.019, (448, 8): 0.068, (449, 2): 0.03, (640, 4): 0.053, (691, 16): 0.11,
        (768, 2): 0.039, (773, 32): 0.14, (853, 1): 0.03, (1024, 1): 0.026}
P = 0.1
OUTPUTS = ["grad_hidden_states", "grad_qkv_weight", "grad_qkv_bias", "grad_out_weight", "grad_out_bias",
           "grad_edit_region_bias", "grad_within_edit_bias", "grad_cross_edit_bias"]


def make_inputs(B, S):
    """The spec's distribution and the fp32 forward; the 19 inputs in the spec's order."""
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    x = torch.randn(B, S, C, device=dev)
    dy = torch.randn(B, S, C, device=dev)
    Wqkv = torch.randn(3 * C, C, device=dev) * 0.02
    bqkv = torch.zeros(3 * C, device=dev)
    Wo = torch.randn(C, C, device=dev) * 0.02
    bo = torch.zeros(C, device=dev)
    E = torch.randn(H, M, M, device=dev) * 0.02
    w_in = torch.randn(H, 1, 1, device=dev) * 0.02
    w_x = torch.randn(H, 1, 1, device=dev) * 0.02
    e = (torch.rand(B, S, device=dev) < 0.5).float()
    a = torch.ones(B, S, device=dev)
    m = (torch.rand(B, H, S, S, device=dev) < 1 - P).float()
    qkv = (x @ Wqkv.t() + bqkv).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k, v = (t.contiguous() for t in (qkv[0], qkv[1], qkv[2]))
    ei, ej = e[:, None, :, None], e[:, None, None, :]
    s = (q @ k.transpose(-1, -2)) / D ** 0.5 + E[:, :S, :S] + w_in * ei * ej + w_x * (ei * (1 - ej) + (1 - ei) * ej)
    s = s.masked_fill(a[:, None, None, :] == 0, float("-inf"))
    probs = torch.softmax(s, -1)
    dropped = probs * m / (1 - P)
    o = (dropped @ v).permute(0, 2, 1, 3).reshape(B, S, C)
    return [dy, x, e, Wqkv, bqkv, Wo, bo, E, w_in, w_x, a, q, k, v, s, probs, dropped, o, m]


def reference_backward(dy, x, e, Wqkv, bqkv, Wo, bo, E, w_in, w_x, a, q, k, v, s, probs, dropped, o, m):
    """The spec's backward formulas, as the benchmark's PyTorch reference computes them."""
    B, S, _ = x.shape
    scale = 1 / D ** 0.5
    dy2 = dy.reshape(B * S, C)
    g_bo = dy2.sum(0)
    g_Wo = dy2.t() @ o.reshape(B * S, C)
    do = (dy2 @ Wo).view(B, S, H, D).permute(0, 2, 1, 3)
    dPd = do @ v.transpose(-1, -2)
    dv = dropped.transpose(-1, -2) @ do
    dP = dPd * m / (1 - P)
    dS = probs * (dP - (dP * probs).sum(-1, keepdim=True))
    dS = dS.masked_fill(a[:, None, None, :] == 0, 0.0)
    g_E, g_win, g_wx = edit_bias_grads(dS, e, E)
    dq = (dS @ k) * scale
    dk = (dS.transpose(-1, -2) @ q) * scale
    dqkv = torch.stack([dq, dk, dv], 0).permute(1, 3, 0, 2, 4).reshape(B * S, 3 * C)
    return [(dqkv @ Wqkv).view(B, S, C), dqkv.t() @ x.reshape(B * S, C), dqkv.sum(0), g_Wo, g_bo, g_E, g_win, g_wx]


def edit_bias_grads(dS, e, E):
    """dE (dS summed over the batch in the [S, S] corner of E's [H, M, M], zeros elsewhere), dw_in and dw_x."""
    S, H = dS.shape[-1], E.shape[0]
    g_E = torch.zeros_like(E)
    g_E[:, :S, :S] = dS.sum(0)
    ei, ej = e[:, None, :, None], e[:, None, None, :]
    g_win = (dS * ei * ej).sum((0, 2, 3)).view(H, 1, 1)
    g_wx = (dS * (ei * (1 - ej) + (1 - ei) * ej)).sum((0, 2, 3)).view(H, 1, 1)
    return g_E, g_win, g_wx


class Tapegrad:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        f = self.lib.tg_region_attention_backward
        f.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_float, ctypes.c_float] + [ctypes.c_int64] * 5 + \
                     [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_void_p]
        f.restype = ctypes.c_int
        self.lib.tg_last_error.restype = ctypes.c_char_p
        self.lib.tg_version.restype = ctypes.c_char_p

    def backward(self, inputs, outputs, precision):
        B, S, _ = inputs[1].shape
        ip = (ctypes.c_void_p * 19)(*[t.data_ptr() for t in inputs])
        op = (ctypes.c_void_p * 8)(*[t.data_ptr() for t in outputs])
        rc = self.lib.tg_region_attention_backward(ip, 1 / D ** 0.5, P, B, S, C, H, M, op, precision,
                                                   ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if rc != 0:
            raise RuntimeError(self.lib.tg_last_error().decode())


FLUSH = None


def flush_l2(i):
    """Overwrites a 512 MiB buffer (the H200's L2 is 60 MB), a different byte on each run i."""
    global FLUSH
    if FLUSH is None:
        FLUSH = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    FLUSH.fill_(i % 256)


def time_us(fn):
    """The spec's timing: L2 flushed before each run, 10 warm-up, 50 timed, median."""
    for _ in range(10):
        fn()
    times = []
    for i in range(50):
        flush_l2(i)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def passes(got, ref, atol):
    """The benchmark's rule for one output: >= 99% within atol + 1e-5 |ref|, nothing non-finite."""
    if not torch.isfinite(got).all():
        return False, 0.0
    ok = ((got - ref).abs() <= atol + 1e-5 * ref.abs()).float().mean().item()
    return ok >= 0.99, ok


def t_sol_us(B, S):
    flops = 16 * B * S * C * C + 8 * B * H * S * S * D
    bytes_ = 4 * (B * H * S * S + H * M * M + 8 * B * S * C + 8 * C * C)
    return max(flops / 989e12, bytes_ / 4.8e12) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libtapegrad.so")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    tg = Tapegrad(args.lib)
    print(tg.lib.tg_version().decode(), "| torch", torch.__version__, "|", torch.cuda.get_device_name())
    compiled = torch.compile(reference_backward, dynamic=True) if args.compile else None
    rows, failures = [], []
    for B_S in CASES:
        S, B = B_S
        atol = ATOL[B_S]
        worst = {name: 0.0 for name in OUTPUTS}
        for rnd in range(args.rounds):  # correctness on fresh inputs
            torch.manual_seed(1000 * rnd + S)
            inputs = make_inputs(B, S)
            torch.backends.cuda.matmul.allow_tf32 = False
            ref = reference_backward(*inputs)
            out = [torch.full_like(r, float("nan")) for r in ref]
            tg.backward(inputs, out, 1)
            torch.cuda.synchronize()
            for name, got, want in zip(OUTPUTS, out, ref):
                ok, frac = passes(got, want, atol)
                worst[name] = max(worst[name], ((got - want).abs().max() / atol).item())
                if not ok:
                    failures.append(f"S={S} B={B} round {rnd}: {name} passes only {frac:.4f}")
        torch.manual_seed(S)
        inputs = make_inputs(B, S)
        out = [torch.empty_like(r) for r in reference_backward(*inputs)]
        row = {"S": S, "B": B, "atol": atol, "worst_error_over_atol": worst, "t_sol_us": t_sol_us(B, S)}
        torch.backends.cuda.matmul.allow_tf32 = False
        row["torch_fp32_us"] = time_us(lambda: reference_backward(*inputs))
        torch.backends.cuda.matmul.allow_tf32 = True
        row["torch_tf32_us"] = time_us(lambda: reference_backward(*inputs))
        if compiled:
            row["torch_compile_us"] = time_us(lambda: compiled(*inputs))
        torch.backends.cuda.matmul.allow_tf32 = False
        row["tapegrad_high_us"] = time_us(lambda: tg.backward(inputs, out, 1))
        row["tapegrad_highest_us"] = time_us(lambda: tg.backward(inputs, out, 0))
        base, sol, t = row["torch_fp32_us"], row["t_sol_us"], row["tapegrad_high_us"]
        row["score"] = 1 / (1 + (t - sol) / (base - sol))
        rows.append(row)
        print(f"S={S:4d} B={B:3d}  tapegrad high {t:8.1f} us  highest {row['tapegrad_highest_us']:8.1f} us | "
              f"torch fp32 {base:8.1f}  tf32 {row['torch_tf32_us']:8.1f}"
              + (f"  compile {row['torch_compile_us']:8.1f}" if compiled else "")
              + f" | x{base / t:5.2f} vs fp32, x{row['torch_tf32_us'] / t:5.2f} vs tf32 | score {row['score']:.3f}"
              + f" | worst err/atol {max(worst.values()):.2f} ({max(worst, key=worst.get)})", flush=True)
    mean = lambda key: statistics.mean(r[key] for r in rows)
    summary = {k: mean(k) for k in rows[0] if k.endswith("_us") or k == "score"}
    print("mean of the 16 cases: " + ", ".join(f"{k} {v:.1f}" if k != "score" else f"score {v:.3f}"
                                               for k, v in summary.items()))
    print("correctness:", "all outputs pass the benchmark rule in every round" if not failures else
          f"{len(failures)} failures:\n  " + "\n  ".join(failures))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rounds": args.rounds, "summary": summary,
                       "failures": failures, "cases": rows}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
