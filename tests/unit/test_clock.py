"""adapters.clock: compute and tracking time as unions of intervals, tracking taken out of compute."""

import json
import threading
import time

import pytest

from adapters import clock


@pytest.fixture(autouse=True)
def fresh_clock():
    clock.reset()
    yield
    clock.reset()


@pytest.fixture
def fake_now(monkeypatch):
    """adapters.clock reads this list's value as its clock: the tests assert what is counted (once, as the union),
    never how long the machine took (a loaded machine made sleeps run past any bound)."""
    import types

    now = [100.0]
    monkeypatch.setattr(clock, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def test_tracking_inside_compute_is_counted_once_as_tracking(fake_now):
    @clock.tracks
    def log():
        fake_now[0] += 0.10

    @clock.computes
    def task():
        fake_now[0] += 0.10
        log()

    task()
    t = clock.totals()
    assert t["compute_s"] == pytest.approx(0.10) and t["tracking_s"] == pytest.approx(0.10)


def test_parallel_sections_count_their_union_and_nested_ones_their_outermost(fake_now):
    """Four threads inside the same 0.15 s (a nested 0.05 s section each): 0.15 s of compute, not 0.6 or 0.8."""
    gate = threading.Barrier(4)

    def step(seconds: float) -> None:
        if gate.wait() == 0:  # one thread moves the clock while every thread stands inside its sections
            fake_now[0] += seconds
        gate.wait()

    @clock.computes
    def inner():
        step(0.05)

    @clock.computes
    def chunk():
        inner()  # nested compute: not counted twice
        step(0.10)

    threads = [threading.Thread(target=chunk) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert clock.totals()["compute_s"] == pytest.approx(0.15)


def test_interval_arithmetic_in_float64_on_tiny_cases():
    assert clock._union([(0, 1), (0.5, 2), (3, 4)]) == [(0, 2), (3, 4)]
    assert clock._minus([(0, 2), (3, 4)], [(1, 3.5)]) == [(0, 1), (3.5, 4)]
    assert clock._length(clock._minus([(0, 10)], [(1, 2), (4, 5)])) == 8


def test_a_class_gets_init_and_public_methods_timed_and_private_ones_left():
    @clock.tracks
    class T:
        def __init__(self):
            time.sleep(0.02)

        def log(self):
            time.sleep(0.02)

        def _helper(self):
            return 1

        @staticmethod
        def static():
            return 2

    t = T()
    t.log()
    assert not hasattr(T._helper, "__wrapped__") and hasattr(T.log, "__wrapped__")
    assert T.static() == 2
    names = {k.rsplit("<locals>.", 1)[-1] for k, _ in clock.largest()}
    assert names == {"T.__init__", "T.log"}
    assert clock.totals()["tracking_s"] >= 0.035


def test_an_unknown_kind_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"unknown timing kind 'io'; allowed: \['compute', 'tracking'\]"):
        clock.section("io")


def test_the_record_is_one_json_line_appended_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(clock.ENV_FILE, raising=False)
    clock.write_record("x")  # no file configured: nothing written, no error
    path = tmp_path / "t.jsonl"
    monkeypatch.setenv(clock.ENV_FILE, str(path))
    with clock.section("compute", "f"):
        time.sleep(0.01)
    clock.write_record("prepare")
    clock.write_record("prepare")  # a second entry point of the same process (the CLI inside a warm child): skipped
    lines = [json.loads(s) for s in path.read_text().splitlines()]
    assert [r["label"] for r in lines] == ["prepare"] and lines[0]["compute_s"] > 0
    assert lines[0]["largest"][0][0] == "compute:f"


def test_the_label_is_the_dvc_stage_else_the_sessions_command(monkeypatch):
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.delenv("UNLEARN_TIMING_LABEL", raising=False)
    assert clock.stage_label("flows.cli:main") == "flows.cli:main"
    monkeypatch.setenv("UNLEARN_TIMING_LABEL", "unlearn erase")
    assert clock.stage_label("flows.cli:main") == "unlearn erase"
    monkeypatch.setenv("DVC_STAGE", "train")
    assert clock.stage_label("flows.train") == "train"


def test_compute_done_in_another_process_counts_once(monkeypatch):
    """A Dask worker's task body is compute of the stage that waited for it; where the same work was timed here
    too (the threads runner), the union of intervals counts it once. A fake clock: the behaviour (once vs
    twice), never the machine's speed, decides the figures."""
    import types

    import pytest

    from adapters import clock

    now = [100.0]
    monkeypatch.setattr(clock, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    clock.reset()
    with clock.section("compute", "here"):
        now[0] += 0.05
    clock.elsewhere("compute", "worker", 0.05)  # the same 50 ms, seen from the worker: no double count
    assert clock.totals()["compute_s"] == pytest.approx(0.05)
    now[0] += 0.02
    clock.elsewhere("compute", "worker", 0.01)  # disjoint work (ended 20 ms later, lasted 10 ms): added
    assert clock.totals()["compute_s"] == pytest.approx(0.06)
    clock.reset()
