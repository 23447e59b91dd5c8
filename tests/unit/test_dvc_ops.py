"""adapters.dvc_ops: commit, gc, remotes and push through DVC's API on a tiny real DVC project."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from adapters import dvc_ops


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory):
    """The tiny project, made once (`dvc init`, then `dvc repro` of its one stage: two fresh DVC processes)."""
    root = tmp_path_factory.mktemp("dvc-project") / "p"
    root.mkdir()
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=root, check=True)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"make": {"cmd": "echo one > out.txt",
                                                                        "outs": ["out.txt"]}}}))
    subprocess.run([sys.executable, "-m", "dvc", "repro", "-q"], cwd=root, check=True, capture_output=True)
    return root


@pytest.fixture
def project(reproduced, tmp_path):
    """Each test's own copy of the reproduced project (DVC keys its state by the repository's path)."""
    return Path(shutil.copytree(reproduced, tmp_path / "p", symlinks=True))


def cached_objects(root):
    return sorted(p.name for p in (root / ".dvc" / "cache").rglob("*") if p.is_file())


def test_commit_records_a_changed_output_and_gc_drops_the_old_object(project, tmp_path, capsys):
    before = yaml.safe_load((project / "dvc.lock").read_text())["stages"]["make"]["outs"][0]["md5"]
    (project / "out.txt").write_text("two\n")
    assert dvc_ops.commit(project, ["make"]) == ["make"]
    dvc_ops.gc_workspace(project)
    # DVC's own lines are diagnostics on stderr: stdout is `unlearn run`'s JSON lines
    out = capsys.readouterr()
    assert out.out == "" and "Removed" in out.err
    after = yaml.safe_load((project / "dvc.lock").read_text())["stages"]["make"]["outs"][0]["md5"]
    assert len(cached_objects(project)) == 1 and cached_objects(project)[0] == after[2:]
    status = subprocess.run([sys.executable, "-m", "dvc", "status", "-q"], cwd=project, capture_output=True)
    assert status.returncode == 0  # clean


def test_a_local_remote_is_added_listed_pushed_to_and_gced(project, tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    assert dvc_ops.remotes(project) == set()
    assert dvc_ops.add_local_remote(project, "pipeline-local", remote) == "pipeline-local"
    assert dvc_ops.remotes(project) == {"pipeline-local"}
    assert "pipeline-local" in (project / ".dvc" / "config.local").read_text()
    dvc_ops.push(project, "pipeline-local")
    assert len([p for p in remote.rglob("*") if p.is_file()]) == 1
    (project / "out.txt").write_text("three\n")
    dvc_ops.commit(project, ["make"])
    dvc_ops.push(project, "pipeline-local")
    dvc_ops.gc_workspace(project, remote="pipeline-local")
    assert len([p for p in remote.rglob("*") if p.is_file()]) == 1  # the old version left the remote too


def test_an_unknown_stage_fails_naming_the_operation_and_a_held_lock_is_busy(project):
    with pytest.raises(dvc_ops.DvcFailed, match=r"dvc commit nope in .* failed"):
        dvc_ops.commit(project, ["nope"])
    from dvc.repo import Repo

    holder = Repo(str(project))
    holder.lock.lock()
    try:
        with pytest.raises(dvc_ops.DvcLockBusy, match="locked by another DVC process"):
            dvc_ops.commit(project, ["make"])
    finally:
        holder.lock.unlock()
        holder.close()


def test_dvc_lines_are_printed_once_when_the_root_logger_prints_too(project):
    """In `unlearn erase` Prefect's console handler sits on the root logger; DVC's own handlers print each line
    and the record propagated to the root printed it a second time ("Updating lock file" twice per commit)."""
    (project / "out.txt").write_text("four\n")
    code = ("import logging, sys; from pathlib import Path; from adapters import dvc_ops; "
            "logging.basicConfig(stream=sys.stderr, format='ROOT %(message)s', level=logging.INFO); "
            f"dvc_ops.commit(Path({str(project)!r}), ['make'])")
    from tests.helpers import ROOT

    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("Updating lock file") == 1, out.stderr


def test_a_commit_killed_while_dvc_wrote_the_lock_file_is_recovered(project, caplog):
    # DVC writes dvc.lock in place: a kill at "Updating lock file" left it empty, and every later DVC call (the
    # pending erasure's commit and gc) failed with "dvc.lock validation failed", so the erasure never finished
    (project / "out.txt").write_text("two\n")
    backup = project / ".dvc" / "tmp" / "dvc.lock.before-commit"
    backup.parent.mkdir(parents=True, exist_ok=True)
    backup.write_bytes((project / "dvc.lock").read_bytes())  # what commit() copies before DVC writes
    (project / "dvc.lock").write_bytes(b"")                    # ... and what the kill left
    assert dvc_ops.commit(project, ["make"]) == ["make"]
    assert "restored from the copy" in caplog.text and not backup.exists()
    dvc_ops.gc_workspace(project)
    status = subprocess.run([sys.executable, "-m", "dvc", "status", "-q"], cwd=project, capture_output=True)
    assert status.returncode == 0  # the lock records the current output: clean


def test_dvc_failures_end_in_one_line_with_exit_1():
    from flows.errors import EXIT_FAILURE, exit_code

    assert exit_code(dvc_ops.DvcFailed("dvc commit deletion in /p failed: './dvc.lock' validation failed")) == EXIT_FAILURE


def test_gc_says_nothing_of_a_stage_that_never_ran_but_warns_of_one_whose_output_exists(project, capsys):
    """The qualify stage under validation.mode per_batch never runs: its output has nothing cached to lose, so
    gc's "missing version info" warning is noise there; an output that exists without a lock entry still warns."""
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    stages["never"] = {"cmd": "echo x > never.txt", "outs": ["never.txt"]}
    stages["unlocked"] = {"cmd": "echo y > unlocked.txt", "outs": ["unlocked.txt"]}
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    (project / "unlocked.txt").write_text("y\n")  # made by hand, never committed: no version info
    dvc_ops.gc_workspace(project)
    err = capsys.readouterr().err
    assert "never.txt" not in err and "'unlocked.txt'" in err and "missing version info" in err
