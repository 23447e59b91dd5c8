"""A corpus of malformed (and a few valid) request files through the ONE validation path that
`unlearn validate` and `unlearn run` share (adapters.request_check.check_request_file): every bad file gets a
clear error naming the file, ONE line per problem (its row or field, the value, the fix), no defect twice,
and nothing is changed. pandera owns schema and types; the Great Expectations suite owns the rules that
need the manifest or the erasure record, and runs only for a file that passed the cheap checks.

Importing GX costs 3-5 s; the corpus swaps its evaluation for the same rules in pandas (`fast_suite`: the
problem lines are rendered by the same code), and `test_real_gx_agrees` runs the real, persisted suite on
every manifest case and checks that it gives the same lines."""

from __future__ import annotations

import copy
from pathlib import Path
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

import adapters.request_check as validation
from adapters.request_check import MANIFEST_NOT_CHECKED, check_request_file
from unlearning.privacy.ledger import hash_sample_id

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


def fast_suite(frame: pd.DataFrame, gx_dir=None, run_name="request") -> validation.SuiteRun:
    """The suite's expectations (value in set, nulls skipped) evaluated in pandas on the lookup frame."""
    failures = []
    for rule, (column, allowed, _) in validation.MANIFEST_RULES.items():
        values = frame[column]
        bad = values.notna() & ~values.isin(allowed)
        if bad.any():
            failures.append((rule, frame.loc[bad, "row"].astype(int).tolist(), column, ""))
    return validation.SuiteRun(failures)


def csv(text):
    return lambda p: p.write_text(text)


def parquet(**cols):
    def write(p):
        pd.DataFrame(cols).to_parquet(p)
    return write


GOOD = {"request_id": ["p1"], "sample_id": ["digits-0001"], "requested_at": ["2026-11-30T10:00:00Z"], "reason": ["gdpr"]}
SOON = (datetime.now(timezone.utc) + timedelta(seconds=60)).isoformat()

