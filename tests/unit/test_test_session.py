"""What tests/conftest.py adds to a test run: the progress line with an ETA (tests/progress_eta.py), and a logging
handler bound to pytest's capture that falls back to the real stderr once pytest closes that capture."""

from __future__ import annotations

import io
import logging

from tests.capture_safe_logging import StderrWhileOpen, follow_open_stderr
from tests.progress_eta import duration, progress_line, seconds_left


def test_the_progress_line_counts_and_estimates_the_time_left():
    assert progress_line(300, 1200, 150.0, (450.0, "at the pace so far"), "tests/flow/test_x.py::test_y", 14.2) == (
        "[tests] 300/1200 done (25%), 2m30s elapsed, about 7m30s left (at the pace so far); "
        "now tests/flow/test_x.py::test_y (14 s)")
    assert progress_line(0, 10, 10.0, None, None, 0.0) == "[tests] 0/10 done (0%), 10 s elapsed"  # no pace yet
    assert progress_line(10, 10, 70.0, (0.0, "at the pace so far"), None, 0.0) == (
        "[tests] 10/10 done (100%), 1m10s elapsed; the session's teardown now")
    assert [duration(s) for s in (0.4, 59.6, 61, 3599, 3725)] == ["0 s", "1m00s", "1m01s", "59m59s", "1h02m"]


def test_the_time_left_follows_the_last_runs_times_at_this_runs_pace():
    last = {"a": 1.0, "b": 2.0, "slow": 60.0, "c": 0.5}
    # this run is twice as slow on what both ran: the slow test left counts 120 s, the new one this run's mean
    assert seconds_left({"a": 2.0, "b": 4.0}, ["slow", "new"], last) == (2 * 60.0 + 3.0, "by the last run's times")
    assert seconds_left({"a": 2.0, "b": 4.0}, ["slow"], {}) == (3.0, "at the pace so far")  # no cache: the mean
    assert seconds_left({}, ["a"], last) is None
    assert seconds_left({"a": 2.0, "b": 4.0}, ["slow", "new"], last, workers=2) == (61.5, "by the last run's times")
    # the slow test has run 100 s of its expected 120 s: 20 s of it and the new test's 3 s are left
    assert seconds_left({"a": 2.0, "b": 4.0}, ["slow", "new"], last, running_for={"slow": 100.0})[0] == 23.0


def test_a_prefect_console_handler_on_a_closed_capture_writes_to_the_real_stderr(capfd):
    from prefect.logging.handlers import PrefectConsoleHandler

    captured = io.StringIO()
    handler = PrefectConsoleHandler(stream=captured)
    logger = logging.getLogger("prefect.test-session-check")
    logger.addHandler(handler)
    try:
        follow_open_stderr()
        assert isinstance(handler.stream, StderrWhileOpen) and handler.console.file is handler.stream
        logger.warning("while the capture is open")
        assert "while the capture is open" in captured.getvalue()
        captured.close()  # what pytest does to its capture when a run is interrupted, before the teardowns
        logger.warning("after pytest closed it")
    finally:
        logger.removeHandler(handler)
    err = capfd.readouterr().err
    assert "after pytest closed it" in err and "Logging error" not in err and "closed file" not in err
