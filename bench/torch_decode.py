#!/usr/bin/env python3
"""PyTorch FlexAttention (compiled; its FlexDecoding kernel for one query) and SDPA on the decode
shapes of bench/attention_decode.cpp, in the same run on the same GPU: TB/s of K and V read (the
live blocks' bytes for a sliding window) and microseconds per call, median of many calls.

  python3 bench/torch_decode.py [--json out.json] [--only SHAPE]... [--graph]

--graph also times 20 calls captured in a CUDA graph (torch.cuda.CUDAGraph), per call: the peers'
figure for flextile_attention_decode_bench --graph.
"""
import argparse, json

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from benchlib import median_ms  # bench/benchlib.py: event-timed median


SHAPES = [  # name, B, Hq, Hkv, S, L, window (0: none), causal mask, head dim
    ("decode", 8, 32, 8, 32768, 1, 0, False, 128),
    ("decode_causal", 8, 32, 8, 32768, 1, 0, True, 128),
    ("decode_window4096", 8, 32, 8, 32768, 1, 4096, False, 128),
    ("decode_b1", 1, 32, 8, 32768, 1, 0, False, 128),
    ("decode_s2048", 8, 32, 8, 2048, 1, 0, False, 128),
    ("decode_s4096", 8, 32, 8, 4096, 1, 0, False, 128),  # the window's bytes without a mask
    ("decode_b1_s2048", 1, 32, 8, 2048, 1, 0, False, 128),
    ("decode_l4", 8, 32, 8, 32768, 4, 0, False, 128),
    ("decode_d256", 8, 32, 8, 16384, 1, 0, False, 256),  # the main shape's bytes at D = 256
]


def graph_us(fn, steps=20):
    """Microseconds a call of fn() when `steps` calls are replayed from one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capturing stream, as torch.cuda.graph asks
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(steps):
            fn()
    return median_ms(g.replay) * 1e3 / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", action="append", default=[], help="a shape's name (repeatable)")
    ap.add_argument("--graph", action="store_true", help="also 20 calls replayed from a CUDA graph, per call")
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    flex = torch.compile(flex_attention, dynamic=False)
    results = []
    for name, B, Hq, Hkv, S, L, window, causal, D in SHAPES:
        if a.only and name not in a.only:
            continue
        q = torch.randn(B, Hq, L, D, device=dev, dtype=dt)
        k, v = (torch.randn(B, Hkv, S, D, device=dev, dtype=dt) for _ in range(2))
        pos = S - L
        bm, keys = None, S
        if window or causal:
            def mm(b, h, qi, kv):
                ok = (qi + pos) >= kv
                return ok & ((qi + pos) - kv < window) if window else ok
            bm = create_block_mask(mm, None, None, L, S, device=dev)
            if window:  # the blocks a window reads: its 128-key blocks, clamped to S
                first = max(0, (pos - window + 1) // 128) * 128
                keys = min(S, (pos // 128 + 1) * 128) - first
        kv_bytes = 2 * B * Hkv * keys * D * k.element_size()
        r = {"variant": name, "B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "L": L, "D": D}
        try:
            ms = median_ms(lambda: flex(q, k, v, block_mask=bm, enable_gqa=True))
            r.update(flex_us=ms * 1e3, flex_tbps=kv_bytes / ms / 1e9)
        except Exception as ex:
            r.update(flex_error=repr(ex)[:200])
        if not window:
            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
            r.update(sdpa_us=ms * 1e3, sdpa_tbps=kv_bytes / ms / 1e9)
        if a.graph:
            for key, fn in (("flex", lambda: flex(q, k, v, block_mask=bm, enable_gqa=True)),
                            ("sdpa", None if window else lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))):
                if fn is None:
                    continue
                try:
                    r[key + "_graph_us"] = graph_us(fn)
                except Exception as ex:
                    r[key + "_graph_error"] = repr(ex)[:200]
        print(json.dumps(r), flush=True)
        results.append(r)
        del q, k, v
        torch.cuda.empty_cache()
    print("\n%-18s %10s %10s %10s %10s" % ("shape", "flex us", "flex TB/s", "sdpa us", "sdpa TB/s")
          + ("  %14s %14s" % ("flex graph us", "sdpa graph us") if a.graph else ""))
    for r in results:
        graphs = ""
        if a.graph:
            graphs = "  %14s %14s" % tuple("%.1f" % r[key] if key in r else "-" for key in ("flex_graph_us", "sdpa_graph_us"))
        print("%-18s %10.1f %10.2f %10s %10s" % (r["variant"], r.get("flex_us", float("nan")), r.get("flex_tbps", float("nan")),
              "%.1f" % r["sdpa_us"] if "sdpa_us" in r else "-", "%.2f" % r["sdpa_tbps"] if "sdpa_tbps" in r else "-") + graphs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