# (case id, file name, writer, expected status, substrings every one of which must be in the problems, ledger kind)
# Every invalid file has exactly one problem line per problem: LINES names the files with more than one.
CASES = [
    ("empty-file", "a.csv", csv(""), "invalid", ["the file is empty", H], None),
    ("not-csv-one-line", "a.csv", csv('{"sample_id": "digits-0001"}'), "invalid", ["missing column"], None),
    # a row with a field too many: pandas would shift it one column left (its first field as the index)
    ("extra-leading-field", "a.csv", csv(H + "\nr1,r1,digits-0001,2026-11-30T08:00:00Z,gdpr\n"), "invalid",
     ["row 1: 5 field(s), but the header has 4", "quote a value that holds a comma"], None),
    ("extra-trailing-field", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\n\nr2,digits-0002,2026-11-30,a,b\n"),
     "invalid", ["row 2: 5 field(s)"], None),
    ("short-rows", "a.csv", csv(H + "\nr1,digits-0001\nr2,digits-0002\nr3,digits-0003,2026-11-30,gdpr\n"),
     "invalid", ["rows 1, 2: 2 field(s), but the header has 4"], None),
    ("spaced-sample-id", "a.csv", csv(H + "\nr1,digits-0001 ,2026-11-30,gdpr\nr2, digits-0002,2026-11-30,gdpr\n"),
     "invalid", ["column 'sample_id' rows 1, 2: value 'digits-0001 ' (and others) has spaces around it"], None),
    # an unclosed quote swallows the rest of the file into one value: named by its quote, not "2 field(s)" alone
    ("unclosed-quote", "a.csv", csv(H + '\nr1,"digits-0001,2026-11-30,gdpr\nr2,digits-0002,2026-11-30,gdpr\n'),
     "invalid", ['row 1 (file lines 2-3): a quote (") opens a value that is never closed on its line',
                 "the row has 2 field(s), the header 4", "close the quote"], None),
    ("quoted-comma-is-one-field", "a.csv", csv(H + '\nr1,digits-0001,2026-11-30,"gdpr, art. 17"\n'), "ok", [], None),
    ("utf16", "a.csv", lambda p: p.write_bytes((H + "\nr1,digits-0001,2026-11-30,gdpr\n").encode("utf-16")),
     "invalid", ["not UTF-8 text", "save it as UTF-8"], None),
    # a quoted field may hold a line break: it would enter the append-only ledger as it is
    ("newline-in-request-id", "a.csv", csv(H + '\n"r1\nr2",digits-0001,2026-11-30,gdpr\n'), "invalid",
     ["column 'request_id' row 1: value 'r1\\nr2' holds a control character"], None),
    ("tab-in-reason", "a.csv", csv(H + '\nr1,digits-0001,2026-11-30,"gdpr\tart17"\n'), "invalid",
     ["column 'reason' row 1", "control character"], None),
    # a time of day with no zone names no instant; a date alone is a day (its midnight, UTC)
    ("zoneless-time", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30T09:00:00,gdpr\nr2,digits-0002,2026-11-30 10:15,gdpr\n"),
     "invalid", ["column 'requested_at' rows 1, 2: value '2026-11-30T09:00:00' (and others) has a time but no time "
                 "zone", "2026-11-30T09:00:00Z"], None),
    ("good-compact-offset", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30T09:00:00.5+0130,gdpr\n"), "ok", [], None),
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
    # the same defect in many rows is one line naming them (a 10^6-row file is not answered with 10^6 lines)
    ("bad-times-one-line", "a.csv", csv(H + "\nr1,digits-0001,nope,gdpr\nr2,digits-0002,never,gdpr\n"
                                        "r3,digits-0003,x,gdpr\n"), "invalid",
     ["column 'requested_at' rows 1, 2, 3: value 'nope' (and others) is not a valid timestamp"], None),
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
    ("unknown-id", "a.csv", csv(H + "\nr1,digits-9999,2026-11-30,gdpr\n"), "invalid",
     ["row 1: value 'digits-9999' is not in the manifest", "correct the id or remove the row"], None),
    # a data subject does not know the split: a validation row is erased (not trained on), never refused
    ("validation-row", "a.csv", csv(H + "\nr1,digits-0009,2026-11-30,gdpr\n"), "ok",
     ["1 name validation rows: erased from the stores, not unlearned"], None),
    ("train-and-validation-rows", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\nr2,digits-0009,2026-11-30,gdpr\n"),
     "ok", ["2 request(s) to apply; 1 name validation rows"], None),
    ("already-deleted", "a.csv", csv(H + "\nr1,digits-0007,2026-11-30,gdpr\n"), "invalid",
     ["row 1: value 'digits-0007' was deleted already by batch batch-old", "remove the row"], None),
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
     "invalid", ["separated by ';', not commas", "write the file as CSV"], None),
    ("binary-garbage", "a.csv", lambda p: p.write_bytes(b"\x00\xff\xfe\x00PK\x03\x04" * 20), "invalid",
     [], None),
    ("txt-suffix", "a.txt", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\n"), "invalid", ["not supported"], None),
    ("json-suffix", "a.json", csv("{}"), "invalid", ["not supported"], None),
    ("capitalised-columns", "a.csv", csv("Request_ID,Sample_ID,Requested_At,Reason\nr1,digits-0001,2026-11-30,gdpr\n"),
     "invalid", ["must be lowercase", "rename 'Request_ID' -> 'request_id'", "'Reason' -> 'reason'"], None),
    ("many-problems", "a.csv", csv(H + "\nr1,digits-9999,2026-11-30,gdpr\nr1,digits-0002,never,gdpr\n"), "invalid",
     ["'never'", "'r1' appears more than once", "not yet checked against the manifest"], None),
    ("unknown-and-validation-ids", "a.csv", csv(H + "\nr1,digits-9999,2026-11-30,gdpr\nr2,digits-0009,2026-11-30,gdpr\n"),
     "invalid", ["row 1: value 'digits-9999' is not in the manifest"], None),
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
    ("parquet-corrupt", "a.parquet", csv("not a parquet file"), "invalid",
     ["not a Parquet file", "if it is CSV, name it .csv"], None),
    ("parquet-future", "a.parquet", parquet(request_id=["p1"], sample_id=["digits-0001"],
                                            requested_at=["2999-01-01T00:00:00Z"], reason=["gdpr"]), "invalid",
     ["in the future"], None),
    ("directory", "a.csv", lambda p: p.mkdir(), "invalid", ["a directory, not a request file", "name one request file"],
     None),
    ("tombstoned", "a.csv", csv(H + "\nr1,digits-0005,2026-11-30,gdpr\n"), "invalid",
     ["row 1: value 'digits-0005' was erased already"], "tomb"),
    ("tombstoned-hashed", "a.csv", csv(H + "\nr1,digits-0005,2026-11-30,gdpr\n"), "invalid",
     # with hashed ids the line names the id by its keyed form (an erased id never comes back in plain text)
     [f"row 1: value {hash_sample_id('digits-0005', SALT)!r} was erased already"], "tombhash"),
    # one problem, one line (each of these was two or more lines before, or is new)
    ("dup-row", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\nr1,digits-0001,2026-11-30,gdpr\n"), "invalid",
     ["rows 1, 2: the same request (request_id 'r1', sample_id 'digits-0001') appears 2 times; keep one row"], None),
    ("dup-row-other-reason", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\nr1,digits-0001,2026-11-30,ccpa\n"),
     "invalid", ["rows 1, 2: the same request"], None),
    ("dup-row-and-dup-sample", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\nr1,digits-0001,2026-11-30,gdpr\n"
                                            "r3,digits-0001,2026-11-30,gdpr\n"), "invalid",
     ["rows 1, 2: the same request", "column 'sample_id' rows 1, 3: value 'digits-0001' appears more than once"], None),
    ("bad-and-mixed-objective", "a.csv", csv(H + ",objective\nr1,digits-0001,2026-11-30,gdpr,forget-it\n"
                                             "r2,digits-0002,2026-11-30,gdpr,suppression\n"), "invalid",
     ["row 1: value 'forget-it' is not allowed"], None),
    ("spaced-column", "a.csv", csv("request_id,sample_id,requested_at, Reason\nr1,digits-0001,2026-11-30,gdpr\n"),
     "invalid", ["rename ' Reason' -> 'reason'"], None),
    ("tab-separated", "a.csv", csv("request_id\tsample_id\trequested_at\treason\nr1\tdigits-0001\t2026-11-30\tgdpr\n"),
     "invalid", ["separated by tabs, not commas"], None),
    ("foreign-file", "a.csv", csv(H + "\nr1,mnist-00001,2026-11-30,gdpr\nr2,mnist-00002,2026-11-30,gdpr\n"
                                  "r3,mnist-00003,2026-11-30,gdpr\n"), "invalid",
     ["none of the 3 sample ids", "probably for another dataset"], None),
    ("unknown-validation-deleted", "a.csv", csv(H + "\nr1,digits-9999,2026-11-30,gdpr\nr2,digits-0009,2026-11-30,gdpr\n"
                                                "r3,digits-0007,2026-11-30,gdpr\nr4,digits-0002,2026-11-30,gdpr\n"), "invalid",
     ["row 1: value 'digits-9999' is not in the manifest", "row 3: value 'digits-0007' was deleted already by batch batch-old"],
     None),
    ("partial-overlap-keeps-row-numbers", "a.csv", csv(H + "\nold-1,digits-0007,2026-11-01T10:00:00Z,gdpr\n"
                                                       "r2,digits-0002,nope,gdpr\n"), "invalid",
     ["column 'requested_at' row 2: value 'nope'"], "plain"),
    ("partial-overlap-unknown", "a.csv", csv(H + "\nold-1,digits-0007,2026-11-01T10:00:00Z,gdpr\n"
                                             "r2,digits-9999,2026-11-30,gdpr\n"), "invalid",
     ["row 2: value 'digits-9999' is not in the manifest"], "plain"),
    # hostile and odd input: each one line naming the problem and the fix
    ("formula-request-id-and-reason", "a.csv", csv(H + "\n=cmd|' /C calc'!A0,digits-0001,2026-11-30,=1+1\n"), "invalid",
     ["column 'request_id' row 1: value \"=cmd|' /C calc'!A0\" starts with '=', '+', '-' or '@', which a spreadsheet "
      "runs as a formula", "column 'reason' row 1: value '=1+1' starts with", "start it with a letter or a digit"], None),
    ("formula-plus-minus-at", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,+gdpr\nr2,digits-0002,2026-11-30,-gdpr\n"
                                           "r3,digits-0003,2026-11-30,@gdpr\n"), "invalid",
     ["column 'reason' rows 1, 2, 3: value '+gdpr' (and others) starts with '=', '+', '-' or '@'"], None),
    ("formula-leading-tab", "a.csv", csv(H + '\nr1,digits-0001,2026-11-30,"\t=1+1"\n'), "invalid",
     ["column 'reason' row 1", "control character"], None),
    ("formula-leading-cr", "a.csv", csv(H + '\n"\r=1",digits-0001,2026-11-30,gdpr\n'), "invalid",
     ["column 'request_id' row 1", "control character"], None),
    ("formula-mid-text-is-fine", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,gdpr art. 17 = erasure\n"), "ok", [], None),
    ("lookalike-fullwidth", "a.csv", csv(H + "\nr1,ｄｉｇｉｔｓ－０００５,2026-11-30,gdpr\n"), "invalid",
     ["row 1: value 'ｄｉｇｉｔｓ－０００５' is not in the manifest", "full-width", "did you mean 'digits-0005'?"], None),
    ("lookalike-dotless-i", "a.csv", csv(H + "\nr1,dıgits-0005,2026-11-30,gdpr\n"), "invalid",
     ["'dıgits-0005' is not in the manifest", "dotless", "did you mean 'digits-0005'?"], None),
    ("lookalike-zero-width-space", "a.csv", csv(H + "\nr1,digits-\u200b0005,2026-11-30,gdpr\n"), "invalid",
     ["an invisible character", "did you mean 'digits-0005'?"], None),
    ("lookalike-every-row", "a.csv", csv(H + "\nr1,dıgits-0001,2026-11-30,gdpr\nr2,Digits-0002,2026-11-30,gdpr\n"), "invalid",
     ["row 1: value 'dıgits-0001'", "did you mean 'digits-0001'?", "row 2: value 'Digits-0002'",
      "did you mean 'digits-0002'?"], None),
    ("repeated-header", "a.csv", csv(H + "\nr1,digits-0001,2026-11-30,gdpr\n" + H + "\nr2,digits-0002,2026-11-30,gdpr\n"),
     "invalid", ["row 2: repeat(s) the header (request_id,sample_id,requested_at,reason); remove it"], None),
    ("parquet-truncated", "a.parquet", lambda p: (parquet(**GOOD)(p), p.write_bytes(p.read_bytes()[:-30])), "invalid",
     ["a truncated Parquet file", "write or copy it again"], None),
    ("parquet-named-csv", "a.csv", parquet(**GOOD), "invalid", ["this is a Parquet file", "name it .parquet"], None),
    ("symlink-to-a-system-file", "a.csv", lambda p: (p.parent.joinpath("passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\n"), p.symlink_to(p.parent / "passwd")), "invalid",
     ["a symlink (to ", "copy the file itself"], None),
    ("parquet-struct-sample-id", "a.parquet", parquet(request_id=["p1"], sample_id=[{"id": "digits-0001"}],
                                                      requested_at=["2026-11-30"], reason=["gdpr"]), "invalid",
     ["column 'sample_id': Parquet type is struct", "a nested column", "write 'sample_id' as a string column"], None),
    ("parquet-list-reason", "a.parquet", parquet(request_id=["p1"], sample_id=["digits-0001"], requested_at=["2026-11-30"],
                                                 reason=[["gdpr", "art17"]]), "invalid",
     ["column 'reason': Parquet type is list", "a nested column"], None),
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
    # a batch naming every retained training row (0-6 of the manifest; 7 is deleted, 8-9 are validation rows)
    ("nothing-left", "a.csv", csv(H + "".join(f"\nr{i},digits-000{i},2026-11-30,gdpr" for i in range(7)) + "\n"),
     "invalid", ["names all 7 training rows still retained"], None),
    ("ledger-partial-overlap", "a.csv", csv(H + "\nold-1,digits-0007,2026-11-01T10:00:00Z,gdpr\n"
                                            "r2,digits-0002,2026-11-30,gdpr\n"), "ok", [], "plain"),
]

