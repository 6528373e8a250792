#!/usr/bin/env python3
"""Side-by-side table of flex_attention (FlexTile) and PyTorch FlexAttention from the JSON lines
of the two bench logs (flextile_attention_bench and torch_reference.py, same run, same GPU).

Usage: compare_attention.py FLEXTILE_LOG TORCH_LOG
"""
import sys

from benchlib import json_rows as rows_of


def main(flextile_log, torch_log):
    ours = {r["variant"]: r for r in rows_of(flextile_log) if r.get("impl") == "flextile"}
    peer = {r["variant"]: r for r in rows_of(torch_log) if r.get("impl") == "torch_flex" and "fwd_tflops" in r}
    sdpa = {r["variant"]: r for r in rows_of(torch_log) if r.get("impl") == "torch_sdpa" and "fwd_tflops" in r}
    nan = float("nan")
    print(f"{'variant':<15} {'FlexTile':>9} {'default':>8} {'torch flex':>10} {'ratio':>6} {'SDPA':>6}  "
          f"{'mask gen/str ms':>16} {'torch mask ms':>13} {'mask ratio':>10}  config")
    for name, r in ours.items():
        p = peer.get(name, {})
        pt = p.get("fwd_tflops", nan)
        s = sdpa.get(name, {}).get("fwd_tflops", nan)
        gen, st = r.get("blockmask_generic_ms", -1), r.get("blockmask_structural_ms", -1)
        pm = p.get("blockmask_ms", nan)
        best_mask = min(x for x in (gen, st) if x > 0) if max(gen, st) > 0 else nan
        print(f"{name:<15} {r['fwd_tflops']:>9.1f} {r.get('default_tflops', nan):>8.1f} {pt:>10.1f} "
              f"{r['fwd_tflops'] / pt:>6.2f} {s:>6.0f}  {gen:>7.2f}/{st:<8.2f} {pm:>13.2f} "
              f"{pm / best_mask:>9.1f}x  {r['config']}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
