"""Headless Chromium driven over the DevTools protocol (a websocket, the `websockets` package): open a page, click
what a reviewer clicks, read the rendered page, take a screenshot. For the browser test of the review screens
(test_operations.py); `--dump-dom` alone cannot click."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


class Browser:
    """One headless Chromium with a fresh profile (`profile`: a new folder, so no saved UI state) and one page of
    `width` x `height` CSS pixels. Stop it with `close` (its process group, by its PID)."""

    def __init__(self, chromium: str, profile: Path, width: int = 1400, height: int = 1000, timeout: float = 90):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--remote-debugging-port={port}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.n = 0
        try:
            page = self._page(port, timeout)
            from websockets.sync.client import connect

            self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout)
            self.call("Page.enable")
        except BaseException:
            self._stop()
            raise

    @staticmethod
    def _page(port: int, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=3) as res:
                    return next(t for t in json.load(res) if t["type"] == "page")
            except (OSError, StopIteration, ValueError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def call(self, method: str, **params) -> dict:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:  # events arrive between the answers: skipped
            msg = json.loads(self.ws.recv(timeout=120))
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, js: str):
        """The value of a JavaScript expression in the page (JSON-serialisable values come back as Python)."""
        res = self.call("Runtime.evaluate", expression=js, returnByValue=True, awaitPromise=True)
        return res.get("result", {}).get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def wait(self, js: str, what: str, timeout: float = 120):
        """Poll `js` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.eval(js)
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (page {self.eval('location.href')})")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self._stop()

    def _stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
