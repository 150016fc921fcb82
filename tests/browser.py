"""Headless Chromium for tests: Debian's ``chromium`` + ``chromium-driver``, driven by Selenium.

``make test`` (.ci/run) installs both with apt-get when they are missing. Without them the
browser tests skip locally and fail in CI (``CI`` set), so a missing install step shows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--window-size=1400,1000"]

# Every token element as [token id, logprob, version, loss] (strings, as the page has them).
TOKENS_JS = ("return Array.from(document.querySelectorAll('main .strip span'), s => "
             "[s.dataset.tokenId, s.dataset.logprob, s.dataset.version, s.dataset.loss]);")


def require_chromium() -> None:
    if os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER):
        return
    msg = f"{CHROMIUM} / {CHROMEDRIVER} missing (make test installs Debian's chromium and chromium-driver)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A fresh headless Chromium (own profile directory, removed afterwards)."""
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="rlgate-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def artifacts_dir(tmp_path: Path) -> Path:
    """Where screenshots go: $RLGATE_ARTIFACTS (CI can keep them), else the test's tmp dir."""
    base = os.environ.get("RLGATE_ARTIFACTS")
    out = Path(base) if base else tmp_path / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


def wait_for(driver: Any, js: str, timeout: float = 60.0) -> Any:
    """Wait until ``js`` (a script returning a value) returns something truthy; return it."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: d.execute_script(js))


def console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
