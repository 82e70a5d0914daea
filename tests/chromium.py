"""Headless Chromium over the DevTools protocol on a pipe (`--remote-debugging-pipe`): what a page logs,
whether its images decode, what its DOM holds, and a screenshot. No websocket, no port, no download: the
system's `chromium` (Debian's package) and two file descriptors, as browser drivers do it.

    with Chromium.launch() as browser:
        page = browser.open(Path("report.html"), width=1400, height=2000)
        page.evaluate("document.title"); page.screenshot(Path("shot.png")); page.errors
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome")
TIMEOUT_S = 60.0


def find_binary() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


class ProtocolError(RuntimeError):
    pass


class Chromium:
    def __init__(self, binary: str) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-profile-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def as_fd3_and_fd4() -> None:   # the pipe Chromium reads commands from (3) and writes to (4)
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)
            for fd in (3, 4):          # dup2 onto itself keeps close-on-exec, which os.pipe sets
                os.set_inheritable(fd, True)

        self._process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             "--disable-extensions", "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=as_fd3_and_fd4, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    @classmethod
    def launch(cls) -> "Chromium":
        binary = find_binary()
        if binary is None:
            raise FileNotFoundError("no chromium on PATH")
        return cls(binary)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (ProtocolError, OSError, TimeoutError):
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise ProtocolError("chromium closed its pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = TIMEOUT_S) -> dict:
        """One command; the events that arrive meanwhile are kept in `events`."""
        self._next_id += 1
        command: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            command["sessionId"] = session
        os.write(self._to_browser, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._read_message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise ProtocolError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, session: str, timeout: float = TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            self.events.append(self._read_message(deadline))

    def open(self, path: Path, width: int = 1400, height: int = 2000) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        self.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        self.wait_for("Page.loadEventFired", session)
        return Page(self, session)


class Page:
    def __init__(self, browser: Chromium, session: str) -> None:
        self._browser = browser
        self._session = session

    def evaluate(self, expression: str) -> Any:
        """A JavaScript expression's value (a promise awaited), as JSON."""
        result = self._browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                         "awaitPromise": True}, session=self._session)
        if "exceptionDetails" in result:
            raise ProtocolError(f"evaluate: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    @property
    def errors(self) -> list[str]:
        """What the page logged as an error: console.error, uncaught exceptions, failed loads."""
        found = []
        for event in self._browser.events:
            if event.get("sessionId") != self._session:
                continue
            params = event.get("params", {})
            if event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(" ".join(str(arg.get("value", arg.get("description"))) for arg in params.get("args", [])))
            elif event.get("method") == "Runtime.exceptionThrown":
                found.append(params.get("exceptionDetails", {}).get("text", "exception"))
            elif event.get("method") == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(params["entry"].get("text", "error"))
        return found

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self._browser.send("Page.getLayoutMetrics", session=self._session)["cssContentSize"]
            params |= {"captureBeyondViewport": True,
                       "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}}
        data = self._browser.send("Page.captureScreenshot", params, session=self._session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
