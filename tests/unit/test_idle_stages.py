"""flows/idle.py: a stage with nothing to do does its small part (the qualify stage's "skipped" record, the
deletion stage's metrics) before any Prefect import, and anything with work goes the full way."""

from __future__ import annotations

import json
import subprocess
import sys


from tests.helpers import ROOT, fabricated_state, make_project

PROBE = """
import sys
sys.path.insert(0, {root!r})
from flows.idle import nothing_to_do
done = nothing_to_do({target!r}, {argv!r})
print("RESULT", done, sorted(m for m in ("prefect", "mlflow", "great_expectations", "torch") if m in sys.modules))
"""


def idle(target: str, params_path) -> tuple[bool, list[str]]:
    code = PROBE.format(root=str(ROOT), target=target, argv=["--params", str(params_path)])
    res = subprocess.run([sys.executable, "-c", code], cwd=params_path.parent, capture_output=True, text=True,
                         timeout=120)
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, res.stdout[-2000:] + res.stderr[-2000:]
    done, modules = line[-1].split(" ", 2)[1:]
    return done == "True", eval(modules)


def with_state(params_path, ledger_lines: int) -> dict:
    ledger = "".join(json.dumps({"batch_id": "b1", "sample_id": f"sha256:{i}", "request_id": f"r{i}",
                                 "kind": "unlearned", "method": "retrain"}) + "\n" for i in range(ledger_lines))
    params, _ = fabricated_state(params_path, "a,train,0,0,0,deleted,b1\nb,train,1,1,1,retained,\n", ledger)
    return params


def test_qualify_under_per_batch_writes_its_record_without_prefect(tmp_path):
    params_path = make_project(tmp_path / "p", inbox_files=False)
    done, modules = idle("flows.qualify", params_path)
    assert done and modules == []
    record = json.loads((params_path.parent / "models" / "qualification.json").read_text())
    assert record["skipped"].startswith("validation.mode is per_batch")
    qualified = make_project(tmp_path / "q", {"validation": {"mode": "qualified"}}, inbox_files=False)
    assert idle("flows.qualify", qualified)[0] is False


def test_an_empty_inbox_on_a_state_with_batches_writes_the_metrics_only(tmp_path):
    params_path = make_project(tmp_path / "p", inbox_files=False)
    params = with_state(params_path, ledger_lines=1)
    done, modules = idle("flows.deletion_batch", params_path)
    assert done and modules == []
    metrics = json.loads((params_path.parent / params["base"]["paths"]["metrics_dir"] / "deletion.json").read_text())
    assert metrics["n_forgotten"] == 1
    # the lock file stays after every batch, an empty journal folder after every finished erase: still idle
    (params_path.parent / ".state.lock").write_text("1234")
    (params_path.parent / ".state.erasure-journal").mkdir()
    assert idle("flows.deletion_batch", params_path)[0] is True
    # an erase a kill stopped (its journal): the full flow, which finishes it first
    (params_path.parent / ".state.erasure-journal" / "b1.json").write_text("{}")
    assert idle("flows.deletion_batch", params_path)[0] is False
    (params_path.parent / ".state.erasure-journal" / "b1.json").unlink()
    inbox = params_path.parent / "requests" / "inbox"
    (inbox / "x.csv").write_text("request_id,sample_id\n")
    assert idle("flows.deletion_batch", params_path)[0] is False  # a file to process: the full flow


def test_a_state_without_batches_goes_the_full_way(tmp_path):
    params_path = make_project(tmp_path / "p", inbox_files=False)
    with_state(params_path, ledger_lines=0)  # it may have to follow a retrained original (ensure_state)
    assert idle("flows.deletion_batch", params_path)[0] is False
