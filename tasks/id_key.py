"""How a stage keys sample ids without taking the whole params (docs/erasure.md, "The key"): whether ids are
hashed (deletion.hash_sample_ids) and the project's id key, asked for only when an id is keyed:
unlearning/salt.py id_salt makes the key when the project has none yet, so building this record has no effect
of its own, and a stage that keys no id never makes one."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from unlearning.config import Params
from unlearning.ledger import hash_sample_id
from unlearning.salt import id_salt


@dataclass(frozen=True)
class IdKey:
    hashed: bool  # deletion.hash_sample_ids
    salt: Callable[[], str]  # the key text ('' when ids are not hashed), read (or made) on each call

    # Builds the slice record from the whole params, its one job: the key lives beside params.yaml (base.paths
    # salt, state_dir, tombstones) and id_salt takes the whole params by design (tests/unit/test_import_rules.py).
    @classmethod
    def of(cls, params: Params) -> "IdKey":
        return cls(params.deletion.hash_sample_ids, partial(id_salt, params))

    def ledger_keys(self, sample_ids) -> list[str]:
        """Sample ids as the ledger keys them (the project's one id hash, unlearning/salt.py)."""
        salt = self.salt()
        return [hash_sample_id(str(s), salt) if self.hashed else str(s) for s in sample_ids]
