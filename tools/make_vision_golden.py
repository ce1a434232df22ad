#!/usr/bin/env python3
"""Golden outputs of transformers' kimi_k25 (vision tower + projector + deepseek_v3 LM) for
moetrain's conformance tests, and golden preprocessing of its image processor.

Model cases (tests/golden/k25_*), the layout of tools/make_golden.py plus the images:
    <case>/model/                 config.json + model.safetensors (save_pretrained)
    <case>/inputs.safetensors     input_ids int64 [B, T] (image_token_id marks placeholders),
                                  pixel_values f32 [patches, 3 * patch^2] (processor order),
                                  image_grid_thw int64 [images, 3] (t = 1)
    <case>/outputs.safetensors    logits [B, T, V], loss [] (labels = input_ids with placeholders
                                  set to -100: the loss is on text tokens only), every gradient
Several image sizes share one batch, one row may hold several images.

Preprocessing case (tests/golden/k25_preprocess/): random RGB PNGs of odd sizes and, per image,
the processor's resized uint8 image before padding (resized_N [h, w, 3], int32) and its pixel_values_N
and image_grid_thw_N in preprocess.safetensors, so the C++ test checks resize and
normalise/patchify separately.

Usage: python3 tools/make_vision_golden.py --out tests/golden
(the preprocessing case needs torchvision and Pillow besides torch and transformers)
"""
import argparse
import json
import os
import platform
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import run_unambiguous  # noqa: E402

VISION = dict(patch_size=4, pos_emb_height=6, pos_emb_width=6, pos_emb_time=4,
              num_attention_heads=2, num_hidden_layers=2, hidden_size=16, intermediate_size=24,
              hidden_act="gelu_pytorch_tanh", merge_kernel_size=[2, 2])
TEXT = dict(vocab_size=64, hidden_size=32, intermediate_size=40, moe_intermediate_size=12,
            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16,
            kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
            n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
            topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
            rms_norm_eps=1e-6, num_nextn_predict_layers=0, tie_word_embeddings=False,
            pad_token_id=None, bos_token_id=0, eos_token_id=1)
IMAGE_TOKEN, VIDEO_TOKEN = 63, 62

# Per case: grids (rows, cols in patches) of the images, and the rows they sit in (B rows of T).
CASES = [
    dict(name="k25_a", seed=31, B=2, T=24, grids=[(4, 6), (2, 2), (6, 4)], rows=[0, 0, 1]),
    dict(name="k25_b", seed=32, B=1, T=30, grids=[(8, 10), (2, 4)], rows=[0, 0],
         pos=(5, 5)),
]


def build(spec, seed):
    import transformers
    vision = dict(VISION)
    if "pos" in spec:
        vision.update(pos_emb_height=spec["pos"][0], pos_emb_width=spec["pos"][1])
    cfg = transformers.Kimi_K25Config(
        text_config=dict(TEXT, model_type="deepseek_v3"), vision_config=vision,
        projection_hidden_size=VISION["hidden_size"], projection_layer_norm_eps=1e-5,
        image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN, vision_start_token_id=60,
        vision_end_token_id=61, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.Kimi_K25ForConditionalGeneration(cfg)
    model = model.to(torch.float32)
    model.config._attn_implementation = "eager"
    model.train()
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() == 2 else p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))
    return model


