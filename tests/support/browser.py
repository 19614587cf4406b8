"""A real headless Chromium (the distribution's package) that loads a page and gives back its DOM.

`scripts/ensure-chromium` installs it; a test that needs it is skipped, saying so, where it is
missing. Each load runs a fresh browser with a profile of its own, no network services of its
own (updates, sync, QUIC), and a bounded time.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
LOAD_TIMEOUT = 90.0  # a cold start of Chromium on a busy 2-core machine


def chromium() -> str:
    """The browser's path, or the test is skipped."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (scripts/ensure-chromium installs it)")
    return path


def dump_dom(url: str) -> str:
    """The DOM Chromium built from `url`, serialised (what it rendered, not the bytes it was sent)."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        result = subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=LOAD_TIMEOUT,
            check=False,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout
