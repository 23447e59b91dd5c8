"""Which errors end a command or a DVC stage with one `error:` line, and with which documented exit code.

Exit codes (docs/troubleshooting.md): 0 done or nothing to do, 2 bad input, 3 the gate rejected every candidate,
1 any other failure; `unlearn status` 4 while an erase is unfinished, 5 while a batch is held for review (as
`unlearn run` and the deletion stage when a file was held). Stdlib only: `unlearn` answers a config typo before any
heavy import.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from contextlib import contextmanager

EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_GATE_REJECTED = 1, 2, 3
EXIT_ERASE_UNFINISHED, EXIT_HELD = 4, 5  # `unlearn status`: an erase to finish; a batch waiting for `unlearn approve`
ENV_DEBUG = "UNLEARN_DEBUG"  # `--debug`: tracebacks everywhere

# Errors that end a command with one line: bad input -> 2; by class name (their modules import heavy packages).
BY_NAME = {"TrackingUnavailable": EXIT_BAD_INPUT, "LockTimeout": EXIT_BAD_INPUT, "BatchRejected": EXIT_GATE_REJECTED,
           "AfterCommitError": EXIT_FAILURE, "StateCorrupt": EXIT_FAILURE, "DvcFailed": EXIT_FAILURE}

# The project's bad-input errors, by module and class name (a subclass counts): checking them by import would
# load pandas and pandera (0.7 s) on the error path of a config typo.
BAD_INPUT = {("unlearning.config", "ConfigError"), ("unlearning.requests", "RequestValidationError"),
             ("unlearning.privacy.fingerprint", "StateMismatch"), ("flows.scaffold", "ScaffoldError"),
             ("unlearning.data.dataset", "DataError"), ("unlearning.privacy.erasure", "UnknownBatch")}


def exit_code(e: BaseException) -> int | None:
    """The documented exit code of an error reported in one line, or None for an unexpected one (traceback)."""
    if isinstance(e, BrokenPipeError):  # a closed pipe is the reader's choice, not bad input
        return None
    if isinstance(e, (FileNotFoundError, PermissionError, ConnectionError)) or any(
            (c.__module__, c.__name__) in BAD_INPUT for c in type(e).__mro__):
        return EXIT_BAD_INPUT
    return next((BY_NAME[c.__name__] for c in type(e).__mro__ if c.__name__ in BY_NAME), None)


def debugging() -> bool:
    return os.environ.get(ENV_DEBUG, "") not in ("", "0")


@contextmanager
def one_line_errors():
    """A stage's entry point (`python -m flows.<stage>`, as `dvc repro` runs it): a known error ends it with one
    `error:` line and its exit code; any other error keeps its traceback (exit 1)."""
    try:
        yield
    except Exception as e:
        code = exit_code(e)
        if code is None or debugging():
            raise
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(code) from None


# Prefect's states quote the exception: "...encountered an exception ConfigError: ..." (task) or
# "...encountered an exception: ConfigError: ..." (flow).
_STATE_EXCEPTION = re.compile(r"encountered an exception:? (\w+):")


class KnownErrorsOnce(logging.Filter):
    """On Prefect's console handler. A task that fails on a known error (`exit_code` is not None) is logged
    three or four times: the task's failure with its traceback, its Failed state, the flow's failure with the
    traceback again, the flow's Failed state; the command then prints it once as `error:`. Those records stay
    off the console (the Prefect API handler still sends them to the run's logs in the UI); every other record,
    and every record under UNLEARN_DEBUG, passes."""

    # The known errors by class name: a task's Failed-state record can come before any record that carries
    # the exception itself (a failure in the flow's first task), so `seen` alone would let it through.
    KNOWN = {name for _, name in BAD_INPUT} | set(BY_NAME) | {"FileNotFoundError", "PermissionError"}

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()  # class names of the known errors left out so far

    def filter(self, record: logging.LogRecord) -> bool:
        if debugging():
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            if exit_code(exc) is None:
                return True
            self.seen.add(type(exc).__name__)
            return False
        if record.levelno < logging.INFO:
            return True
        try:
            text = record.getMessage()
        except Exception:  # a record whose arguments do not format: leave it to the handler
            return True
        match = _STATE_EXCEPTION.search(text)
        return not (match and match.group(1) in self.seen | self.KNOWN)


def quiet_known_errors_on_console() -> None:
    """Install KnownErrorsOnce on the root logger's console handlers (Prefect's, set up when it is imported), once."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not any(
                isinstance(f, KnownErrorsOnce) for f in handler.filters):
            handler.addFilter(KnownErrorsOnce())
