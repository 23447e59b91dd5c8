"""flows.session: stage timing from DVC's output, and CMD passed through (no server when one is configured)."""

import os
import re
import sys

import pytest

from flows import session


def test_stage_lines_are_timed_and_output_passes_through(capsys):
    script = ("import time\n"
              "print(\"Stage 'prepare' didn't change, skipping\")\n"
              "print(\"Running stage 'train':\"); time.sleep(0.2)\n"
              "print(\"Running stage 'deletion':\"); time.sleep(0.1)\n")
    rc, stages, _ = session.run_timed([sys.executable, "-c", script], env={})
    assert rc == 0 and [name for name, _ in stages] == ["prepare (skipped)", "train", "deletion"]
    # The parent times a stage from reading its line to reading the next one, so the measured time can fall a
    # hair short of the child's sleep (CI measured 0.19999 for sleep(0.2)): bounds with slack, not exact.
    assert 0.15 <= stages[1][1] < 2 and 0.05 <= stages[2][1] < 2
    assert "Running stage 'train':" in capsys.readouterr().out


@pytest.mark.parametrize("stage_code,expected", [(2, 2), (3, 3), (1, 1)])
def test_a_failed_stage_gives_its_own_exit_code_not_dvcs(stage_code, expected):
    """DVC exits 255 whatever the stage exited with: the session returns the stage's documented code."""
    script = ("import sys\n"
              "print(\"Running stage 'prepare':\")\n"
              f"print(\"ERROR: failed to reproduce 'prepare': failed to run: python -m flows.warm run flows.prepare, "
              f"exited with {stage_code}\")\n"
              "sys.exit(255)\n")
    rc, _, _ = session.run_timed([sys.executable, "-c", script], env={})
    assert rc == expected
    rc, _, _ = session.run_timed([sys.executable, "-c", "import sys; sys.exit(255)"], env={})
    assert rc == 255  # DVC's own failure (no stage line): its code stays