# Files with more than one problem (every other invalid file has exactly one problem, so one line).
LINES = {"ledger-conflict-plus-bad-time": 2, "many-problems": 2,
         "dup-row-and-dup-sample": 2, "unknown-validation-deleted": 2, "formula-request-id-and-reason": 2,
         "lookalike-every-row": 2}

RESULTS: dict[str, tuple[bool, bool]] = {}
LINE_COUNTS: dict[str, tuple[int, int]] = {}  # invalid case -> (problems in the file, problem lines)  # case -> (clear error or expected outcome, state unchanged)


def run_case(path, write, kind, gx_dir=None):
    """Write the case's file and check it as `unlearn validate` would; (FileCheck, nothing changed)."""
    write(path)
    m = manifest()
    hashed = kind in ("hashed", "tombhash")
    led = ledger(hashed=hashed) if kind in ("plain", "hashed") else []
    before = (m.copy(), copy.deepcopy(led), path.read_bytes() if path.is_file() else None)
    tomb = {"digits-0005"} if kind == "tomb" else {hash_sample_id("digits-0005", SALT)} if kind == "tombhash" else None
    fc = check_request_file(path, m, led, hash_ids=hashed, salt=SALT, max_clock_skew_seconds=300, tombstoned=tomb,
                            gx_dir=gx_dir)
    unchanged = (m.equals(before[0]) and led == before[1]
                 and (path.read_bytes() if path.is_file() else None) == before[2])
    return fc, unchanged


