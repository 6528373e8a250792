#!/usr/bin/env python3
"""Side-by-side table of flex_attention_backward (FlexTile) and PyTorch FlexAttention's backward,
and of a training step (forward + backward), from the JSON lines of the two bench logs
(flextile_attention_backward_bench and torch_reference.py, same run, same GPU).

Step TFLOP/s = 3.5 x forward FLOPs / (forward ms + backward ms), as both sides count them.

Usage: compare_backward.py FLEXTILE_LOG TORCH_LOG
"""
import sys

from benchlib import json_rows as rows_of


def main(flextile_log, torch_log):
    ours = {r["variant"]: r for r in rows_of(flextile_log) if r.get("impl") == "flextile" and "bwd_tflops" in r}
    peer = {r["variant"]: r for r in rows_of(torch_log) if r.get("impl") == "torch_flex" and "bwd_tflops" in r}
    nan = float("nan")
    print(f"{'variant':<15} {'bwd FlexTile':>12} {'default':>8} {'torch flex':>10} {'ratio':>6}   "
          f"{'step FlexTile':>13} {'torch step':>10} {'ratio':>6}  config")
    for name, r in ours.items():
        p = peer.get(name)
        pb = p["bwd_tflops"] if p else nan
        ps = 3.5 * p["fwd_tflops"] * p["fwd_ms"] / (p["fwd_ms"] + p["bwd_ms"]) if p else nan
        print(f"{name:<15} {r['bwd_tflops']:>12.1f} {r.get('default_bwd_tflops', nan):>8.1f} {pb:>10.1f} "
              f"{r['bwd_tflops'] / pb:>6.2f}   {r['step_tflops']:>13.1f} {ps:>10.1f} {r['step_tflops'] / ps:>6.2f}  "
              f"{r['config']}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
