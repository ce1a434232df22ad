"""What tools/chat_ids.py and tools/make_tokenizers.py share: Kimi's tiktoken setting (pattern,
reserved special ids) and rendering a tokenizer_config.json's chat template to text."""

# tokenization_kimi.py's pat_str, verbatim (tiktoken's regex engine has class intersection).
KIMI_PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
KIMI_RESERVED = 256  # special ids right above the ranks, "<|reserved_token_ID|>" unless named


def content(tok):
    """An added token's text: tokenizer_config.json writes it as a string or as a dict."""
    return tok.get("content") if isinstance(tok, dict) else tok


def kimi_encoding(name, ranks, named):
    """tiktoken's Encoding for Kimi's pattern: BPE ranks {bytes: rank} and the reserved special
    ids above them, those in `named` ({id: text}) under their own text."""
    import tiktoken
    n = len(ranks)
    names = {n + i: f"<|reserved_token_{n + i}|>" for i in range(KIMI_RESERVED)}
    names.update(named)
    return tiktoken.Encoding(name=name, pat_str=KIMI_PAT, mergeable_ranks=ranks,
                             special_tokens={v: k for k, v in names.items()})


def render_chat(cfg, messages, add_generation_prompt, tools=None):
    """The text of a conversation through the chat template of tokenizer_config.json `cfg`, as
    transformers renders it (its special tokens' texts passed in as variables)."""
    from transformers.utils.chat_template_utils import render_jinja_template
    kw = {k: content(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token")}
    text = render_jinja_template([messages], tools=tools, chat_template=cfg["chat_template"],
                                 add_generation_prompt=add_generation_prompt, **kw)
    text = text[0] if isinstance(text, tuple) else text
    return text[0] if isinstance(text, list) else text
