"""Retries only where a second try can help (transient IO / network), never on deterministic errors."""

import errno

import pytest

from tasks.retry import is_transient, transient_io_only, transient_io_or_dvc_lock
from unlearning.config import ConfigError
from unlearning.privacy.fingerprint import StateMismatch
from unlearning.requests import RequestValidationError


class FailedState:
    def __init__(self, exc):
        self.exc = exc

    def result(self, raise_on_failure=True):
        return self.exc


@pytest.mark.parametrize("exc, retry", [
    (TimeoutError("slow disk"), True),
    (ConnectionResetError("peer"), True),
    (OSError(errno.EIO, "io error"), True),
    (OSError(errno.EBUSY, "busy"), True),
    (FileNotFoundError("models/original.pt"), False),
    (PermissionError("read-only"), False),
    (OSError(errno.ENOSPC, "disk full"), False),
    (StateMismatch("recipe: epochs was 30, now 5"), False),
    (ConfigError("params.yaml: unknown key"), False),
    (RequestValidationError("f.csv", ["bad id"]), False),
    (ValueError("bad value"), False),
    (None, False),
])
def test_only_transient_io_is_retried(exc, retry):
    assert is_transient(exc) is retry
    assert transient_io_only(None, None, FailedState(exc)) is retry


def test_dvc_operations_retry_the_repository_lock_only():
    from adapters.dvc_ops import DvcFailed, DvcLockBusy

    assert transient_io_or_dvc_lock(None, None, FailedState(DvcLockBusy("dvc commit: the repository is locked")))
    assert not transient_io_or_dvc_lock(None, None, FailedState(DvcFailed("dvc commit failed: no such stage")))
    assert not transient_io_or_dvc_lock(None, None, FailedState(ValueError("x")))
