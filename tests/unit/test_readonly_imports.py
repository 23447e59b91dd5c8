"""Read-only commands answer without the orchestration stack: `import flows.cli`, `unlearn status --help` and
`unlearn status` on a project with a state import neither Prefect, MLflow nor Great Expectations (nor torch).
Checked in a fresh interpreter (sys.modules), the way a user's shell runs the command."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys


from tests.helpers import ROOT, fabricated_state, make_project

HEAVY = ("prefect", "mlflow", "great_expectations", "torch")

PROBE = """
import json, sys
sys.path.insert(0, {root!r})
import flows.cli
loaded = {{"import": [m for m in {heavy!r} if m in sys.modules]}}
for name, argv in {runs!r}:
    try:
        rc = flows.cli.main(argv)
    except SystemExit as e:
        rc = e.code
    loaded[name] = [m for m in {heavy!r} if m in sys.modules] + ([] if rc in (0, None) else [f"exit {{rc}}"])
print("LOADED " + json.dumps(loaded))
"""


def heavy_modules_after(runs: list[tuple[str, list[str]]], cwd) -> dict:
    code = PROBE.format(root=str(ROOT), heavy=HEAVY, runs=runs)
    res = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    line = [x for x in res.stdout.splitlines() if x.startswith("LOADED ")]
    assert line, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(line[-1][len("LOADED "):])


def a_project_with_a_state(tmp_path):
    """A state as a batch leaves it (champion, manifest, ledger) and a local registry whose alias already points
    at the champion: nothing to reconcile."""
    params_path = make_project(tmp_path / "proj", inbox_files=False)
    params, _ = fabricated_state(params_path, "a,train,0,0,0,retained,\nb,val,1,1,1,retained,\n")
    root = params_path.parent
    db = root / params["base"]["paths"]["mlflow_db"]
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE registered_model_aliases (alias TEXT, version INTEGER, name TEXT)")
    con.execute("INSERT INTO registered_model_aliases VALUES (?, 2, ?)",
                (params["tracking"]["alias"], params["tracking"]["registered_model"]))
    con.commit()
    con.close()
    return params_path


def test_read_only_commands_import_no_orchestration_stack(tmp_path):
    params_path = a_project_with_a_state(tmp_path)
    p = str(params_path)
    loaded = heavy_modules_after([("status --help", ["status", "--help"]), ("status", ["--params", p, "status"]),
                                  ("status --json", ["--params", p, "status", "--json"])], params_path.parent)
    assert loaded == {"import": [], "status --help": [], "status": [], "status --json": []}, loaded
