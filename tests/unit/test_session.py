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
    assert 0.2 <= stages[1][1] < 2 and 0.1 <= stages[2][1] < 2
    assert "Running stage 'train':" in capsys.readouterr().out


def test_an_existing_server_is_used_and_the_exit_code_kept(monkeypatch, capsys):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    monkeypatch.setattr(session, "start_temporary_server", lambda: (_ for _ in ()).throw(AssertionError("no server")))
    assert session.main([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert "wall time per stage" in capsys.readouterr().out