@pytest.mark.parametrize("case,name,write,status,expect,kind", CASES, ids=[c[0] for c in CASES])
def test_request_corpus(tmp_path, monkeypatch, case, name, write, status, expect, kind):
    monkeypatch.setattr(validation, "run_suite", fast_suite)
    path = tmp_path / name
    fc, unchanged = run_case(path, write, kind)
    text = fc.summary()
    ok = fc.status == status and all(s in text for s in expect)
    if status == "invalid":
        ok = ok and str(path) in text and "<batch>" not in text and fc.problems and all(
            "\n" not in p for p in fc.problems)
        ok = ok and text.count("\n  - ") == len(fc.problems) == LINES.get(case, 1)
        LINE_COUNTS[case] = (LINES.get(case, 1), len(fc.problems))
    RESULTS[case] = (bool(ok), unchanged)
    assert fc.status == status, text
    for s in expect:
        assert s in text, text
    assert unchanged
    if status == "invalid":
        assert str(path) in text and "<batch>" not in text
        assert all("\n" not in p for p in fc.problems)  # one line each
        assert len(fc.problems) == LINES.get(case, 1), fc.problems  # and one line per problem
        with pytest.raises(validation.RequestValidationError):
            raise fc.error()
    if "conflict" in case:
        assert isinstance(fc.error(), validation.RequestConflict)


