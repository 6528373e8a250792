#!/usr/bin/env python3
"""Tuned / default / PyTorch FlexAttention table from bench/autotune_sweep.sh's log and the JSON
lines of torch_reference.py (same run, same GPU).

Usage: compare_autotune.py SWEEP_LOG TORCH_LOG
"""
import re
import sys

from benchlib import json_rows as rows_of

WINNER = re.compile(r"winner: (.+?) ([\d.]+) ms ([\d.]+) TFLOP/s; default (.+?) ([\d.]+) ms ([\d.]+) TFLOP/s; "
                    r"speedup ([\d.]+)")


def sweeps(path):
    out, variant = {}, None
    with open(path) as f:
        for line in f:
            if line.startswith("== autotune "):
                variant = line.split()[2]
                out[variant] = {}
            elif variant and (m := WINNER.match(line)):
                out[variant].update(best=m[1], best_tflops=float(m[3]), default=m[4], default_tflops=float(m[6]),
                                    speedup=float(m[7]))
            elif variant and (m := re.match(r"sweep (\S+): ([\d.]+) s", line)):
                out[m[1]]["seconds"] = float(m[2])
            elif variant and (m := re.match(r"compile: ([\d.]+) s for (\d+) configs; timing: ([\d.]+) s", line)):
                out[variant].update(compile_s=float(m[1]), configs=int(m[2]), timing_s=float(m[3]))
    return out


def main(sweep_log, torch_log):
    tuned = sweeps(sweep_log)
    peer = {r["variant"]: r for r in rows_of(torch_log) if r.get("impl") == "torch_flex" and "fwd_tflops" in r}
    nan = float("nan")
    print(f"{'variant':<15} {'tuned':>7} {'default':>8} {'speedup':>7} {'torch flex':>10} {'ratio':>6} "
          f"{'sweep s':>8} {'compile s':>9}  winner")
    total = 0.0
    for name, t in tuned.items():
        pt = peer.get(name, {}).get("fwd_tflops", nan)
        total += t.get("seconds", 0.0)
        print(f"{name:<15} {t.get('best_tflops', nan):>7.1f} {t.get('default_tflops', nan):>8.1f} "
              f"{t.get('speedup', nan):>7.3f} {pt:>10.1f} {t.get('best_tflops', nan) / pt:>6.2f} "
              f"{t.get('seconds', nan):>8.1f} {t.get('compile_s', nan):>9.2f}  {t.get('best', '-')}")
    print(f"all sweeps: {total:.1f} s")


if __name__ == "__main__":
    main(*sys.argv[1:3])
