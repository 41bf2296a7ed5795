"""The words a model knows, and the words of a prompt it does not.

A word-level tokenizer (the built-in models' tokenizer.json, made by
h3render.engine.tokenize.word_level_tokenizer) maps every word it never saw to <unk>:
the text encoder learns nothing from it, and the render ignores it without a word. A
model with such a tokenizer publishes its words with its engine info (key "vocabulary",
h3render.queue.engine_info), and a prompt's words outside them get a warning naming them
and listing the words the model knows. A sub-word tokenizer (UMT5's SentencePiece)
covers any text: it has no vocabulary to publish, and its prompts get no such warning.

The check tokenizes as the engine's tokenizer does (the same normalizer, pre-tokenizer and
prompt cleaning), rebuilt from the published words, so a machine without the model
warns the same as the worker that has it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from h3render.queue.rules import short

LISTED_WORDS = 120  # a longer vocabulary is listed up to this many words, then "and N more"


def tokenizer_words(path: Path) -> list[str] | None:
    """The words of a word-level tokenizer.json, sorted, without its special tokens; None when
    the file is missing, unreadable or not word-level (a sub-word tokenizer knows any word)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordLevel" or not isinstance(model.get("vocab"), dict):
        return None
    special = {t.get("content") for t in doc.get("added_tokens") or [] if isinstance(t, dict) and t.get("special")}
    return sorted(w for w in model["vocab"] if isinstance(w, str) and w not in special)


def local_words(model: str) -> list[str] | None:
    """The vocabulary of `model` as installed on this machine (or shipped built in), read from
    its tokenizer.json without converting anything; None when it has none here."""
    try:
        from h3render import paths
        from h3render.engine.builtin import BUILTIN
        from h3render.engine.models import validate_name

        validate_name(model)
        candidates = [paths.models_dir() / model / "tokenizer.json"]
        if model in BUILTIN:
            candidates.append(BUILTIN[model] / "tokenizer" / "tokenizer.json")
    except Exception:  # noqa: BLE001 - a name that cannot be a model has no vocabulary here
        return None
    for path in candidates:
        if path.is_file():
            return tokenizer_words(path)
    return None


@lru_cache(maxsize=8)
def _tokenizer(words: tuple[str, ...]):
    from h3render.engine.tokenize import word_level_tokenizer

    return word_level_tokenizer(list(words))


def _encode(prompt: str, words: list[str]):
    from h3render.engine.tokenize import clean_prompt

    text = clean_prompt(prompt)
    return text, _tokenizer(tuple(words)).encode(text, add_special_tokens=True)


def unknown_words(prompt: str, words: list[str]) -> list[str]:
    """The words of `prompt` (as written, each once, in order) the vocabulary `words` lacks."""
    text, enc = _encode(prompt, words)
    unk = _tokenizer(tuple(words)).token_to_id("<unk>")
    seen: dict[str, None] = {}
    for token_id, (a, b) in zip(enc.ids, enc.offsets):
        if token_id == unk:
            seen.setdefault(text[a:b], None)
    return list(seen)


def token_count(prompt: str, words: list[str]) -> int:
    """How many tokens the text encoder would be given for `prompt`, </s> included, untruncated."""
    return len(_encode(prompt, words)[1].ids)


def listing(words: list[str]) -> str:
    """The words a model knows, for a message: punctuation left out, long lists cut."""
    shown = [w for w in words if any(c.isalnum() for c in w)]
    more = len(shown) - LISTED_WORDS
    return ", ".join(shown[:LISTED_WORDS]) + (f" and {more} more" if more > 0 else "")


def prompt_warnings(field: str, prompt: str, words: list[str], model: str, text_len: int | None) -> list[str]:
    """Warnings for one prompt field against a published vocabulary: words the model never saw
    (it renders as if they were not there), and tokens past text_len (the encoder drops them)."""
    out = []
    unknown = unknown_words(prompt, words)
    if unknown:
        names = short(", ".join(repr(w) for w in unknown))
        out.append(f"{field}: {len(unknown)} word{'s' if len(unknown) > 1 else ''} not in the vocabulary of "
                   f"model {model!r}, rendered as if absent: {names}; the words it knows: {listing(words)}")
    if text_len:
        n = token_count(prompt, words)
        if n > text_len:
            out.append(f"{field}: {n} tokens, and model {model!r} reads the first {text_len} (</s> included); "
                       "the rest is ignored")
    return out
