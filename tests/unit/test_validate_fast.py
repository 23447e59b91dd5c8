"""A bad request file answers fast and once: `unlearn validate` and `unlearn run FILE` report the cheap
checks' problems (one line each, exit 2) without importing torch, Prefect, MLflow or Great Expectations,
and read the same manifest and ledger as the deletion flow's load_state."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import ROOT
from tests.unit.test_cli_init_reset import change_params, project  # noqa: F401  (the fixture)
from unlearning.config import load_params

HEAVY = ("torch", "prefect", "mlflow", "great_expectations")

PROBE = """
import json, sys
from flows.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def cli(*argv):
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def bad_file(tmp_path):
    path = tmp_path / "bad.csv"  # outside the inbox: `unlearn run` never moves it
    path.write_text("request_id,sample_id,requested_at\nr1,s01,2026-11-30T09:00:00Z\nr1,s02,2026-11-30T09:00:00Z\n")
    return path


def test_live_state_is_what_load_state_reads(project):  # noqa: F811
    from adapters.request_check import live_state
    from tasks.state import StateSettings, load_state

    params = load_params(project)
    live, state = live_state(params), load_state.fn(StateSettings.of(params), "cpu")
    assert live is not None and live.manifest.equals(state.manifest) and live.ledger == state.ledger
    assert live.info == state.prepared.info
    change_params(project, epochs=5)  # a mismatch: left to load_state, which names what changed
    assert live_state(load_params(project)) is None


def test_validate_and_run_answer_a_bad_file_once_without_heavy_imports(project, tmp_path):  # noqa: F811
    bad = bad_file(tmp_path)
    for command in ("validate", "run", "audit"):
        result, err = cli("--params", str(project), command, str(bad))
        assert result == {"rc": 2, "heavy": []}, (command, result, err)
        lines = err.strip().splitlines()
        assert "Traceback" not in err and len(lines) == 4, err  # header, 2 problems, the not-yet-checked note
        assert "missing column(s) ['reason']" in lines[1] and "'r1' appears more than once" in lines[2]
        assert lines[3].startswith("  note: the ids were not yet checked against the manifest")
    assert bad.exists() and not (project.parent / "requests" / "rejected").exists()  # nothing moved


def test_validate_json_says_whether_the_manifest_was_checked(project, tmp_path, capsys):  # noqa: F811
    from flows.cli import main

    assert main(["--params", str(project), "validate", str(bad_file(tmp_path)), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "invalid" and out["manifest_checked"] is False and len(out["problems"]) == 2


def test_audit_json_of_a_bad_file_is_the_validate_json(project, tmp_path, capsys):  # noqa: F811
    """`unlearn audit --json` on a bad file: the problems as JSON (as validate prints them), exit 2, no server."""
    from flows.cli import main

    bad = bad_file(tmp_path)
    assert main(["--params", str(project), "validate", str(bad), "--json"]) == 2
    validated = json.loads(capsys.readouterr().out)
    assert main(["--params", str(project), "audit", str(bad), "--json"]) == 2
    audited = json.loads(capsys.readouterr().out)
    assert audited == validated and audited["to_apply"] == 0
