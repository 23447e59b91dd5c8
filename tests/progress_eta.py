"""A progress line for a long test run, at least every `EVERY_S` seconds (tests/conftest.py registers it):

    [tests] 412/1394 done (29%), 2m10s elapsed, about 5m20s left (by the last run's times); now tests/flow/x.py (14 s)

pytest's own `-q` output is a row of dots with a percentage at its end: no count of what is left, no time, and
nothing at all while one long test runs. A thread writes the line, so it comes during a long test too. It writes
to a duplicate of the terminal's stdout taken at configure time, before any test's capture: pytest captures file
descriptor 1 during each test, and a line written there would land in that test's captured output instead. Under
pytest-xdist (`make test` runs two workers) it runs in the controller, which sees each test start and finish.

The estimate: tests take very different times (a flow test a minute, most unit tests milliseconds), so the
count alone says little. Each test's time of the last run is kept in pytest's cache; the time left is the last
run's times of the tests not run yet, scaled by how this run compares with the last on the tests done so far
(a loaded machine), plus the mean time of this run for the tests the cache does not know, shared by the xdist
workers. Without a cache (`-p no:cacheprovider`, a first run) it is the mean time per test so far times the tests
left, and says so."""

from __future__ import annotations

import os
import threading
import time

import pytest

EVERY_S = 10.0
CACHE_KEY = "progress_eta/seconds"


def duration(seconds: float) -> str:
    """`42 s`, `3m05s`, `1h02m`."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def seconds_left(done: dict[str, float], todo: list[str], last: dict[str, float], workers: int = 1,
                 running_for: dict[str, float] | None = None) -> tuple[float, str] | None:
    """(seconds, how) left for the tests `todo` on `workers` processes side by side, from this run's times
    `done` and the last run's `last` (each a test's own wall time), less what the tests running now (`todo`'s,
    -> seconds so far) have run already; None before any test finished."""
    if not done:
        return None
    mean_now = sum(done.values()) / len(done)
    known_done = [n for n in done if n in last]
    if not known_done or sum(last[n] for n in known_done) <= 0:
        return mean_now * len(todo) / workers, "at the pace so far"
    pace = sum(done[n] for n in known_done) / sum(last[n] for n in known_done)
    expected = {n: pace * last[n] if n in last else mean_now for n in todo}
    spent = sum(min(s, expected.get(n, 0.0)) for n, s in (running_for or {}).items())
    return (sum(expected.values()) - spent) / workers, "by the last run's times"


def progress_line(n_done: int, total: int, elapsed: float, left: tuple[float, str] | None, running: str | None,
                  running_s: float) -> str:
    """The line for `n_done` of `total` tests after `elapsed` seconds, `running` the test now running (or None)."""
    pct = 100 * n_done // max(total, 1)
    if total and n_done == total:
        return f"[tests] {n_done}/{total} done (100%), {duration(elapsed)} elapsed; the session's teardown now"
    eta = f", about {duration(left[0])} left ({left[1]})" if left is not None else ""
    now = f"; now {running} ({duration(running_s)})" if running else ""
    return f"[tests] {n_done}/{total} done ({pct}%), {duration(elapsed)} elapsed{eta}{now}"


class ProgressEta:
    """The pytest plugin: times each test (setup, call, teardown), and a daemon thread writes `progress_line`
    every EVERY_S; the times go to pytest's cache for the next run's estimate."""

    def __init__(self, every_s: float = EVERY_S):
        self.every_s = every_s
        self.order: list[str] = []
        self.done: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.started = time.monotonic()
        self.running: dict[str, float] = {}  # the tests running now (one per xdist worker) -> since when
        self.workers: set[str] = set()  # the xdist workers seen (none without xdist: one process)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._cache = None

    # --- pytest hooks ------------------------------------------------------------------------------------------
    def pytest_configure(self, config):
        # configure runs outside any capture: fd 1 is the terminal (or the CI log) here
        self._fd = os.dup(1)
        self._cache = getattr(config, "cache", None)  # None with -p no:cacheprovider

    def pytest_collection_finish(self, session):
        if not session.config.option.collectonly:
            self.start([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        """Under xdist the controller collects nothing itself: each worker reports the same test ids."""
        self.start(list(ids))

    def start(self, order: list[str]) -> None:
        if self._thread is not None or not order:
            return
        self.order = order
        if self._cache is not None:
            self.last = self._cache.get(CACHE_KEY, {})
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="progress-eta", daemon=True)
        self._thread.start()

    def pytest_runtest_logstart(self, nodeid, location):
        self.running[nodeid] = time.monotonic()

    def pytest_runtest_logreport(self, report):
        node = getattr(report, "node", None)  # the xdist worker that ran it
        if node is not None:
            self.workers.add(str(getattr(getattr(node, "gateway", None), "id", node)))

    def pytest_runtest_logfinish(self, nodeid, location):
        self.done[nodeid] = time.monotonic() - self.running.pop(nodeid, time.monotonic())

    def pytest_sessionfinish(self, session):
        if self._cache is not None and self.done:
            self._cache.set(CACHE_KEY, {**self.last, **{n: round(s, 3) for n, s in self.done.items()}})

    def pytest_unconfigure(self, config):
        self._stop.set()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # --- the thread --------------------------------------------------------------------------------------------
    def line(self) -> str:
        now = time.monotonic()
        done, running = dict(self.done), dict(self.running)  # the main thread changes them meanwhile
        todo = [n for n in self.order if n not in done]
        longest = min(running, key=running.get, default=None)  # the test running the longest now
        left = seconds_left(done, todo, self.last, max(1, len(self.workers)),
                            {n: now - t0 for n, t0 in running.items()})
        return progress_line(len(done), len(self.order), now - self.started, left, longest,
                             now - running[longest] if longest else 0.0)

    def _run(self):
        while not self._stop.wait(self.every_s):
            try:
                os.write(self._fd, f"\n{self.line()}\n".encode())
            except (OSError, TypeError):  # the terminal went away, or unconfigure closed the descriptor
                return
