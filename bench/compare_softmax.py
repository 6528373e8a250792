#!/usr/bin/env python3
"""Side-by-side table of FlexTile's row softmax and the peers from the JSON lines of the bench logs.

Usage: compare_softmax.py FLEXTILE_LOG TORCH_LOG
"""
import sys

from benchlib import json_rows as rows_of


def main(flextile_log, torch_log):
    ours = {(r["rows"], r["cols"]): r for r in rows_of(flextile_log)}
    peers = rows_of(torch_log)
    torch = {(r["rows"], r["cols"]): r for r in peers if r["name"] == "torch.softmax"}
    copy = next((r for r in peers if r["name"] == "device copy"), None)
    ceiling = copy["gbps"] if copy else float("nan")
    print(f"device copy (read + write): {ceiling:.0f} GB/s")
    print(f"{'shape (bf16)':<14} {'FlexTile GB/s':>13} {'% of copy':>9} {'torch GB/s':>10} {'ratio':>6}  config")
    for key, r in sorted(ours.items()):
        t = torch.get(key)
        tg = t["gbps"] if t else float("nan")
        print(f"{key[0]}x{key[1]:<8} {r['gbps']:>13.0f} {100 * r['gbps'] / ceiling:>8.0f}% {tg:>10.0f} "
              f"{r['gbps'] / tg:>6.2f}  {r.get('config', '')}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
