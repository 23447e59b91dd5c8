"""Inbox entries `dvc repro` cannot hash, moved to requests/rejected/ before DVC looks at the inbox.

DVC 3 decides whether the deletion stage changed by hashing its dependencies BEFORE it runs the stage's
command (dvc/stage `changed_deps`; dvc-data stats every file of a directory dependency, following
symlinks). One dangling symlink in requests/inbox (a dependency of the deletion stage) ends `dvc repro` with
`[Errno 2] No such file or directory` before the flow, whose inbox scan (unlearning/requests.py
`entry_problem`) would reject it, ever starts: every other file waits behind it. So `make run`
(flows/session.py) calls `reject_unhashable` before each `dvc repro` that reaches the deletion stage: such an
entry is moved to requests/rejected/ beside <name>.error.json, as the flow moves any other bad entry, one line
each on the console, and the good files beside it are applied by the stage. A plain `dvc repro` cannot be
helped from inside (its hash runs first): `python -m flows.intake` does the same step by hand
(docs/requests.md).

Stdlib and unlearning.io only (no torch, no pandas): `make run` pays nothing for a clean inbox. `erase_first`, the
other pre-step of `make run`, puts `unlearn erase` first when an erase was stopped halfway.
"""

from __future__ import annotations

import os
import stat
import sys
from datetime import datetime, timezone
from pathlib import Path

from unlearning.io import atomic_write_json, dangling_symlink_problem, move_unique

# the line flows/session.py reads as "a file was not applied, the others go on" (FILES_HELD_LINE)
HELD_LINE = "error: {n} file(s) rejected and moved to requests/rejected/ (see <name>.error.json there)"


def reject(path: Path, params, error: BaseException | str) -> Path:
    """Move an inbox entry to requests/rejected/ beside <name>.error.json (what was wrong, one line each; for a
    gate rejection, each failing check of each candidate in words, with its value and its bound: the
    `failing_checks` tasks.stages.fail set on the error)."""
    failing = list(getattr(error, "failing_checks", None) or [])
    problems = getattr(error, "problems", None) or [str(error), *failing]
    dest = move_unique(path, params.path("rejected"))
    atomic_write_json(dest.with_name(dest.name + ".error.json"), {
        "file": path.name, "rejected_at": datetime.now(timezone.utc).isoformat(),
        "error": type(error).__name__ if isinstance(error, BaseException) else "not a request file",
        "problems": problems, **({"failing_checks": failing} if failing else {}), "nothing_changed": True})
    return dest


def unhashable(entry: Path) -> str | None:
    """Why DVC's hash of the inbox would fail or hang on `entry` (None: it hashes). The flow's `entry_problem`
    refuses these too, with the same words for a dangling symlink; this is only the part DVC stumbles on."""
    try:
        st = entry.stat()  # follows a symlink, as dvc-data does
    except FileNotFoundError:
        if not entry.is_symlink():
            return None  # removed meanwhile
        return dangling_symlink_problem(entry)
    except OSError as e:  # a symlink loop, a name too long
        return f"cannot be read ({e.strerror})"
    if stat.S_ISDIR(st.st_mode):
        return next((f"a directory holding {why.split(' (')[0]} ({p.relative_to(entry)})" for p in entry.rglob("*")
                     if (why := unhashable(p)) and not p.is_dir()), None)
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block DVC's read for ever
        return "not a regular file (a FIFO or a device); a request file is a regular .csv or .parquet file"
    if not os.access(entry, os.R_OK):
        return "not readable (permissions); a request file must be readable by the pipeline"
    return None


def reject_unhashable(params) -> list[tuple[str, str, Path]]:
    """Move every top-level inbox entry DVC cannot hash to requests/rejected/; [(name, why, where)]."""
    inbox = params.path("inbox")
    if not inbox.is_dir():
        return []
    moved = []
    for entry in sorted(inbox.iterdir()):
        why = unhashable(entry)
        if why:
            moved.append((entry.name, why, reject(entry, params, why)))
    return moved


def intake(params_path: str = "params.yaml", out=None) -> int:
    """The pre-step: exit 0 for an inbox DVC can hash, 2 (after moving the rest) when an entry was rejected.
    `out`: where the lines go (None: sys.stdout as it is at the call)."""
    from unlearning.config import load_params

    out = out or sys.stdout

    moved = reject_unhashable(load_params(params_path))
    for name, why, dest in moved:
        print(f"{name}: {why}; moved to {dest} before `dvc repro` hashes the inbox", file=out, flush=True)
    if moved:
        print(HELD_LINE.format(n=len(moved)), file=out, flush=True)
    return 2 if moved else 0


def is_dvc_repro(cmd: list[str]) -> bool:
    """`dvc repro ...` or `python -m dvc repro ...`."""
    words = cmd[2:] if len(cmd) > 2 and cmd[1:3] == ["-m", "dvc"] else cmd
    return bool(words) and os.path.basename(words[0]) == "dvc" and "repro" in words[1:]


def erase_first(commands: list[list[str]], params_path: str = "params.yaml", out=None) -> list[list[str]]:
    """`make run` and `unlearn repro` (flows/session.py): an erase a kill stopped between two stores (its journal,
    unlearning/privacy/erasure_journal.py) is finished by `unlearn erase` BEFORE `dvc repro`. Inside `dvc repro` the
    stores DVC holds cannot be rewritten, and DVC, seeing the prepared store the erase had already rewritten,
    would re-run prepare and retrain the original. The `unlearn erase` of the commands is reused (it carries their
    `--params`); the commands are returned unchanged when nothing is unfinished."""
    if not commands or not is_dvc_repro(commands[0]) or not os.path.exists(params_path):
        return commands
    from unlearning.config import ConfigError, load_params
    from unlearning.privacy.erasure_journal import has_unfinished

    try:
        params = load_params(params_path)
    except ConfigError:
        return commands  # the stage itself says what is wrong, in one line
    if not has_unfinished(params.path("state_dir")):
        return commands
    erase = next((list(c) for c in commands if c[-1:] == ["erase"]), [sys.executable, "-m", "flows.cli", "erase"])
    print(f"an erase was stopped before it finished ({params.path('state_dir').name}'s erasure journal): "
          f"`unlearn erase` finishes it before `dvc repro`", file=out or sys.stdout, flush=True)
    return [erase, *commands]


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml", help="path of params.yaml (default: ./params.yaml)")
    sys.exit(intake(parser.parse_args().params))
