"""docs/PERFORMANCE.md keeps one section per machine: `make bench` replaces only its own."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from perf_report import HEADER, machine_key, merge, sections  # noqa: E402


def test_a_new_machine_goes_first_and_the_others_stay_verbatim():
    zen4 = machine_key("AMD EPYC", "avx512-vnni", 2)
    xeon = machine_key("Intel(R) Xeon(R) Processor", "avx512-vnni", 2)
    text = merge(merge(None, xeon, "## Xeon\n\n| f16 | 0.60x |\n\nnote added by hand"), zen4, "## Zen 4\n| q8_0 | 1.57x |")
    assert text.startswith(HEADER)
    assert [k for k, _ in sections(text)] == [zen4, xeon]

    zen3 = machine_key("AMD EPYC", "avx2", 2)
    after = merge(text, zen3, "## Zen 3\n| q8_0 | 0.80x |")
    assert [k for k, _ in sections(after)] == [zen3, zen4, xeon]
    assert dict(sections(after))[xeon] == dict(sections(text))[xeon]
    assert "note added by hand" in after
    assert after.count("# Performance") == 1


def test_the_same_machine_replaces_its_section():
    key = machine_key("AMD EPYC", "avx2", 2)
    other = machine_key("AMD EPYC", "avx2", 1)  # another thread count is another section
    text = merge(merge(None, other, "## one thread\nold"), key, "## two threads\nfirst run")
    again = merge(text, key, "## two threads\nsecond run")
    got = dict(sections(again))
    assert "second run" in got[key] and "first run" not in again
    assert got[other] == dict(sections(text))[other]
    assert [k for k, _ in sections(again)] == [key, other]


def test_the_key_survives_an_html_comment():
    key = machine_key("Weird  --CPU\tname", "scalar", 4)
    assert "--" not in key and key == "Weird -CPU name | scalar | 4 threads"
    assert [k for k, _ in sections(merge(None, key, "## x"))] == [key]


def test_the_committed_report_has_one_section_per_machine_with_every_table():
    text = (ROOT / "docs" / "PERFORMANCE.md").read_text()
    found = sections(text)
    keys = [k for k, _ in found]
    assert found and len(set(keys)) == len(keys), keys
    for key, body in found:
        # every machine's section carries (a)-(c) tables and the figures of the DiT target
        for table in ("| weight type | h3render GFLOP/s | ggml GFLOP/s |", "| level | h3render s | speed-up vs torch |",
                      "| weight type | MB | GEMV GB/s |"):
            assert table in body, f"{key}: no {table!r}"
