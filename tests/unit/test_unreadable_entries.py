"""An unreadable entry anywhere (requests/rejected/, requests/processed/, a store's folder or file) never stops
`unlearn verify-erasure`: it is named and counted, as a problem (what it cannot read it cannot vouch for), and every
other store is still checked. The command runs without root's right to read anything (CAP_DAC_OVERRIDE dropped by
setpriv when the tests run as root), as a team member's account would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT, make_project


def _unprivileged() -> list[str]:
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: a file cannot be made unreadable")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


def test_unreadable_entries_are_named_and_counted_and_the_rest_is_checked(tmp_path):
    from unlearning.config import load_params
    from unlearning.privacy.erasure import add_tombstones, id_key
    from unlearning.privacy.salt import id_salt

    params = make_project(tmp_path, inbox_files=False)
    p = load_params(params)
    add_tombstones(p.path("tombstones"), [id_key(True, id_salt(p))("s1")])  # s1 was erased
    rejected, processed = tmp_path / "requests" / "rejected", tmp_path / "requests" / "processed"
    rejected.mkdir(parents=True)
    (rejected / "locked.csv").write_text("request_id,sample_id,requested_at,reason\nr1,s1,2026-01-01,gdpr\n")
    (rejected / "open.csv").write_text("request_id,sample_id,requested_at,reason\nr2,s2,2026-01-01,gdpr\n")
    (processed / "sub").mkdir(parents=True)
    (processed / "sub" / "a.json").write_text("{}")
    os.chmod(rejected / "locked.csv", 0)
    os.chmod(processed / "sub", 0)
    reports = tmp_path / "state" / "erasure"
    reports.mkdir(parents=True)
    (reports / "b1.json").write_text(json.dumps({"batch_id": "b1", "stores": [], "pending": []}))
    os.chmod(reports / "b1.json", 0)
    try:
        res = subprocess.run([*_unprivileged(), sys.executable, "-m", "flows.cli", "--params", str(params),
                              "verify-erasure"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    finally:
        for path in (rejected / "locked.csv", processed / "sub", reports / "b1.json"):
            os.chmod(path, 0o755)
    out, err = res.stdout, res.stderr
    assert res.returncode == 1, out + err  # not 2 (bad input) nor a traceback: the verification ran to its end
    assert "Traceback" not in err and "Permission denied" in err
    checks = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    unread = {c["store"]: c for c in checks if c.get("unreadable")}
    assert unread["rejected request files"]["unreadable_entries"] == ["locked.csv (Permission denied)"]
    assert unread["erasure reports"]["unreadable_entries"] == ["b1.json (Permission denied)"]
    assert any("could not be read, so were not checked: locked.csv" in line for line in err.splitlines())
    assert {c["store"] for c in checks} >= {"tombstones", "rejected request files", "id traces"}  # all checked
