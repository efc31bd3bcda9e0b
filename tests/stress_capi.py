"""Random configurations of the benchmark interface through tapegrad's C API,
against PyTorch references on the same inputs (the GPU machine has PyTorch):
the cases the fixed-seed GPU suite and bench/compare_torch.py do not draw.

Each configuration draws its sizes (B, S, hidden C = 64 H, max_positions M >=
S), its softmax scale and dropout p, its masks (keys masked at random, a batch
whose keys are all masked, one key left, all inside or all outside the edit
region) and the magnitude of x (up to 3x the spec's: logits spread by ~10,
softmax peaked but not saturated; see below), makes the saved tensors with
the spec's forward in float64 (a row whose keys are all masked gets P = 0),
and checks tapegrad's 8 gradients, each output poisoned with NaN first:
  - "highest": max error against the float64 reference at most 10x PyTorch
    fp32's (the issue's rule), plus 1e-6 of the output's scale (for outputs
    whose fp32 error is zero or nearly so);
  - "high": max error at most 4x PyTorch TF32's (the benchmark's tolerances
    are set at TF32's error), plus 1e-3 of the scale (fp16's unit roundoff
    is 2^-11), plus what the identity Delta = rowsum(dP P) = rowsum(do o)
    can cost at fp16's precision in the rows where P is one-hot to fp16's
    precision (max P >= 1 - 2^-11: one key left, S = 1): there PyTorch's dS,
    its Delta made from its own dP, cancels exactly, while the fused
    backward's Delta, from the given o, differs from its fp16 dP's rowsum by
    at most 2^-10 sum_j P_ij |dP|_ij (do and v each rounded to fp16), and
    that difference is all of dS. The
    slack is the change in each output when the reference's Delta moves by
    that much in those rows, all in one direction (a bound: the rounding's
    signs vary);
  - nothing non-finite, and no input changed.
Each precision runs three times on the same tensors, the outputs poisoned
before each call: the C API replays the third call from a CUDA graph it
captures, and the third call's outputs are the ones checked.
|dP|_ij is dP's sum over d of |do_id v_jd| m_ij / (1 - p), what its rounding
scales with. An output's scale is its largest |reference|; for dE at least
the largest sum over the batch of P |dP|, for dw_in and dw_x at least each
head's total of those sums (dE is 0 where each row keeps one key, and dw_in,
dw_x are sums of dS that cancel).

Not drawn: a saturated softmax (measured with x 300x the spec's: logits
spread by ~10^4, P one-hot in fp32). There the fused backward's error is
that identity's rounding where PyTorch's is ~0: at "highest" 10x to 10^5x
fp32's error on dx, dWqkv, dbqkv and dE (bench/NOTES.md version 29).

Usage: python3 tests/stress_capi.py --lib build/libtapegrad.so [--configs 40] [--seed 1]
Exit status 1 if any check fails (each failure printed).
"""
import argparse
import ctypes
import os
import random
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from compare_torch import D, OUTPUTS, Tapegrad, edit_bias_grads  # noqa: E402

# Per precision: the PyTorch reference whose error is the yardstick, its factor, the floor (times the output's
# scale), and whether the identity's slack applies.
TOLERANCES = [("highest", 0, "fp32", 10, 1e-6, False), ("high", 1, "tf32", 4, 1e-3, True)]
DE, DW_IN, DW_X = 5, 6, 7  # places in OUTPUTS


def draw_config(rng):
    H = rng.choice([1, 2, 4, 8, 16])
    S = rng.choice([1, 2, 3, rng.randint(4, 80), rng.randint(81, 300), rng.randint(301, 700)])
    B = rng.choice([1, 2, 3, 5]) if S <= 300 else rng.choice([1, 2])
    M = rng.choice([S, S + rng.randint(1, 40), max(S, 1024)])
    return {"B": B, "S": S, "H": H, "C": 64 * H, "M": M, "p": rng.choice([0.0, 0.1, 0.3, 0.7]),
            "scale": rng.uniform(0.05, 0.3), "keys": rng.choice(["all", "random", "batch 0 masked", "one key"]),
            "edit": rng.choice(["random", "inside", "outside"]), "x_scale": rng.choice([1.0, 1e-3, 3.0])}


