#!/usr/bin/env python3
"""Peer timings for bench/softmax: torch.softmax and a device copy on the same GPU.

Prints one JSON object per line: {"name", "rows", "cols", "ms", "gbps"} where gbps counts bytes read
plus bytes written once (the fewest a row softmax or a copy must move). Timing: CUDA events, warm-up,
median of many repetitions, random (never zero) inputs, inputs rotated so L2 holds none of them.
"""
import json
import sys

import torch

from benchlib import median_ms


def main():
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1:] or ["32768x4096", "16384x1000", "4096x16384"])]
    dev = torch.cuda.get_device_name()
    for rows, cols in shapes:
        xs = [torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        i = [0]

        def softmax():
            i[0] = (i[0] + 1) % len(xs)
            return torch.softmax(xs[i[0]], dim=-1)

        ms = median_ms(softmax)
        nbytes = 2 * rows * cols * 2
        print(json.dumps({"name": "torch.softmax", "device": dev, "rows": rows, "cols": cols, "ms": ms,
                          "gbps": nbytes / ms / 1e6}), flush=True)
    # Device-to-device copy: the bandwidth ceiling (bytes read + bytes written).
    n = 1 << 30  # 2 GiB of bf16 per buffer
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=30)
    print(json.dumps({"name": "device copy", "device": dev, "rows": 1, "cols": n, "ms": ms,
                      "gbps": 2 * n * 2 / ms / 1e6}), flush=True)


if __name__ == "__main__":
    main()
