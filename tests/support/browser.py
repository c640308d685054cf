"""A headless Chromium driven over the DevTools protocol on a pipe (no websocket, no
Playwright): ``--remote-debugging-pipe`` reads NUL-terminated JSON commands on fd 3 and
writes answers and events on fd 4."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["Browser", "chromium_path", "headless_chromium"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    def __init__(self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int):
        self.proc = proc
        self._out = to_browser
        self._in = from_browser
        self._buf = b""
        self._next = 0
        self.session: str | None = None

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 30.0
    ) -> Any:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if self.session is not None and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            for reply in self._messages(deadline, method):
                if reply.get("id") == self._next:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})

    def _messages(self, deadline: float, what: str) -> Iterator[dict[str, Any]]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from chromium to {what}")
            ready, _, _ = select.select([self._in], [], [], left)
            if ready:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self._buf += chunk
        *whole, self._buf = self._buf.split(b"\0")
        for raw in whole:
            yield json.loads(raw)

    def open(self, url: str) -> None:
        """A new tab on ``url``; later calls go to it."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", {
            "width": 1400, "height": 1800, "deviceScaleFactor": 1, "mobile": False,
        })  # fmt: skip
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(data["data"]))


@contextlib.contextmanager
def headless_chromium(executable: str) -> Iterator[Browser]:
    """A headless Chromium for the duration of the block; killed and reaped after."""
    to_r, to_w = os.pipe()  # we write commands, chromium reads them on fd 3
    from_r, from_w = os.pipe()  # chromium writes on fd 4, we read
    # the child's ends above fd 4, so that placing them on 3 and 4 clobbers nothing
    for fd in (to_r, from_w):
        high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
        os.close(fd)
        if fd == to_r:
            to_r = high
        else:
            from_w = high
    profile = tempfile.mkdtemp(prefix="agiledart-chromium-")
    cmd = [
        "bash",
        "-c",
        f'exec "$0" "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-',
        executable,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--remote-debugging-pipe",
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    proc = subprocess.Popen(
        cmd,
        pass_fds=(to_r, from_w),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(to_r)
    os.close(from_w)
    try:
        yield Browser(proc, to_w, from_r)
    finally:
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            os.write(to_w, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(to_w)
        os.close(from_r)
        shutil.rmtree(profile, ignore_errors=True)
