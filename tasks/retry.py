"""When a Prefect task may retry: only on failures that a second try can fix (transient IO and network).

Deterministic failures (bad params, a missing file or dataset, a validation error, a state built from other
params) fail the same way again: retrying them only delays the error and prints "Retry 1/2" noise."""

from __future__ import annotations

import errno

# errno values of IO that can succeed on a second try (a busy device, an interrupted or timed-out call).
TRANSIENT_ERRNOS = {errno.EIO, errno.EAGAIN, errno.EBUSY, errno.EINTR, errno.ETIMEDOUT}


def is_transient(exc: BaseException | None) -> bool:
    if isinstance(exc, (TimeoutError, ConnectionError, BlockingIOError, InterruptedError)):
        return True
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)):
        return False
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


def _exception(state) -> BaseException | None:
    try:
        result = state.result(raise_on_failure=False)
    except Exception as e:  # noqa: BLE001 - the state could not even be read: treat it as the failure
        return e
    return result if isinstance(result, BaseException) else None


def transient_io_only(task, task_run, state) -> bool:
    """retry_condition_fn: retry transient IO / network errors only."""
    return is_transient(_exception(state))


def transient_io_or_dvc_lock(task, task_run, state) -> bool:
    """retry_condition_fn for DVC operations: also retry the repository lock held for a moment by another DVC
    process (`dvc status` from a shell, a second batch); any other DVC failure is deterministic."""
    from adapters.dvc_ops import DvcLockBusy

    exc = _exception(state)
    return is_transient(exc) or isinstance(exc, DvcLockBusy)
