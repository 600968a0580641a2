"""Debian's chromium driven by Selenium through Debian's chromedriver (nothing downloaded):
the browser the console's tests and screenshots use."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def missing() -> str | None:
    """Why the browser cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


def start(width: int = 1280, height: int = 860):
    """A headless chromium with a fresh profile, kept off the network it cannot reach."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="leveret-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    original_quit = driver.quit

    def quit_and_clean() -> None:
        original_quit()
        shutil.rmtree(profile, ignore_errors=True)

    driver.quit = quit_and_clean  # type: ignore[method-assign]
    return driver