def test_corpus_size_and_summary():
    assert len(CASES) >= 40
    if len(RESULTS) == len(CASES):
        bad = [c for c, (ok, _) in RESULTS.items() if not ok]
        assert not bad, bad
        problems, lines = (sum(c[i] for c in LINE_COUNTS.values()) for i in (0, 1))
        assert problems == lines
        print(f"\ncorpus: clear/expected outcome {sum(ok for ok, _ in RESULTS.values())}/{len(CASES)}, "
              f"state unchanged {sum(u for _, u in RESULTS.values())}/{len(CASES)}, {len(LINE_COUNTS)} invalid "
              f"files: {problems} problems, {lines} problem lines")


MANIFEST_CASES = [c for c in CASES if c[3] == "ok" or any("manifest" in e or "erased" in e or "validation rows" in e
                                                             or "another dataset" in e for e in c[4])]


def test_real_gx_agrees(tmp_path):
    """The persisted suite through real Great Expectations (a file context created in tmp) gives the very
    lines of the pandas stand-in on every manifest case, and each run's Data Docs."""
    assert len(MANIFEST_CASES) >= 10
    gx_dir = tmp_path / "gx"
    for case, name, write, status, expect, kind in MANIFEST_CASES:
        (tmp_path / case).mkdir()
        real, _ = run_case(tmp_path / case / name, write, kind, gx_dir=gx_dir)
        (tmp_path / f"{case}-fast").mkdir()
        original = validation.run_suite
        validation.run_suite = fast_suite
        try:
            fast, _ = run_case(tmp_path / f"{case}-fast" / name, write, kind)
        finally:
            validation.run_suite = original
        assert real.status == status and real.problems == fast.problems, (case, real.problems, fast.problems)
        if real.manifest_checked and status != "already_processed":
            assert real.data_docs and (Path(real.data_docs) / "index.html").is_file(), case
            assert f"data docs: {Path(real.data_docs) / 'index.html'}" in real.summary()
    assert (gx_dir / "expectations" / "deletion_request.json").is_file()


def test_a_structural_defect_is_reported_once_without_great_expectations(tmp_path, monkeypatch):
    """Missing column + duplicate request_id: two lines (pandera's), no GX run (its import alone costs 3-5 s),
    and a note that the manifest rules run once these are fixed."""
    def no_gx(*args, **kwargs):
        raise AssertionError("GX must not run for a file that failed the cheap checks")

    monkeypatch.setattr(validation, "run_suite", no_gx)
    path = tmp_path / "bad.csv"
    path.write_text("request_id,sample_id,requested_at\nr1,digits-0001,2026-11-30\nr1,digits-0002,2026-11-30\n")
    fc = check_request_file(path, manifest(), [])
    assert fc.status == "invalid" and not fc.manifest_checked
    assert len(fc.problems) == 2, fc.problems
    assert "missing column(s) ['reason']" in fc.problems[0] and "'r1' appears more than once" in fc.problems[1]
    assert fc.data_docs is None
    text = fc.summary()
    assert text.count("\n  - ") == 2 and text.endswith(f"note: {MANIFEST_NOT_CHECKED}")
