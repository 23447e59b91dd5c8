"""Stages with nothing to do end before any Prefect import or server (docs/operations.md, "One session").

A DVC stage's command (`python -m flows.warm run flows.<stage>`) asks `nothing_to_do` first. Two stages often
have nothing to do, and used to start a Prefect server (plus the imports: 10-70 s on a loaded machine) only to
say so:
- `qualify` under `validation.mode: per_batch` (the default): it writes the "skipped" record, its DVC out;
- `deletion` with an empty inbox and a state that already holds batches: the stage re-runs when a dependency
  changed (a new release of the code, a forced `dvc repro -f`), and only rewrites its DVC metrics.

Everything else (a first run that builds the state, a state that holds no batch and may have to follow a
retrained original, a half-finished swap to settle, an erase a kill stopped, any file in the inbox) goes the full
way, unchanged.
Stdlib, pydantic and the pure core only: no prefect, mlflow, torch or great_expectations.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

KEEP_FILES = (".gitkeep", ".keep")  # unlearning.requests.KEEP_FILES (that module imports pandas)


def _params_path(argv: list[str], positional: bool) -> str | None:
    """`--params X` from a stage's argv; None when the argv asks for more (a request file, an unknown flag)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--params", default="params.yaml")
    if positional:
        p.add_argument("request", nargs="?")
    try:
        a, rest = p.parse_known_args(argv)
    except SystemExit:
        return None
    if rest or getattr(a, "request", None):
        return None
    return a.params


def _load(params_path: str):
    """The validated params, or None on any problem: the stage itself then reports it, as before."""
    from unlearning.config import ConfigError, load_params

    try:
        return load_params(params_path)
    except (ConfigError, OSError):
        return None


def qualify_skipped(params_path: str) -> bool:
    """Under per_batch: write the qualify stage's "skipped" record (flows/qualify.py writes the same one)."""
    params = _load(params_path)
    if params is None or params.validation.mode == "qualified":
        return False
    import json
    import os

    from unlearning.certificate.qualification import Qualification

    q = params.qualify
    record = Qualification(list(q.methods), list(q.bins), q.confidence, q.interval, float("nan"),
                           skipped="validation.mode is per_batch: every batch is certified on its own; set "
                                   "validation.mode: qualified to qualify the model")
    path = params.path("models_dir") / "qualification.json"  # tasks.qualification.qualification_path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record.to_dict(), indent=1, default=float))
    os.replace(tmp, path)
    print(f"qualify: skipped ({record.skipped}); wrote {path} (no Prefect server started)", flush=True)
    return True


def _settled_state_with_batches(state_dir: Path) -> bool:
    """state/ is complete, holds at least one batch (so it never follows a retrained original), and no swap
    is left to settle (no `.state.previous` or staging folder beside it)."""
    from unlearning.io import StateCorrupt
    from unlearning.privacy.ledger import read_ledger

    if not ((state_dir / "model.pt").is_file() and (state_dir / "champion.json").is_file()):
        return False
    if state_dir.parent.is_dir() and any(_unsettled(p, state_dir) for p in state_dir.parent.iterdir()):
        return False
    try:
        return bool(read_ledger(state_dir / "ledger.jsonl"))
    except (StateCorrupt, OSError, ValueError):
        return False


def _unsettled(entry: Path, state_dir: Path) -> bool:
    """Whether `entry` beside the state folder is work left: a swap to settle (`.state.previous`, a staging
    folder) or an erase a kill stopped (its journal, unlearning/privacy/erasure_journal.py). The lock file (it stays
    after every batch) and an empty journal folder (every erase finished) are not."""
    from unlearning.privacy.erasure_journal import journal_dir

    if not entry.name.startswith(f".{state_dir.name}.") or entry.name == f".{state_dir.name}.lock":
        return False
    if entry == journal_dir(state_dir):
        return any(entry.glob("*.json"))
    return True


def _has_entries(folder: Path) -> bool:
    return folder.is_dir() and any(p.name not in KEEP_FILES for p in folder.iterdir())


def deletion_idle(params_path: str) -> bool:
    """An empty inbox and a settled state with batches: rewrite the stage's metrics (DVC outs), nothing else."""
    if _has_entries(Path(params_path).parent / "requests" / "inbox"):  # the default inbox has work: answered
        return False  # before the params' validation (0.3-0.5 s); "False" only ever means the full flow
    params = _load(params_path)
    if params is None:
        return False
    inbox = params.path("inbox")
    if not inbox.is_dir() or _has_entries(inbox):
        return False
    if not _settled_state_with_batches(params.path("state_dir")):
        return False
    from adapters.dvc_metrics import write_deletion_metrics

    write_deletion_metrics(params)
    print(f"no request files in {inbox}; nothing to do (no Prefect server started)", flush=True)
    return True


def nothing_to_do(target: str, argv: list[str]) -> bool:
    """True when the stage `target` had nothing to do and did what it must (its record, its metrics)."""
    if target == "flows.qualify":
        path = _params_path(argv, positional=False)
        return path is not None and qualify_skipped(path)
    if target == "flows.deletion_batch":
        path = _params_path(argv, positional=True)
        return path is not None and deletion_idle(path)
    return False


if __name__ == "__main__":
    sys.exit(0 if nothing_to_do(sys.argv[1], sys.argv[2:]) else 1)
