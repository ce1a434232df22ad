#!/usr/bin/env python3
"""Chat / instruction data through a model's own chat template: conversations in, token ids with
the loss masked to the assistant's replies out, in the JSON-lines form `moetrain data prepare`
reads ({"input_ids": [...], "labels": [...]}, labels = the id where the loss counts, else -100).

    input:  one conversation per line, {"messages": [{"role": "user", "content": "..."}, ...]}
            (roles as the template knows them; optional "tools")
    output: one {"input_ids", "labels"} line per conversation

The ids are transformers' `apply_chat_template(messages, tokenize=True)` for the model directory's
tokenizer (tokenizer.json). A tiktoken directory (Kimi: tiktoken.model, whose tokenizer class
ships as remote code) renders the same template with transformers' renderer and encodes it with
tiktoken and Kimi's pattern, special tokens allowed. An assistant message's tokens are the ones
between the conversation rendered up to it with the generation prompt and rendered through it, so
the template must render each conversation prefix as a prefix of the next (checked; most are).

Usage: python3 tools/chat_ids.py --model DIR --input chats.jsonl --out chats.ids.jsonl
       moetrain data prepare chats.ids.jsonl --tokenizer DIR --out data
"""
import argparse
import base64
import json
import os
import sys

from tokenizer_util import content, kimi_encoding, render_chat

IGNORE = -100


class TiktokenChat:
    """A tiktoken directory: template rendered by transformers, text encoded by tiktoken."""

    def __init__(self, model_dir):
        ranks = {}
        with open(os.path.join(model_dir, "tiktoken.model")) as f:
            for line in f:
                if line.strip():
                    b64, r = line.split()
                    ranks[base64.b64decode(b64)] = int(r)
        with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
            self.cfg = json.load(f)
        named = {int(k): content(v) for k, v in self.cfg.get("added_tokens_decoder", {}).items()}
        self.enc = kimi_encoding("model", ranks, named)

    def __call__(self, messages, add_generation_prompt, tools=None):
        text = render_chat(self.cfg, messages, add_generation_prompt, tools)
        return self.enc.encode(text, allowed_special="all")


class HfChat:
    def __init__(self, model_dir):
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(model_dir)

    def __call__(self, messages, add_generation_prompt, tools=None):
        out = self.tok.apply_chat_template(messages, tools=tools, tokenize=True,
                                           add_generation_prompt=add_generation_prompt)
        return list(out["input_ids"] if hasattr(out, "keys") else out)


def load(model_dir):
    if os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        return HfChat(model_dir)
    return TiktokenChat(model_dir)


def to_ids(render, messages, tools=None, where="conversation"):
    """(input_ids, labels) of one conversation; labels keep the assistant messages' tokens."""
    ids = render(messages, False, tools)
    labels = [IGNORE] * len(ids)
    for k, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        before = render(messages[:k], True, tools) if k else []
        through = render(messages[:k + 1], False, tools)
        for part, name in ((before, "before"), (through, "through")):
            if ids[:len(part)] != part:
                sys.exit(f"{where}: the chat template does not render the conversation {name} "
                         f"message {k} as a prefix of the whole; cannot place the loss mask")
        labels[len(before):len(through)] = ids[len(before):len(through)]
    return ids, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model (or tokenizer) directory")
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    render = load(args.model)
    tmp = args.out + ".tmp"
    n = 0
    with open(args.input, encoding="utf-8") as f, open(tmp, "w") as out:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            conv = json.loads(line)
            ids, labels = to_ids(render, conv["messages"], conv.get("tools"), f"{args.input}:{i}")
            out.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
            n += 1
    os.replace(tmp, args.out)
    print(f"{args.out}: {n} conversations")


if __name__ == "__main__":
    main()
