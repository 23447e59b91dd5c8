"""A progress line for a long test run, at least every `EVERY_S` seconds (tests/conftest.py registers it):

    [tests] 412/1394 done (29%), 2m10s elapsed, about 5m20s left at the pace so far; now tests/flow/test_x.py (14 s)

pytest's own `-q` output is a row of dots with a percentage at its end: no count of what is left, no time, and
nothing at all while one long test runs. A thread writes the line, so it comes during a long test too. It writes
to a duplicate of the terminal's stdout taken at configure time, before any test's capture: pytest captures file
descriptor 1 during each test, and a line written there would land in that test's captured output instead.

The estimate is the mean time per finished test times the tests left: the fast unit tests run first and the
flow tests last, so early on it is low; it says so ("at the pace so far")."""

from __future__ import annotations

import os
import threading
import time

EVERY_S = 10.0


def duration(seconds: float) -> str:
    """`42 s`, `3m05s`, `1h02m`."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_line(done: int, total: int, elapsed: float, running: str | None, running_s: float) -> str:
    """The line for `done` of `total` tests after `elapsed` seconds, `running` the test now running (or None)."""
    pct = 100 * done // max(total, 1)
    left = f", about {duration(elapsed / done * (total - done))} left at the pace so far" if done else ""
    now = f"; now {running} ({duration(running_s)})" if running else ""
    return f"[tests] {done}/{total} done ({pct}%), {duration(elapsed)} elapsed{left}{now}"


class ProgressEta:
    """The pytest plugin: counts finished tests, and a daemon thread writes `progress_line` every EVERY_S."""

    def __init__(self, every_s: float = EVERY_S):
        self.every_s = every_s
        self.total = self.done = 0
        self.started = time.monotonic()
        self.running: str | None = None
        self.running_since = self.started
        self._stop = threading.Event()
        self._fd: int | None = None

    # --- pytest hooks ------------------------------------------------------------------------------------------
    def pytest_configure(self, config):
        # configure runs outside any capture: fd 1 is the terminal (or the CI log) here
        self._fd = os.dup(1)

    def pytest_collection_finish(self, session):
        self.total = len(session.items)
        if self.total and not session.config.option.collectonly:
            self.started = time.monotonic()
            threading.Thread(target=self._run, name="progress-eta", daemon=True).start()

    def pytest_runtest_logstart(self, nodeid, location):
        self.running, self.running_since = nodeid, time.monotonic()

    def pytest_runtest_logfinish(self, nodeid, location):
        self.done += 1
        self.running = None

    def pytest_unconfigure(self, config):
        self._stop.set()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # --- the thread --------------------------------------------------------------------------------------------
    def _run(self):
        while not self._stop.wait(self.every_s):
            now = time.monotonic()
            line = progress_line(self.done, self.total, now - self.started, self.running, now - self.running_since)
            try:
                os.write(self._fd, f"\n{line}\n".encode())
            except (OSError, TypeError):  # the terminal went away, or unconfigure closed the descriptor
                return
