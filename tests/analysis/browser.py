"""Open a report in headless Chromium: did every image load? And a screenshot."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["CHROMIUM", "check_images", "screenshot"]

CHROMIUM = next((p for name in ("chromium", "chromium-browser") if (p := shutil.which(name))), None)
_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def _run(args: list[str]) -> str:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        proc = subprocess.run(
            [CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=90,
            check=True,
        )
    return proc.stdout


def check_images(report: Path) -> tuple[int, int, str]:
    """(images, broken images, data-images-ok) as the page's own script saw them."""
    dom = _run(["--virtual-time-budget=10000", "--dump-dom", report.resolve().as_uri()])
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None, dom[:500]
    attrs = dict(re.findall(r'(data-images[\w-]*)="([^"]*)"', body.group(1)))
    assert "data-images" in attrs, f"the page's check did not run: {body.group(0)}"
    return int(attrs["data-images"]), int(attrs["data-images-broken"]), attrs["data-images-ok"]


def screenshot(report: Path, png: Path) -> None:
    _run([f"--screenshot={png}", "--window-size=1280,6000", report.resolve().as_uri()])
