#!/usr/bin/env python3
"""PyTorch's attention with sinks (GPT-OSS), the peer of `flextile_attention_bench --sinks` and
`flextile_attention_backward_bench --sinks` in the same call. PyTorch FlexAttention has no sinks in
its kernel: its users take the LSE and renormalize outside, out * sigmoid(lse - sink) (what
e^lse / (e^lse + e^sink) is), which is what is timed here, compiled with the flex_attention call
(torch.compile, Triton backend; inductor fuses the renormalization into one element-wise kernel).
Beside it the same FlexAttention call without sinks, so that the table shows what the sinks cost
each. Timed by benchlib.median_ms (CUDA events around each call, median); FLOPs count allowed
(q, kv) pairs, 4 * D a pair (DESIGN.md); --backward adds forward + backward less the forward, at
2.5 x the forward's FLOPs (torch_reference.py's count), through autograd of the same function
(gradients of q, k, v and the sinks).

  python3 bench/torch_sinks.py [--variants full,causal,sliding_window] [--b 2] [--h 16] [--n 8192]
                               [--d 128] [--backward]
"""
import argparse
import json
import math

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from benchlib import median_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="full,causal,sliding_window")
    ap.add_argument("--b", type=int, default=2)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--window", type=int, default=1024)  # flextile's sliding_window variant
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backward", action="store_true")
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    B, H, N, D = a.b, a.h, a.n, a.d

    def with_sinks(q, k, v, sinks, block_mask):
        out, lse = flex_attention(q, k, v, block_mask=block_mask, return_lse=True)
        return out * torch.sigmoid(lse - sinks[None, :, None]).unsqueeze(-1).to(out.dtype)

    def without(q, k, v, sinks, block_mask):
        return flex_attention(q, k, v, block_mask=block_mask)

    impls = {"torch_flex_sinks": torch.compile(with_sinks, dynamic=False),
             "torch_flex": torch.compile(without, dynamic=False)}

    def causal(b, h, q, k): return q >= k
    def full(b, h, q, k): return (q >= 0) & (k >= 0)
    def window(b, h, q, k): return (q >= k) & (q - k < a.window)
    masks = {"full": full, "causal": causal, "sliding_window": window}
    pairs = {"full": N * N, "causal": N * (N + 1) // 2,
             "sliding_window": sum(min(i + 1, a.window) for i in range(N))}
    q = torch.randn(B, H, N, D, device=dev, dtype=dt)
    k = torch.randn(B, H, N, D, device=dev, dtype=dt)
    v = torch.randn(B, H, N, D, device=dev, dtype=dt)
    dout = torch.randn(B, H, N, D, device=dev, dtype=dt)
    sinks = math.log(N) + 4 * torch.rand(H, device=dev, dtype=torch.float32) - 2
    if a.backward:
        q, k, v, sinks = (x.requires_grad_() for x in (q, k, v, sinks))
    print(f"device: {torch.cuda.get_device_name()}   B={B} H={H} N={N} D={D} bf16, torch {torch.__version__}")
    for name in a.variants.split(","):
        flops = 4.0 * D * pairs[name] * B * H
        bm = create_block_mask(masks[name], None, None, N, N, device=dev)
        for impl, fn in impls.items():
            try:
                call = lambda: fn(q, k, v, sinks, bm)  # noqa: E731
                out = call()
                assert out.shape == (B, H, N, D), out.shape
                ms = median_ms(call, a.iters, 3)
                row = dict(impl=impl, variant=name, B=B, H=H, N=N, D=D, fwd_ms=ms, fwd_tflops=flops / ms / 1e9)
                if a.backward:
                    def step():
                        for x in (q, k, v, sinks):
                            x.grad = None
                        call().backward(dout)
                    step()
                    bms = median_ms(step, max(5, a.iters // 2), 3) - ms
                    row.update(bwd_ms=bms, bwd_tflops=2.5 * flops / bms / 1e9)
                print(json.dumps(row), flush=True)
            except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
                print(json.dumps(dict(impl=impl, variant=name, error=str(e)[:300])), flush=True)


if __name__ == "__main__":
    main()
