#!/usr/bin/env python3
"""The synthetic image-text task of the vision demo (bench/RESULTS.md, "Vision demo"), and the
tiny random kimi_k25 model it fine-tunes.

Each example is a small RGB PNG holding one filled shape (circle, square, triangle or cross) in
one colour (red, green, blue or yellow), at a random place and size on a noisy dark background,
with one of two questions and its one-word answer:
    {"content": [{"prompt": "what colour is it? "}, {"image": "img/00012.png"}, {"text": "red"}]}
    {"content": [{"prompt": "what shape is it? "}, {"image": "img/00013.png"}, {"text": "circle"}]}
Every (question, answer) pair occurs equally often in each split, so a model that ignores the
image and always gives one answer per question scores exactly chance (1 / 4). The blank control
(DIR/blank/) is the same task with every image a uniform grey: nothing in it tells the answers
apart, so a model trained on it must stay at chance.

Writes:
    DIR/train.jsonl, DIR/heldout.jsonl, DIR/img/*.png          the task
    DIR/blank/train.jsonl, DIR/blank/heldout.jsonl, DIR/blank/blank.png    the control
    DIR/text.txt                      the questions and answers as %-separated documents, to
                                      train a tokenizer on (data prepare --separator %)
    DIR/model/ (with --model-vocab)   a random kimi_k25 (transformers 5.24, torch): config.json
                                      + model.safetensors, image_token_id = --image-token-id

Images need only the standard library (zlib); the model needs torch and transformers.
Usage: python3 tools/make_vision_demo.py --out DIR [--train 1024] [--heldout 256] [--side 24]
           [--seed 1] [--model-vocab 304 --image-token-id 300]
"""
import argparse
import json
import math
import os
import random
import struct
import zlib

COLOURS = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (50, 80, 230),
           "yellow": (230, 220, 40)}
SHAPES = ["circle", "square", "triangle", "cross"]
QUESTIONS = {"colour": "what colour is it? ", "shape": "what shape is it? "}


def write_png(path, pixels, side):
    """pixels: rows of (r, g, b) tuples; an 8-bit RGB PNG, no filter."""
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
        f.write(chunk(b"IEND", b""))


def inside(shape, x, y, cx, cy, r):
    dx, dy = x - cx, y - cy
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        return abs(dx) <= r * 0.8 and abs(dy) <= r * 0.8
    if shape == "triangle":  # apex up, base at cy + r
        return -r <= dy <= r and abs(dx) <= (dy + r) / 2
    return (abs(dx) <= r * 0.3 and abs(dy) <= r) or (abs(dy) <= r * 0.3 and abs(dx) <= r)


def render(rng, shape, colour, side):
    r = rng.uniform(side * 0.28, side * 0.4)
    cx = rng.uniform(r, side - r)
    cy = rng.uniform(r, side - r)
    base = COLOURS[colour]
    rows = []
    for y in range(side):
        row = []
        for x in range(side):
            if inside(shape, x + 0.5, y + 0.5, cx, cy, r):
                px = tuple(max(0, min(255, c + rng.randint(-20, 20))) for c in base)
            else:
                v = rng.randint(0, 40)
                px = (v, v, v)
            row.append(px)
        rows.append(row)
    return rows


def examples(rng, n):
    """n examples, every (question, answer) pair equally often (n a multiple of 8)."""
    assert n % 8 == 0, "split sizes must be multiples of 8 (2 questions x 4 answers)"
    out = []
    for i in range(n):
        question = "colour" if i % 2 == 0 else "shape"
        k = (i // 2) % 4
        colour = list(COLOURS)[k] if question == "colour" else rng.choice(list(COLOURS))
        shape = SHAPES[k] if question == "shape" else rng.choice(SHAPES)
        out.append((question, colour, shape))
    rng.shuffle(out)
    return out


def write_split(rng, out, name, n, side, blank_dir):
    lines, blank_lines = [], []
    os.makedirs(os.path.join(out, "img"), exist_ok=True)
    for question, colour, shape in examples(rng, n):
        img = "img/%s_%05d.png" % (name, len(lines))
        write_png(os.path.join(out, img), render(rng, shape, colour, side), side)
        answer = colour if question == "colour" else shape
        lines.append({"content": [{"prompt": QUESTIONS[question]}, {"image": img},
                                  {"text": answer}]})
        blank_lines.append({"content": [{"prompt": QUESTIONS[question]}, {"image": "blank.png"},
                                        {"text": answer}]})
    for d, ls in ((out, lines), (blank_dir, blank_lines)):
        with open(os.path.join(d, name + ".jsonl"), "w") as f:
            for line in ls:
                f.write(json.dumps(line) + "\n")


def write_model(out, vocab, image_token, seed):
    import torch
    import transformers
    vision = dict(patch_size=4, pos_emb_height=6, pos_emb_width=6, pos_emb_time=4,
                  num_attention_heads=2, num_hidden_layers=2, hidden_size=32,
                  intermediate_size=64, hidden_act="gelu_pytorch_tanh", merge_kernel_size=[2, 2])
    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8,
                v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
                first_k_dense_replace=1, rms_norm_eps=1e-6, num_nextn_predict_layers=0,
                tie_word_embeddings=False, pad_token_id=None, bos_token_id=1, eos_token_id=2,
                model_type="deepseek_v3")
    cfg = transformers.Kimi_K25Config(
        text_config=text, vision_config=vision, projection_hidden_size=vision["hidden_size"],
        projection_layer_norm_eps=1e-5, image_token_id=image_token,
        video_token_id=image_token + 1, vision_start_token_id=image_token + 2,
        vision_end_token_id=image_token + 3, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.Kimi_K25ForConditionalGeneration(cfg).to(torch.float32)
    model.save_pretrained(os.path.join(out, "model"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", type=int, default=1024)
    ap.add_argument("--heldout", type=int, default=256)
    ap.add_argument("--side", type=int, default=24, help="image side in pixels")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model-vocab", type=int, default=0, help="also write DIR/model")
    ap.add_argument("--image-token-id", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    blank_dir = os.path.join(a.out, "blank")
    os.makedirs(blank_dir, exist_ok=True)
    write_png(os.path.join(blank_dir, "blank.png"), [[(128, 128, 128)] * a.side] * a.side, a.side)
    with open(os.path.join(a.out, "text.txt"), "w") as f:
        for _ in range(8):
            for question, answers in (("colour", list(COLOURS)), ("shape", SHAPES)):
                for answer in answers:
                    f.write(QUESTIONS[question] + answer + "\n%\n")
    write_split(rng, a.out, "train", a.train, a.side, blank_dir)
    write_split(rng, a.out, "heldout", a.heldout, a.side, blank_dir)
    if a.model_vocab:
        assert 0 <= a.image_token_id < a.model_vocab - 3, "image token (and the 3 after it) in vocab"
        write_model(a.out, a.model_vocab, a.image_token_id, a.seed)
    print("wrote %d train + %d held-out examples (and the blank control) to %s"
          % (a.train, a.heldout, a.out))


if __name__ == "__main__":
    main()
