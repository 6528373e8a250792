#!/usr/bin/env python3
"""PyTorch's torch.compile'd flex_attention: the first call of a fresh process, with a cold and
then a warm Inductor cache, beside bench/first_call.sh (same shape: B=1, H=16, L=S=4096, D=128,
bf16, causal). Each measurement is its own Python process (the parent only starts them); the time
is from just before the first call to its result on the device, after imports, inputs and
create_block_mask, then a second call.

  python3 bench/torch_first_call.py [B,H,L,D]
"""
import os, subprocess, sys, tempfile

CHILD = r"""
import sys, time, torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
B, H, L, D = (int(x) for x in sys.argv[2].split(","))
q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
bm = create_block_mask(lambda b, h, i, j: j <= i, 1, 1, L, L, device="cuda")
flex = torch.compile(flex_attention, dynamic=False)
torch.cuda.synchronize()
t = time.perf_counter(); flex(q, k, v, block_mask=bm); torch.cuda.synchronize(); first = time.perf_counter() - t
t = time.perf_counter(); flex(q, k, v, block_mask=bm); torch.cuda.synchronize(); second = time.perf_counter() - t
print(f"torch {sys.argv[1]:<16} first call {first * 1e3:9.2f} ms   second call {second * 1e3:7.3f} ms   "
      f"(torch {torch.__version__}, B={B} H={H} L={L} D={D} bf16 causal, {torch.cuda.get_device_name()})")
"""


def main():
    shape = sys.argv[1] if len(sys.argv) > 1 else "1,16,4096,128"
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"))
        for label in ("cold", "warm", "warm_again"):
            subprocess.run([sys.executable, "-c", CHILD, label, shape], env=env, check=True)


if __name__ == "__main__":
    main()
