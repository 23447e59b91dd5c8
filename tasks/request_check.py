"""Deletion-request validation without Prefect: the checks `unlearn validate`, `unlearn run` and the deletion
flow share (tasks/validation.py wraps them as the Prefect task).

Two stages, each reporting every problem it finds, one line each, and no defect twice:
1. the cheap checks (well under a second): ledger conflicts, the pandera schema (columns, types, empty and
   duplicate values, timestamps), one objective per file, no future times, no id erased by an earlier batch;
2. only when stage 1 found nothing: the Great Expectations suite against the live manifest (each id exists,
   names a training row, is not deleted already). Importing GX alone costs 3-5 s, so a file with a
   structural defect answers in about a second; the suite holds only the rules pandera does not cover.

`live_state` reads what the checks need (manifest, ledger, hash salt) without torch or Prefect, so
`unlearn validate` answers in about a second before any server starts."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from unlearning.ledger import hash_sample_id
from unlearning.requests import (
    REQUIRED_COLUMNS, RequestValidationError, future_problems, ledger_matches, objective_problems, read_request_file,
    structural_problems,
)

# Said under the problems of a file that failed stage 1: the manifest rules have not run yet.
MANIFEST_NOT_CHECKED = ("the ids were not yet checked against the manifest (exist, name training rows, not deleted "
                        "already): Great Expectations runs those checks once the problems above are fixed")


@dataclass
class RequestCheck:
    problems: list[str]
    gx_result: dict = field(default_factory=dict)
    manifest_checked: bool = True

    @property
    def ok(self) -> bool:
        return not self.problems


def _gx_suite(gx, gxe, manifest: pd.DataFrame, columns: set[str]):
    """The rules against the manifest only (pandera already checked emptiness, nulls, uniqueness, timestamps:
    the suite runs only when it passed). Each defect fails one expectation: an unknown id fails "exists" and
    nothing else (the training and deleted rules look at known ids only)."""
    deleted = manifest.loc[manifest["status"] == "deleted", "sample_id"].tolist()
    not_train = manifest.loc[manifest["split"] != "train", "sample_id"].tolist()
    suite = gx.ExpectationSuite(name="deletion_request")
    if "sample_id" in columns:
        suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="sample_id",
                                                              value_set=manifest["sample_id"].tolist(),
                                                              meta={"rule": "must exist in the manifest"}))
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeInSet(
            column="sample_id", value_set=not_train or ["\x00none"],
            meta={"rule": "must name a training sample (validation rows are never trained on)"}))
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeInSet(column="sample_id",
                                                                 value_set=deleted or ["\x00none"],
                                                                 meta={"rule": "must not be deleted already (see the ledger)"}))
    return suite


def _failure_lines(result) -> list[str]:
    lines = []
    for vr in result.run_results.values():
        for r in vr.results:
            if r.success:
                continue
            cfg = r.expectation_config
            col, rule = cfg.kwargs.get("column"), (cfg.meta or {}).get("rule")
            what = rule if rule else cfg.type
            res = r.result or {}
            values = list(dict.fromkeys(res.get("partial_unexpected_list") or []))
            shown = f": {values[:10]}" if values else ""
            if r.exception_info and r.exception_info.get("raised_exception"):
                lines.append(f"GX {cfg.type}: could not run ({r.exception_info.get('exception_message')})")
            elif col:
                lines.append(f"GX: column '{col}' {what} ({res.get('unexpected_count')} row(s) fail){shown}")
            else:
                lines.append(f"GX: {what}")
    return lines


def gx_check(df: pd.DataFrame, manifest: pd.DataFrame) -> tuple[list[str], dict]:
    """Run the GX suite on the request frame; returns (failure lines, describe_dict result)."""
    import great_expectations as gx  # 3-5 s import: only here, and only for a file that passed pandera
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    # An ephemeral context logs "Created temporary directory ... for ephemeral docs site" at INFO on every call.
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch_def = (ctx.data_sources.add_pandas("requests").add_dataframe_asset("request_file")
                 .add_batch_definition_whole_dataframe("whole_file"))
    suite = ctx.suites.add(_gx_suite(gx, gxe, manifest, set(df.columns)))
    vd = ctx.validation_definitions.add(gx.ValidationDefinition(name="deletion_request", data=batch_def, suite=suite))
    cp = ctx.checkpoints.add(gx.Checkpoint(name="deletion_request", validation_definitions=[vd],
                                           result_format={"result_format": "SUMMARY"}))
    result = cp.run(batch_parameters={"dataframe": df.astype(object).where(df.notna(), None)})
    described = result.describe_dict()
    return _failure_lines(result), described


def foreign_ids_hint(df: pd.DataFrame, manifest: pd.DataFrame) -> str | None:
    """When NO requested id is in the manifest, the file most likely belongs to another dataset (e.g. a sample
    request left in the inbox after switching datasets): say so, with what this dataset's ids look like."""
    if "sample_id" not in df.columns or not len(df) or not len(manifest):
        return None
    requested = df["sample_id"].dropna().astype(str)
    if not len(requested) or requested.isin(manifest["sample_id"]).any():
        return None
    return (f"none of the {len(requested)} sample id(s) is in this dataset's manifest, whose ids look like "
            f"{manifest['sample_id'].iloc[:2].tolist()}: the file is probably for another dataset, move it out of "
            f"the inbox")


