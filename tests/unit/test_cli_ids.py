"""`unlearn ids`: the sample ids a first request may name (prepared manifest, one split, neither deleted nor
erased); `python -m flows.session --help` prints its usage."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from flows.cli import main
from tests.unit.test_verify_erasure_twins import forget, table_project


def project(tmp_path):
    params = table_project(tmp_path)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params.model_dump(mode="json")))
    return params, path


def test_ids_lists_the_split_and_leaves_out_deleted_and_erased(tmp_path, capsys):
    params, path = project(tmp_path)
    assert main(["--params", str(path), "ids", "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["split"] == "train" and {"p1", "p2", "q1"} <= set(before["ids"])
    forget(params, "batch-a", ["p1"])  # erased: tombstoned and gone from the prepared store
    state = params.path("state_dir") / "manifest.csv"
    state.write_text("sample_id,split,label,group,status,deleted_in_batch\nq1,train,1,b,deleted,batch-b\n")
    assert main(["--params", str(path), "ids", "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert set(before["ids"]) - set(after["ids"]) == {"p1", "q1"} and after["n"] == before["n"] - 2
    assert main(["--params", str(path), "ids", "--split", "val", "--head", "2"]) == 0
    out, err = capsys.readouterr()
    assert len(out.split()) == 2 and "2 of" in err and "val ids" in err
    m = params.path("prepared_dir") / "manifest.csv"
    val = [ln.split(",")[0] for ln in m.read_text().splitlines()[1:] if ",val," in ln]
    assert out.split() == val[:2]


def test_ids_before_prepare_is_one_line(tmp_path, capsys):
    path = tmp_path / "params.yaml"
    path.write_text("{}\n")
    assert main(["--params", str(path), "ids"]) == 2
    assert "run the prepare stage first" in capsys.readouterr().err


def test_session_help_prints_usage():
    res = subprocess.run([sys.executable, "-m", "flows.session", "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("usage: python -m flows.session") and not res.stderr


def test_help_and_docs_say_a_request_may_name_validation_rows(capsys):
    """The code honours a validation row in a request (erased, not unlearned: docs/requests.md); no page or help
    text may say a request names training rows only."""
    from pathlib import Path

    import pytest

    with pytest.raises(SystemExit):
        main(["ids", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "validation rows, --split val, are erased without unlearning" in text and "names only" not in text
    root = Path(__file__).resolve().parents[2]
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        flat = " ".join(page.read_text().split())
        assert "may name training rows only" not in flat and "names only those" not in flat, page
    assert "may name training and validation rows alike" in " ".join((root / "docs" / "own-data.md").read_text().split())
