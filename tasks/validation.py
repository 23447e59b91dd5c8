"""Deletion-request validation at the task boundary: the Prefect task around adapters/request_check.py.

The checks themselves (pandera owns schema and types; the Great Expectations suite, persisted in the
project's `gx/` folder, owns the rules that need the live manifest or the erasure record, and runs only
when the structure is valid; every problem one line, no defect twice) live in adapters/request_check.py,
which imports no Prefect, so `unlearn validate` answers before any server or heavy import."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import task

from adapters.clock import computes
from adapters.request_check import (  # noqa: F401  (re-exported: the flows import them from here)
    MANIFEST_NOT_CHECKED, REQUIRED_COLUMNS, FileCheck, LiveState, RequestCheck, RequestConflict, check_file_for,
    check_request_file, check_request_frame, create_gx_project, live_state, manifest_problems, raise_if_invalid,
)
from unlearning.requests import RequestValidationError  # noqa: F401


@task(name="validate-request")
@computes
def validate_request(path: str, df: pd.DataFrame, manifest: pd.DataFrame,
                     gx_dir: str | Path | None = None) -> RequestCheck:
    """pandera + GX (the project's persisted suite when `gx_dir` is given: params.path("gx_dir"), with Data
    Docs in `RequestCheck.data_docs`); the caller raises (raise_if_invalid) listing every problem, after it
    logged them."""
    return check_request_frame(df, manifest, gx_dir=gx_dir, run_name=Path(path).name)


__all__ = ["RequestCheck", "FileCheck", "RequestConflict", "check_request_file", "check_request_frame",
           "validate_request", "raise_if_invalid", "REQUIRED_COLUMNS"]