def manifest_problems(df: pd.DataFrame, manifest: pd.DataFrame) -> tuple[list[str], dict]:
    """Stage 2: the GX suite; the foreign-dataset hint joins the "must exist" line (one defect, one line)."""
    lines, described = gx_check(df, manifest)
    hint = foreign_ids_hint(df, manifest)
    if hint:
        lines = [f"{line}; hint: {hint}" if "must exist in the manifest" in line else line for line in lines]
    return lines, described


def check_request_frame(df: pd.DataFrame, manifest: pd.DataFrame, cheap: list[str] | None = None,
                        gx: bool = True) -> RequestCheck:
    """pandera, then (when it and the `cheap` problems found nothing, and `gx`) the GX suite."""
    problems = [*(f"schema: {p}" for p in structural_problems(df)), *(cheap or [])]
    problems = list(dict.fromkeys(problems))
    if problems or not gx:
        return RequestCheck(problems=problems, manifest_checked=False)
    gx_problems, gx_result = manifest_problems(df, manifest) if len(df.columns) else ([], {})
    return RequestCheck(problems=gx_problems, gx_result=gx_result)


def raise_if_invalid(path: str, check: RequestCheck) -> None:
    if not check.ok:
        raise RequestValidationError(path, check.problems, None if check.manifest_checked else MANIFEST_NOT_CHECKED)


class RequestConflict(RequestValidationError):
    """A request_id already in the ledger arrives with other content: never skipped, never applied."""


@dataclass
class FileCheck:
    """The one validation of a request file, shared by `unlearn validate` and the deletion flow.

    status: "ok" (pending rows to apply), "already_processed" (every request is in the ledger with the same
    content: nothing to do) or "invalid" (problems, one line each). `manifest_checked` is False when the
    cheap checks failed (or `gx=False`): the GX suite against the manifest did not run."""

    path: str
    status: str
    problems: list[str]
    pending: pd.DataFrame | None = None
    skipped: int = 0
    n_rows: int = 0
    gx_result: dict = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    manifest_checked: bool = True

    def error(self) -> RequestValidationError:
        cls = RequestConflict if self.conflicts else RequestValidationError
        return cls(self.path, self.problems, None if self.manifest_checked else MANIFEST_NOT_CHECKED)

    def summary(self) -> str:
        if self.status == "already_processed":
            return (f"{self.path}: all {self.n_rows} request(s) were processed before with the same content; "
                    f"nothing to do")
        if self.status == "ok":
            extra = f" ({self.skipped} already processed with the same content)" if self.skipped else ""
            unchecked = "" if self.manifest_checked else "; not checked against the manifest"
            return f"{self.path}: valid ({len(self.pending)} request(s) to apply{extra}{unchecked})"
        return str(self.error())


