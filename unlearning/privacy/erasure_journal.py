"""The erasure journal: an erase that a kill stopped halfway is resumed, never reported done (docs/design.md §3,
docs/erasure.md "The journal").

An erase purges the stores one after the other (tasks/stores/: the prepared store, the state manifest, the
models, the registry, the DVC cache...). Killed between two of them, the stores disagree: the prepared store no
longer holds the rows the state manifest still lists, and nothing said so (the erasure report is written at the
end). So an erase first writes its journal, then records each store the moment its purge returns, and removes
the journal only once the report is written and committed:

- `start`: the batch, its run, the ids to tombstone (keyed: the ledger's form) and the salted digests of its
  rows, taken while the prepared store still holds them (a resumed erase cannot take them again);
- `record`: one store finished (its purge records), or left pending (a store a running `dvc repro` holds);
- `close`: the erase is done; the journal file goes.

A journal file that exists is an unfinished erase: every entry point resumes it before anything else
(tasks/erasure.py `resume_unfinished`), `unlearn status` names it and exits non-zero, `unlearn verify-erasure`
says which command finishes it. Each write is a temp file renamed over the journal (unlearning/io.py), so a
kill leaves the previous record or the new one, never half of one.

The journal lives beside the state folder (`.state.erasure-journal/<batch>.json`), outside every DVC output:
closing it must not change what `dvc status` compares. It holds no plain id under `deletion.hash_sample_ids`
(keys and digests are salted, as in the ledger and the erasure reports). Stdlib and unlearning.io only:
`unlearn status` reads it without torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from unlearning.io import StateCorrupt, atomic_write_json, read_json_file

VERSION = 1


def journal_dir(state_dir: str | Path) -> Path:
    """`.<state>.erasure-journal/` beside the state folder: outside the deletion stage's DVC output (state/), git-
    ignored with the other `.<state>.*` files (the lock, an interrupted swap)."""
    state_dir = Path(state_dir)
    return state_dir.with_name(f".{state_dir.name}.erasure-journal")


def _file_name(batch_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in batch_id) + ".json"


@dataclass
class Journal:
    """One batch's erase in progress. `stores`: store name -> its purge records, for every store finished;
    `pending`: store name -> what waits for `unlearn erase` (a store a running `dvc repro` holds)."""

    path: Path
    batch_id: str
    started_at: str
    run_id: str | None = None
    champion_version: str | None = None
    keys: list[str] = field(default_factory=list)  # the ids to tombstone, as the ledger writes them
    n_ids: int = 0
    row_digests: list[str] = field(default_factory=list)  # salted digests of the batch's rows (the report's)
    stores: dict[str, list[dict]] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # every store's name, in the order the erase purges them
    passes: int = 1  # how many times an erase took this journal up (1: never interrupted)

    @classmethod
    def start(cls, folder: Path, batch_id: str, *, run_id: str | None, champion_version, keys: list[str],
              n_ids: int, row_digests: list[str], order: list[str]) -> "Journal":
        journal = cls(Path(folder) / _file_name(batch_id), batch_id, datetime.now(timezone.utc).isoformat(),
                      run_id, None if champion_version is None else str(champion_version), sorted(keys), n_ids,
                      sorted(row_digests), order=list(order))
        journal.write()
        return journal

    @classmethod
    def read(cls, path: Path) -> "Journal":
        data = read_json_file(path)
        if not isinstance(data, dict) or data.get("version") != VERSION or "batch_id" not in data:
            raise StateCorrupt(f"{path}: not an erasure journal of this version; it records an erase that did not "
                               f"finish: run `unlearn erase` with the version that wrote it, or remove the file and "
                               f"run `unlearn erase` (every tombstoned row is erased again)")
        data.pop("version")
        return cls(path=Path(path), **data)

    def write(self) -> None:
        record = {k: v for k, v in asdict(self).items() if k != "path"}
        atomic_write_json(self.path, {"version": VERSION, **record})

    def finished(self, store: str) -> bool:
        return store in self.stores and store not in self.pending

    def record(self, store: str, purged: list[dict], pending: str = "") -> None:
        """`store`'s purge returned: its records, and what it left pending (""). Written at once (atomically)."""
        self.stores[store] = purged
        if pending:
            self.pending[store] = pending
        else:
            self.pending.pop(store, None)
        self.write()

    def resumed(self) -> None:
        self.passes += 1
        self.write()

    def close(self) -> None:
        self.path.unlink(missing_ok=True)

    def describe(self) -> str:
        """One line for `unlearn status` and verify-erasure: which stores are done, which are not."""
        order = self.order or list(self.stores)
        done = [s for s in order if self.finished(s)]
        left = [s for s in order if not self.finished(s)]
        held = ", ".join(self.pending.values())
        waiting = f"; pending (a store `dvc repro` held) for `unlearn erase`: {held}" if self.pending else ""
        return (f"batch {self.batch_id}: erase started {self.started_at[:19]}Z, {len(done)} of {len(order)} store(s) "
                f"done" + (f" (next: {left[0]}; not done: {', '.join(left)})" if left else "") + waiting)


def unfinished(state_dir: str | Path) -> list[Journal]:
    """The erases started and not finished, oldest first ([] when none)."""
    folder = journal_dir(state_dir)
    if not folder.is_dir():
        return []
    journals = [Journal.read(p) for p in sorted(folder.glob("*.json"))]
    return sorted(journals, key=lambda j: j.started_at)


def has_unfinished(state_dir: str | Path) -> bool:
    """Whether a journal exists (without reading it: the `make run` session asks before `dvc repro`)."""
    folder = journal_dir(state_dir)
    return folder.is_dir() and any(folder.glob("*.json"))
