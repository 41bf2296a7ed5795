"""A small wrapper over selenium's Chrome driver for page tests.

    with Browser() as b:
        b.open(url)                 # waits for the load event
        b.console_errors()          # SEVERE browser-log entries since the last call
        b.screenshot(path)          # the full page as PNG, shrunk under a size limit

Console errors include uncaught exceptions, console.error calls, CSP violations
and failed resource loads (404s), which is what "no console errors" means here.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_NAMES = ("chromedriver",)
MAX_PNG_BYTES = 300 * 1024
WINDOW = (1280, 900)


# A browser or driver somewhere other than PATH (or, set to a path that does not exist,
# none at all: how tests/browser/test_skips.py sees what a machine without them reports).
CHROMIUM_ENV = "H3RENDER_TEST_CHROMIUM"
DRIVER_ENV = "H3RENDER_TEST_CHROMEDRIVER"
INSTALL = "apt-get install chromium chromium-driver"


def _which(names, env: str) -> str | None:
    if os.environ.get(env):
        return shutil.which(os.environ[env])
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def browser_available() -> str | None:
    """None when chromium, chromedriver and selenium are all there, else what is missing."""
    missing = []
    if _which(CHROMIUM_NAMES, CHROMIUM_ENV) is None:
        missing.append("chromium (apt-get install chromium)")
    if _which(DRIVER_NAMES, DRIVER_ENV) is None:
        missing.append("chromedriver (apt-get install chromium-driver)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install selenium)")
    return ", ".join(missing) or None


def needs_browser():
    """A mark for each test that drives Chromium: without one it is skipped on its own
    line of the report (a mark's skip is reported at the test's own line, so pytest -ra
    does not fold the tests of a module into one), naming what to install."""
    import pytest

    missing = browser_available()
    reason = (f"no headless browser: {missing} missing; `{INSTALL}` (.ci/run installs them)"
              if missing else "headless Chromium is present")
    return pytest.mark.skipif(missing is not None, reason=reason)


class Browser:
    def __init__(self, width: int = WINDOW[0], height: int = WINDOW[1]):
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        opts = Options()
        opts.binary_location = _which(CHROMIUM_NAMES, CHROMIUM_ENV)
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    "--disable-extensions", "--no-first-run", "--mute-audio",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-default-apps", "--disable-sync", "--metrics-recording-only",
                    f"--window-size={width},{height}", "--autoplay-policy=no-user-gesture-required"):
            opts.add_argument(arg)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(executable_path=_which(DRIVER_NAMES, DRIVER_ENV)), options=opts)
        self.driver.set_page_load_timeout(60)
        self._errors: list[dict] = []

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.driver.quit()
        except Exception as e:  # the browser may already be gone
            print(f"browser close: {e}")

    # -------------------------------------------------------------- pages

    def open(self, url: str) -> None:
        self.driver.get(url)
        self.wait(lambda d: d.execute_script("return document.readyState") == "complete", 30, "page load")

    def wait(self, pred, timeout: float, what: str):
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(pred, f"timed out waiting for {what}")

    def css(self, selector: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def one(self, selector: str):
        found = self.css(selector)
        assert len(found) == 1, f"{len(found)} elements match {selector!r} on {self.driver.current_url}"
        return found[0]

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    @property
    def url(self) -> str:
        return self.driver.current_url

    # -------------------------------------------------------------- checks

    def console_errors(self) -> list[dict]:
        """SEVERE browser-log entries since the last call (each entry: level, message, source)."""
        logs = self.driver.get_log("browser")
        return [e for e in logs if e.get("level") == "SEVERE"]

    def screenshot(self, path: Path, max_height: int = 2400) -> int:
        """Save the whole page (up to max_height px) as PNG under MAX_PNG_BYTES; returns its size."""
        h = int(self.js("return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)"))
        w = int(self.js("return document.documentElement.clientWidth"))
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": w, "height": min(h, max_height), "scale": 1},
        })
        data = shrink_png(base64.b64decode(shot["data"]), MAX_PNG_BYTES)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return len(data)


def shrink_png(png: bytes, limit: int) -> bytes:
    """The PNG as is when under `limit`, else palette-quantised, then scaled down until it fits."""
    if len(png) <= limit:
        return png
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    scale = 1.0
    while True:
        im = img if scale == 1.0 else img.resize((int(img.width * scale), int(img.height * scale)), Image.LANCZOS)
        buf = io.BytesIO()
        im.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(buf, "PNG", optimize=True)
        if buf.tell() <= limit or scale < 0.3:
            return buf.getvalue()
        scale *= 0.8
