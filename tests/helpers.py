"""Helpers shared by the tests: a project copy in a temp folder with small, fast params."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

FAST = {
    "base": {"progress": False},
    "train": {"epochs": 12, "model": {"hidden": [16]}},
    "validation": {"n_oracles": 4, "n_shadows": 4, "chunk_size": 2},
}


def sample_requests() -> list:
    """The repository's sample request file(s). `make run` moves an applied file from requests/inbox/ to
    requests/processed/, so after `make run` the sample is found
    there: the tests do not depend on whether the main job ran in this checkout."""
    found = {}
    for folder in ("processed", "inbox"):  # the inbox copy wins when both exist
        for f in sorted((ROOT / "requests" / folder).glob("*.csv")):
            found[f.name] = f
    return list(found.values())


def make_project(dest: Path, overrides: dict | None = None, inbox_files: bool = True) -> Path:
    """A minimal project folder: params.yaml (defaults + FAST + overrides) and the sample inbox."""
    from unlearning.config import deep_merge

    dest.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params = deep_merge(deep_merge(params, FAST), overrides or {})
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (dest / "requests" / "inbox").mkdir(parents=True, exist_ok=True)
    if inbox_files:
        for f in sample_requests():
            shutil.copy(f, dest / "requests" / "inbox" / f.name)
    return dest / "params.yaml"
