"""Prefect artifacts: what a reviewer sees on the flow run's page in the Prefect UI."""

from __future__ import annotations

import re


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-") or "artifact"


def markdown_artifact(markdown: str, key: str, description: str) -> str | None:
    """Publish `markdown` on the current flow (or task) run; outside a run (a direct call) it does nothing and
    returns None. Returns the artifact id."""
    from prefect.artifacts import create_markdown_artifact

    if not _in_run():
        return None
    return str(create_markdown_artifact(markdown=markdown, key=artifact_key(key), description=description))


def table_artifact(rows: list[dict], key: str, description: str) -> str | None:
    """Publish a table (one dict per row) on the current flow or task run; outside a run it does nothing."""
    from prefect.artifacts import create_table_artifact

    if not _in_run():
        return None
    return str(create_table_artifact(table=rows, key=artifact_key(key), description=description))


def run_logger():
    """Prefect's run logger inside a flow or task run (the lines reach the terminal and the Prefect UI);
    the package logger outside one (a direct call in a test or a script)."""
    import logging

    from prefect import get_run_logger

    return get_run_logger() if _in_run() else logging.getLogger("unlearning")


def _in_run() -> bool:
    """Whether this code runs inside a Prefect flow or task run (a direct call in a test or script does not)."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None
