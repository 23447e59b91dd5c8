"""Logging handlers that outlive pytest's capture of stderr (tests/conftest.py applies this to every run).

Prefect configures its console handler when it is imported or its test harness starts: during collection or a
session fixture, when sys.stderr is pytest's capture. The handler keeps that stream object. pytest closes its
capture before it tears the session's fixtures down when a run is interrupted (pytest_keyboard_interrupt stops
the global capture), and the Prefect harness's teardown logs "Stopping temporary server": bound to the closed
capture, that line was a `ValueError: I/O operation on closed file` logging traceback at the end of the run."""

from __future__ import annotations

import io
import logging
import sys


class StderrWhileOpen(io.TextIOBase):
    """The stream a logging handler was given (pytest's capture), while it is open; then the process's own stderr."""

    def __init__(self, captured):
        super().__init__()
        self.captured = captured

    def target(self):
        return sys.__stderr__ if getattr(self.captured, "closed", False) else self.captured

    def write(self, text: str) -> int:
        return self.target().write(text)

    def flush(self) -> None:
        self.target().flush()

    @property
    def encoding(self):
        return getattr(self.target(), "encoding", "utf-8")


def follow_open_stderr() -> None:
    """Point Prefect's console handlers (and the rich console inside them) at StderrWhileOpen of their stream."""
    for logger in [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]:
        for handler in list(getattr(logger, "handlers", ())):
            stream = getattr(handler, "stream", None)
            if (not type(handler).__module__.startswith("prefect") or stream is None
                    or isinstance(stream, StderrWhileOpen) or stream in (sys.__stderr__, sys.__stdout__)):
                continue
            handler.stream = StderrWhileOpen(stream)  # not setStream: it flushes the old stream
            if hasattr(handler, "console"):
                handler.console.file = handler.stream
