"""A corpus of malformed (and a few valid) request files through the ONE validation path that
`unlearn validate` and `unlearn run` share (tasks.request_check.check_request_file): every bad file gets a
clear error naming the file, every problem on one line, no defect twice, and nothing is changed. The suite
against the manifest runs only for a file that passed the cheap checks (pandera, ledger, objective, times).

The Great Expectations suite costs ~1 s per file; the corpus swaps it for the same manifest rules in pandas
(`fast_gx`), and `test_real_gx_agrees` runs real GX on the manifest cases."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

import tasks.request_check as validation
from tasks.request_check import MANIFEST_NOT_CHECKED, check_request_file
from unlearning.ledger import hash_sample_id

H = "request_id,sample_id,requested_at,reason"
SALT = "digits"


def manifest() -> pd.DataFrame:
    ids = [f"digits-{i:04d}" for i in range(10)]
    return pd.DataFrame({"sample_id": ids, "split": ["train"] * 8 + ["val"] * 2, "label": list(range(10)),
                         "group": ["g"] * 10, "class_name": ["c"] * 10,
                         "status": ["retained"] * 7 + ["deleted"] + ["retained"] * 2,
                         "deleted_in_batch": [None] * 7 + ["batch-old"] + [None] * 2})


def ledger(hashed: bool = False) -> list[dict]:
    sid = hash_sample_id("digits-0007", SALT) if hashed else "digits-0007"
    return [{"request_id": "old-1", "sample_id": sid, "batch_id": "batch-old", "request_file": "old.csv",
             "requested_at": "2026-11-01T10:00:00+00:00", "reason": "gdpr", "processed_at": "2026-11-02T00:00:00"}]


def fast_gx(df: pd.DataFrame, m: pd.DataFrame):
    lines = []
    if "sample_id" in df.columns and len(df):
        s = df["sample_id"].dropna()
        for rule, bad in (("must exist in the manifest", ~s.isin(m["sample_id"])),
                          ("must name a training sample", s.isin(m.loc[m.split != "train", "sample_id"])),
                          ("must not be deleted already", s.isin(m.loc[m.status == "deleted", "sample_id"]))):
            if bad.any():
                lines.append(f"GX: column 'sample_id' {rule} ({int(bad.sum())} row(s) fail): {s[bad].tolist()}")
    return lines, {}


def csv(text):
    return lambda p: p.write_text(text)


def parquet(**cols):
    def write(p):
        pd.DataFrame(cols).to_parquet(p)
    return write


GOOD = {"request_id": ["p1"], "sample_id": ["digits-0001"], "requested_at": ["2026-11-30T10:00:00Z"], "reason": ["gdpr"]}
SOON = (datetime.now(timezone.utc) + timedelta(seconds=60)).isoformat()

# (case id, file name, writer, expected status, substrings every one of which must be in the problems, ledger kind)
CASES = [
    ("empty-file", "a.csv", csv(""), "invalid", ["cannot read file"], None),
    ("header-only", "a.csv", csv(H + "\n"), "invalid", ["empty"], None),
    ("missing-reason", "a.csv", csv("request_id,sample_id,requested_at\nr1,digits-0001,2026-11-30\n"), "invalid",
     ["missing column", "reason"], None),
    ("extra-column", "a.csv", csv(H + ",note\nr1,digits-0001,2026-11-30,gdpr,x\n"), "invalid", ["unexpected column 'note'"], None),
    ("dup-request-id", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\nr1,digits-0002,2026-11-30,gdpr\n"), "invalid",
     ["'r1' appears more than once"], None),
    ("dup-sample-id", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\nr2,digits-0001,2026-11-30,gdpr\n"), "invalid",
     ["'digits-0001' appears more than once"], None),
    ("empty-request-id", "a.csv", csv(H + "\n,digits-0001,2026-11-30,gdpr\n"), "invalid", ["request_id", "empty"], None),
    ("empty-sample-id", "a.csv", csv(H + "\nr1,,2026-11-30,gdpr\n"), "invalid", ["sample_id", "empty"], None),
    ("empty-reason", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,\n"), "invalid", ["reason", "empty"], None),
    ("empty-time", "a.csv", csv(H + "\nr1,digits-0001,,gdpr\n"), "invalid", ["requested_at", "empty"], None),
    ("word-time", "a.csv", csv(H + "\nr1,digits-0001,yesterday,gdpr\n"), "invalid", ["'yesterday' is not a valid timestamp"], None),
    ("month-13", "a.csv", csv(H + "\nr1,digits-0001,2026-13-01,gdpr\n"), "invalid", ["not a valid timestamp"], None),
    ("year-2999", "a.csv", csv(H + "\nr1,digits-0001,2999-01-01T00:00:00Z,gdpr\n"), "invalid", ["in the future"], None),
    ("bad-objective", "a.csv", csv(H + ",objective\nr1,digits-0001,2026-11-30,gdpr,forget-it\n"), "invalid",
     ["'forget-it' is not allowed"], None),
    ("mixed-objective", "a.csv", csv(H + ",objective\nr1,digits-0001,2026-11-30,gdpr,suppression\n"
                                     "r2,digits-0002,2026-11-30,gdpr,retrain_equivalence\n"), "invalid", ["mixes"], None),
    ("mixed-objective-and-unknown", "a.csv", csv(H + ",objective\nr1,digits-9999,2026-11-30,gdpr,suppression\n"
                                                 "r2,digits-0002,2026-11-30,gdpr,retrain_equivalence\n"), "invalid",
     ["mixes", "not yet checked against the manifest"], None),
    ("unknown-id", "a.csv", csv(H + "\nr1,digits-9999,2026-11-30,gdpr\n"), "invalid", ["must exist in the manifest"], None),
    ("validation-row", "a.csv", csv(H + "\nr1,digits-0009,2026-11-30,gdpr\n"), "invalid", ["must name a training sample"], None),
    ("already-deleted", "a.csv", csv(H + "\nr1,digits-0007,2026-11-30,gdpr\n"), "invalid", ["must not be deleted already"], None),
    ("ledger-conflict-sample", "a.csv", csv(H + "\nold-1,digits-0003,2026-11-01T10:00:00Z,gdpr\n"), "invalid",
     ["'old-1'", "conflicts with the ledger entry of batch batch-old", "old.csv", "sample_id 'digits-0003'"], "plain"),
    ("ledger-conflict-reason", "a.csv", csv(H + "\nold-1,digits-0007,2026-11-01T10:00:00Z,ccpa\n"), "invalid",
     ["conflicts with the ledger", "reason 'ccpa'"], "plain"),
    ("ledger-conflict-time", "a.csv", csv(H + "\nold-1,digits-0007,2026-11-05,gdpr\n"), "invalid",
     ["conflicts with the ledger", "requested_at"], "plain"),
    ("ledger-conflict-plus-bad-time", "a.csv", csv(H + "\nold-1,digits-0003,2026-11-01T10:00:00Z,gdpr\n"
                                                   "r2,digits-0002,nope,gdpr\n"), "invalid",
     ["conflicts with the ledger", "'nope' is not a valid timestamp"], "plain"),
    ("hashed-ledger-conflict", "a.csv", csv(H + "\nold-1,digits-0003,2026-11-01T10:00:00Z,gdpr\n"), "invalid",
     ["conflicts with the ledger"], "hashed"),
    ("semicolon-csv", "a.csv", csv("request_id;sample_id;requested_at;reason\nr1;digits-0001;2026-11-30;gdpr\n"),
     "invalid", ["missing column"], None),
    ("binary-garbage", "a.csv", lambda p: p.write_bytes(b"\x00\xff\xfe\x00PK\x03\x04" * 20), "invalid",
     [], None),
    ("txt-suffix", "a.txt", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\n"), "invalid", ["not supported"], None),
    ("json-suffix", "a.json", csv("{}"), "invalid", ["not supported"], None),
    ("capitalised-columns", "a.csv", csv("Request_ID,Sample_ID,Requested_At,Reason\nr1,digits-0001,2026-11-30,gdpr\n"),
     "invalid", ["missing column", "unexpected column 'Request_ID'"], None),
    ("many-problems", "a.csv", csv(H + "\nr1,digits-9999,2026-11-30,gdpr\nr1,digits-0002,never,gdpr\n"), "invalid",
     ["'never'", "'r1' appears more than once", "not yet checked against the manifest"], None),
    ("unknown-and-validation-ids", "a.csv", csv(H + "\nr1,digits-9999,2026-11-30,gdpr\nr2,digits-0009,2026-11-30,gdpr\n"),
     "invalid", ["must exist in the manifest (1 row(s) fail): ['digits-9999']",
                 "must name a training sample (1 row(s) fail): ['digits-0009']"], None),
    ("parquet-int-sample-id", "a.parquet", parquet(request_id=["p1"], sample_id=[12], requested_at=["2026-11-30"],
                                                   reason=["gdpr"]), "invalid", ["sample_id", "Parquet type is int64"], None),
    ("parquet-int-request-id", "a.parquet", parquet(request_id=[1], sample_id=["digits-0001"], requested_at=["2026-11-30"],
                                                    reason=["gdpr"]), "invalid", ["request_id", "not text"], None),
    ("parquet-bytes-reason", "a.parquet", parquet(request_id=["p1"], sample_id=["digits-0001"], requested_at=["2026-11-30"],
                                                  reason=[b"gdpr"]), "invalid", ["reason", "bytes"], None),
    ("parquet-bytes-id", "a.parquet", parquet(request_id=["p1"], sample_id=[b"digits-0001"], requested_at=["2026-11-30"],
                                              reason=["gdpr"]), "invalid", ["sample_id", "bytes"], None),
    ("parquet-extra-column", "a.parquet", parquet(**GOOD, x=[1]), "invalid", ["unexpected column 'x'"], None),
    ("parquet-missing-column", "a.parquet", parquet(request_id=["p1"], sample_id=["digits-0001"], reason=["gdpr"]),
     "invalid", ["missing column", "requested_at"], None),
    ("parquet-corrupt", "a.parquet", csv("not a parquet file"), "invalid", ["cannot read file"], None),
    ("parquet-future", "a.parquet", parquet(request_id=["p1"], sample_id=["digits-0001"],
                                            requested_at=["2999-01-01T00:00:00Z"], reason=["gdpr"]), "invalid",
     ["in the future"], None),
    ("directory", "a.csv", lambda p: p.mkdir(), "invalid", ["cannot read file"], None),
    ("tombstoned", "a.csv", csv(H + "\nr1,digits-0005,2026-11-30,gdpr\n"), "invalid", ["erased by an earlier batch"], "tomb"),
    # valid files, and the ledger no-op
    ("good", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30T10:00:00Z,gdpr\n"), "ok", [], None),
    ("good-upper-suffix", "a.CSV", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\n"), "ok", [], None),
    ("good-parquet-upper", "a.PARQUET", parquet(**GOOD), "ok", [], None),
    ("good-offset-time", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30T10:00:00+02:00,gdpr\n"), "ok", [], None),
    ("within-clock-skew", "a.csv", csv(H + f"\nr1,digits-0001,{SOON},gdpr\n"), "ok", [], None),
    ("ledger-same-content", "a.csv", csv(H + "\nold-1,digits-0007,2026-11-01T10:00:00Z,gdpr\n"), "already_processed",
     [], "plain"),
    ("hashed-ledger-same-content", "a.csv", csv(H + "\nold-1,digits-0007,2026-11-01T11:00:00+01:00,gdpr\n"),
     "already_processed", [], "hashed"),
    ("ledger-partial-overlap", "a.csv", csv(H + "\nold-1,digits-0007,2026-11-01T10:00:00Z,gdpr\n"
                                            "r2,digits-0002,2026-11-30,gdpr\n"), "ok", [], "plain"),
]

RESULTS: dict[str, tuple[bool, bool]] = {}  # case -> (clear error or expected outcome, state unchanged)


@pytest.mark.parametrize("case,name,write,status,expect,kind", CASES, ids=[c[0] for c in CASES])
def test_request_corpus(tmp_path, monkeypatch, case, name, write, status, expect, kind):
    monkeypatch.setattr(validation, "gx_check", fast_gx)
    path = tmp_path / name
    write(path)
    m = manifest()
    led = ledger(hashed=kind == "hashed") if kind in ("plain", "hashed") else []
    before = (m.copy(), copy.deepcopy(led), path.read_bytes() if path.is_file() else None)
    tomb = {"digits-0005"} if kind == "tomb" else None
    fc = check_request_file(path, m, led, hash_ids=kind == "hashed", salt=SALT, max_clock_skew_seconds=300,
                            tombstoned=tomb)
    unchanged = (m.equals(before[0]) and led == before[1]
                 and (path.read_bytes() if path.is_file() else None) == before[2])
    text = fc.summary()
    ok = fc.status == status and all(s in text for s in expect)
    if status == "invalid":
        ok = ok and str(path) in text and "<batch>" not in text and fc.problems and all(
            "\n" not in p for p in fc.problems)
        ok = ok and text.count("\n  - ") == len(fc.problems)
    RESULTS[case] = (bool(ok), unchanged)
    assert fc.status == status, text
    for s in expect:
        assert s in text, text
    assert unchanged
    if status == "invalid":
        assert str(path) in text and "<batch>" not in text
        assert all("\n" not in p for p in fc.problems)  # one line each
        with pytest.raises(validation.RequestValidationError):
            raise fc.error()
    if "conflict" in case:
        assert isinstance(fc.error(), validation.RequestConflict)


def test_corpus_size_and_summary():
    assert len(CASES) >= 40
    if len(RESULTS) == len(CASES):
        bad = [c for c, (ok, _) in RESULTS.items() if not ok]
        assert not bad, bad
        print(f"\ncorpus: clear/expected outcome {sum(ok for ok, _ in RESULTS.values())}/{len(CASES)}, "
              f"state unchanged {sum(u for _, u in RESULTS.values())}/{len(CASES)}")


def test_real_gx_agrees(tmp_path):
    """The manifest rules through the real Great Expectations suite (one file, several problems)."""
    path = tmp_path / "m.csv"
    path.write_text(H + "\nr1,digits-9999,2026-11-30,gdpr\nr2,digits-0009,2026-11-30,gdpr\nr3,digits-0007,2026-11-30,gdpr\n")
    fc = check_request_file(path, manifest(), [])
    text = fc.summary()
    assert fc.status == "invalid"
    for s in ("must exist in the manifest", "must name a training sample", "must not be deleted already"):
        assert s in text, text
    # one line per defect: the unknown id fails "exists" only, each known id its own rule only
    assert len(fc.problems) == 3 and text.count("digits-9999") == 1, text
    assert fc.manifest_checked and MANIFEST_NOT_CHECKED not in text


def test_a_structural_defect_is_reported_once_without_great_expectations(tmp_path, monkeypatch):
    """Missing column + duplicate request_id: two lines (pandera's), no GX run (its import alone costs 3-5 s),
    and a note that the manifest rules run once these are fixed."""
    def no_gx(df, m):
        raise AssertionError("GX must not run for a file that failed the cheap checks")

    monkeypatch.setattr(validation, "gx_check", no_gx)
    path = tmp_path / "bad.csv"
    path.write_text("request_id,sample_id,requested_at\nr1,digits-0001,2026-11-30\nr1,digits-0002,2026-11-30\n")
    fc = check_request_file(path, manifest(), [])
    assert fc.status == "invalid" and not fc.manifest_checked
    assert len(fc.problems) == 2, fc.problems
    assert "missing column(s) ['reason']" in fc.problems[0] and "'r1' appears more than once" in fc.problems[1]
    text = fc.summary()
    assert text.count("\n  - ") == 2 and text.endswith(f"note: {MANIFEST_NOT_CHECKED}")
