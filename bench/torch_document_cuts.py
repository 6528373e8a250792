#!/usr/bin/env python3
"""Prints, as JSON, the document start offsets torch_reference.py's "document" variant uses (the same
generator, seed and cut rule), so flextile_attention_bench can time the very same mask.

Usage: torch_document_cuts.py [--b 2] [--n 8192] [--docs 8] > cuts.json
"""
import argparse, json

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--b", type=int, default=2)
ap.add_argument("--n", type=int, default=8192)
ap.add_argument("--docs", type=int, default=8)
a = ap.parse_args()
g = torch.Generator().manual_seed(1)
offsets = []
for b in range(a.b):
    cuts = sorted(torch.randint(1, a.n, (a.docs - 1,), generator=g).tolist())
    offsets.append(sorted(set([0] + cuts + [a.n])))
print(json.dumps({"offsets": offsets}))
