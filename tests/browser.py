"""Headless Chromium for page tests: Debian's chromium and chromedriver driven by Selenium,
offline (no driver downloads, no background networking)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless=new",
    "--no-sandbox",  # tests run as root in containers
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,2000",
)


def chromium(user_data: Path) -> Any:
    """A Selenium Chrome driver on Debian's Chromium; fails with the install line if missing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(binary):
            raise RuntimeError(
                f"{binary} is missing: `make install` installs it "
                "(apt-get install -y chromium chromium-driver)"
            )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={user_data}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


# Every <img>: loaded, and decoded to a real size.
BROKEN_IMAGES = """
return Array.from(document.images)
  .filter(img => !img.complete || img.naturalWidth === 0)
  .map(img => img.alt || img.src.slice(0, 60));
"""
