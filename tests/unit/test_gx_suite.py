"""The Great Expectations side of request validation (adapters/request_check.py): the suite is persisted with the
project (gx/, committed) and matches the rules the code renders; a run leaves the committed files as they
were, builds its Data Docs offline into its own folder, prints nothing, and with hashed ids shows GX (its
result, its Data Docs) hashed ids only. `unlearn init` scaffolds the same gx/ folder."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
from pathlib import Path

import pandas as pd
import pytest

import adapters.request_check as rc
from tests.helpers import ROOT
from unlearning.privacy.ledger import hash_sample_id

H = "request_id,sample_id,requested_at,reason"


def manifest() -> pd.DataFrame:
    ids = [f"digits-{i:04d}" for i in range(10)]
    return pd.DataFrame({"sample_id": ids, "split": ["train"] * 8 + ["val"] * 2, "label": list(range(10)),
                         "status": ["retained"] * 7 + ["deleted"] + ["retained"] * 2,
                         "deleted_in_batch": [None] * 7 + ["batch-old"] + [None] * 2})


def committed(gx_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(gx_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(gx_dir.rglob("*")) if p.is_file() and "uncommitted" not in p.parts}


def test_the_committed_suite_is_the_one_the_code_renders():
    """gx/ in the repo holds the suite, its checkpoint (result format) and validation definition; the
    expectations are exactly MANIFEST_RULES (read as JSON: no GX import)."""
    gx_dir = ROOT / "gx"
    suite = json.loads((gx_dir / "expectations" / f"{rc.GX_NAME}.json").read_text())
    got = {e["meta"]["rule"]: (e["type"], e["kwargs"]["column"], e["kwargs"]["value_set"]) for e in suite["expectations"]}
    assert got == {rule: ("expect_column_values_to_be_in_set", col, allowed)
                   for rule, (col, allowed, _) in rc.MANIFEST_RULES.items()}
    checkpoint = json.loads((gx_dir / "checkpoints" / f"{rc.GX_NAME}.json").read_text())
    assert checkpoint["result_format"] == rc.GX_RESULT_FORMAT
    vd = json.loads((gx_dir / "validation_definitions" / f"{rc.GX_NAME}.json").read_text())
    assert vd["suite"]["name"] == rc.GX_NAME and vd["data"]["datasource"]["name"] == rc.GX_SOURCE
    assert "uncommitted/" in (gx_dir / ".gitignore").read_text().split()
    assert "/gx/uncommitted/" in (ROOT / ".gitignore").read_text().splitlines()


def test_a_run_is_offline_quiet_and_leaves_the_committed_files(tmp_path, monkeypatch, capfd):
    gx_dir = tmp_path / "gx"
    shutil.copytree(ROOT / "gx", gx_dir, ignore=shutil.ignore_patterns("uncommitted"))
    before = committed(gx_dir)
    import great_expectations  # noqa: F401  (imported before the network is cut: the import is not under test)

    def no_network(*args, **kwargs):
        raise AssertionError(f"network access: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(rc, "DOCS_KEEP", 2)
    capfd.readouterr()
    folders = []
    for i in range(3):
        path = tmp_path / f"r{i}.csv"
        path.write_text(H + f"\nr1,digits-000{i + 1},2026-11-30,gdpr\nr2,digits-9999,2026-11-30,gdpr\n")
        fc = rc.check_request_file(path, manifest(), [], gx_dir=gx_dir)
        assert fc.status == "invalid" and fc.manifest_checked and len(fc.problems) == 1, fc.problems
        assert "row 2: value 'digits-9999' is not in the manifest" in fc.problems[0]
        folders.append(Path(fc.data_docs))
    out = capfd.readouterr()
    assert out.out == "" and out.err == "", out  # no banner, no progress bars, no log lines
    assert committed(gx_dir) == before
    docs = folders[-1]
    assert docs.parent == gx_dir / "uncommitted" / "data_docs" / "requests" and docs.name.endswith("-r2.csv")
    index = (docs / "index.html").read_text()
    pages = list((docs / "validations").rglob("*.html"))
    assert len(pages) == 1 and "digits-9999" in pages[0].read_text() and "deletion_request" in index
    assert not (docs / "static" / "fonts").exists()  # 4 MB of GX assets no page uses
    assert sorted(p.name for p in docs.parent.iterdir()) == sorted(f.name for f in folders[1:])  # DOCS_KEEP


def test_the_project_is_created_when_missing_and_ids_stay_hashed(tmp_path):
    gx_dir = tmp_path / "project" / "gx"
    path = tmp_path / "r.csv"
    path.write_text(H + "\nr1,digits-9999,2026-11-30,gdpr\nr2,digits-0005,2026-11-30,gdpr\n")
    tomb = {hash_sample_id("digits-0005", "digits")}
    fc = rc.check_request_file(path, manifest(), [], hash_ids=True, salt="digits", tombstoned=tomb, gx_dir=gx_dir)
    assert (gx_dir / "great_expectations.yml").is_file() and committed(gx_dir).keys() == committed(ROOT / "gx").keys()
    # the problem lines (MLflow, Prefect, the .error.json of a rejected file) name the ids by their salted hashes
    # too: an erased id named again (digits-0005) must not come back in plain text; the row numbers say which
    assert [p.split(": value ")[1].split(" ")[0] for p in fc.problems] == [
        repr(hash_sample_id("digits-9999", "digits")), repr(hash_sample_id("digits-0005", "digits"))]
    assert "erased already" in fc.problems[1] and "row 2" in fc.problems[1]
    # GX's result and its Data Docs carry the salted hashes
    shown = json.dumps(fc.gx_result, default=str) + "".join(p.read_text() for p in Path(fc.data_docs).rglob("*.html"))
    assert "digits-9999" not in shown and hash_sample_id("digits-9999", "digits") in shown


def test_init_scaffolds_the_gx_project(tmp_path):
    from flows.scaffold import scaffold

    table = tmp_path / "data.csv"
    table.write_text("customer,churned,x\nc1,0,1.0\nc2,1,2.0\n")
    done = scaffold(tmp_path / "p", "table", table, id_column="customer", label_column="churned", vcs=False)
    gx_dir = tmp_path / "p" / "gx"
    assert any(line.startswith(f"wrote {gx_dir}/") for line in done), done
    assert committed(gx_dir) == committed(ROOT / "gx") and not (gx_dir / "uncommitted").exists()
    assert "/gx/uncommitted/" in (tmp_path / "p" / ".gitignore").read_text().splitlines()


@pytest.mark.parametrize("n_rows", [1, 25])
def test_many_failing_rows_share_one_closing_line(n_rows):
    """Past MAX_ROW_LINES rows of one rule, the rest share one line (a file is not answered with 500 lines)."""
    ids = [f"digits-{i:04d}" for i in range(10)]
    big = pd.DataFrame({"sample_id": ids * 3, "split": (["train"] * 10) * 3, "status": ["deleted"] * 30})
    big["sample_id"] = [f"v-{i}" for i in range(30)]
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(n_rows)], "sample_id": [f"v-{i}" for i in range(n_rows)]})
    lk = rc.lookup_frame(df, big)
    run = rc.SuiteRun([("not_deleted", list(range(1, n_rows + 1)), "deleted", "")])
    lines = rc.problem_lines(run, lk)
    assert len(lines) == min(n_rows, rc.MAX_ROW_LINES + 1)
    if n_rows > rc.MAX_ROW_LINES:
        assert f"{n_rows - rc.MAX_ROW_LINES} more value(s) fail the same rule" in lines[-1]
