"""The CLI answers a request file the manifest rules reject without importing Great Expectations: the rules are
evaluated with pandas first (adapters.request_check.rule_failures). The pandas verdict must be the suite's, row
for row, on every kind of defect; a file it passes still goes through the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pandas as pd
import pytest

import adapters.request_check as rc
from tests.helpers import ROOT
from tests.unit.test_gx_suite import H, manifest  # the suite's own test data

def frame(sample_ids: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(len(sample_ids))], "sample_id": sample_ids,
                         "requested_at": ["2026-11-28T08:00:00Z"] * len(sample_ids), "reason": ["x"] * len(sample_ids)})


# unknown ids, validation rows, a deleted id, an erased (tombstoned) id, good ids, and their mixtures
CASES = {
    "good": ["digits-0001", "digits-0002"],
    "unknown": ["nope-1"],
    "all_unknown": ["nope-1", "nope-2", "nope-3"],
    "validation_row": ["digits-0009"],
    "deleted": ["digits-0007"],
    "erased": ["gone-0042"],
    "mixed": ["digits-0001", "nope-1", "digits-0008", "digits-0007", "gone-0042", "digits-0003"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pandas_rules_agree_with_the_suite_row_for_row(case):
    lk = rc.lookup_frame(frame(CASES[case]), manifest(), tombstoned={"gone-0042"})
    fast = rc.rule_failures(lk.frame)
    suite = rc.run_suite(lk.frame).failures  # the same suite, in memory
    assert sorted(fast) == sorted(suite)
    assert bool(fast) == (case not in ("good", "validation_row"))


def test_every_defect_fails_exactly_one_rule():
    lk = rc.lookup_frame(frame(CASES["mixed"]), manifest(), tombstoned={"gone-0042"})
    by_rule = {rule: rows for rule, rows, _col, _ in rc.rule_failures(lk.frame)}
    # row 3 names a validation row: a legitimate request (erased, not trained on), no rule fails for it
    assert by_rule == {"exists": [2], "not_deleted": [4, 5]}


def test_fast_path_gives_the_suites_lines_without_gx_and_keeps_the_suite_for_good_files(tmp_path, monkeypatch):
    bad = frame(CASES["mixed"])
    slow = rc.check_request_frame(bad, manifest(), tombstoned={"gone-0042"})
    called = []
    real = rc.run_suite
    monkeypatch.setattr(rc, "run_suite", lambda *a, **k: called.append(1) or real(*a, **k))
    fast = rc.check_request_frame(bad, manifest(), tombstoned={"gone-0042"}, gx_when_invalid=False)
    assert fast.problems == slow.problems and fast.manifest_checked and not called
    assert fast.gx_result == {} and fast.data_docs is None
    good = rc.check_request_frame(frame(CASES["good"]), manifest(), gx_when_invalid=False)
    assert good.ok and called == [1]  # a file the pandas rules pass is still judged by the suite


def test_a_rejected_file_never_imports_great_expectations(tmp_path):
    """In a fresh interpreter: the fast path rejects an unknown id and great_expectations stays unimported."""
    path = tmp_path / "bad.csv"
    path.write_text(f"{H}\nr1,nope-1,2026-11-28T08:00:00Z,x\n")
    code = textwrap.dedent(f"""
        import sys, pandas as pd
        sys.path.insert(0, {str(ROOT)!r})
        import adapters.request_check as rc
        m = pd.DataFrame({{"sample_id": ["digits-0000"], "split": ["train"], "status": ["retained"],
                           "deleted_in_batch": [None]}})
        fc = rc.check_request_file({str(path)!r}, m, [], gx_when_invalid=False)
        assert fc.status == "invalid" and "not in the manifest" in fc.problems[0], fc.problems
        print("gx imported" if "great_expectations" in sys.modules else "gx not imported")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "gx not imported"


def test_the_plans_check_runs_the_rules_with_pandas_only(monkeypatch):
    """`unlearn plan` (gx_suite=False) applies nothing: the suite's rules with pandas, for a bad file and a good
    one alike; never the suite itself."""
    called = []
    monkeypatch.setattr(rc, "run_suite", lambda *a, **k: called.append(1))
    bad = rc.check_request_frame(frame(CASES["mixed"]), manifest(), tombstoned={"gone-0042"}, gx_when_invalid=False,
                                 gx_suite=False)
    good = rc.check_request_frame(frame(CASES["good"]), manifest(), gx_when_invalid=False, gx_suite=False)
    assert len(bad.problems) == 3 and good.ok and good.manifest_checked and not called


def test_data_docs_templates_compile_once(tmp_path):
    """After cache_data_docs_templates, every Data Docs view GX builds loads its templates through one Jinja
    bytecode cache (compiled once per machine, not once per page)."""
    rc.cache_data_docs_templates()
    from great_expectations.render.view.view import DefaultJinjaView

    a, b = DefaultJinjaView(), DefaultJinjaView()
    assert a.env.bytecode_cache is not None and a.env.bytecode_cache is b.env.bytecode_cache