def check_request_file(path, manifest: pd.DataFrame, ledger: list[dict], *, hash_ids: bool = False,
                       salt: str = "", max_clock_skew_seconds: float = 300.0, now=None,
                       tombstoned: set[str] | None = None, gx: bool = True) -> FileCheck:
    """Read and validate one request file against the ledger and the live manifest: stage 1 (ledger,
    structure and types, mixed objectives, future times, erased ids), then, when it found nothing and `gx`,
    stage 2 (the GX suite against the manifest). `gx=False` runs stage 1 only (the CLI's pre-check)."""
    path = str(path)
    try:
        df = read_request_file(path)
    except RequestValidationError as e:
        return FileCheck(path, "invalid", e.problems, manifest_checked=False)
    key = (lambda s: hash_sample_id(s, salt)) if hash_ids else (lambda s: s)
    same, conflicts = ledger_matches(df, ledger, key)
    n = len(df)
    if n and len(same) == n and not conflicts:
        return FileCheck(path, "already_processed", [], df.iloc[0:0], skipped=n, n_rows=n)
    keep = [i for i in range(n) if i not in set(same)]
    pending = df.iloc[keep].reset_index(drop=True)
    pending.attrs = dict(df.attrs)
    cheap = [f"schema: {p}" for p in objective_problems(pending)]
    cheap += [f"schema: {p}" for p in future_problems(pending, max_clock_skew_seconds, now)]
    if tombstoned and "sample_id" in pending.columns:
        # An erased id is also gone from the manifest: reported here once, so GX does not run for it.
        erased = [s for s in pending["sample_id"].dropna().astype(str) if key(s) in tombstoned]
        if erased:
            cheap.append(f"sample id(s) {erased[:10]} were erased by an earlier batch (see the ledger); "
                         f"nothing is left to forget")
    check = check_request_frame(pending, manifest, cheap, gx=gx and not conflicts)
    problems = [*conflicts, *check.problems]
    return FileCheck(path, "invalid" if problems else "ok", problems, pending, skipped=len(same), n_rows=n,
                     gx_result=check.gx_result, conflicts=conflicts, manifest_checked=check.manifest_checked)


# --- what the checks need, without torch or Prefect ---------------------------------------------------------

@dataclass
class LiveState:
    manifest: pd.DataFrame
    ledger: list[dict]
    salt: str  # the prepared dataset's name: the salt of hashed ids in the ledger and tombstones


def live_state(params) -> LiveState | None:
    """The live manifest and ledger as `tasks.state.load_state` would give them, read without a model: from
    a state folder whose recorded fingerprint matches the current params and data. None when only the full
    load can tell (no state yet: the original's checkpoint decides; a state written before fingerprints; a
    mismatch, whose message names what changed): the caller then calls load_state. Raises what load_state
    raises for a missing prepared folder."""
    from unlearning.data import load_prepared, read_state_manifest
    from unlearning.fingerprint import matches, prepared_fingerprint
    from unlearning.io import recover_dir
    from unlearning.ledger import read_ledger

    state_dir = params.path("state_dir")
    recover_dir(state_dir)  # as load_state does: a half-finished commit is undone first
    prepared = load_prepared(params.path("prepared_dir"))
    champion_file = state_dir / "champion.json"
    if not (state_dir / "model.pt").exists() or not champion_file.exists():
        return None
    recorded = json.loads(champion_file.read_text()).get("fingerprint")
    if recorded is None or not matches(recorded, prepared_fingerprint(params, prepared.info, prepared.manifest)):
        return None
    return LiveState(read_state_manifest(state_dir / "manifest.csv"), read_ledger(state_dir / "ledger.jsonl"),
                     prepared.info["name"])


def check_file_for(path: str | Path, params, live: LiveState, gx: bool = True) -> FileCheck:
    """`check_request_file` with the arguments the deletion flow passes (flows.deletion_batch.check_file)."""
    from unlearning.erasure import read_tombstones

    return check_request_file(path, live.manifest, live.ledger, hash_ids=params.deletion.hash_sample_ids,
                              salt=live.salt, max_clock_skew_seconds=params.deletion.max_clock_skew_seconds,
                              tombstoned=read_tombstones(params.path("tombstones")), gx=gx)


__all__ = ["RequestCheck", "FileCheck", "RequestConflict", "LiveState", "check_request_file", "check_request_frame",
           "check_file_for", "gx_check", "live_state", "manifest_problems", "raise_if_invalid", "REQUIRED_COLUMNS",
           "MANIFEST_NOT_CHECKED"]
