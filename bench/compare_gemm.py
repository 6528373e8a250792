#!/usr/bin/env python3
"""Side-by-side table of FlexTile's matmul and torch.matmul from the JSON lines of the bench logs.

Usage: compare_gemm.py FLEXTILE_LOG TORCH_LOG
"""
import sys

from benchlib import json_rows as rows_of


def main(flextile_log, torch_log):
    key = lambda r: (r["M"], r["N"], r["K"])
    ours = {key(r): r for r in rows_of(flextile_log)}
    peer = {key(r): r for r in rows_of(torch_log)}
    print(f"{'shape (bf16)':<18} {'FlexTile TFLOP/s':>16} {'cuBLAS TFLOP/s':>14} {'ratio':>6}  config")
    for k, r in sorted(ours.items()):
        p = peer.get(k, {}).get("tflops", float("nan"))
        print(f"{k[0]}x{k[1]}x{k[2]:<8} {r['tflops']:>16.1f} {p:>14.1f} {r['tflops'] / p:>6.2f}  {r['config']}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
