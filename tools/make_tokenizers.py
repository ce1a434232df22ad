#!/usr/bin/env python3
"""Small tokenizers trained with the reference libraries under real models' settings, and the ids
those libraries give for a hard corpus: what tests/io/test_hf_tokenizer.cpp compares the engine's
C++ tokenizers with, token for token (CI then needs no Python).

    <out>/corpus.json          list of test strings (code, prose, CJK, emoji, combining marks,
                               CRLF, whitespace runs, long digit runs, special tokens in text)
    <out>/deepseek_v3/         tokenizer.json + tokenizer_config.json: HF `tokenizers` BPE with
                               DeepSeek-V3's normaliser (none), Split x3 + ByteLevel pre-tokenizer
    <out>/qwen3/               the same with Qwen3's (NFC; one Split + ByteLevel)
    <out>/kimi/                tiktoken.model + tokenizer_config.json: tiktoken's BPE trainer with
                               Kimi's pattern, 256 reserved special ids above the ranks
    <out>/goldens.json         {family: [ids per corpus string]}, from `tokenizers` (encode without
                               added specials) and `tiktoken` (allowed_special="all")
    <out>/versions.json

Needs tokenizers, tiktoken (pip) and transformers (for the chat-template golden, tools/chat_ids.py).
Usage: python3 tools/make_tokenizers.py --out tests/tokenizer
"""
import argparse
import base64
import glob
import json
import os
import random
import unicodedata

import chat_ids
from tokenizer_util import KIMI_PAT, kimi_encoding, render_chat

DEEPSEEK_SPLITS = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
QWEN3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DS_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>",
               "<｜Assistant｜>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
KIMI_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
                 6: "<|im_system|>", 7: "<|im_middle|>"}

# Chat templates in the models' shapes (shortened): what tools/chat_ids.py renders.
DS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
    "{% elif m['role'] == 'assistant' %}{{ '<｜Assistant｜>' + m['content'] + '<｜end▁of▁sentence｜>' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}")
QWEN_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
KIMI_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ '<|im_system|>system<|im_middle|>' }}"
    "{% elif m['role'] == 'user' %}{{ '<|im_user|>user<|im_middle|>' }}"
    "{% else %}{{ '<|im_assistant|>assistant<|im_middle|>' }}{% endif %}"
    "{{ m['content'] }}{{ '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_assistant|>assistant<|im_middle|>' }}{% endif %}")


def corpus():
    s = [
        "Hello, world! It's a test: we'll see what they've done.",
        "def f(x):\r\n    return x ** 2  # square\r\n\r\n\tif x:\n\t\tpass\n",
        "    \n\n   trailing spaces   \n",
        "数字3.14159265358979323846和中文混合，日本語のひらがなとカタカナ。한국어 문장입니다.",
        "Emoji 😀🎉👩‍👩‍👧‍👦 and flags 🇯🇵🇫🇷 and ZWJ ❤️‍🔥",
        "Combining: e\u0301 a\u0300 n\u0303 o\u0308 (decomposed) vs é à ñ ö (precomposed) Å",
        "Digits 1234567890123456789012345 and 007, 3,000,000.50 $12.99 ٣٤٥ ૧૨૩",
        "Runs:\t\t\t  \u00a0\u00a0x\u2003y\u3000z \u0085 end  ",
        "CamelCaseWords and UPPERCASE and lowercase, McDonald's O'Neil DON'T I'M",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
        "Mixed 中文English混合text日本語とEnglish",
        "Special tokens in text: <|im_end|> <｜User｜>hi<｜Assistant｜> [EOS] <|endoftext|>",
        "x" * 3 + " " * 17 + "y\r\n\r\n\r\n" + "-" * 40 + "==>",
        "Grüße aus Köln — „Anführungszeichen“ and «guillemets» … ‘quotes’",
        "Ελληνικά και русский текст, עִבְרִית, العربية",
        "URL https://example.com/a/b?c=d&e=f#g and email a.b@c.de",
        "",
        " ",
        "\n",
        "a\u200bb\u200dc\ufeffd",
    ]
    # Random strings over the characters where pre-tokenizer rules meet: letters of several cases
    # and scripts, marks, digits of several scripts, punctuation, symbols, every kind of space.
    rng = random.Random(17)
    alphabet = list("aZ'sltdmrevI ") + ["\t", "\r", "\n", "\r\n", "  ", "\u00a0", "\u0085",
                                          "\u2003", "\u3000", "\u0301", "\u0308", "\u20dd"]
    alphabet += list("0123456789٣૧²½.,;:!?-_/\\\"#$%&()[]{}<>@^`|~+=*") + list("ÀéñÅßſǅʰΣωжЖ")
    alphabet += list("中文字龥ぁゟァヿ한국𠀀") + ["😀", "👩\u200d👧", "🇯🇵", "❤\ufe0f"]
    alphabet += ["<|im_end|>", "[EOS]", "<｜User｜>", "<|endoftext|>"]
    for _ in range(120):
        s.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))))
    return s


