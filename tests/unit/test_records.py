"""The batch path's typed records and the methods' traits: no code outside a method's own module and the config
compares method names; Step.certificate lists every kind; a sequential look evaluates its verdict once; the
records are frozen and carry what later steps read (the applied alpha, the looks, the per-split table)."""

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from unlearning import sequential
from unlearning.certificate import acceptance
from unlearning.certificate.acceptance import Outcome, outcome_from_logits, split_records
from unlearning.batch.rows import BatchRows
from unlearning.config import METHOD_TRAITS, CertificateKind, Gate, method_traits
from unlearning.data.store import Prepared
from unlearning.certificate.gate import Check, SplitMeasures, Verdict
from unlearning.certificate.metric_keys import ALPHA, LOOKS
from unlearning.models import build_model
from unlearning.planning.plan import Step
from unlearning.batch.records import Selection

ROOT = Path(__file__).resolve().parents[2]
NAME_HOMES = {"unlearning/config.py"}  # the trait table and the defaults name methods; so do the methods' modules
PIPELINE = ("unlearning", "tasks", "flows")  # the batch path: no method name at all, a trait says what it needs
# adapters/ (figures, tracking), the benches and the benches' study drivers name the methods they run and report
# on; none of them may decide by comparing a name
COMPARE_ONLY = ("adapters", "bench", "unlearning/studies")
# The benches' and studies' compares with a method name, each the method as the study's subject (no trait stands
# for it): listed so that no NEW compare slips in. Remove an entry once its compare is gone (the test then fails
# until the entry goes, so the list only shrinks).
STUDY_SUBJECTS = {
    # do_nothing is each study's baseline ("no unlearning"); the studies report every method against it
    ("bench/calibration.py", "do_nothing"), ("bench/equivalence.py", "do_nothing"),
    ("bench/gpu_batch.py", "do_nothing"),
    ("unlearning/studies/diagnostics_study.py", "do_nothing"), ("unlearning/studies/random_sets.py", "do_nothing"),
    ("unlearning/studies/readme.py", "do_nothing"),
    # the independent retrain is the equivalence study's floor, and one of the cost bench's paths
    ("bench/equivalence.py", "retrain"), ("bench/batch_cost.py", "retrain"),
    # methods a study adds to some of its sets, or states a lemma of (the ascent methods overshoot)
    ("bench/calibration.py", "finetune"), ("unlearning/studies/random_sets.py", "newton_ggn"),
    ("unlearning/studies/readme.py", "gradient_ascent"), ("unlearning/studies/readme.py", "descent_ascent"),
}


def registered_method_names() -> set[str]:
    """Every method the registry runs (unlearning/methods/registry.py), the trait table's included."""
    from unlearning.methods import REGISTRY

    return set(REGISTRY) | set(METHOD_TRAITS)


