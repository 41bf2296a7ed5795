"""Turn a prompt into the token ids the engine's text encoder takes.

Mirrors what diffusers' WanPipeline does before its UMT5 encoder:

    prompt_clean(text)                       # ftfy if installed, html-unescape twice,
                                             # collapse whitespace, strip
    tokenizer(text, max_length=text_len, truncation=True, add_special_tokens=True)

The post-processor in tokenizer.json appends </s>; truncation keeps room for it.
The pipeline then pads to text_len and zeroes the padded rows of the encoder
output; the engine does that padding itself, so only the real tokens are
returned here (the attention mask's ones).
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from h3render.engine.exceptions import ModelFileError

TOKENIZER_FILE = "tokenizer.json"
# T5's special tokens, at the ids UMT5 gives them.
SPECIAL_TOKENS = ["<pad>", "</s>", "<unk>"]


def word_level_tokenizer(words: list[str]) -> Tokenizer:
    """A T5-style word-level tokenizer over `words` (ids after the special tokens):
    NFKC and lower-casing, whitespace split, </s> appended. The built-in demo models
    ship one, saved as their tokenizer.json."""
    from tokenizers import normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    vocab = {w: i for i, w in enumerate(SPECIAL_TOKENS + [w for w in words if w not in SPECIAL_TOKENS])}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def clean_prompt(text: str) -> str:
    """The Wan pipeline's prompt_clean: fix text, unescape HTML, collapse whitespace."""
    try:  # diffusers applies ftfy only when it is installed; so do we
        import ftfy  # type: ignore[import-not-found]

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


class PromptTokenizer:
    """A tokenizer.json loaded once, encoding prompts to at most text_len ids."""

    def __init__(self, path: Path, text_len: int):
        if text_len < 1:
            raise ValueError(f"text_len={text_len} must be at least 1")
        path = Path(path)
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise ModelFileError(f"{path}: cannot load tokenizer: {exc}") from exc
        tok.no_padding()
        tok.enable_truncation(max_length=text_len)
        self.path, self.text_len, self._tok = path, text_len, tok

    def encode(self, prompt: str) -> np.ndarray:
        """Token ids (n,) int32 with n <= text_len, ending with </s>."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
        ids = self._tok.encode(clean_prompt(prompt), add_special_tokens=True).ids
        return np.asarray(ids, dtype=np.int32)


@lru_cache(maxsize=8)
def _cached(path: str, mtime_ns: int, text_len: int) -> PromptTokenizer:
    return PromptTokenizer(Path(path), text_len)


def load_tokenizer(model_dir: Path, text_len: int) -> PromptTokenizer:
    """The tokenizer of a model directory (its tokenizer.json), cached per file version."""
    path = Path(model_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise ModelFileError(f"{path}: missing; the model directory needs its tokenizer.json")
    return _cached(str(path), path.stat().st_mtime_ns, text_len)
