"""The typed records of the batch path (docs/design.md §1, §4.5): what a stage hands the next, frozen.

- `Selection`: which candidates a batch tries, in order, and why (unlearning/policy/selection_policy.py walks the rules into one,
  unlearning/policy/selection.py completes it with the fallbacks);
- `Licensing`: what the qualification licensed for a batch in qualified mode (tasks/qualification.py);
- `Promotion`: what the promotion (or the record of a file of validation rows only) wrote: the version after and
  before, the champion's history, the ledger entries;
- `BatchResult`: what one request file came to (the deletion flow's result per file), with its exit code.

Their JSON forms (`to_dict`) are what MLflow and the flow's callers store; read-only item access
(`record["candidates"]`) serves the readers of that form.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from unlearning.config import EXACT_RETRAIN, method_traits


class ItemAccess:
    """Read-only `record[key]` and `record.get(key, default)` over a frozen dataclass's fields (a field that is
    None reads as missing for `get`, as the JSON form leaves it out)."""

    def __getitem__(self, key: str):
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default=None):
        value = getattr(self, key, None) if key in self.__dataclass_fields__ else None
        return default if value is None else value

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Selection(ItemAccess):
    """Which candidates a batch tries, in order, and why (docs/design.md §4.5): the record the planner, the
    batch summary and `selection.json` read. `explicit`: deletion.method named one method (the planner honours
    it over the cost rule); `rules_would_have_tried` and `debt_reasons`: set when the retraining debt forced an
    exact retrain (unlearning/policy/history.py force_retrain). Read-only item access (`sel["candidates"]`) serves
    readers of its JSON form."""

    candidates: list[str]
    fired: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    rule_methods: dict[str, str] = field(default_factory=dict)
    nearest_miss: tuple[str, str, str] | None = None
    explicit: bool = False
    rules_would_have_tried: list[str] | None = None
    debt_reasons: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> str:
        """The first candidate: the one the batch tries first."""
        return self.candidates[0]

    @classmethod
    def of(cls, value: "Selection | Mapping") -> "Selection":
        """A Selection from itself or from its JSON form (a dict with its field names)."""
        if isinstance(value, Selection):
            return value
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in dict(value).items() if k in names})

    def forced_retrain(self, reasons: list[str]) -> "Selection":
        """Exact retrain alone, saying why (the rules' own list is kept in `rules_would_have_tried`)."""
        return replace(self, candidates=[EXACT_RETRAIN], fired=[("retraining_debt", "; ".join(reasons))],
                       rules_would_have_tried=list(self.candidates), debt_reasons=list(reasons))


@dataclass(frozen=True)
class Licensing:
    """What the qualification licensed for one batch in qualified mode (docs/certificate.md, "Two modes"):
    the license (unlearning/certificate/qualification.py License: the method, the row, why), the batch's predicted gap in
    noise units and the unit, whether the batch is due an audit, its index, and the qualification it read."""

    license: Any  # unlearning.certificate.qualification.License
    gap_to_noise: float
    noise_unit: float
    audit_due: bool
    batch_index: int
    qualification: str  # the qualification's tag (model version and fingerprint)

    @property
    def method(self) -> str:
        return self.license.method

    def qualifies(self, method: str) -> bool:
        """Whether `method`, promoted, is the licensed approximate method ("qualified, not audited"), not the
        exact retrain the batch fell back to."""
        return method == self.method and not method_traits(method).exact

    def to_dict(self) -> dict:
        """The JSON form MLflow keeps (`qualification_license.json`)."""
        return {"license": self.license.to_dict(), "gap_to_noise": self.gap_to_noise, "noise_unit": self.noise_unit,
                "audit_due": self.audit_due, "batch_index": self.batch_index, "qualification": self.qualification}


@dataclass(frozen=True)
class Promotion(ItemAccess):
    """What a batch's promotion committed (tasks/stages.py promote): the model version now champion and the one
    before it, the champion's history with this batch's point, the ledger entries appended and the debt after."""

    version: str
    before: str | None
    history: list = field(default_factory=list)
    n_entries: int = 0
    debt_after: dict | None = None  # the retraining debt once the batch is in (unlearning/policy/history.py)


@dataclass(frozen=True)
class BatchResult(ItemAccess, Mapping):
    """What one request file came to in the deletion flow: `status` applied | already_processed | rejected |
    held (no candidate passed: requests/held/, for `unlearn approve`) | changed (it changed, or was still open
    for writing: it stays in the inbox). Fields that do not apply are
    None and left out of its mapping and JSON form (`unlearn run --json` prints it)."""

    file: str
    status: str
    batch_id: str | None = None
    method: str | None = None  # the promoted method (None: nothing unlearned)
    model_version: str | None = None
    run_id: str | None = None  # the batch's MLflow run
    metrics: dict | None = None
    erased_not_trained_on: int | None = None  # validation rows the file named: erased, never trained on
    error: str | None = None
    moved_to: str | None = None  # where the file went (processed/, rejected/); None: it stayed
    reason: str | None = None  # why it was not applied: validation | gate | not a request file | ...
    applied_status: str | None = None  # a file that changed while it was processed: what was applied of it
    exit_code: int | None = None  # what it means for the run's exit (flows/errors.py; None: applied, nothing to do)

    def __iter__(self):
        return iter(k for k in self.__dataclass_fields__ if getattr(self, k) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @classmethod
    def of(cls, value: "BatchResult | Mapping") -> "BatchResult":
        """A BatchResult from itself or from its mapping form."""
        if isinstance(value, BatchResult):
            return value
        return cls(**{k: v for k, v in dict(value).items() if k in cls.__dataclass_fields__})

    def but(self, **changes) -> "BatchResult":
        """This result with some fields changed (it is frozen)."""
        return replace(self, **changes)
