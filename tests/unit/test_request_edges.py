"""Request files at the edges: what `unlearn validate` refuses before reading a byte (symlinks, directories),
exactly as the deletion flow refuses them; Great Expectations on a stated sample of a large file while the
pandas rules cover every row; look-alike ids named without leaking a plain id when ids are hashed."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest

import adapters.request_check as rc
from flows.cli import EXIT_BAD_INPUT, main
from tests.helpers import make_project
from tests.unit.test_request_corpus import H, SALT, manifest
from unlearning.requests import RequestValidationError, entry_problem, scan_inbox

PASSWD_LINE = "root:x:0:0:root:/root:/bin/bash"


def test_validate_refuses_a_symlink_without_quoting_its_target(tmp_path, capsys):
    params = make_project(tmp_path / "p", inbox_files=False)
    secret = tmp_path / "passwd"
    secret.write_text(PASSWD_LINE + "\n")
    link = tmp_path / "requests.csv"
    link.symlink_to(secret)
    for as_json in ([], ["--json"]):
        assert main(["--params", str(params), "validate", str(link), *as_json]) == EXIT_BAD_INPUT
        out = capsys.readouterr()
        assert PASSWD_LINE not in out.err + out.out
        assert "a symlink (to " in out.err and "copy the file itself" in out.err, out.err


def test_validate_and_the_flow_give_one_answer_for_an_inbox_symlink_leaving_the_inbox(tmp_path, capsys):
    params = make_project(tmp_path / "p", inbox_files=False)
    inbox = tmp_path / "p" / "requests" / "inbox"
    outside = tmp_path / "elsewhere.csv"
    outside.write_text(H + "\nr1,digits-0001,2026-11-30,gdpr\n")
    link = inbox / "a.csv"
    link.symlink_to(outside)
    flow_says = dict(scan_inbox(inbox)[1])[link]
    assert flow_says == entry_problem(link, inbox) and "leaving the inbox" in flow_says
    assert main(["--params", str(params), "validate", str(link)]) == EXIT_BAD_INPUT
    assert flow_says in capsys.readouterr().err


def test_validate_refuses_a_directory_in_one_line(tmp_path, capsys):
    params = make_project(tmp_path / "p", inbox_files=False)
    folder = tmp_path / "batch.csv"
    folder.mkdir()
    assert main(["--params", str(params), "validate", str(folder)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "a directory, not a request file" in err and "Errno" not in err, err


def test_run_refuses_a_symlink_before_the_flow_starts(tmp_path):
    from flows.cli import _precheck_request

    params = make_project(tmp_path / "p", inbox_files=False)
    target = tmp_path / "t.csv"
    target.write_text(H + "\nr1,digits-0001,2026-11-30,gdpr\n")
    link = tmp_path / "l.csv"
    link.symlink_to(target)
    with pytest.raises(RequestValidationError, match="a symlink"):
        _precheck_request(argparse.Namespace(request=str(link), params=str(params)))


def test_a_staged_inbox_symlink_is_still_a_request_file(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    staged = inbox / ".a.csv.tmp"
    staged.write_text(H + "\n")
    (inbox / "a.csv").symlink_to(staged.name)
    assert entry_problem(inbox / "a.csv", inbox) is None
    assert scan_inbox(inbox) == ([inbox / "a.csv"], [])


def _big_request(tmp_path, n: int, bad_rows: dict[int, str]):
    m = manifest()  # copies of the corpus manifest: in each block of 10 ids, 0-6 are retained training rows
    m = pd.concat([m] + [m.assign(sample_id=[f"x{k}-{i}" for i in range(10)]) for k in range(n // 7 + 1)])
    ids = [f"x{i // 7}-{i % 7}" for i in range(n)]
    for row, value in bad_rows.items():
        ids[row - 1] = value
    path = tmp_path / "big.csv"
    pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "sample_id": ids,
                  "requested_at": "2026-11-30T09:00:00Z", "reason": "gdpr"}).to_csv(path, index=False)
    return path, m.reset_index(drop=True)


def test_great_expectations_validates_a_stated_sample_while_pandas_checks_every_row(tmp_path, monkeypatch):
    """Past GX_MAX_ROWS the real suite runs on a seeded sample; the report says so (summary and gx_result),
    and a bad row outside the sample is still found (the manifest rules, in pandas, cover every row)."""
    monkeypatch.setattr(rc, "GX_MAX_ROWS", 20)
    path, m = _big_request(tmp_path, 200, {})
    ok = rc.check_request_file(path, m, [])  # the flow's path: the suite always runs
    assert ok.status == "ok", ok.problems
    assert "validated a seeded random sample of 20 of the 200 rows" in ok.summary()
    assert ok.gx_result["sample"]["rows_validated_by_gx"] == 20 and ok.gx_result["sample"]["rows"] == 200
    assert ok.gx_result["success"] is True
    sample = rc.gx_sample(rc.lookup_frame(pd.read_csv(path, dtype=str), m).frame)[0]
    outside = next(r for r in range(1, 201) if r not in set(sample["row"]))
    path, m = _big_request(tmp_path, 200, {outside: "nope-1"})
    bad = rc.check_request_file(path, m, [])
    assert bad.status == "invalid" and len(bad.problems) == 1
    assert f"row {outside}: value 'nope-1' is not in the manifest" in bad.problems[0]


def test_a_small_file_is_validated_whole_by_great_expectations(monkeypatch):
    lk = rc.lookup_frame(pd.DataFrame({"request_id": ["r1"], "sample_id": ["digits-0001"]}), manifest())
    frame, note = rc.gx_sample(lk.frame)
    assert note == "" and len(frame) == 1 and frame["sample_id"].tolist() == ["digits-0001"]


def test_a_look_alike_is_named_only_in_plain_mode(tmp_path, monkeypatch):
    from tests.unit.test_request_corpus import fast_suite
    from unlearning.privacy.ledger import hash_sample_id

    monkeypatch.setattr(rc, "run_suite", fast_suite)
    path = tmp_path / "a.csv"
    path.write_text(H + "\nr1,ｄｉｇｉｔｓ－０００５,2026-11-30,gdpr\n")
    plain = rc.check_request_file(path, manifest(), [])
    assert "did you mean 'digits-0005'?" in plain.problems[0]
    hashed = rc.check_request_file(path, manifest(), [], hash_ids=True, salt=SALT)
    assert "digits-0005" not in hashed.problems[0] and "ｄｉｇｉｔｓ" not in hashed.problems[0]
    assert repr(hash_sample_id("ｄｉｇｉｔｓ－０００５", SALT)) in hashed.problems[0]
    assert "it is the id of a manifest row once normalized" in hashed.problems[0]


def test_many_repeats_and_conflicts_share_one_closing_line():
    from unlearning.requests import MAX_VALUE_LINES, ROWS_SHOWN, ledger_matches, structural_problems

    n = 30
    rows = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)] * 2, "sample_id": [f"s{i}" for i in range(n)] * 2,
                         "requested_at": "2026-11-30", "reason": "gdpr"})
    lines = structural_problems(rows)
    assert len(lines) == MAX_VALUE_LINES + 1 and lines[-1].startswith(f"{n - MAX_VALUE_LINES} more request(s)")
    ledger = [{"request_id": f"r{i}", "sample_id": "other", "requested_at": "2026-11-30", "reason": "gdpr"}
              for i in range(n)]
    same, conflicts = ledger_matches(rows.iloc[:n], ledger)
    assert same == [] and len(conflicts) == ROWS_SHOWN + 1
    assert f"{n - ROWS_SHOWN} more request id(s) conflict" in conflicts[-1]
