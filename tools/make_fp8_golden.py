#!/usr/bin/env python3
"""Reference FP8 block dequantisation for tests/io/test_fp8.cpp, from PyTorch's float8_e4m3fn.

Writes <out>/fp8_blocks.safetensors with, per case X:
    X                F8_E4M3 weight [R, C]
    X_scale_inv      F32 block scales [ceil(R/128), ceil(C/128)]
    X.expected       F32 [R, C]: q.to(float32) * scale (each block's scale), computed by torch
Cases: full and partial 128x128 blocks, scales far from 1, every e4m3 byte value (subnormals,
+-448 included; NaN bytes left out), a 1-element weight.

Usage: python3 tools/make_fp8_golden.py --out tests/fp8
"""
import argparse
import json
import os
import platform

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fp8")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(17)
    out = {}

    def add(name, q, scale):
        R, C = q.shape
        full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:R, :C]
        out[name] = q.contiguous()
        out[name + "_scale_inv"] = scale.contiguous()
        out[name + ".expected"] = (q.to(torch.float32) * full).contiguous()

    # Every finite e4m3 byte (0x7f and 0xff are NaN in e4m3fn) in a 2x127 partial block.
    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    add("all_codes", codes.view(torch.float8_e4m3fn).view(2, 127), torch.tensor([[0.37]]))
    # Partial blocks both ways: 300 = 2*128 + 44 rows, 200 = 128 + 72 columns; scales from
    # 1e-4 to 1e3 and quantised as DeepSeek does (block amax lands on +-448).
    w = torch.randn(300, 200, generator=g) * torch.logspace(-4, 3, 300).unsqueeze(1)
    scale = torch.empty(3, 2)
    for i in range(3):
        for j in range(2):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            scale[i, j] = blk.abs().max() / 448.0
    full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:300, :200]
    q = (w / full).clamp(-448, 448).to(torch.float8_e4m3fn)
    q[0, 0] = 448.0
    q[299, 199] = -448.0
    add("partial", q, scale)
    # Exactly one full block, scale 1 and a negative-free power of two.
    q = (torch.rand(128, 128, generator=g) * 896 - 448).to(torch.float8_e4m3fn)
    add("full_block", q, torch.tensor([[1.0]]))
    add("tiny", torch.tensor([[-448.0]]).to(torch.float8_e4m3fn), torch.tensor([[2.0 ** -20]]))

    os.makedirs(args.out, exist_ok=True)
    save_file(out, os.path.join(args.out, "fp8_blocks.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump({"python": platform.python_version(), "torch": torch.__version__}, f, indent=2)
        f.write("\n")
    print(f"{len(out) // 3} cases")


if __name__ == "__main__":
    main()