def method_name_literals(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every string constant in `path` that is one of the method `names`."""
    return sorted((node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names)


def method_name_compares(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every method name compared in `path`: an operand of ==, !=, in, not in (alone or inside a
    tuple, list or set: `m in ("sisa", "retrain")`), or a `case "retrain":` pattern."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for o in operands:
                items = o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o]
                found += [(i.lineno, i.value) for i in items if isinstance(i, ast.Constant) and i.value in names]
        elif isinstance(node, ast.MatchValue) and isinstance(node.value, ast.Constant) and node.value.value in names:
            found.append((node.lineno, node.value.value))
    return sorted(found)


def python_files(folder: str):
    for p in sorted((ROOT / folder).rglob("*.py")):
        yield str(p.relative_to(ROOT)), p


def test_no_pipeline_code_outside_a_method_and_the_config_names_a_method():
    names, offenders = registered_method_names(), {}
    for layer in PIPELINE:
        for rel, p in python_files(layer):
            if rel in NAME_HOMES or rel.startswith(("unlearning/methods/", "unlearning/studies/")):
                continue
            if found := method_name_literals(p, names):
                offenders[rel] = found
    assert offenders == {}


def test_no_figure_bench_or_study_compares_a_method_name_but_its_listed_subjects():
    names, found = registered_method_names(), set()
    for folder in COMPARE_ONLY:
        for rel, p in python_files(folder):
            found |= {(rel, name) for _, name in method_name_compares(p, names)}
    assert found - STUDY_SUBJECTS == set(), "compare a trait (unlearning/config.py method_traits), not a name"
    assert STUDY_SUBJECTS - found == set(), "no longer compared: remove it from STUDY_SUBJECTS"


def test_the_finders_find_a_name_and_a_name_compare(tmp_path):
    src = tmp_path / "x.py"
    src.write_text('def f(m, p):\n    keep = ["finetune"]\n    if p["method"] == "retrain" or m in ("sisa", "x"):\n'
                   '        return "retrain" != m\n    match m:\n        case "scrub":\n            return 1\n')
    names = registered_method_names()
    assert method_name_literals(src, names) == [(2, "finetune"), (3, "retrain"), (3, "sisa"), (4, "retrain"),
                                                (6, "scrub")]
    assert method_name_compares(src, names) == [(3, "retrain"), (3, "sisa"), (4, "retrain"), (6, "scrub")]
    assert {"do_nothing", "newton_ggn", "al_wpgd", "retrain", "sisa"} <= names  # the registry's, not two


def test_every_trait_names_a_registered_method_and_the_registry_hands_them_out():
    from unlearning.methods import REGISTRY

    assert set(METHOD_TRAITS) <= set(REGISTRY)
    assert REGISTRY["retrain"].traits.exact and REGISTRY["retrain"].traits.fallback
    assert REGISTRY["sisa"].traits.needs_sharded_original and REGISTRY["sisa"].traits.exact
    assert not REGISTRY["finetune"].traits.exact and method_traits("not-a-method") == method_traits("finetune")
    assert sum(t.fallback for t in METHOD_TRAITS.values()) == 1  # one method ends every candidate list


def test_step_certificate_is_an_enum_listing_every_kind():
    assert {k.value for k in CertificateKind} == {"exact", "audit", "absolute", "sequential", "qualified"}
    step = Step("do_nothing", "sequential")
    assert step.certificate is CertificateKind.SEQUENTIAL and step.certificate == "sequential"
    assert f"{step.certificate}" == "sequential"  # the plan's lines and MLflow tags read the value
    with pytest.raises(ValueError, match=r"Step.certificate = 'oracle'; allowed: \['exact', 'audit'"):
        Step("do_nothing", "oracle")


def test_the_selection_is_a_frozen_record_with_its_json_form():
    sel = Selection(["do_nothing", "retrain"], [("gap_below_noise_floor", "x")], explicit=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sel.candidates = ["retrain"]
    forced = sel.forced_retrain(["too much debt"])
    assert forced.candidates == ["retrain"] and forced.rules_would_have_tried == ["do_nothing", "retrain"]
    assert Selection.of(forced.to_dict()) == forced
    assert "nearest_miss" not in sel.to_dict() and sel["candidates"] == sel.candidates


def _tiny_batch(n_forget=6, n_retain=20, n_val=10, classes=3):
    rng = np.random.default_rng(0)
    n = n_forget + n_retain + n_val
    X = rng.normal(size=(n, 4)).astype(np.float32)
    label = rng.integers(0, classes, n)
    manifest = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)]})
    prepared = Prepared(X, label, manifest, {"class_names": [str(c) for c in range(classes)]})
    forget, retain = np.arange(n_forget), np.arange(n_forget, n_forget + n_retain)
    rows = BatchRows(before=np.arange(n_forget + n_retain), forget=forget, retain=retain,
                     adjacent_mask=np.arange(n_retain) < 5, validation=np.arange(n_forget + n_retain, n))
    return prepared, rows


def test_a_look_evaluates_its_verdict_once_and_the_outcome_records_alpha(monkeypatch):
    prepared, rows = _tiny_batch()
    n_eval = len(rows.eval_rows()[0])
    g = torch.Generator().manual_seed(0)
    logits = {k: torch.randn(m, n_eval, 3, generator=g) for k, m in
              (("candidate", 1), ("original", 1), ("oracles", 6), ("shadow_unlearned", 6), ("oracle_ref", 6),
               ("accuracy_ref", 6))}
    model = build_model({"arch": "mlp", "in_shape": [4], "n_classes": 3, "kwargs": {"hidden": [2]}}, [0])

    def no_second_verdict(*a, **k):
        raise AssertionError("the gate was evaluated besides the look's own verdict")

    monkeypatch.setattr(acceptance, "evaluate_gate", no_second_verdict)
    calls, gate_of_the_look = [], sequential.evaluate_gate

    def once(*a, **k):
        calls.append(a)
        return gate_of_the_look(*a, **k)

    monkeypatch.setattr(sequential, "evaluate_gate", once)
    out = outcome_from_logits("do_nothing", model, logits, prepared, rows, Gate(), "retrain_equivalence", 0, {}, 0.0,
                              6)
    assert len(calls) == 1 and len(out.looks) == 1 and out.looks[0].decision == "final"
    assert out.alpha == 0.01 and out.tracked_metrics()[ALPHA] == 0.01 and ALPHA not in out.metrics
    recs = {r.split: r for r in out.splits}
    assert all(recs[s].passed == out.verdict.passed_for(s) for s in recs)
    assert recs["forget"].pvalue == out.metrics["klom_pvalue/forget"] == out.verdict.checks["klom_pvalue/forget"].value
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.verdict = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.verdict.passed = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.looks[0].decision = "reject"
    looked = dataclasses.replace(out, looks=("look 1", "look 2"))
    assert looked.tracked_metrics()[LOOKS] == 2.0 and split_records(looked) == list(out.splits)


def test_a_hand_made_outcome_gets_its_split_records_from_its_measures():
    v = Verdict(True, "retrain_equivalence", checks={"acc/validation_drop": Check(0.9, ">=", 0.95, False)})
    out = Outcome("retrain", None, {}, v, {}, pd.DataFrame(),
                  measures=(SplitMeasures("forget", 0.5), SplitMeasures("validation", 0.9)))
    recs = {r.split: r for r in split_records(out)}
    assert recs["validation"].passed is False and recs["forget"].passed is True and recs["forget"].accuracy == 0.5
