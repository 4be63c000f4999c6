"""Fixtures of the status page browser suite: Debian's Chromium driven by selenium.

Chromium and its driver come from the distribution (``/usr/bin/chromium``,
``/usr/bin/chromedriver``). When either is missing and the suite runs as root with
``apt-get``, the session installs them (``chromium``, ``chromium-driver``); otherwise every
test here is skipped with the reason. Chromium runs headless with a fresh profile and every
background fetch off: the machines this runs on may have no route out. Each test exports its
own model repository; the workers of the session share one ``cache_dir``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException

from tests._e2e_support import attach_logs, export_repo, make_cache_dir
from tests.worker_e2e._harness import worker_logs

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
APT_PACKAGES = ("chromium", "chromium-driver")
APT_TIMEOUT_S = 900.0
"""``apt-get update`` plus the install; Chromium is a large download on a slow mirror."""
CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)
WINDOW = (1440, 900)

pytest_runtest_makereport = attach_logs(Path(__file__).parent, lambda: worker_logs(6000))


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(
        ["apt-get", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=APT_TIMEOUT_S,
    )


def _install_chromium() -> str | None:
    """Install Chromium and its driver with apt-get; why that is impossible, or ``None``."""
    if os.geteuid() != 0:
        return "not root, so apt-get cannot install them"
    if shutil.which("apt-get") is None:
        return "apt-get is not available"
    steps = [
        ("update",),
        ("install", "-y", "--no-install-recommends", *APT_PACKAGES),
    ]
    for step in steps:
        try:
            done = _apt_get(*step)
        except subprocess.TimeoutExpired:
            return f"apt-get {step[0]} took longer than {APT_TIMEOUT_S:.0f} s"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return f"apt-get {step[0]} failed ({done.returncode}): {' | '.join(tail)}"
    return None


@pytest.fixture(scope="session")
def chromium() -> tuple[Path, Path]:
    """``(browser, driver)`` paths, installed from the distribution when missing."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        reason = _install_chromium()
        if reason is not None:
            pytest.skip(f"{CHROMIUM} / {CHROMEDRIVER} are missing and {reason}")
        if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
            pytest.skip(
                f"apt-get installed {APT_PACKAGES} but {CHROMIUM} or {CHROMEDRIVER} is absent"
            )
    return CHROMIUM, CHROMEDRIVER


@pytest.fixture
def browser(chromium: tuple[Path, Path], tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a fresh profile under ``tmp_path``; quit afterwards."""
    binary, driver = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.add_argument(f"--window-size={WINDOW[0]},{WINDOW[1]}")
    service = webdriver.ChromeService(
        executable_path=str(driver), log_output=str(tmp_path / "chromedriver.log")
    )
    try:
        chrome = webdriver.Chrome(options=options, service=service)
    except WebDriverException as error:
        raise AssertionError(f"Chromium did not start: {error.msg}") from error
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cache_dir`` of this suite's workers."""
    return make_cache_dir(tmp_path_factory)


@pytest.fixture
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository of the shipped examples and ``spin``, exported for this test alone."""
    return export_repo(tmp_path_factory)