def make_inputs(cfg, gen):
    """The 19 inputs in the spec's order, in float64, and the spec's forward."""
    B, S, C, H, M, p = cfg["B"], cfg["S"], cfg["C"], cfg["H"], cfg["M"], cfg["p"]
    f64 = {"device": "cuda", "dtype": torch.float64}
    rand = lambda *shape: torch.randn(*shape, generator=gen, **f64)
    x, dy = rand(B, S, C) * cfg["x_scale"], rand(B, S, C)
    Wqkv, bqkv, Wo, bo = rand(3 * C, C) * 0.02, rand(3 * C) * 0.02, rand(C, C) * 0.02, rand(C) * 0.02
    E, w_in, w_x = rand(H, M, M) * 0.02, rand(H, 1, 1) * 0.02, rand(H, 1, 1) * 0.02
    uniform = lambda *shape: torch.rand(*shape, generator=gen, **f64)
    e = {"random": (uniform(B, S) < 0.5).double(), "inside": torch.ones(B, S, **f64),
         "outside": torch.zeros(B, S, **f64)}[cfg["edit"]]
    a = torch.ones(B, S, **f64)
    if cfg["keys"] == "random":
        a = (uniform(B, S) < 0.7).double()
    elif cfg["keys"] == "batch 0 masked":
        a[0] = 0
    elif cfg["keys"] == "one key":
        a.zero_()
        a[:, S // 2] = 1
    m = (uniform(B, H, S, S) >= p).double()
    qkv = (x @ Wqkv.t() + bqkv).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k, v = (t.contiguous() for t in (qkv[0], qkv[1], qkv[2]))
    ei, ej = e[:, None, :, None], e[:, None, None, :]
    s = (q @ k.transpose(-1, -2)) * cfg["scale"] + E[:, :S, :S] + w_in * ei * ej + \
        w_x * (ei * (1 - ej) + (1 - ei) * ej)
    s = s.masked_fill(a[:, None, None, :] == 0, float("-inf"))
    probs = torch.softmax(s, -1).nan_to_num(0.0)  # a row with every key masked: P = 0
    dropped = probs * m / (1 - p)
    o = (dropped @ v).permute(0, 2, 1, 3).reshape(B, S, C)
    return [dy, x, e, Wqkv, bqkv, Wo, bo, E, w_in, w_x, a, q, k, v, s, probs, dropped, o, m]


def reference_backward(cfg, dy, x, e, Wqkv, bqkv, Wo, bo, E, w_in, w_x, a, q, k, v, s, probs, dropped, o, m,
                       delta_slack=0.0):
    """The spec's backward formulas (bench/compare_torch.py's) at any size, in the inputs' dtype, with Delta =
    rowsum(dP P) moved by delta_slack rowsum(P |dP|) in the rows where P is one-hot to fp16's precision; and
    the sums over the batch of P |dP| [H, S, S] (the docstring's |dP|)."""
    B, S, C, H, p, scale = cfg["B"], cfg["S"], cfg["C"], cfg["H"], cfg["p"], cfg["scale"]
    dy2 = dy.reshape(B * S, C)
    do = (dy2 @ Wo).view(B, S, H, D).permute(0, 2, 1, 3)
    dP = (do @ v.transpose(-1, -2)) * m / (1 - p)
    dP_terms = (do.abs() @ v.abs().transpose(-1, -2)) * m / (1 - p)
    one_hot = probs.amax(-1, keepdim=True) >= 1 - 2.0**-11
    delta = (dP * probs).sum(-1, keepdim=True) + delta_slack * one_hot * (dP_terms * probs).sum(-1, keepdim=True)
    dS = probs * (dP - delta)
    dS = dS.masked_fill(a[:, None, None, :] == 0, 0.0)
    g_E, g_win, g_wx = edit_bias_grads(dS, e, E)
    dq, dk, dv = (dS @ k) * scale, (dS.transpose(-1, -2) @ q) * scale, dropped.transpose(-1, -2) @ do
    dqkv = torch.stack([dq, dk, dv], 0).permute(1, 3, 0, 2, 4).reshape(B * S, 3 * C)
    grads = [(dqkv @ Wqkv).view(B, S, C), dqkv.t() @ x.reshape(B * S, C), dqkv.sum(0),
             dy2.t() @ o.reshape(B * S, C), dy2.sum(0), g_E, g_win, g_wx]
    return grads, (probs * dP_terms).sum(0)


def call_backward(tg, cfg, inputs, precision, calls=3):
    """The 8 gradients through the C API from the last of `calls` calls on the same tensors (the third replays
    a CUDA graph), the outputs poisoned with NaN before each."""
    outputs = [torch.empty(shape, device="cuda") for shape in output_shapes(cfg)]
    for _ in range(calls):
        for t in outputs:
            t.fill_(float("nan"))
        call_once(tg, cfg, inputs, outputs, precision)
    return outputs


def call_once(tg, cfg, inputs, outputs, precision):
    ip = (ctypes.c_void_p * 19)(*[t.data_ptr() for t in inputs])
    op = (ctypes.c_void_p * 8)(*[t.data_ptr() for t in outputs])
    rc = tg.lib.tg_region_attention_backward(ip, cfg["scale"], cfg["p"], cfg["B"], cfg["S"], cfg["C"], cfg["H"],
                                             cfg["M"], op, precision,
                                             ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc != 0:
        raise RuntimeError(tg.lib.tg_last_error().decode())
    torch.cuda.synchronize()


def output_shapes(cfg):
    B, S, C, H, M = cfg["B"], cfg["S"], cfg["C"], cfg["H"], cfg["M"]
    return [(B, S, C), (3 * C, C), (3 * C,), (C, C), (C,), (H, M, M), (H, 1, 1), (H, 1, 1)]


def max_error(got, ref):
    return (got.double() - ref).abs().max().item()


def references(cfg, inputs):
    """The float64 reference, the one with the identity's slack, PyTorch fp32's and TF32's, and the sums over the
    batch of P |dP|."""
    as64 = [t.double() for t in inputs]
    ref64, terms = reference_backward(cfg, *as64)
    slack, _ = reference_backward(cfg, *as64, delta_slack=2.0**-10)
    torch.backends.cuda.matmul.allow_tf32 = False
    fp32, _ = reference_backward(cfg, *inputs)
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32, _ = reference_backward(cfg, *inputs)
    torch.backends.cuda.matmul.allow_tf32 = False
    return ref64, slack, {"fp32": fp32, "tf32": tf32}, terms


def output_scales(ref64, terms):
    """Each output's scale (the docstring's): a number, or dw_in's and dw_x's per head."""
    scales = [ref.abs().max() for ref in ref64]
    scales[DE] = torch.maximum(scales[DE], terms.max())
    for i in (DW_IN, DW_X):
        scales[i] = torch.maximum(ref64[i].abs(), terms.sum((1, 2)).view(-1, 1, 1))
    return scales


def check_outputs(got, ref64, slack, yardstick, scales, name, factor, floor, with_slack):
    """The failures of one precision's outputs."""
    failures = []
    for i, out in enumerate(OUTPUTS):
        pytorch = max_error(yardstick[i], ref64[i])
        allowed = factor * pytorch + floor * scales[i] + (max_error(slack[i], ref64[i]) if with_slack else 0.0)
        error = (got[i].double() - ref64[i]).abs()
        if not torch.isfinite(got[i]).all() or not (error <= allowed).all():
            failures.append(f"{name} {out}: error {error.max().item():.3g}, allowed "
                            f"{torch.as_tensor(allowed).min().item():.3g} or more (PyTorch's {pytorch:.3g})")
    return failures


def check_config(tg, cfg, gen):
    """The failures of one configuration, as lines of text."""
    inputs = [t.float().contiguous() for t in make_inputs(cfg, gen)]
    before = [t.clone() for t in inputs]
    ref64, slack, pytorch, terms = references(cfg, inputs)
    scales = output_scales(ref64, terms)
    failures = []
    for name, precision, yardstick, factor, floor, with_slack in TOLERANCES:
        try:
            got = call_backward(tg, cfg, inputs, precision)
        except RuntimeError as error:
            failures.append(f"{name}: the C API failed: {error}")
            continue
        failures += check_outputs(got, ref64, slack, pytorch[yardstick], scales, name, factor, floor, with_slack)
    failures += [f"input {i} changed" for i, (b, t) in enumerate(zip(before, inputs)) if not torch.equal(b, t)]
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libtapegrad.so")
    ap.add_argument("--configs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    tg, rng = Tapegrad(args.lib), random.Random(args.seed)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    failed = 0
    for n in range(args.configs):
        cfg = draw_config(rng)
        failures = check_config(tg, cfg, gen)
        failed += bool(failures)
        print(f"{n:3d} {'FAIL' if failures else 'ok  '} " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else
                                                                  f"{k}={v}" for k, v in cfg.items()), flush=True)
        for line in failures:
            print("      " + line)
    print(f"{args.configs - failed} of {args.configs} configurations pass")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
