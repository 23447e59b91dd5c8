"""Deletion requests: reading CSV/Parquet files and the structural pandera schema (DESIGN §3).

A request file has `request_id, sample_id, requested_at, reason` and optionally `objective`. The
structural checks live here (pure core); the checks against the manifest (ids exist, not already
deleted) run as a Great Expectations suite at the task boundary. Problems are collected, never
raised one at a time, so a bad file is reported in full.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors

OBJECTIVES = ("retrain_equivalence", "suppression")
REQUIRED_COLUMNS = ("request_id", "sample_id", "requested_at", "reason")
REQUEST_SUFFIXES = (".csv", ".parquet")

REQUEST_SCHEMA = pa.DataFrameSchema(
    {
        "request_id": pa.Column(str, pa.Check.str_length(min_value=1), nullable=False, unique=True),
        "sample_id": pa.Column(str, pa.Check.str_length(min_value=1), nullable=False, unique=True),
        "requested_at": pa.Column(str, pa.Check(lambda s: parse_timestamps(s).notna(), element_wise=False,
                                                name="parses_as_timestamp"), nullable=False),
        "reason": pa.Column(str, pa.Check.str_length(min_value=1), nullable=False),
        "objective": pa.Column(str, pa.Check.isin(list(OBJECTIVES)), required=False, nullable=True),
    },
    strict=True, name="deletion_request",
)


def parse_timestamps(values: pd.Series) -> pd.Series:
    """ISO 8601 timestamps (date only, or with time and zone) to UTC; unparseable values become NaT."""
    return pd.to_datetime(values, format="ISO8601", utc=True, errors="coerce")


class RequestValidationError(ValueError):
    """A deletion request file failed validation; `problems` lists every failure."""

    def __init__(self, path: str | Path, problems: list[str]):
        self.path, self.problems = str(path), list(problems)
        body = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"deletion request {self.path} rejected ({len(self.problems)} problem(s); nothing was "
                         f"changed):\n{body}")


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_request_file(path: str | Path) -> pd.DataFrame:
    """Read a request file with every column as text (ids stay strings; types are checked later)."""
    path = Path(path)
    if path.suffix not in REQUEST_SUFFIXES:
        raise RequestValidationError(path, [f"file type '{path.suffix}' is not supported; use .csv or .parquet"])
    try:
        if path.suffix == ".csv":
            df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
        else:
            df = pd.read_parquet(path).astype("string").astype(object)
    except Exception as e:  # unreadable file: report it like any other problem
        raise RequestValidationError(path, [f"cannot read file: {e}"]) from None
    return df.where(df.notna(), None)


def _row_hint(index) -> str:
    # Rows are reported as the file's data-row number (1 = first row after the header).
    return f"row {int(index) + 1}" if isinstance(index, (int, float)) and index == index else "file"


def structural_problems(df: pd.DataFrame) -> list[str]:
    """Every schema failure of a request frame, one readable line each."""
    problems = []
    if len(df) == 0:
        problems.append("the batch is empty: a request file needs at least one row")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        problems.append(f"missing column(s) {missing}; required columns: {list(REQUIRED_COLUMNS)}")
    if len(df) == 0:
        return problems
    try:
        REQUEST_SCHEMA.validate(df, lazy=True)
    except SchemaErrors as err:
        for _, fc in err.failure_cases.iterrows():
            column, check, value = fc.get("column"), str(fc.get("check")), fc.get("failure_case")
            if check.startswith("column_in_dataframe"):
                continue  # already reported as a missing column, with the full list
            if check.startswith("column_in_schema"):
                problems.append(f"unexpected column '{value}'; allowed columns: {list(REQUEST_SCHEMA.columns)}")
            elif check.startswith("field_uniqueness") or check == "unique":
                problems.append(f"column '{column}': value {value!r} appears more than once; ids must be unique")
            elif check == "parses_as_timestamp":
                problems.append(f"column 'requested_at' {_row_hint(fc.get('index'))}: value {value!r} is not a valid "
                                f"timestamp (use ISO 8601, e.g. 2026-11-30T09:00:00Z)")
            elif "dtype" in check:
                problems.append(f"column '{column}': has the wrong type ({check}); values must be text")
            elif check == "not_nullable":
                problems.append(f"column '{column}' {_row_hint(fc.get('index'))}: value is empty; every row needs a {column}")
            elif check.startswith("isin"):
                problems.append(f"column '{column}' {_row_hint(fc.get('index'))}: value {value!r} is not allowed; "
                                f"allowed: {list(OBJECTIVES)}")
            else:
                problems.append(f"column '{column}' {_row_hint(fc.get('index'))}: value {value!r} failed {check}")
    return list(dict.fromkeys(problems))  # de-duplicate, keep order


def coerce_requests(df: pd.DataFrame) -> pd.DataFrame:
    """The validated, typed frame (call after `structural_problems` returned nothing)."""
    out = REQUEST_SCHEMA.validate(df).copy()
    out["requested_at"] = parse_timestamps(out["requested_at"])
    return out


def batch_objective(df: pd.DataFrame, default: str) -> str:
    """The batch's objective: the file's `objective` column (one value for the whole file) or the default."""
    if "objective" not in df.columns:
        return default
    values = sorted({v for v in df["objective"] if v})
    if len(values) > 1:
        raise RequestValidationError("<batch>", [f"column 'objective' mixes {values}; one batch has one objective"])
    return values[0] if values else default


def list_request_files(inbox: str | Path) -> list[Path]:
    """Request files in the inbox, in processing order (by file name: use sortable, timestamped names)."""
    inbox = Path(inbox)
    if not inbox.is_dir():
        return []
    return sorted(p for p in inbox.iterdir() if p.is_file() and p.suffix in REQUEST_SUFFIXES
                  and not p.name.startswith("."))
