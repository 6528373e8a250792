#!/usr/bin/env python3
"""PyTorch's forward where v's head dim differs from q's and k's (DeepSeek's MLA prefill: D = 192,
DV = 128), the peer of `flextile_attention_bench --d 192 --dv 128` in the same call: FlexAttention
(compiled, Triton backend) and SDPA, timed by benchlib.median_ms (CUDA events around each call,
median), as ../shared/bench/torch_reference.py times them. FLOPs count allowed (q, kv) pairs: 2 * (D + DV) a pair, Q·Kᵀ at
D and P·V at DV (4 * D a pair where the dims agree, as DESIGN.md counts).
--backward adds the backward (forward + backward timed, less the forward; 2.5 x the forward's
FLOPs, as torch_reference.py counts it): the peer of `flextile_attention_backward_bench --d 192 --dv 128`.

  python3 bench/torch_value_dim.py [--variants full,causal] [--b 2] [--h 16] [--n 8192] [--d 192] [--dv 128]
                                   [--backward]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from benchlib import median_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="full,causal,sliding_window")
    ap.add_argument("--b", type=int, default=2)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--d", type=int, default=192)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backward", action="store_true")
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    B, H, N, D, DV = a.b, a.h, a.n, a.d, a.dv
    flex = torch.compile(flex_attention, dynamic=False)

    def causal(b, h, q, k): return q >= k
    def full(b, h, q, k): return (q >= 0) & (k >= 0)
    def window(b, h, q, k): return (q >= k) & (q - k < a.window)
    table = {"full": (full, None), "causal": (causal, "causal"), "sliding_window": (window, "mask")}
    pairs = {"full": N * N, "causal": N * (N + 1) // 2,
             "sliding_window": sum(min(i + 1, a.window) for i in range(N))}
    q = torch.randn(B, H, N, D, device=dev, dtype=dt)
    k = torch.randn(B, H, N, D, device=dev, dtype=dt)
    v = torch.randn(B, H, N, DV, device=dev, dtype=dt)
    dout = torch.randn(B, H, N, DV, device=dev, dtype=dt)
    if a.backward:
        q, k, v = (x.requires_grad_() for x in (q, k, v))

    def with_backward(forward, fwd_ms):
        """The backward's fields: forward + backward timed, less the forward."""
        if not a.backward:
            return {}

        def step():
            q.grad = k.grad = v.grad = None
            forward().backward(dout)
        step()
        ms = median_ms(step, max(5, a.iters // 2), 3) - fwd_ms
        return dict(bwd_ms=ms, bwd_tflops=2.5 * flops / ms / 1e9)
    print(f"device: {torch.cuda.get_device_name()}   B={B} H={H} N={N} D={D} DV={DV} bf16, torch {torch.__version__}")
    for name in a.variants.split(","):
        mm, sdpa_form = table[name]
        flops = 2.0 * (D + DV) * pairs[name] * B * H
        bm = create_block_mask(mm, None, None, N, N, device=dev)
        try:
            out = flex(q, k, v, block_mask=bm)
            assert out.shape == (B, H, N, DV), out.shape
            ms = median_ms(lambda: flex(q, k, v, block_mask=bm), a.iters, 3)
            print(json.dumps(dict(impl="torch_flex", variant=name, B=B, H=H, N=N, D=D, DV=DV, fwd_ms=ms,
                                  fwd_tflops=flops / ms / 1e9,
                                  **with_backward(lambda: flex(q, k, v, block_mask=bm), ms))), flush=True)
        except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
            print(json.dumps(dict(impl="torch_flex", variant=name, error=str(e)[:300])), flush=True)
        mask, is_causal = None, sdpa_form == "causal"
        if sdpa_form == "mask":
            i = torch.arange(N, device=dev)
            mask = mm(0, 0, i[:, None], i[None, :])
        try:
            sd = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
            sd()
            ms = median_ms(sd, a.iters, 3)
            print(json.dumps(dict(impl="torch_sdpa", variant=name, B=B, H=H, N=N, D=D, DV=DV, fwd_ms=ms,
                                  fwd_tflops=flops / ms / 1e9, **with_backward(sd, ms))), flush=True)
        except Exception as e:  # noqa: BLE001
            print(json.dumps(dict(impl="torch_sdpa", variant=name, error=str(e)[:300])), flush=True)


if __name__ == "__main__":
    main()
