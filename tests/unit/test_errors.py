"""flows/errors.py: which errors end a command or stage in one line, and the console filter for Prefect's copies."""

import logging
import sys

import pytest

from flows.errors import EXIT_BAD_INPUT, EXIT_FAILURE, KnownErrorsOnce, exit_code, one_line_errors
from unlearning.config import ConfigError
from unlearning.data import DataError


def record(msg: str, level=logging.ERROR, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("prefect.task_runs", level, __file__, 1, msg, None, exc_info)


def test_data_errors_are_bad_input_and_unknown_errors_are_not():
    assert exit_code(DataError("prepare.table: no rows")) == EXIT_BAD_INPUT
    assert exit_code(FileNotFoundError("x")) == EXIT_BAD_INPUT
    assert exit_code(ValueError("a bug")) is None and exit_code(KeyError("k")) is None


def test_prefects_copies_of_a_known_error_stay_off_the_console(monkeypatch):
    """The four records Prefect 3 logs for a task failing on a known error (their texts as Prefect writes them)."""
    monkeypatch.delenv("UNLEARN_DEBUG", raising=False)
    f = KnownErrorsOnce()
    err = ConfigError("bad thing: prepare.x = 3")
    assert not f.filter(record(f"Task run failed with exception: {err!r}", exc=err))
    assert not f.filter(record(f"Finished in state Failed('Task run encountered an exception ConfigError: {err}')"))
    assert not f.filter(record(f"Encountered exception during execution: {err!r}", exc=err))
    assert not f.filter(record(f"Finished in state Failed('Flow run encountered an exception: ConfigError: {err}')",
                               logging.INFO))
    # an unexpected error keeps its traceback and its state lines; other records pass
    bug = ZeroDivisionError("division by zero")
    assert f.filter(record(f"Task run failed with exception: {bug!r}", exc=bug))
    assert f.filter(record("Finished in state Failed('Task run encountered an exception ZeroDivisionError: x')"))
    assert f.filter(record("Beginning flow run 'x' for flow 'prepare'", logging.INFO))


def test_a_state_record_before_the_exception_record_is_left_out_too(monkeypatch):
    # a failure in the flow's first task: its Failed-state line came first, when nothing was "seen" yet
    monkeypatch.delenv("UNLEARN_DEBUG", raising=False)
    f = KnownErrorsOnce()
    assert not f.filter(record("Finished in state Failed('Task run encountered an exception StateMismatch: "
                               "state/ was built from other params: recipe: epochs was 30, now 5')"))
    assert f.filter(record("Finished in state Failed('Task run encountered an exception KeyError: x')"))


def test_a_closed_pipe_is_not_bad_input(tmp_path, capfd):
    # `unlearn status | head -1`: BrokenPipeError is a ConnectionError, which counted as bad input (exit 2)
    import os
    import subprocess

    assert exit_code(BrokenPipeError(32, "Broken pipe")) is None
    assert exit_code(ConnectionRefusedError("x")) == EXIT_BAD_INPUT
    r, w = os.pipe()
    os.close(r)
    proc = subprocess.run([sys.executable, "-c", "from flows.cli import main; raise SystemExit(main(['methods']))"],
                          stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(w)
    assert proc.returncode == EXIT_FAILURE and "Broken pipe" not in proc.stderr and "Traceback" not in proc.stderr


def test_an_unknown_batch_is_bad_input(tmp_path):
    from tasks.erasure import verify_erasure
    from tasks.stores.base import ErasureSettings
    from tests.helpers import make_project
    from unlearning.config import load_params
    from unlearning.privacy.erasure import UnknownBatch

    params = load_params(make_project(tmp_path, inbox_files=False))
    with pytest.raises(UnknownBatch, match="batch 'batch-000000000000' is not in the ledger .* holds no batch yet"):
        verify_erasure(ErasureSettings.of(params), "batch-000000000000", None)
    assert exit_code(UnknownBatch("x")) == EXIT_BAD_INPUT


def test_debug_keeps_every_record(monkeypatch):
    monkeypatch.setenv("UNLEARN_DEBUG", "1")
    err = DataError("rows with missing values")
    assert KnownErrorsOnce().filter(record(f"Task run failed with exception: {err!r}", exc=err))


def test_one_line_errors_exit_with_the_documented_code(capsys, monkeypatch):
    monkeypatch.delenv("UNLEARN_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        with one_line_errors():
            raise DataError("case.csv: rows with missing values: 'a'; set prepare.table.missing: drop")
    assert e.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "error: case.csv: rows with missing values: 'a'; set prepare.table.missing: drop\n"

    class AfterCommitError(RuntimeError):
        pass

    with pytest.raises(SystemExit) as e:
        with one_line_errors():
            raise AfterCommitError("applied; NOT done: the DVC commit")
    assert e.value.code == EXIT_FAILURE
    with pytest.raises(ZeroDivisionError):  # an unexpected error keeps its traceback
        with one_line_errors():
            1 / 0


def test_the_module_is_stdlib_only():
    import subprocess

    code = "import sys, flows.errors; print(sorted(m for m in ('prefect', 'pandas', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unreadable_pipeline_files_are_one_line_failures(tmp_path):
    """Truncated state files: StateCorrupt naming the file and how to restore it (exit 1, no traceback)."""
    import torch

    from unlearning.data.store import read_state_manifest
    from unlearning.io import StateCorrupt, load_checkpoint, read_json_file
    from unlearning.privacy.ledger import LedgerError, read_ledger

    (tmp_path / "champion.json").write_text('{"model_version": "3", "fing')
    (tmp_path / "ledger.jsonl").write_text('{"request_id": "r1"}\n{"request_id": "r')
    (tmp_path / "manifest.csv").write_text("sample_id,split,label,group,class_name,status,deleted_in_batch\nd-1,tr")
    torch.save({"extra": {}}, tmp_path / "model.pt")
    (tmp_path / "model.pt").write_bytes((tmp_path / "model.pt").read_bytes()[:40])
    for read, name in ((read_json_file, "champion.json"), (read_ledger, "ledger.jsonl"),
                       (read_state_manifest, "manifest.csv"), (load_checkpoint, "model.pt")):
        with pytest.raises(StateCorrupt) as e:
            read(tmp_path / name)
        assert str(tmp_path / name) in str(e.value) and "\n" not in str(e.value)
        assert exit_code(e.value) == EXIT_FAILURE
    assert issubclass(LedgerError, StateCorrupt)
    with pytest.raises(FileNotFoundError):  # a missing file stays a missing file
        load_checkpoint(tmp_path / "absent.pt")


def test_a_broken_params_yaml_is_a_config_error(tmp_path):
    from unlearning.config import load_params

    (tmp_path / "params.yaml").write_text("base: [\n  seed: 1\n")
    with pytest.raises(ConfigError, match=r"params.yaml: not valid YAML at line \d+, column \d+"):
        load_params(tmp_path / "params.yaml")
    (tmp_path / "params.yaml").write_text("- base\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_params(tmp_path / "params.yaml")
    (tmp_path / "params.yaml").write_text("base:\n\tseed: 0\n")  # libyaml does not name the tab itself
    with pytest.raises(ConfigError, match=r"line 2, column 1: .*\(a tab: YAML indents with spaces only\)"):
        load_params(tmp_path / "params.yaml")


def test_a_second_batch_says_once_that_it_waits_for_the_lock(tmp_path, capsys):
    import os

    from unlearning.io import LockTimeout, exclusive_lock

    with exclusive_lock(tmp_path / ".state.lock"):
        with pytest.raises(LockTimeout, match="held by another batch"):
            with exclusive_lock(tmp_path / ".state.lock", timeout=0.3, poll=0.05):
                pass
    err = capsys.readouterr().err
    assert err.count("waiting for") == 1 and f"process {os.getpid()} holds it" in err
    assert "operations.lock_timeout_seconds" in err
    with exclusive_lock(tmp_path / ".state.lock", timeout=0.3):  # free again: taken at once, nothing said
        pass
    assert capsys.readouterr().err == ""


def test_reconcile_reports_a_truncated_champion_file_in_one_line(tmp_path):
    # json.loads raised a JSONDecodeError traceback from the deletion stage and `unlearn erase`
    from flows.deletion_batch import reconcile
    from tasks.stores.base import ErasureSettings
    from unlearning.config import parse_params
    from unlearning.io import StateCorrupt

    params = parse_params({}, root=tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "champion.json").write_text('{"model_version": "3", "fingerpr')
    with pytest.raises(StateCorrupt, match=r"champion\.json: not valid JSON"):
        reconcile(ErasureSettings.of(params), None, lambda: False)


def test_an_inbox_file_still_open_for_writing_is_left_in_the_inbox(tmp_path):
    # a writer paused mid-row: the file was applied with its cut last row, moved to processed/, and the rows
    # written afterwards followed it there unread (4 requests lost, silently)
    import subprocess
    import sys
    import time

    from flows.deletion_batch import process_inbox_file, report_results
    from unlearning.config import parse_params

    inbox = tmp_path / "requests" / "inbox"
    inbox.mkdir(parents=True)
    f = inbox / "2026-12-01T1000_stream.csv"
    writer = subprocess.Popen([sys.executable, "-c", f"f = open({str(f)!r}, 'w'); f.write('request_id,sample_id\\n'"
                               f" 'r1,digits-0001\\nr2,dig'); f.flush(); import time; time.sleep(30)"])
    try:
        for _ in range(100):
            if f.exists() and f.stat().st_size:
                break
            time.sleep(0.05)
        r = process_inbox_file(f, parse_params({}, root=tmp_path), "cpu", inbox)
    finally:
        writer.kill()
        writer.wait()
    assert r["status"] == "changed" and f"process(es) [{writer.pid}]" in r["reason"] and f.exists()
    assert report_results([r]) == 2


def test_a_failed_move_to_processed_after_the_batch_applied_says_it_was_applied(tmp_path, monkeypatch):
    # requests/processed not writable: the batch was in state/, but the one line said only "Operation not
    # permitted" with exit 2 ("bad input, nothing changed"). Mocked: as root, chmod does not make a folder unwritable.
    import flows.deletion_batch as D
    from flows.errors import EXIT_FAILURE, exit_code
    from unlearning.config import parse_params

    inbox = tmp_path / "requests" / "inbox"
    inbox.mkdir(parents=True)
    f = inbox / "2026-12-01T1000_a.csv"
    f.write_text("request_id,sample_id\nr1,digits-0001\n")
    monkeypatch.setattr(D, "process_request_file", lambda *a: {"file": f.name, "status": "applied", "batch_id": "b-1"})

    def refuse(*a):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(D, "processed", refuse)
    with pytest.raises(D.AfterCommitError, match=r"batch b-1 WAS applied.*NOT done: moving the file") as e:
        D.process_inbox_file(f, parse_params({}, root=tmp_path), "cpu", inbox)
    assert exit_code(e.value) == EXIT_FAILURE


@pytest.mark.parametrize("left", [["champion.json"], ["ledger.jsonl", "manifest.csv"]])
def test_a_state_without_its_model_is_damage_not_a_fresh_start(tmp_path, left):
    # a missing state/model.pt rebuilt the state from the original silently (exit 0): the champion history lost
    # its batches, and verify-erasure failed afterwards
    from tasks.state import StateSettings, ensure_state, load_state
    from unlearning.config import parse_params
    from unlearning.io import StateCorrupt

    (tmp_path / "state").mkdir()
    for name in left:
        (tmp_path / "state" / name).write_text("{}\n")
    params = parse_params({}, root=tmp_path)
    for read in (load_state.fn, ensure_state):
        with pytest.raises(StateCorrupt, match=r"model\.pt: missing, while .* holds .*restore the state"):
            read(StateSettings.of(params), "cpu")


def test_a_problem_line_names_at_most_twenty_rows():
    from unlearning.requests import rows_text

    assert rows_text([3]) == "row 3" and rows_text([1, 2]) == "rows 1, 2"
    assert rows_text(list(range(1, 100_001))) == f"rows {', '.join(map(str, range(1, 21)))} and 99980 more"


def test_an_mlflow_store_held_locked_is_named_in_one_line(tmp_path):
    # another process holding BEGIN EXCLUSIVE: MLflow gave up after ~30 s with four sqlalchemy tracebacks
    import sqlite3
    import subprocess
    import sys
    import time

    from adapters.store_check import tracking_store_problem

    db = tmp_path / "mlflow.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    holder = subprocess.Popen([sys.executable, "-c", f"import sqlite3, time; c = sqlite3.connect({str(db)!r}, "
                               f"isolation_level=None); c.execute('BEGIN EXCLUSIVE'); print('held', flush=True); "
                               f"time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.perf_counter()
        problem = tracking_store_problem(f"sqlite:///{db}")
        assert time.perf_counter() - t0 < 10
    finally:
        holder.kill()
        holder.wait()
    assert problem.startswith(f"MLflow store sqlite:///{db} is locked by another process") and "fuser" in problem
    assert tracking_store_problem(f"sqlite:///{db}") is None  # released: usable again


def test_reconcile_purges_a_never_promoted_version_once_rows_were_erased(tmp_path):
    # a batch killed after registering its model left v4: `unlearn erase` only tagged it, and verify-erasure
    # failed ("1 version(s) besides the champion remain") until another batch's erasure ran
    from flows.deletion_batch import reconcile
    from tasks.state import StateSettings
    from tasks.stores.base import ErasureSettings
    from unlearning.config import parse_params

    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "champion.json").write_text('{"model_version": "2"}')
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tombstones.txt").write_text("digits-0001\n")

    class Registry:
        def __init__(self):
            self.all, self.purged = ["1", "2", "4"], []

        def reconcile_alias(self, *a):
            return "2", False

        def fail_stale_runs(self):
            return []

        def tag_unpromoted(self, *a):
            return ["4"]

        def unpromoted_versions(self, name):
            return ["4"]

        def versions(self, name):
            return list(self.all)

        def purge_versions(self, name, keep):
            self.purged = [v for v in self.all if v not in keep]
            self.all = [v for v in self.all if v in keep]
            return self.purged

    registry = Registry()
    params = parse_params({}, root=tmp_path)
    notes = reconcile(ErasureSettings.of(params), registry, StateSettings.of(params))
    assert registry.purged == ["4"] and registry.all == ["1", "2"]  # v1 is left to the erasure's own rule
    assert any("purged never-promoted version(s) ['4']" in n for n in notes)
