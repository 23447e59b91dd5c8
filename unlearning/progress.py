"""Progress of long loops for a person watching: a bar on a terminal, plain lines everywhere else.

On a terminal a tqdm bar redraws in place. Off a terminal (CI, `dvc repro` logs, a Prefect worker) a bar
prints nothing readable (carriage returns, `[A` cursor codes, a line stuck at 0/30), so there it writes
one plain line when the loop starts, then at least every `every_s` seconds and at every 10 %, and at the
end, each with the elapsed time and an ETA:

    oracles x80: 120/300 steps (40%), 3.1 s elapsed, ETA 4.6 s

A loop whose single steps are long (a solver fit over every retain row, a conjugate-gradient solve) keeps
the 10 s rule through `tick()`: inner loops call it, and the innermost bar of the thread prints a line
(with its current `stage`) when `every_s` passed. `set_default(False)` (from `base.progress`) turns off
every bar built with `enabled=None`. `after_s` keeps a command that ends quickly quiet: no line (not even the
first) before that many seconds, and no last line when none was printed. `heartbeat_s` keeps the 10 s rule where
no inner loop ticks (loading a state, one long library call): a thread pokes the bar that often.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO

_local = threading.local()  # per thread: the stack of active bars (Prefect tasks run in threads)
_default = {"enabled": True}


def set_default(enabled: bool) -> None:
    """The process-wide switch for bars built with `enabled=None` (the flows set it from base.progress)."""
    _default["enabled"] = bool(enabled)


def default_enabled() -> bool:
    return _default["enabled"]


def resolve(progress) -> bool:
    """A `progress` argument (True/False, a label, or None = the process default) as on/off."""
    return default_enabled() if progress is None else bool(progress)


def tick() -> None:
    """Called by inner loops (row chunks, solver iterations): the thread's innermost active bar prints a
    plain line if `every_s` passed since its last one. Costs a clock read."""
    stack = getattr(_local, "stack", None)
    if stack:
        stack[-1].poke()


def _fmt(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


class Progress:
    """`with Progress(total, "train x80", unit="steps") as bar: ... bar.update()`.

    `enabled=False` prints nothing, `None` follows `set_default`. `stream` defaults to stderr; `tty` overrides
    the terminal detection. `stage(name)` names the part of the loop that runs now; `stop(reason)` says why a
    loop ends before its total (the last line shows it instead of an ETA). `after_s`: silent for that long (a
    loop that ends sooner prints nothing; on a terminal, the bar appears then). `heartbeat_s`: a thread pokes the
    bar that often, so a single step that calls no `tick()` still gets its line every `every_s`."""

    def __init__(self, total: int, desc: str, *, unit: str = "it", enabled: bool | None = True,
                 stream: IO | None = None, every_s: float = 10.0, min_gap_s: float = 2.0, tty: bool | None = None,
                 clock=time.perf_counter, after_s: float = 0.0, heartbeat_s: float | None = None):
        self.total, self.desc, self.unit, self.enabled = max(int(total), 0), desc, unit, resolve(enabled)
        self.stage_name: str | None = None
        self.stopped: str | None = None
        self.stream = stream if stream is not None else sys.stderr
        self.every_s, self.min_gap_s, self.clock, self.after_s = every_s, min_gap_s, clock, after_s
        self.printed = 0  # lines written (plain mode)
        self.tty = bool(tty) if tty is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self._bar = None
        self._start = self._last = 0.0
        self._last_decile = -1
        self.heartbeat_s = heartbeat_s
        self._lock = threading.RLock()  # the heartbeat thread and the loop's own thread both write lines
        self._beat: threading.Thread | None = None
        self._ended = threading.Event()

    def __enter__(self) -> "Progress":
        self._start = self._last = self.clock()
        if not self.enabled:
            return self
        if not hasattr(_local, "stack"):
            _local.stack = []
        _local.stack.append(self)
        if self.after_s <= 0:
            self._show()
        if self.heartbeat_s:
            self._beat = threading.Thread(target=self._heartbeat, name=f"progress {self.desc}", daemon=True)
            self._beat.start()
        return self

    def _heartbeat(self) -> None:
        while not self._ended.wait(self.heartbeat_s):
            self.poke()

    def _show(self, now: float | None = None) -> None:
        """The bar on a terminal, else the first plain line."""
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, leave=False, file=self.stream,
                             mininterval=0.5, initial=self.done)
        else:
            self._line(now)

    def _silent(self, now: float) -> bool:
        """Still inside `after_s` (nothing shown yet); past it, shows the bar or the first line once."""
        if self.after_s <= 0 or self._bar is not None or self.printed:
            return False
        if now - self._start < self.after_s:
            return True
        self._show(now)
        return True

    def update(self, n: int = 1) -> None:
        with self._lock:
            self._update(n)

    def _update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = self.clock()
        if self._silent(now):
            return
        decile = int(10 * self.done / self.total) if self.total else 10
        since = now - self._last
        if since >= self.every_s or (decile > self._last_decile and since >= self.min_gap_s):
            self._line(now)

    def stage(self, name: str) -> None:
        """Name the part of the loop that runs now (shown in the lines and on the bar)."""
        self.stage_name = name
        if self._bar is not None:
            self._bar.set_description(f"{self.desc} [{name}]", refresh=False)

    def stop(self, reason: str) -> None:
        """The loop ends before its total, for `reason` (e.g. "target", "budget")."""
        self.stopped = reason

    def poke(self) -> None:
        """A line (or a bar refresh) when `every_s` passed without one: long single steps stay visible."""
        with self._lock:
            self._poke()

    def _poke(self) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self._silent(now) or now - self._last < self.every_s:
            return
        if self._bar is not None:
            self._bar.refresh()
            self._last = now
        else:
            self._line(now)

    def __exit__(self, *exc) -> bool:
        self._ended.set()
        if self._beat is not None:
            self._beat.join()
        if self.enabled:
            stack = getattr(_local, "stack", [])
            if stack and stack[-1] is self:
                stack.pop()
            if self._bar is not None:
                self._bar.close()
            elif self.after_s > 0 and not self.printed:
                pass  # ended within after_s: nothing to say
            elif self._last_decile < 10 or self.done == 0 or self.stopped:
                self._line()
        return False

    def _line(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        elapsed = now - self._start
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        if self.stopped:
            tail = f", stopped early ({self.stopped})"
        else:
            tail = f", ETA {_fmt(eta)}" if eta is not None and self.done < self.total else ""
        stage = f" [{self.stage_name}]" if self.stage_name else ""
        print(f"{self.desc}{stage}: {self.done}/{self.total} {self.unit} ({pct:.0f}%), {_fmt(elapsed)} elapsed{tail}",
              file=self.stream, flush=True)
        self.printed += 1
        self._last = now
        self._last_decile = int(10 * self.done / self.total) if self.total else 10