def test_an_existing_server_is_used_and_the_exit_code_kept(monkeypatch, capsys):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    monkeypatch.setattr(session, "ServerProcess", lambda env: (_ for _ in ()).throw(AssertionError("no server")))
    assert session.main(["--cold", sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert "wall time per stage" in capsys.readouterr().out


def test_then_commands_run_in_order_and_stop_at_the_first_failure(monkeypatch, capsys):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    py = sys.executable
    rc = session.main(["--cold", py, "-c", "print('first')", "--then", py, "-c", "import sys; sys.exit(4)",
                       "--then", py, "-c", "print('never')"])
    out = capsys.readouterr().out
    assert rc == 4 and "first" in out and "never" not in out
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()[0].startswith("python")]
    assert len(rows) == 2  # one timing row per command that ran


def test_commands_are_split_on_then_and_an_empty_one_is_refused():
    assert session.split_commands(["dvc", "repro", "--then", "unlearn", "erase"]) == \
        ([["dvc", "repro"], ["unlearn", "erase"]], True)
    assert session.split_commands(["--cold", "x"]) == ([["x"]], False)
    for bad in (["x", "--then"], ["--then", "x"], []):
        with pytest.raises(ValueError, match="an empty command"):
            session.split_commands(bad)


def test_the_table_splits_each_stage_into_compute_tracking_and_orchestration():
    rows = [("start (DVC, server, imports)", 2.0), ("prepare (skipped)", 0.0), ("train", 4.0), ("deletion", 14.0)]
    timings = {"train": {"compute_s": 1.0, "tracking_s": 1.5}, "deletion": {"compute_s": 9.0, "tracking_s": 3.0}}
    split = session.timing_split(rows, timings, total=20.0, server_up=8.5)
    assert split["overhead_share"] == 0.5 and split["stages"][2]["orchestration_s"] == 1.5
    lines = session.timing_table(split)
    train = next(line for line in lines if line.strip().startswith("train"))
    assert train.split()[1:] == ["4.0s", "1.0s", "1.5s", "1.5s"]
    total = next(line for line in lines if line.strip().startswith("total"))
    assert total.split()[1:] == ["20.0s", "10.0s", "4.5s", "5.5s"]
    # Every row's numbers end in the same columns as the header's names, the longest stage name included.
    header = next(line for line in lines if line.strip().startswith("stage"))
    ends = [header.index(name) + len(name) for name in ("wall", "compute", "tracking", "orchestration")]
    for line in lines[3:-1]:
        assert [m.end() for m in re.finditer(r"\S+", line)][-4:] == ends, line
    assert "overhead (tracking + orchestration): 50% of the wall time; the Prefect server answered after 8.5 s" \
        in lines[-1]


def test_every_dvc_stage_runs_through_the_warm_entry_that_records_its_split():
    """`python -m flows.warm run` writes the stage's compute and tracking seconds for the session's table; a
    stage started as `python -m flows.<x>` writes nothing, and `make report` printed 0 s of compute for its
    20 minutes of studies (overhead 100 %)."""
    import yaml
    from pathlib import Path

    root = Path(session.__file__).parents[1]
    stages = {f"{f}:{name}": s for f in ("dvc.yaml", "report/dvc.yaml")
              for name, s in yaml.safe_load((root / f).read_text())["stages"].items()}
    assert "report/dvc.yaml:report" in stages
    wrong = {name: s["cmd"] for name, s in stages.items() if not s["cmd"].startswith("python -m flows.warm run ")}
    assert not wrong

def test_the_prefect_database_counts_as_migrated_only_with_this_versions_stamp(tmp_path):
    import importlib.metadata

    env = {"PREFECT_HOME": str(tmp_path)}
    assert not session.prefect_db_is_migrated(env)
    (tmp_path / "prefect.db").write_text("")
    (tmp_path / "prefect.db.version").write_text(importlib.metadata.version("prefect") + "\n")
    assert session.prefect_db_is_migrated(env)
    assert not session.prefect_db_is_migrated({**env, "PREFECT_API_DATABASE_CONNECTION_URL": "postgresql+asyncpg://x"})
    (tmp_path / "prefect.db.version").write_text("2.0.0")
    assert not session.prefect_db_is_migrated(env)
    session.stamp_migrated(env)  # a server migrated it at its start: the next sessions skip the check
    assert session.prefect_db_is_migrated(env)
    assert session.prefect_home({"HOME": "x"}) == os.path.join(os.path.expanduser("~"), ".prefect")  # Prefect's


def test_dvc_git_hint_becomes_one_line_on_the_dvc_lock_policy_and_other_output_passes(capsys):
    hint = ("Updating lock file 'dvc.lock'\n\nTo track the changes with git, run:\n\n\tgit add dvc.lock\n\n"
            "To enable auto staging, run:\n\n\tdvc config core.autostage true\nUse `dvc push` to send your updates.\n")
    rc, _, _ = session.run_timed([sys.executable, "-c", f"import sys; sys.stdout.write({hint!r})"], env={})
    out = capsys.readouterr().out
    assert rc == 0 and "autostage" not in out and "To track the changes" not in out
    assert out.splitlines() == ["Updating lock file 'dvc.lock'",
                                "DVC updated dvc.lock: it records what this run was built from; commit it with your "
                                "data version when you want to keep this run (`git add dvc.lock`; docs/getting-started.md, \"dvc.lock\")",
                                "Use `dvc push` to send your updates."]
    other = "a\n\n\nTo track the changes with git, run:\nsomething else\n"  # not DVC's block: unchanged
    hint_filter = session.DvcGitHint()
    lines = [s for line in other.splitlines(keepends=True) for s in hint_filter.feed(line)] + hint_filter.flush()
    assert "".join(lines) == other


def test_the_temporary_servers_docs_hint_is_dropped_and_other_prefect_records_kept():
    import logging

    f = session.NoServerDocsHint()
    rec = logging.LogRecord("prefect", logging.INFO, "", 0, "Starting temporary server on http://127.0.0.1:1\nSee "
                            "https://www.prefect.io/docs/v3/concepts/server#how-to-guides for more information.", None, None)
    assert f.filter(rec) and rec.getMessage() == "Starting temporary server on http://127.0.0.1:1"
    other = logging.LogRecord("prefect", logging.WARNING, "", 0, "See https://x for why", None, None)
    assert f.filter(other) and other.getMessage() == "See https://x for why"


def test_a_bad_params_key_stops_dvc_repro_before_any_server_or_worker(tmp_path, monkeypatch, capsys):
    from tests.helpers import ROOT

    text = (ROOT / "params.yaml").read_text().replace("\n  epochs: ", "\n  epoch: ", 1)
    (tmp_path / "params.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(session, "ServerProcess", lambda env: (_ for _ in ()).throw(AssertionError("no server")))
    monkeypatch.setattr(session, "start_warm_worker", lambda env, folder: (_ for _ in ()).throw(AssertionError("no")))
    assert session.main(["/x/bin/dvc", "repro", "deletion", "--then", "unlearn", "status"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: params.yaml: unknown key 'train.epoch'")
    assert session.params_problem(["unlearn", "status"]) is None  # only `dvc repro` reads ./params.yaml for sure


@pytest.mark.parametrize("marker, expected", [("http://127.0.0.1:9/api", None), ("http://127.0.0.1:8/api", 180),
                                              (None, 180)])
def test_flows_send_heartbeats_only_to_a_server_that_outlives_the_session(monkeypatch, marker, expected):
    """flows.common.prefect_api: the session's temporary server (its URL in UNLEARN_TEMPORARY_SERVER) gets no
    heartbeats, any other server keeps Prefect's default (180 s). Nothing is contacted: no ENV_WAIT_FOR_API."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    from flows.common import prefect_api
    from flows.warm import ENV_TEMPORARY_SERVER, ENV_WAIT_FOR_API

    monkeypatch.delenv(ENV_WAIT_FOR_API, raising=False)
    monkeypatch.delenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", raising=False)
    if marker is None:
        monkeypatch.delenv(ENV_TEMPORARY_SERVER, raising=False)
    else:
        monkeypatch.setenv(ENV_TEMPORARY_SERVER, marker)
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        with prefect_api() as url:
            assert url == "http://127.0.0.1:9/api"
            assert get_current_settings().flows.heartbeat_frequency == expected
        assert get_current_settings().flows.heartbeat_frequency == 180


def test_after_a_file_was_not_applied_the_erasure_still_runs_and_the_first_code_is_kept(monkeypatch, capsys):
    # `make run` with one rejected inbox file beside a good one stopped before `unlearn erase`: the good file's
    # forgotten rows stayed in data/prepared, the original and the DVC cache, and nothing said so
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    py = sys.executable
    rejected = ("import sys; print('error: 1 file(s) rejected and moved to requests/rejected/ with an error report: "
                "[\"bad.csv\"]'); sys.exit(2)")
    rc = session.main(["--cold", py, "-c", rejected, "--then", py, "-c", "print('erase ran')",
                       "--then", py, "-c", "print('status ran')"])
    out = capsys.readouterr().out
    assert rc == 2 and "erase ran" in out and "status ran" in out and "the next commands still run" in out


def test_a_second_sigterm_while_the_worker_shuts_down_prints_no_traceback():
    # 2 of 8 `make run`s ended with "Exception ignored in atexit callback ... raise SystemExit(0)"
    import signal
    import subprocess
    import time

    script = ("import atexit, signal, sys, time; from flows import warm; signal.signal(signal.SIGTERM, warm._stop); "
              "atexit.register(time.sleep, 1.0); print('ready', flush=True); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.4)  # inside the atexit handler now
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "Traceback" not in err and "Exception ignored" not in err, err
