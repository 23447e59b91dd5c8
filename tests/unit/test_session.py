"""flows.session: stage timing from DVC's output, and CMD passed through (no server when one is configured)."""

import sys

from flows import session


def test_stage_lines_are_timed_and_output_passes_through(capsys):
    script = ("import time\n"
              "print(\"Stage 'prepare' didn't change, skipping\")\n"
              "print(\"Running stage 'train':\"); time.sleep(0.2)\n"
              "print(\"Running stage 'deletion':\"); time.sleep(0.1)\n")
    rc, stages = session.run_timed([sys.executable, "-c", script], env={})
    assert rc == 0 and [name for name, _ in stages] == ["prepare (skipped)", "train", "deletion"]
    # The parent times a stage from reading its line to reading the next one, so the measured time can fall a
    # hair short of the child's sleep (CI measured 0.19999 for sleep(0.2)): bounds with slack, not exact.
    assert 0.15 <= stages[1][1] < 2 and 0.05 <= stages[2][1] < 2
    assert "Running stage 'train':" in capsys.readouterr().out


def test_an_existing_server_is_used_and_the_exit_code_kept(monkeypatch, capsys):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    monkeypatch.setattr(session, "start_temporary_server", lambda: (_ for _ in ()).throw(AssertionError("no server")))
    assert session.main([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert "wall time per stage" in capsys.readouterr().out


def test_dvc_git_hint_becomes_one_line_on_the_dvc_lock_policy_and_other_output_passes(capsys):
    hint = ("Updating lock file 'dvc.lock'\n\nTo track the changes with git, run:\n\n\tgit add dvc.lock\n\n"
            "To enable auto staging, run:\n\n\tdvc config core.autostage true\nUse `dvc push` to send your updates.\n")
    rc, _ = session.run_timed([sys.executable, "-c", f"import sys; sys.stdout.write({hint!r})"], env={})
    out = capsys.readouterr().out
    assert rc == 0 and "autostage" not in out and "To track the changes" not in out
    assert out.splitlines() == ["Updating lock file 'dvc.lock'",
                                "DVC updated dvc.lock: it records what this run was built from; commit it with your "
                                "data version when you want to keep this run (`git add dvc.lock`; README, \"dvc.lock\")",
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
