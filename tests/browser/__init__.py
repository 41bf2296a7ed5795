"""Headless Chromium for the dashboard tests: Debian's chromium + chromium-driver via selenium.

Nothing is downloaded at run time: the browser and the driver are the system's
(`apt-get install chromium chromium-driver`), found on PATH and handed to
selenium explicitly, so Selenium Manager never runs.
"""

from browser.chromium import Browser, browser_available, needs_browser, shrink_png  # noqa: F401
