"""docs/PERFORMANCE.md as one section per machine: `make bench` replaces its own.

A section is the report of one `make bench` run, keyed by CPU model, engine
kernel set and thread count. Writing a new run replaces the section with the
same key and keeps every other one verbatim, newest first, so the file gathers
every machine the bench has run on (the ratios differ a lot between, say, an
AVX-512 VNNI core and an AVX2-only one) instead of only the last.
"""

from __future__ import annotations

import re

HEADER = """# Performance

Written by `make bench` (bench/bench_speed.py). Each section is one run on one
machine, every ratio in it measured in that run, the two sides timed back to back
on the same threads (best of the repeats). The machines are shared with other jobs,
so absolute times move between runs; the ratios are what to read.

`make bench` replaces the section of the machine it runs on (same CPU model, engine
kernels and thread count) and keeps the others, newest first; text added by hand
inside a section goes when that machine's section is rewritten.
"""

_BEGIN = "<!-- bench-machine: {key} -->"
_END = "<!-- /bench-machine -->"
_SECTION = re.compile(r"<!-- bench-machine: (?P<key>.+?) -->\n.*?<!-- /bench-machine -->\n?", re.S)


def machine_key(cpu: str, simd: str, threads: int) -> str:
    """The identity of a section: CPU model, kernel set and threads."""
    cpu = " ".join(cpu.split()).replace("--", "-")  # the key lives inside an HTML comment
    return f"{cpu} | {simd} | {threads} threads"


def sections(text: str) -> list[tuple[str, str]]:
    """(key, whole section text with its markers) in file order."""
    return [(m.group("key"), m.group(0).rstrip("\n") + "\n") for m in _SECTION.finditer(text)]


def merge(existing: str | None, key: str, body: str) -> str:
    """The file with `body` as the section for `key`: first, and the others kept verbatim."""
    new = f"{_BEGIN.format(key=key)}\n{body.strip()}\n{_END}\n"
    kept = [text for k, text in sections(existing or "") if k != key]
    return HEADER + "\n" + "\n".join([new, *kept])
