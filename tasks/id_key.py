"""How a stage keys sample ids without taking the whole params (docs/erasure.md, "The key"): whether ids are
hashed (deletion.hash_sample_ids) and where the project's key and keyed records are (base.paths: the key file,
the ledger, the tombstones). The key is read when an id is keyed, not when the record is built: reading it
makes one when the project has none yet (unlearning/privacy/salt.py project_salt), so a stage that keys no id never
makes one, as before."""

from __future__ import annotations

from dataclasses import dataclass

from unlearning.config import Params, ProjectPaths
from unlearning.privacy.ledger import hash_sample_id
from unlearning.privacy.salt import project_salt


@dataclass(frozen=True)
class IdKey:
    hashed: bool  # deletion.hash_sample_ids
    paths: ProjectPaths  # base.paths: project_salt reads the key file and the keyed records there, nothing else

    # Builds the slice record from the whole params, its one job.
    @classmethod
    def of(cls, params: Params) -> "IdKey":
        return cls(params.deletion.hash_sample_ids, params.project_paths)

    def salt(self) -> str:
        """The key text ids are keyed with, '' when they are not hashed (no key is read or made): what
        unlearning/privacy/salt.py id_salt returns for the same params."""
        return project_salt(self.paths) if self.hashed else ""

    def ledger_keys(self, sample_ids) -> list[str]:
        """Sample ids as the ledger keys them (the project's one id hash, unlearning/privacy/salt.py)."""
        salt = self.salt()
        return [hash_sample_id(str(s), salt) if self.hashed else str(s) for s in sample_ids]
