"""Tasks of the `report` flow: run one study, write its JSON atomically, log it to MLflow, regenerate the results
section of the evidence page (`report.readme`). The studies themselves are pure (unlearning.studies)."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch
from prefect import task

from adapters.clock import computes
from unlearning.config import Gate, Params, ProjectPaths, Report
from unlearning.io import atomic_write_json, atomic_write_text
from unlearning.studies import readme


# The whole params: the report flow's task, and a study is a whole configuration (unlearning/studies/ take it).
@task(name="study")
@computes
def run_study(params: Params, name: str, device: str) -> dict:
    """S3 / S5 on digits (CPU: small models, the vectorized ensembles), S4 on Fashion-MNIST on `device`."""
    if name == "s3":
        from unlearning.studies.random_sets import run_s3

        return run_s3(params, params.report.s3, progress=None)
    if name == "s5":
        from unlearning.studies.diagnostics_study import run_s5

        return run_s5(params, params.report.s5, progress=None)
    if name == "s4":
        from unlearning.studies.entanglement import run_s4

        return run_s4(params.report.s4, params.prepare.fashion_mnist_dir, device=device, progress=None)
    raise ValueError(f"report.studies: unknown study {name!r}; allowed: s3, s4, s5")


def write_report(paths: ProjectPaths, name: str, result: dict) -> Path:
    path = paths.path("reports_dir") / f"{name}.json"
    atomic_write_json(path, result)
    return path


def figures(name: str, result: dict) -> dict:
    from adapters import plots

    if name == "s3":
        return {"s3_sweep.png": plots.sweep_scatter(result)}
    if name == "s4":
        return {"s4_accuracy.png": plots.entanglement_bars(result)}
    if name == "s5":
        return {"s5_predicted_vs_realised.png": plots.predicted_against_realised(result)}
    return {}


def commit_of(root: Path) -> str:
    """The repository's commit (with `+dirty` when the tree has changes), or 'unknown' outside git."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(paths: ProjectPaths, gate: Gate, device: str) -> dict:
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit_of(paths.root),
            "cores": os.cpu_count(), "threads": torch.get_num_threads(), "device": device,
            "suppression_gate": gate.suppression.model_dump()}


def regenerate_readme(report: Report, paths: ProjectPaths, section: str) -> Path | None:
    """Swap the generated `section` into report.readme (atomic); None when report.readme is null."""
    if report.readme is None:
        return None
    path = Path(report.readme)
    path = path if path.is_absolute() else paths.root / path
    atomic_write_text(path, readme.replace_section(path.read_text(), section, str(path)))
    return path