def training_texts(repo):
    texts = []
    for p in sorted(glob.glob(os.path.join(repo, "docs", "*.md"))) + [os.path.join(repo, "README.md")]:
        with open(p, encoding="utf-8") as f:
            texts.append(f.read())
    return texts + corpus() * 3


def hf_bpe(texts, vocab, specials, normalizer, splits):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC() if normalizer == "NFC" else normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


CONVERSATIONS = [
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Sum 2+2?"},
     {"role": "assistant", "content": "4."}, {"role": "user", "content": "和 3+3？"},
     {"role": "assistant", "content": "六 (6) 😀"}],
    [{"role": "user", "content": "Write hello in C.\r\n"},
     {"role": "assistant", "content": "int main() {\n    puts(\"hello\");\n}\n"}],
    [{"role": "user", "content": "  spaces   and\ttabs  "}, {"role": "assistant", "content": " ok "},
     {"role": "user", "content": "1234567890"}, {"role": "assistant", "content": "０１２ e\u0301"}],
]


def write_chat(out):
    """chat.jsonl (conversations), chat_<family>.ids.jsonl (tools/chat_ids.py's output, what
    `data prepare` reads) and chat_goldens.json: per family and conversation the ids of
    transformers' apply_chat_template (tiktoken: transformers' renderer + tiktoken) and the text of
    each assistant turn as the template renders it (the rendered conversation through the turn
    minus the one before it with the generation prompt), for the loss mask."""
    from transformers import AutoTokenizer
    with open(os.path.join(out, "chat.jsonl"), "w") as f:
        for c in CONVERSATIONS:
            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
    goldens = {}
    for fam in ("deepseek_v3", "qwen3", "kimi"):
        d = os.path.join(out, fam)
        with open(os.path.join(d, "tokenizer_config.json")) as f:
            cfg = json.load(f)

        def text(msgs, gen):
            return render_chat(cfg, msgs, gen)
        render = chat_ids.load(d)
        fam_gold = {"ids": [], "assistant": []}
        with open(os.path.join(out, f"chat_{fam}.ids.jsonl"), "w") as f:
            for c in CONVERSATIONS:
                ids, labels = chat_ids.to_ids(render, c)
                if fam == "kimi":
                    ref = render(c, False)
                else:
                    tok = AutoTokenizer.from_pretrained(d)
                    ref = list(tok.apply_chat_template(c, tokenize=True)["input_ids"])
                assert ids == ref, fam
                f.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
                fam_gold["ids"].append(ref)
                # As the engine decodes it: qwen3's tokenizer normalises to NFC.
                norm = (lambda t: unicodedata.normalize("NFC", t)) if fam == "qwen3" else str
                fam_gold["assistant"].append(
                    [norm(text(c[:k + 1], False)[len(text(c[:k], True) if k else ""):])
                     for k, m in enumerate(c) if m["role"] == "assistant"])
        goldens[fam] = fam_gold
    write_json(os.path.join(out, "chat_goldens.json"), goldens)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=512, help="HF tokenizers' vocabulary (specials included)")
    ap.add_argument("--kimi-ranks", type=int, default=768, help="tiktoken ranks (+256 reserved)")
    args = ap.parse_args()
    import tiktoken
    import tokenizers
    import transformers
    from tiktoken import _educational

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    texts = training_texts(repo)
    os.makedirs(args.out, exist_ok=True)
    cases = corpus()
    write_json(os.path.join(args.out, "corpus.json"), cases)
    goldens = {}

    for fam, specials, norm, splits, cfg in [
        ("deepseek_v3", DS_SPECIALS, None, DEEPSEEK_SPLITS,
         {"add_bos_token": True, "add_eos_token": False, "bos_token": DS_SPECIALS[0],
          "eos_token": DS_SPECIALS[1], "pad_token": DS_SPECIALS[2], "chat_template": DS_TEMPLATE,
          "tokenizer_class": "LlamaTokenizerFast", "legacy": True, "model_max_length": 4096}),
        ("qwen3", QWEN_SPECIALS, "NFC", [QWEN3_SPLIT],
         {"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>",
          "pad_token": "<|endoftext|>", "chat_template": QWEN_TEMPLATE,
          "tokenizer_class": "Qwen2TokenizerFast", "model_max_length": 4096})]:
        d = os.path.join(args.out, fam)
        os.makedirs(d, exist_ok=True)
        tok = hf_bpe(texts, args.vocab, specials, norm, splits)
        tok.save(os.path.join(d, "tokenizer.json"))
        write_json(os.path.join(d, "tokenizer_config.json"), cfg)
        goldens[fam] = [tok.encode(c, add_special_tokens=False).ids for c in cases]
        for c, ids in zip(cases, goldens[fam]):
            if norm is None:
                assert tok.decode(ids, skip_special_tokens=False) == c, c

    # Kimi: tiktoken's own trainer (its `regex` module has no class intersection, so it trains on
    # the pattern without `&&[^\p{Han}]`: only which merges exist depends on that); encoding
    # below uses the verbatim pattern.
    train_pat = KIMI_PAT.replace(r"&&[^\p{Han}]", "")
    ranks = _educational.bpe_train("".join(texts)[:60000], args.kimi_ranks, train_pat, visualise=None)
    d = os.path.join(args.out, "kimi")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tiktoken.model"), "w") as f:
        for b, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(b).decode()} {r}\n")
    n = len(ranks)
    named = {n + off: content for off, content in KIMI_SPECIALS.items()}
    decoder = {str(i): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True} for i, content in named.items()}
    write_json(os.path.join(d, "tokenizer_config.json"),
               {"added_tokens_decoder": decoder, "bos_token": "[BOS]", "eos_token": "[EOS]",
                "pad_token": "[EOS]", "chat_template": KIMI_TEMPLATE, "model_max_length": 4096,
                "tokenizer_class": "TikTokenTokenizer"})
    enc = kimi_encoding("kimi_small", ranks, named)
    goldens["kimi"] = [enc.encode(c, allowed_special="all") for c in cases]
    for c, ids in zip(cases, goldens["kimi"]):
        assert enc.decode(ids) == c, c
    with open(os.path.join(args.out, "goldens.json"), "w") as f:
        f.write("{\n" + ",\n".join(
            f' "{k}": [\n' + ",\n".join("  " + json.dumps(x) for x in v) + "\n ]"
            for k, v in goldens.items()) + "\n}\n")
    write_chat(args.out)
    write_json(os.path.join(args.out, "versions.json"),
               {"tokenizers": tokenizers.__version__, "tiktoken": tiktoken.__version__,
                "transformers": transformers.__version__})
    print({k: sum(len(x) for x in v) for k, v in goldens.items()})


if __name__ == "__main__":
    main()
