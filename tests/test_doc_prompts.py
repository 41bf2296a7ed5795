"""Every prompt the README, docs and examples show for the demo model renders what it says.

A newcomer copies these first. Each must use only words shapes-wan was trained on (its
tokenizer is word-level: an unknown word becomes <unk>, and the clip a blob), name a
colour, a shape and a direction the detector can read back, and render that clip.
docs/H3C.md is left out: its prompts are for MiniMax-H3 on h3.c, whose tokenizer has
no closed vocabulary.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from h3render.demo_data import parse_caption
from h3render.engine.builtin import DATA_DIR

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "H3C.md")]
OTHER_MODEL = re.compile(r"--model (?!shapes-wan)\S+")


def documented_prompts() -> dict[str, list[str]]:
    """prompt -> where it is shown, for every shapes-wan prompt shown to users."""
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if OTHER_MODEL.search(line):
                continue
            for p in re.findall(r'--prompt "([^"]+)"', line) + re.findall(r'^prompt = \[(.+)\]', line):
                for q in re.findall(r'"([^"]+)"', f'"{p}"' if '"' not in p else p):
                    if q != "...":
                        found.setdefault(q, []).append(f"{doc.relative_to(ROOT)}:{n}")
    for ex in sorted((ROOT / "examples" / "comfyui").glob("*_api.json")):
        for node in json.loads(ex.read_text()).values():
            inputs = node.get("inputs", {})
            if inputs.get("model") != "shapes-wan":
                continue
            for key in ("prompt", "prompts"):
                for q in str(inputs.get(key) or "").splitlines():
                    if q.strip():
                        found.setdefault(q.strip(), []).append(str(ex.relative_to(ROOT)))
    return found


PROMPTS = documented_prompts()


def test_the_docs_show_demo_prompts():
    assert len(PROMPTS) >= 3, PROMPTS
    places = [w for ws in PROMPTS.values() for w in ws]
    assert any(w.startswith("README") for w in places) and any(w.startswith("examples") for w in places)


@pytest.mark.parametrize("prompt", sorted(PROMPTS))
def test_documented_prompt_is_in_the_vocabulary_and_names_what_to_check(prompt):
    vocab = json.loads((DATA_DIR / "shapes-wan" / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    words = re.findall(r"[a-z]+|[^\sa-z]", prompt.lower())
    unknown = [w for w in words if w not in vocab]
    assert not unknown, f"{PROMPTS[prompt]}: {prompt!r} has words shapes-wan never saw: {unknown}"
    named = parse_caption(prompt)
    assert all(named.values()), f"{PROMPTS[prompt]}: {prompt!r} names {named}"


def test_documented_prompts_render_what_they_say(converted_models):
    """About 5 s: each distinct prompt once with shapes-wan at f16, read back by the detector."""
    from h3render.engine.eval_demo import check_prompt, render_prompts

    model = converted_models("shapes-wan", ("f16",))
    prompts = sorted(PROMPTS)
    clips = render_prompts(model, [SimpleNamespace(caption=p) for p in prompts], "f16", seed=1, threads=2)
    misses = []
    for p, clip in zip(prompts, clips):
        marks = check_prompt(p, clip)
        print(f"{PROMPTS[p]}: {p!r} -> {marks}")
        misses += [(p, a) for a, ok in marks.items() if ok is False]
    # colour and direction are followed on 100% of held-out prompts (docs/DEMO_MODEL.md), shape on
    # about 3 in 4: a documented prompt may miss its shape, never its colour or direction
    assert not [m for m in misses if m[1] != "shape"], misses
    assert len(misses) <= len(prompts) // 2, misses
