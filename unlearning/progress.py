"""Progress of long loops for a person watching: a bar on a terminal, plain lines everywhere else.

On a terminal a tqdm bar redraws in place. Off a terminal (CI, `dvc repro` logs, a Prefect worker) a bar
prints nothing readable (carriage returns, `[A` cursor codes, a line stuck at 0/30), so there it writes
one plain line when the loop starts, then at least every `every_s` seconds and at every 10 %, and at the
end, each with the elapsed time and an ETA:

    oracles x80: 120/300 steps (40%), 3.1 s elapsed, ETA 4.6 s
"""

from __future__ import annotations

import sys
import time
from typing import IO


def _fmt(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


class Progress:
    """`with Progress(total, "train x80", unit="steps") as bar: ... bar.update()`.

    `enabled=False` prints nothing. `stream` defaults to stderr; `tty` overrides the terminal detection."""

    def __init__(self, total: int, desc: str, *, unit: str = "it", enabled: bool = True, stream: IO | None = None,
                 every_s: float = 10.0, min_gap_s: float = 2.0, tty: bool | None = None, clock=time.perf_counter):
        self.total, self.desc, self.unit, self.enabled = max(int(total), 0), desc, unit, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.every_s, self.min_gap_s, self.clock = every_s, min_gap_s, clock
        self.tty = bool(tty) if tty is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self._bar = None
        self._start = self._last = 0.0
        self._last_decile = -1

    def __enter__(self) -> "Progress":
        self._start = self._last = self.clock()
        if not self.enabled:
            return self
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, leave=False, file=self.stream,
                             mininterval=0.5)
        else:
            self._line()
        return self

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = self.clock()
        decile = int(10 * self.done / self.total) if self.total else 10
        since = now - self._last
        if since >= self.every_s or (decile > self._last_decile and since >= self.min_gap_s):
            self._line(now)

    def __exit__(self, *exc) -> bool:
        if self.enabled:
            if self._bar is not None:
                self._bar.close()
            elif self._last_decile < 10 or self.done == 0:
                self._line()
        return False

    def _line(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        elapsed = now - self._start
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        tail = f", ETA {_fmt(eta)}" if eta is not None and self.done < self.total else ""
        print(f"{self.desc}: {self.done}/{self.total} {self.unit} ({pct:.0f}%), {_fmt(elapsed)} elapsed{tail}",
              file=self.stream, flush=True)
        self._last = now
        self._last_decile = int(10 * self.done / self.total) if self.total else 10
