"""PyTorch eager peer of bench/train_step: the same region-aware attention
layer (shared/spec/region-attention.md), the same sizes, precisions, dropout
and method (3 warm-up steps, 20 host-timed synchronised steps, the median;
peak memory over one step, parameters and inputs included).

Usage: python3 bench/train_step.py [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

C, H, M, P = 1024, 16, 1024, 0.1
D = C // H


def make_params(device):
    g = torch.Generator(device="cpu").manual_seed(0)
    def normal(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(device).requires_grad_()
    return {
        "Wqkv": normal(3 * C, C), "bqkv": torch.zeros(3 * C, device=device, requires_grad=True),
        "Wo": normal(C, C), "bo": torch.zeros(C, device=device, requires_grad=True),
        "E": normal(H, M, M), "w_in": normal(H, 1, 1), "w_x": normal(H, 1, 1),
    }


def layer(x, e, a, p):
    B, S, _ = x.shape
    qkv = F.linear(x, p["Wqkv"], p["bqkv"]).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    s = (q @ k.transpose(-1, -2)) * (1.0 / D ** 0.5)
    ei, ej = e[:, None, :, None], e[:, None, None, :]
    s = s + p["E"][:, :S, :S] + p["w_in"] * ei * ej + p["w_x"] * (ei * (1 - ej) + (1 - ei) * ej)
    s = s.masked_fill(a[:, None, None, :] == 0, float("-inf"))
    probs = F.dropout(torch.softmax(s, dim=-1), P, training=True)
    o = (probs @ v).permute(0, 2, 1, 3).reshape(B, S, C)
    return F.linear(o, p["Wo"], p["bo"])


def measure(params, B, S, precision):
    torch.backends.cuda.matmul.allow_tf32 = precision == "high"
    dev = "cuda"
    x = torch.randn(B, S, C, device=dev, requires_grad=True)
    e = (torch.rand(B, S, device=dev) < 0.5).float()
    a = torch.ones(B, S, device=dev)
    dy = torch.randn(B, S, C, device=dev)

    def step():
        layer(x, e, a, params).backward(dy)
        for t in list(params.values()) + [x]:
            t.grad = None

    for _ in range(3):
        step()
    times = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**20
    return {"impl": "pytorch eager", "precision": precision, "B": B, "S": S,
            "median_ms": statistics.median(times), "peak_mib": peak}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    params = make_params("cuda")
    rows = [measure(params, B, S, prec) for prec in ("highest", "high") for B, S in ((8, 1024), (32, 773), (64, 128))]
    print(f"{'impl':<14} {'precision':<9} {'B':>5} {'S':>6} {'median ms':>10} {'peak MiB':>14}")
    for r in rows:
        print(f"{r['impl']:<14} {r['precision']:<9} {r['B']:>5} {r['S']:>6} {r['median_ms']:>10.3f} {r['peak_mib']:>14.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