def inputs(spec, seed):
    g = torch.Generator().manual_seed(seed + 7)
    ps, m = VISION["patch_size"], 2
    B, T = spec["B"], spec["T"]
    ids = torch.randint(2, 60, (B, T), generator=g)
    cursor = [1] * B  # a text token before every image
    for (h, w), r in zip(spec["grids"], spec["rows"]):
        n = (h // m) * (w // m)
        assert cursor[r] + n + 1 <= T, "case too short for its images"
        ids[r, cursor[r]:cursor[r] + n] = IMAGE_TOKEN
        cursor[r] += n + 1
    pix = torch.randn(sum(h * w for h, w in spec["grids"]), 3 * ps * ps, generator=g)
    thw = torch.tensor([[1, h, w] for h, w in spec["grids"]], dtype=torch.int64)
    return ids, pix, thw


def write_case(out_dir, spec):
    from safetensors.torch import save_file
    for attempt in range(20):
        seed = spec["seed"] * 100 + attempt
        model = build(spec, seed)
        ids, pix, thw = inputs(spec, seed)
        labels = ids.masked_fill(ids == IMAGE_TOKEN, -100)
        ps = VISION["patch_size"]
        out = run_unambiguous(spec["name"], model, lambda: model(
            input_ids=ids, pixel_values=pix.view(-1, 3, ps, ps), image_grid_thw=thw,
            labels=labels))
        if out is not None:
            break
    else:
        raise SystemExit(f"{spec['name']}: no unambiguous routing in 20 draws")
    case = os.path.join(out_dir, spec["name"])
    shutil.rmtree(case, ignore_errors=True)
    os.makedirs(case)
    model.save_pretrained(os.path.join(case, "model"), safe_serialization=True)
    tensors = {"logits": out.logits.detach().float().contiguous(),
               "loss": out.loss.detach().float().reshape(())}
    for name, p in model.named_parameters():
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        tensors[name] = grad.detach().float().contiguous()
    save_file(tensors, os.path.join(case, "outputs.safetensors"),
              metadata={"model_type": "kimi_k25", "seed": str(seed)})
    save_file({"input_ids": ids.contiguous(), "pixel_values": pix.contiguous(),
               "image_grid_thw": thw.contiguous()}, os.path.join(case, "inputs.safetensors"))
    print(f"{spec['name']}: loss {out.loss.item():.6f}, {len(tensors) - 2} gradients")


def write_png(path, img):
    """8-bit RGB PNG with zlib and struct only (no imaging library needed here)."""
    import struct
    import zlib

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))
    with open(path, "wb") as fh:
        fh.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                 + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def write_preprocess(out_dir):
    """Random images (smooth + noise, so resampling is exercised) through the processor."""
    import numpy as np
    from safetensors.torch import save_file
    from transformers.models.kimi_k25 import image_processing_kimi_k25 as ipk
    case = os.path.join(out_dir, "k25_preprocess")
    shutil.rmtree(case, ignore_errors=True)
    os.makedirs(case)
    # Small limits so that these sizes shrink (and one fits as is): patch 14, 64 patches at most,
    # 10 patches per side.
    kw = dict(patch_size=14, merge_size=2, max_patches=64, size={"max_height": 10,
                                                                 "max_width": 10})
    proc = ipk.Kimi_K25ImageProcessor(**kw)
    rng = np.random.default_rng(5)
    sizes = [(97, 131), (200, 60), (56, 84), (300, 301)]
    captured = []
    orig_resize = proc.resize

    def resize(images, size, resample, **k):
        r = orig_resize(images, size=size, resample=resample, **k)
        captured.append(r.clone())
        return r
    proc.resize = resize
    tensors = {}
    for i, (h, w) in enumerate(sizes):
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([128 + 100 * np.sin(xx / (3 + c) + yy / (5 + 2 * c)) for c in range(3)], -1)
        img = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
        write_png(os.path.join(case, f"image_{i}.png"), img)
        captured.clear()
        out = proc(images=[img], return_tensors="pt")
        resized = captured[0][0].permute(1, 2, 0).contiguous() if captured else torch.from_numpy(img)
        tensors[f"resized_{i}"] = resized.to(torch.int32)  # the engine reads no U8
        pv = out["pixel_values"]
        tensors[f"pixel_values_{i}"] = pv.reshape(pv.shape[0], -1).float().contiguous()
        tensors[f"image_grid_thw_{i}"] = out["image_grid_thw"].to(torch.int64).contiguous()
    # Not outputs.safetensors: test_golden runs every directory holding one as a model case.
    save_file(tensors, os.path.join(case, "preprocess.safetensors"),
              metadata={"processor": json.dumps(kw), "images": str(len(sizes))})
    print(f"k25_preprocess: {len(sizes)} images")


def versions():
    import safetensors
    import transformers
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "safetensors": safetensors.__version__,
            "device": "cpu"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    only = set(a.only.split(",")) if a.only else None
    for spec in CASES:
        if only is None or spec["name"] in only:
            write_case(a.out, spec)
            with open(os.path.join(a.out, spec["name"], "versions.json"), "w") as fh:
                json.dump(versions(), fh, indent=2)
    if only is None or "k25_preprocess" in only:
        write_preprocess(a.out)
        with open(os.path.join(a.out, "k25_preprocess", "versions.json"), "w") as fh:
            json.dump(versions(), fh, indent=2)


if __name__ == "__main__":
    main()
