"""The inbox watcher of `unlearn serve` (flows/serve.py): it announces every entry that is waiting at its
start, every entry that appears or changes once it has settled (a file written in pieces is announced after
its last write, not at its first), entries that are no request files too (their run rejects them with the
reason), never dot-files, and nothing before the trigger deployment exists. Real files and the real
watchfiles watcher in a thread; the announcement is recorded instead of sent as a Prefect event."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from flows.serve import SettledEntries, watch_inbox


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_is_ready_once_it_stopped_changing(tmp_path):
    clock, f = Clock(), tmp_path / "a.csv"
    f.write_text("header\n")
    entries = SettledEntries(2.0, clock)
    entries.touch(f)
    entries.touch(tmp_path / ".tmp.csv")  # a dot-file is never announced
    clock.now = 1.0
    assert entries.ready() == []
    with open(f, "a") as fh:
        fh.write("row 1\n")  # still being written: its settle time starts again
    clock.now = 2.5
    assert entries.ready() == []
    clock.now = 4.6
    assert entries.ready() == [f] and entries.ready() == []


def test_a_moved_entry_is_forgotten(tmp_path):
    clock, f = Clock(), tmp_path / "a.csv"
    f.write_text("x")
    entries = SettledEntries(0.0, clock)
    entries.touch(f)
    f.unlink()
    assert entries.ready() == [] and entries.waiting == {}


def run_watcher(inbox: Path, settle: float, ready_to_announce=lambda: True):
    announced: list[tuple[float, str]] = []
    stop = threading.Event()
    t = threading.Thread(target=watch_inbox, args=(inbox, stop, settle, lambda p: announced.append(
        (time.monotonic(), p.name)), ready_to_announce), daemon=True)
    t.start()
    return announced, stop, t


def wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.1)
    return predicate()


def test_watcher_announces_waiting_new_and_odd_entries_after_they_settle(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "2026-12-01T0900_left.csv").write_text("left by a stopped serve\n")
    (inbox / ".gitkeep").write_text("")
    gate = threading.Event()
    announced, stop, t = run_watcher(inbox, 1.0, gate.is_set)
    try:
        time.sleep(1.5)
        assert announced == []  # the trigger deployment does not exist yet: an event would reach nothing
        gate.set()
        assert wait_until(lambda: [n for _, n in announced] == ["2026-12-01T0900_left.csv"])
        # a file written in pieces, 0.4 s apart: one announcement, after its last piece
        slow = inbox / "2026-12-01T1000_slow.CSV"
        for k in range(4):
            with open(slow, "a") as fh:
                fh.write(f"row {k}\n")
            last = time.monotonic()
            time.sleep(0.4)
        (inbox / "notes.txt").write_text("not a request file")
        (inbox / "sub").mkdir()
        (inbox / ".writing.csv").write_text("a dot-file")
        assert wait_until(lambda: len(announced) >= 4)
        time.sleep(1.5)
        names = [n for _, n in announced]
        assert sorted(names[1:]) == ["2026-12-01T1000_slow.CSV", "notes.txt", "sub"] and len(names) == 4
        slow_at = next(at for at, n in announced if n == slow.name)
        assert slow_at - last >= 0.9  # after the last write had settled for the settle time
    finally:
        stop.set()
        t.join(timeout=10)


def test_an_announced_entry_still_waiting_is_due_again_after_a_doubling_wait(tmp_path):
    # a sweep of `unlearn serve`: a file whose event was lost in a server outage, or whose run failed, stayed
    # in the inbox until the next 02:00 schedule, a later drop or a serve restart, and nothing said so
    from flows.serve import Retries

    clock, f, g = Clock(), tmp_path / "a.csv", tmp_path / "b.csv"
    f.write_text("x")
    g.write_text("y")
    retries = Retries(60.0, clock)
    retries.announced(f, fresh=True)
    retries.announced(g, fresh=True)
    clock.now = 59.0
    assert retries.due() == []
    clock.now = 60.0
    assert retries.due() == [f, g]
    retries.announced(f, fresh=False)  # announced again: the next wait doubles
    g.unlink()  # applied or rejected: it left the inbox, nothing to retry
    clock.now = 179.0
    assert retries.due() == [] and g not in retries.pending
    clock.now = 180.0
    assert retries.due() == [f]
    for _ in range(12):  # doubling stops at an hour
        retries.announced(f, fresh=False)
    assert retries.pending[f][1] == 3600.0
    with open(f, "a") as fh:
        fh.write("more")  # changed: the settle path announces it afresh; no retry of the old content
    assert retries.due() == [] and f not in retries.pending
    retries.announced(f, fresh=True)
    assert retries.pending[f][1] == 60.0


def test_watcher_announces_again_only_when_no_run_is_live_and_waits_out_an_outage(tmp_path, capsys):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    f = inbox / "2026-12-01T0900_a.csv"
    f.write_text("a\n")
    server_up, live = threading.Event(), threading.Event()
    server_up.set()
    live.set()  # a run is live: it may still take the file
    announced: list[str] = []
    stop = threading.Event()
    t = threading.Thread(target=watch_inbox, daemon=True, kwargs=dict(
        inbox=inbox, stop=stop, settle_seconds=0.2, announce=lambda p: announced.append(p.name),
        ready_to_announce=server_up.is_set, retry_seconds=1.0, runs_live=lambda: live.is_set()))
    t.start()
    try:
        assert wait_until(lambda: announced == [f.name])
        time.sleep(2.0)
        assert announced == [f.name]  # due, but a run is live
        live.clear()  # no run left and the file is still there: its run failed, or its event was lost
        assert wait_until(lambda: announced == [f.name] * 2)
        server_up.clear()  # the server goes down; a new file waits, and the watcher says so once
        g = inbox / "2026-12-01T1000_b.csv"
        g.write_text("b\n")
        time.sleep(2.5)
        assert announced == [f.name] * 2
        server_up.set()
        assert wait_until(lambda: g.name in announced)
    finally:
        stop.set()
        t.join(timeout=10)
    out = capsys.readouterr().out
    assert out.count("the Prefect server does not answer") == 1 and "entr(ies) wait" in out
    assert "the Prefect server answers again" in out and "(again: still in the inbox and no run is live" in out


def test_only_runs_that_may_still_take_a_file_count_as_live():
    import datetime as dt

    from flows.serve import _is_live

    now = dt.datetime(2026, 12, 3, 12, tzinfo=dt.timezone.utc)

    def run(type_, name, when=None):
        return {"state": {"type": type_, "name": name, "state_details": {"scheduled_time": when}}}

    assert _is_live(run("RUNNING", "Running"), now) and _is_live(run("PENDING", "Pending"), now)
    assert _is_live(run("SCHEDULED", "AwaitingConcurrencySlot", "2026-12-03T12:00:30Z"), now)
    assert _is_live(run("SCHEDULED", "Scheduled", "2026-12-03T11:59:59+00:00"), now)  # a triggered run, due
    assert not _is_live(run("SCHEDULED", "Scheduled", "2026-12-04T02:00:00+00:00"), now)  # the next 02:00


def test_an_outage_before_the_first_file_is_said_too(tmp_path, capsys):
    # the sweep's case: serve up with an empty inbox, the server killed, a file dropped during the outage
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    server_up = threading.Event()
    server_up.set()
    announced: list[str] = []
    stop = threading.Event()
    t = threading.Thread(target=watch_inbox, daemon=True, kwargs=dict(
        inbox=inbox, stop=stop, settle_seconds=0.2, announce=lambda p: announced.append(p.name),
        ready_to_announce=server_up.is_set))
    t.start()
    try:
        time.sleep(1.0)  # the trigger deployment is seen while the inbox is empty
        server_up.clear()
        (inbox / "a.csv").write_text("a\n")
        seen: list[str] = []
        assert wait_until(lambda: seen.append(capsys.readouterr().out) or "does not answer" in "".join(seen),
                          timeout=5)
        assert announced == []
        server_up.set()
        assert wait_until(lambda: announced == ["a.csv"])
    finally:
        stop.set()
        t.join(timeout=10)
