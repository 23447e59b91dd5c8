"""The ledger records the verdict the registry tag records: a retrain promoted by gate.exact_retrain_overrides
although it failed (statistical) checks is `promoted_as_gate_false_reject` in both, not `passed` in the ledger."""

import types

import pandas as pd

from tasks.stages import ledger_entries, promoted_verdict


def test_ledger_entries_record_the_promoted_verdict(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("x\n")
    batch = types.SimpleNamespace(path=f, batch_id="batch-x")
    requests = pd.DataFrame({"request_id": ["r1"], "sample_id": ["digits-0001"], "reason": ["t"],
                             "requested_at": [pd.Timestamp("2026-11-28", tz="UTC")]})
    for passed, verdict in ((True, "passed"), (False, "promoted_as_gate_false_reject")):
        outcome = types.SimpleNamespace(verdict=types.SimpleNamespace(passed=passed))
        assert promoted_verdict(outcome) == verdict
        entries = ledger_entries(requests, batch, False, "digits", objective="retrain_equivalence",
                                 method="retrain", before="1", after="2", now="now", fingerprint="fp",
                                 verdict=promoted_verdict(outcome))
        assert [e["verdict"] for e in entries] == [verdict]
