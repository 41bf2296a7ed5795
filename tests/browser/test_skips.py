"""Without a browser each browser test is skipped on its own report line, naming what to
install, and the tests that need none still run (here deselected: they start a dashboard).

The browser is hidden through H3RENDER_TEST_CHROMIUM (a path that does not exist), so
this runs the same with or without Chromium on the machine; about 5 s.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
BROWSER_FILES = ("test_dashboard_browser.py", "faults/test_browser_xss.py")
NO_BROWSER_TESTS = ("test_post_without_csrf_is_refused",)  # plain HTTP: not marked


def test_each_browser_test_skips_on_its_own_naming_the_packages(tmp_path):
    env = dict(os.environ, H3RENDER_TEST_CHROMIUM=str(tmp_path / "no-chromium"))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *BROWSER_FILES,
         "-k", " and ".join(f"not {t}" for t in NO_BROWSER_TESTS)],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    defined = [m for f in BROWSER_FILES for m in re.findall(r"^def (test_\w+)\(", (TESTS / f).read_text(), re.M)]
    browser_tests = [t for t in defined if t not in NO_BROWSER_TESTS]
    skips = re.findall(r"^SKIPPED \[(\d+)\] (\S+):(\d+): (.*)$", out, re.M)
    assert len(skips) == len(browser_tests) >= 13, out[-3000:]
    assert {n for n, *_ in skips} == {"1"}  # none folded into another's line
    assert len({(f, line) for _, f, line, _ in skips}) == len(skips)
    for *_, reason in skips:
        assert "chromium (apt-get install chromium) missing" in reason
        assert "apt-get install chromium chromium-driver" in reason
    assert re.search(rf"\b{len(browser_tests)} skipped, {len(NO_BROWSER_TESTS)} deselected", out), out[-500:]


def test_readme_and_ci_name_the_browser_packages():
    """What the skip reason asks for is in README's prerequisites, and CI installs it."""
    from browser.chromium import INSTALL

    root = TESTS.parent
    readme = (root / "README.md").read_text()
    prereq = readme[:readme.index("\n## ")]  # the part before the first section
    assert INSTALL in prereq
    ci = (root / ".ci" / "run").read_text()
    assert "need+=(chromium)" in ci and "need+=(chromium-driver)" in ci
