"""A copy of this project in another folder, for the benches that run it there (bench/session_overhead.py,
bench/request_validation.py) and for the tests (tests/helpers.py imports these): the project's files with the
sample request file in the inbox (`copy_project`), or a minimal project of params.yaml with small, fast params
(`make_project`). Here, not in tests/: a bench imports no test code."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

FAST = {
    "base": {"progress": False},
    "train": {"epochs": 12, "model": {"hidden": [16]}},
    "validation": {"n_oracles": 4, "n_shadows": 4, "chunk_size": 2},
}


def sample_requests() -> list:
    """The repository's sample request file(s), as committed. `make run` moves an applied file from
    requests/inbox/ to requests/processed/ and, with ids hashed by default, rewrites that copy with salted hashes;
    so a sample no longer in the inbox is read from git's index: the tests do not depend on whether the main job
    ran in this checkout."""
    listed = subprocess.run(["git", "ls-files", "--", "requests/inbox/*.csv"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split()
    found = []
    for rel in listed:
        f = ROOT / rel
        if not f.exists():
            f = _committed_copy(rel)
        found.append(f)
    return found


_COMMITTED: dict[str, Path] = {}


def _committed_copy(rel: str) -> Path:
    """A file's content in git's index, written once per test session into a temporary folder of its own."""
    if rel not in _COMMITTED:
        folder = Path(tempfile.mkdtemp(prefix="sample-requests-"))
        data = subprocess.run(["git", "show", f":{rel}"], cwd=ROOT, check=True, capture_output=True).stdout
        (folder / Path(rel).name).write_bytes(data)
        _COMMITTED[rel] = folder / Path(rel).name
    return _COMMITTED[rel]


# What a run of the checkout writes without git ignoring it (docs/getting-started.md, "dvc.lock"; the tombstones are
# kept on purpose): a copy must not inherit them, or the fresh project would start with the sample's ids erased.
RUN_OUTPUTS = {"dvc.lock", "data/tombstones.txt"}


def tracked_files() -> list[str]:
    """The project's files: tracked ones and new ones not yet committed, without the outputs of a run here."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    return [f for f in out if not f.startswith(".helpers/") and f not in RUN_OUTPUTS]


def copy_project(dest: Path) -> None:
    """A copy of the project's files in `dest` with the sample request file in its inbox (the e2e tests, and
    bench/session_overhead.py)."""
    for rel in tracked_files():
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / "requests" / "inbox").mkdir(parents=True, exist_ok=True)
    for f in sample_requests():  # as committed, also after `make run` moved (and hashed) the sample
        shutil.copy2(f, dest / "requests" / "inbox" / f.name)


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
