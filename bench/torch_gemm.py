#!/usr/bin/env python3
"""Peer timings for bench/gemm: torch.matmul (cuBLAS) in bf16 on the same shapes and GPU.

Prints one JSON object per line: {"name", "M", "N", "K", "ms", "tflops"} with tflops = 2*M*N*K / time.
Timing: CUDA events, warm-up, median of many repetitions, random inputs. torch.matmul returns bf16
(FlexTile's example kernel writes f32, which moves more bytes: the comparison favours cuBLAS slightly).
"""
import json
import statistics
import sys

import torch


def median_ms(fn, reps=50, warmup=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1:] or ["8192x8192x8192", "16384x128x128"])]
    dev = torch.cuda.get_device_name()
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ms = median_ms(lambda: torch.matmul(a, b), reps=20 if m * n * k > 1e11 else 100)
        print(json.dumps({"name": "torch.matmul", "device": dev, "M": m, "N": n, "K": k, "ms": ms,
                          "tflops": 2 * m * n * k / ms / 1e9}), flush=True)


if __name__ == "__main__":
    main()
