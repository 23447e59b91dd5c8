"""Deletion-request validation at the task boundary: pandera (structure, from the core) and a Great
Expectations suite (against the live manifest). Every failure of both is collected into one error."""

from __future__ import annotations

import logging

from dataclasses import dataclass, field

import pandas as pd
from prefect import task

from unlearning.ledger import hash_sample_id
from unlearning.requests import (
    REQUIRED_COLUMNS, RequestValidationError, future_problems, ledger_matches, objective_problems, read_request_file,
    structural_problems,
)


@dataclass
class RequestCheck:
    problems: list[str]
    gx_result: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def _gx_suite(gx, gxe, manifest: pd.DataFrame, columns: set[str]):
    deleted = manifest.loc[manifest["status"] == "deleted", "sample_id"].tolist()
    train = manifest.loc[manifest["split"] == "train", "sample_id"].tolist()
    suite = gx.ExpectationSuite(name="deletion_request")
    suite.add_expectation(gxe.ExpectTableRowCountToBeBetween(min_value=1))
    if "sample_id" in columns:
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column="sample_id"))
        suite.add_expectation(gxe.ExpectColumnValuesToBeUnique(column="sample_id"))
        suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="sample_id",
                                                              value_set=manifest["sample_id"].tolist(),
                                                              meta={"rule": "must exist in the manifest"}))
        suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="sample_id", value_set=train,
                                                              meta={"rule": "must name a training sample (validation rows are never trained on)"}))
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeInSet(column="sample_id",
                                                                 value_set=deleted or ["\x00none"],
                                                                 meta={"rule": "must not be deleted already (see the ledger)"}))
    if "request_id" in columns:
        suite.add_expectation(gxe.ExpectColumnValuesToBeUnique(column="request_id"))
    if "requested_at" in columns:
        suite.add_expectation(gxe.ExpectColumnValuesToBeDateutilParseable(column="requested_at"))
    return suite


MESSAGES = {
    "expect_table_row_count_to_be_between": "the batch is empty",
    "expect_column_values_to_not_be_null": "has empty values",
    "expect_column_values_to_be_unique": "has duplicate values",
    "expect_column_values_to_be_dateutil_parseable": "has timestamps that do not parse",
}


def _failure_lines(result) -> list[str]:
    lines = []
    for vr in result.run_results.values():
        for r in vr.results:
            if r.success:
                continue
            cfg = r.expectation_config
            col, rule = cfg.kwargs.get("column"), (cfg.meta or {}).get("rule")
            what = rule if rule else MESSAGES.get(cfg.type, cfg.type)
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
    import great_expectations as gx  # 3-5 s import: only inside the task
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


def foreign_ids_hint(df: pd.DataFrame, manifest: pd.DataFrame) -> list[str]:
    """When NO requested id is in the manifest, the file most likely belongs to another dataset (e.g. a sample
    request left in the inbox after switching datasets): say so, with what this dataset's ids look like."""
    if "sample_id" not in df.columns or not len(df) or not len(manifest):
        return []
    requested = df["sample_id"].dropna().astype(str)
    if not len(requested) or requested.isin(manifest["sample_id"]).any():
        return []
    return [f"hint: none of the {len(requested)} sample id(s) (e.g. {requested.iloc[0]!r}) is in this dataset's "
            f"manifest, whose ids look like {manifest['sample_id'].iloc[:2].tolist()}; the file is probably for "
            f"another dataset: move it out of the inbox"]


def check_request_frame(df: pd.DataFrame, manifest: pd.DataFrame) -> RequestCheck:
    problems = [f"schema: {p}" for p in structural_problems(df)]
    gx_problems, gx_result = gx_check(df, manifest) if len(df.columns) else ([], {})
    return RequestCheck(problems=problems + gx_problems + foreign_ids_hint(df, manifest), gx_result=gx_result)


@task(name="validate-request")
def validate_request(path: str, df: pd.DataFrame, manifest: pd.DataFrame) -> RequestCheck:
    """pandera + GX; raises RequestValidationError listing every problem (after the caller logged it)."""
    return check_request_frame(df, manifest)


def raise_if_invalid(path: str, check: RequestCheck) -> None:
    if not check.ok:
        raise RequestValidationError(path, check.problems)


class RequestConflict(RequestValidationError):
    """A request_id already in the ledger arrives with other content: never skipped, never applied."""


@dataclass
class FileCheck:
    """The one validation of a request file, shared by `unlearn validate` and the deletion flow.

    status: "ok" (pending rows to apply), "already_processed" (every request is in the ledger with the same
    content: nothing to do) or "invalid" (problems, one line each)."""

    path: str
    status: str
    problems: list[str]
    pending: pd.DataFrame | None = None
    skipped: int = 0
    n_rows: int = 0
    gx_result: dict = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)

    def error(self) -> RequestValidationError:
        cls = RequestConflict if self.conflicts else RequestValidationError
        return cls(self.path, self.problems)

    def summary(self) -> str:
        if self.status == "already_processed":
            return (f"{self.path}: all {self.n_rows} request(s) were processed before with the same content; "
                    f"nothing to do")
        if self.status == "ok":
            extra = f" ({self.skipped} already processed with the same content)" if self.skipped else ""
            return f"{self.path}: valid ({len(self.pending)} request(s) to apply{extra})"
        return str(self.error())


def check_request_file(path, manifest: pd.DataFrame, ledger: list[dict], *, hash_ids: bool = False,
                       salt: str = "", max_clock_skew_seconds: float = 300.0, now=None,
                       tombstoned: set[str] | None = None) -> FileCheck:
    """Read and validate one request file against the ledger and the live manifest; every problem is
    collected (structure and types, ledger conflicts, manifest via GX, mixed objectives, future times)."""
    path = str(path)
    try:
        df = read_request_file(path)
    except RequestValidationError as e:
        return FileCheck(path, "invalid", e.problems)
    key = (lambda s: hash_sample_id(s, salt)) if hash_ids else (lambda s: s)
    same, conflicts = ledger_matches(df, ledger, key)
    n = len(df)
    if n and len(same) == n and not conflicts:
        return FileCheck(path, "already_processed", [], df.iloc[0:0], skipped=n, n_rows=n)
    keep = [i for i in range(n) if i not in set(same)]
    pending = df.iloc[keep].reset_index(drop=True)
    pending.attrs = dict(df.attrs)
    check = check_request_frame(pending, manifest) if len(pending) or not n else RequestCheck([])
    problems = [*conflicts, *check.problems]
    problems += [f"schema: {p}" for p in objective_problems(pending)]
    problems += [f"schema: {p}" for p in future_problems(pending, max_clock_skew_seconds, now)]
    if tombstoned and "sample_id" in pending.columns:
        erased = [s for s in pending["sample_id"].dropna().astype(str) if key(s) in tombstoned]
        if erased:
            problems.append(f"sample id(s) {erased[:10]} were erased by an earlier batch (see the ledger); "
                            f"nothing is left to forget")
    problems = list(dict.fromkeys(problems))
    return FileCheck(path, "invalid" if problems else "ok", problems, pending, skipped=len(same), n_rows=n,
                     gx_result=check.gx_result, conflicts=conflicts)


__all__ = ["RequestCheck", "FileCheck", "RequestConflict", "check_request_file", "check_request_frame",
           "validate_request", "raise_if_invalid", "REQUIRED_COLUMNS"]
