#!/usr/bin/env python3
"""Peer timings for bench/gemm: torch.matmul (cuBLAS) in bf16 on the same shapes, same GPU.

Prints one JSON object per line: {"name", "M", "N", "K", "ms", "tflops"} with 2*M*N*K FLOPs.
CUDA events, warm-up, median of many repetitions, random (never zero) inputs; inputs that fit in
L2 are rotated among three sets.
"""
import json
import sys

import torch

from benchlib import median_ms


def main():
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1:] or ["8192x8192x8192", "16384x128x128"])]
    dev = torch.cuda.get_device_name()
    for m, n, k in shapes:
        sets = 3 if m * k * 2 < (64 << 20) else 1
        a = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        b = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        i = [0]

        def mm():
            i[0] = (i[0] + 1) % sets
            return torch.matmul(a[i[0]], b[i[0]])

        ms = median_ms(mm, reps=20 if m * n * k > 1e11 else 50)
        print(json.dumps({"name": "torch.matmul", "device": dev, "M": m, "N": n, "K": k, "ms": ms,
                          "tflops": 2 * m * n * k / ms / 1e9}), flush=True)


if __name__ == "__main__":
    main()
