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
