"""Sharded, isolated, sliced, aggregated training (SISA) and its exact unlearning (docs/sharding.md;
Bourtoule et al., "Machine Unlearning", IEEE S&P 2021).

The training rows are split into S shards; one constituent (a member of the user's module, seed = its shard's
seed) trains on each shard, in R slices: slice r trains on the shard's slices 0..r for `slice_epochs` epochs with
a fresh optimizer and a data-order stream of its own, and its result is checkpointed. The deployed model is the
aggregate of the constituents (`Aggregate`: mean of the softmax, its mean weighted by each shard's rows, or a
majority vote).

A deletion retrains only the shards that held a forgotten row, each from the checkpoint before the first slice
that held one, over the later slices without the forgotten rows (`affected`, `sisa_unlearn`). Slices before it
never saw a forgotten row, the optimizer restarts at every slice and the order of slice r is a function of the
constituent's seed and r alone, so the result IS the constituent trained from scratch on the retain rows with
the same seeds and slice order (`train_from_scratch`; the audit, tests/unit/test_sharding.py).

Shard assignment (`assign_shards`): the key (the sample id for `random`, the group for `group`, any column of the
user's table for `column`) decides: every value of the key lands in exactly one shard, so a request for one
customer touches one shard. Values are placed largest first on the least-loaded shard, ties broken by a seeded
permutation: deterministic from the seed, and shard sizes differ by at most the largest value's row count.
Within a shard, rows are ordered by value (seeded), so a value's rows sit in as few slices as their count allows.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from unlearning.privacy.ledger import HASH_PREFIX, hash_sample_id
from unlearning.models import Ensemble, TrainRecipe, build_model, fit
from unlearning.models.aggregate import AGGREGATES, Aggregate  # noqa: F401  (the deployed model; re-exported)
from unlearning.progress import Progress

BY = ("random", "group", "column")


# --- the plan: which shard and slice each row is in ------------------------------------------------------------
def assign_shards(keys: Sequence, shards: int, seed: int) -> np.ndarray:
    """Shard index per row [n] (int64): every distinct key in exactly one shard, balanced by row count
    (largest value first onto the least-loaded shard; ties of count and load broken by a seeded permutation)."""
    if shards < 1:
        raise ValueError(f"shards = {shards} must be >= 1")
    keys = np.asarray(keys, dtype=object).astype(str)
    values, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    rng = np.random.default_rng([int(seed), 0x5A4D])
    tiebreak = rng.permutation(len(values))
    order = np.lexsort((tiebreak, -counts))  # largest value first, seeded among equal counts
    load = np.zeros(shards, dtype=np.int64)
    shard_of_value = np.empty(len(values), dtype=np.int64)
    for v in order:
        k = int(np.argmin(load))  # the least-loaded shard (lowest index among equals)
        shard_of_value[v] = k
        load[k] += counts[v]
    return shard_of_value[inverse.reshape(-1)]


def shard_skew(sizes: Sequence[int]) -> float:
    """The largest shard's rows over the mean shard's (1.0: even; S: every row in one shard)."""
    sizes = np.asarray(list(sizes), dtype=float)
    return float(sizes.max() / max(sizes.mean(), 1e-12)) if sizes.size else 1.0


def skew_warning(sizes: Sequence[int], max_skew: float, keys: Sequence | None = None,
                 key_name: str = "the key") -> str | None:
    """One line when the largest shard holds more than `max_skew` (train.sharding.max_skew) times the mean
    shard's rows, else None. A deletion in the largest shard then costs about its share of a retrain, not 1/S
    (`cost_in_retrains`), and the aggregate's vote is spread unevenly. `keys` (per row): names the largest value,
    which no placement can split (every value sits in one shard)."""
    sizes = [int(n) for n in sizes]
    skew = shard_skew(sizes)
    if skew <= max_skew:
        return None
    total = max(sum(sizes), 1)
    line = (f"train.sharding: skewed shards ({max(sizes)} rows down to {min(sizes)}; the largest is {skew:.1f} x the "
            f"mean of {total / len(sizes):.0f}, over train.sharding.max_skew = {max_skew:g}): deleting a row of the "
            f"largest shard retrains about {max(sizes) / total:.2g} of a full retrain, not 1/{len(sizes)}")
    if keys is not None and len(keys):
        values, counts = np.unique(np.asarray(keys, dtype=object).astype(str), return_counts=True)
        top = int(np.argmax(counts))
        if counts[top] * len(sizes) > total:  # one value alone holds more than a shard's fair share
            line += (f"; {key_name} value {str(values[top])!r} alone holds {int(counts[top])} rows "
                     f"({counts[top] / total:.0%}), and a value never splits across shards")
    return line + ("; shard by a finer key (a person or customer column), by: random, or fewer shards; "
                   "train.sharding.aggregate: size_weighted weighs each constituent by its rows")


def assign_slices(keys: Sequence, shard: np.ndarray, shards: int, slices: int, seed: int) -> np.ndarray:
    """Slice index per row [n]: within each shard, rows ordered by their key's seeded rank (a row order seeded
    too), then cut into `slices` parts of equal row count (sizes differ by at most one)."""
    if slices < 1:
        raise ValueError(f"slices = {slices} must be >= 1")
    keys = np.asarray(keys, dtype=object).astype(str)
    _, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.reshape(-1)
    rng = np.random.default_rng([int(seed), 0x511CE])
    value_rank = rng.permutation(int(inverse.max()) + 1 if len(inverse) else 0)
    row_noise = rng.permutation(len(keys))
    out = np.empty(len(keys), dtype=np.int64)
    for k in range(shards):
        rows = np.flatnonzero(shard == k)
        rows = rows[np.lexsort((row_noise[rows], value_rank[inverse[rows]]))]
        for r, part in enumerate(np.array_split(rows, slices)):
            out[part] = r
    return out


@dataclass(frozen=True)
class ShardPlan:
    """Where every training row sits: `sample_ids` [n], `shard` [n], `slice` [n]; the seeds of the constituents
    (one per shard) and the per-slice epochs. Made once, at training time, and stored beside the checkpoints: a
    deletion keeps every remaining row where it was."""

    sample_ids: np.ndarray
    shard: np.ndarray
    slice: np.ndarray
    shards: int
    slices: int
    seeds: tuple[int, ...]
    slice_epochs: int
    by: str = "random"
    column: str | None = None

    def rows_of(self, k: int, through: int, keep: np.ndarray | None = None) -> np.ndarray:
        """Row positions of shard k in slices 0..through (ascending), of those `keep` marks (all by default)."""
        m = (self.shard == k) & (self.slice <= through)
        if keep is not None:
            m &= keep
        return np.flatnonzero(m)

    def sizes(self, keep: np.ndarray | None = None) -> list[int]:
        """Rows per shard (of those `keep` marks)."""
        s = self.shard if keep is None else self.shard[keep]
        return np.bincount(s, minlength=self.shards).astype(int).tolist()

    def to_dict(self) -> dict:
        return {"shards": self.shards, "slices": self.slices, "seeds": list(self.seeds),
                "slice_epochs": self.slice_epochs, "by": self.by, "column": self.column,
                "sample_ids": [str(s) for s in self.sample_ids], "shard": self.shard.tolist(),
                "slice": self.slice.tolist()}

    def without(self, drop: np.ndarray) -> "ShardPlan":
        """The plan of the rows left after dropping `drop` (positions or a mask): every other row keeps its shard
        and slice, so the constituents a deletion retrains are the ones a from-scratch run on them trains."""
        keep = np.ones(len(self.shard), dtype=bool)
        keep[drop] = False
        return ShardPlan(self.sample_ids[keep], self.shard[keep], self.slice[keep], self.shards, self.slices,
                         self.seeds, self.slice_epochs, self.by, self.column)

    def positions(self, keys: Sequence[str]) -> np.ndarray:
        """Positions of the rows whose stored id (`sample_ids`, an id hash in a stored plan) is in `keys`."""
        return np.flatnonzero(np.isin(self.sample_ids.astype(str), np.asarray(list(keys), dtype=str)))

    @staticmethod
    def from_dict(d: dict) -> "ShardPlan":
        return ShardPlan(np.asarray(d["sample_ids"], dtype=object), np.asarray(d["shard"], dtype=np.int64),
                         np.asarray(d["slice"], dtype=np.int64), int(d["shards"]), int(d["slices"]),
                         tuple(int(s) for s in d["seeds"]), int(d["slice_epochs"]), d.get("by", "random"),
                         d.get("column"))


def slice_epochs(epochs: int, slices: int) -> int:
    """Epochs per slice: slice r trains on r + 1 of R slices, so 2e / (R + 1) epochs per slice spend as many
    gradient evaluations as e epochs over the whole shard (the paper's rule, §V-B); e when R = 1."""
    return int(epochs) if slices == 1 else max(1, round(2 * int(epochs) / (slices + 1)))


def make_plan(sample_ids: Sequence, keys: Sequence, shards: int, slices: int, seed: int, epochs: int,
              member_seeds: Sequence[int], by: str = "random", column: str | None = None) -> ShardPlan:
    """The plan for rows `sample_ids` with shard keys `keys` (the ids themselves for `by: random`)."""
    if by not in BY:
        raise ValueError(f"sharding by = {by!r} is not known; allowed: {list(BY)}")
    if len(member_seeds) != shards:
        raise ValueError(f"{len(member_seeds)} member seeds for {shards} shards")
    n_values = len(set(map(str, keys)))
    if n_values < shards:
        raise ValueError(f"train.sharding.shards = {shards} but the key{f' column {column!r}' if column else ''} has "
                         f"only {n_values} distinct value(s): every value sits in one shard, so at most {n_values} "
                         f"shards can hold rows; lower train.sharding.shards")
    shard = assign_shards(keys, shards, seed)
    return ShardPlan(np.asarray(list(sample_ids), dtype=object), shard,
                     assign_slices(keys, shard, shards, slices, seed),
                     shards, slices, tuple(int(s) for s in member_seeds), slice_epochs(epochs, slices), by, column)


def affected(plan: ShardPlan, forget: np.ndarray) -> dict[int, int]:
    """{shard: first affected slice} for the rows `forget` marks (a bool mask [n] or row positions)."""
    mask = np.zeros(len(plan.shard), dtype=bool)
    mask[forget] = True
    out: dict[int, int] = {}
    for k, r in zip(plan.shard[mask].tolist(), plan.slice[mask].tolist()):
        out[k] = min(r, out.get(k, r))
    return dict(sorted(out.items()))


def id_hash(sample_id, salt: str | None = "") -> str:
    """A stored plan names its rows by the id keyed with the project's salt (`hash_sample_id`, the ledger's form
    and the ensemble cache's `.ids.json`): the plan says which rows trained which checkpoint without listing ids,
    and hashing every id of the dataset does not undo it. `salt` None: the short unsalted hash an older version
    wrote (`legacy_plan`), read only to keep such a plan working until it is trained again."""
    if salt is None:
        return hashlib.sha256(str(sample_id).encode()).hexdigest()[:16]
    return hash_sample_id(str(sample_id), salt)


def legacy_plan(plan: "ShardPlan") -> bool:
    """Whether a stored plan names its rows by an older version's unsalted hashes (no `sha256:` prefix)."""
    return len(plan.sample_ids) > 0 and not str(plan.sample_ids[0]).startswith(HASH_PREFIX)


def rows_digest(ids: Sequence[str]) -> str:
    """Order-independent digest of the rows a checkpoint trained on (their stored ids)."""
    h = hashlib.sha256()
    for s in sorted(map(str, ids)):
        h.update(s.encode() + b"\n")
    return h.hexdigest()


def order_seed(member_seed: int, r: int) -> int:
    """The data-order stream of slice r of a constituent: a function of its seed and r only."""
    return (int(member_seed) * 1_000_033 + 7919 * (int(r) + 1)) % (2**62)


def cost_in_retrains(plan: ShardPlan, first: dict[int, int], keep: np.ndarray | None = None) -> float:
    """Gradient evaluations of retraining shards {k: from slice} over those of training every shard from scratch
    (the sharded original's own full retrain): the sisa step's cost in units of one retrain."""
    def evals(k: int, r0: int) -> int:
        return sum(len(plan.rows_of(k, r, keep)) for r in range(r0, plan.slices))

    total = sum(evals(k, 0) for k in range(plan.shards))
    return sum(evals(k, r0) for k, r0 in first.items()) / max(total, 1)


# --- training in slices -----------------------------------------------------------------------------------------
@dataclass
class SliceReport:
    """What a sliced training run did: (shard, slice) pairs trained, gradient evaluations, seconds."""

    trained: list[tuple[int, int]] = field(default_factory=list)
    gradient_evals: int = 0
    seconds: float = 0.0


Checkpoint = Callable[[int, int, Ensemble], None]  # (shard, slice, one-member ensemble) -> stored


def train_slices(start: dict[int, Ensemble], first: dict[int, int], plan: ShardPlan, X: torch.Tensor,
                 y: torch.Tensor, recipe: TrainRecipe, keep: np.ndarray | None = None,
                 checkpoint: Checkpoint | None = None, progress: bool | str = False,
                 vectorize: bool = False) -> tuple[dict[int, Ensemble], SliceReport]:
    """Train shards {k: from slice r0} from their `start` members (one-member ensembles: the checkpoint after
    slice r0 - 1, or a fresh member) through the last slice, on the rows `keep` marks (X, y: every plan row,
    in plan order); `checkpoint(k, r, member)` stores each (shard, slice) (the member trains on in place
    afterwards: copy it to keep it in memory). Returns the final members and the report.

    `vectorize`: shards with the same row count at a slice train together in one vectorized pass (per-member
    rows). Faster, but a member's float rounding then depends on which shards share its pass (measured: 3e-8
    after 2 epochs, 1.2e-4 after 30 on Fashion-MNIST), so a constituent's bits would depend on other shards' row
    counts, forgotten rows included: exact only to float summation order. The default trains each shard in a
    pass of its own: every constituent is bit-equal to a from-scratch run on its own rows."""
    report = SliceReport()
    t0 = time.perf_counter()
    members = {k: m for k, m in start.items()}
    # one progress line for the whole run, naming the shard and slice in training (not one bar per (shard, slice):
    # 10 shards x 4 slices printed 80 lines that did not say which shard); the inner training loop ticks it
    total = sum(plan.slices - r0 for r0 in first.values())
    label = progress if isinstance(progress, str) else f"train {plan.shards} shards"
    with Progress(total, label, unit="shard-slices", enabled=progress) as bar:
        for r in range(plan.slices):
            todo = [k for k in sorted(first) if first[k] <= r]
            rows = {k: plan.rows_of(k, r, keep) for k in todo}
            groups = ([[k for k in todo if len(rows[k]) == n] for n in sorted({len(v) for v in rows.values()})]
                      if vectorize else [[k] for k in todo])
            for group in groups:
                bar.stage(f"{_shard_names(group, plan.shards)}, slice {r + 1}/{plan.slices}")
                size = len(rows[group[0]])
                model = Ensemble.concat([members[k] for k in group]) if len(group) > 1 else members[group[0]]
                if size:
                    fit(model, X, y, recipe, epochs=plan.slice_epochs,
                        rows=torch.as_tensor(np.stack([rows[k] for k in group]), dtype=torch.long),
                        order_seeds=[order_seed(plan.seeds[k], r) for k in group])
                    report.gradient_evals += plan.slice_epochs * size * len(group)
                for i, k in enumerate(group):
                    members[k] = model.select(i) if len(group) > 1 else model
                    report.trained.append((k, r))
                    if checkpoint is not None:
                        checkpoint(k, r, members[k])
                bar.update(len(group))
    report.trained.sort()
    report.seconds = time.perf_counter() - t0
    return members, report


def _shard_names(group: list[int], shards: int) -> str:
    """The shards of one training pass, numbered from 1 as a person counts them: "shard 3/10", "shards 1, 4/10"."""
    return (f"shard {group[0] + 1}/{shards}" if len(group) == 1
            else f"shards {', '.join(str(k + 1) for k in group)}/{shards}")


def train_from_scratch(spec: dict, plan: ShardPlan, X: torch.Tensor, y: torch.Tensor, recipe: TrainRecipe,
                       keep: np.ndarray | None = None, checkpoint: Checkpoint | None = None,
                       dtype: torch.dtype = torch.float32, device: str = "cpu", search_paths: Sequence[str] = (),
                       progress: bool | str = False, vectorize: bool = False) -> tuple[Ensemble, SliceReport]:
    """Every constituent from its seed, every slice, on the rows `keep` marks: the sharded original, and the
    exactness audit's reference. Returns the constituents as one S-member ensemble (member k = shard k)."""
    fresh = build_model(spec, list(plan.seeds), search_paths=search_paths).to(device=device, dtype=dtype)
    start = {k: fresh.select(k) for k in range(plan.shards)}
    members, report = train_slices(start, {k: 0 for k in range(plan.shards)}, plan, X, y, recipe, keep,
                                   checkpoint, progress, vectorize)
    return Ensemble.concat([members[k] for k in range(plan.shards)]), report


def sisa_unlearn(constituents: Ensemble, load_checkpoint: Callable[[int, int], Ensemble], plan: ShardPlan,
                 forget: np.ndarray, X: torch.Tensor, y: torch.Tensor, recipe: TrainRecipe,
                 keep: np.ndarray | None = None, checkpoint: Checkpoint | None = None,
                 progress: bool | str = False) -> tuple[Ensemble, SliceReport, dict[int, int]]:
    """Exact unlearning of the rows `forget` marks (positions or a mask over plan rows): each affected shard
    retrains from the checkpoint before its first affected slice (a fresh member for slice 0) over the later
    slices without them; the others are untouched. `keep`: rows still in training before this deletion (rows
    forgotten earlier are out). Returns (constituents, report, {shard: first retrained slice})."""
    drop = np.zeros(len(plan.shard), dtype=bool)
    drop[forget] = True
    keep = (np.ones(len(plan.shard), dtype=bool) if keep is None else np.asarray(keep, dtype=bool)) & ~drop
    first = affected(plan, drop)
    start = {}
    for k, r0 in first.items():
        start[k] = constituents.select(k).fresh() if r0 == 0 else load_checkpoint(k, r0 - 1)
    p = next(constituents.parameters())
    # copies: training goes on in place, and a checkpoint held in memory must stay what it was
    start = {k: m.select(0).to(device=p.device, dtype=p.dtype) for k, m in start.items()}
    members, report = train_slices(start, first, plan, X, y, recipe, keep, checkpoint, progress)
    out = Ensemble.concat([members[k] if k in members else constituents.select(k) for k in range(plan.shards)])
    return out, report, first


# --- the sharded original as the deletion flow holds it -----------------------------------------------------------
@dataclass
class ShardState:
    """Everything `sisa` needs besides the constituents: the plan of the rows still in training (ids as
    `id_hash`), their features and labels in plan order, the checkpoint of every (shard, slice), and the
    aggregation rule. The shell (tasks/sharding.py) reads and writes it; `attach` hangs it on an `Aggregate`."""

    plan: ShardPlan
    X: torch.Tensor
    y: torch.Tensor
    checkpoints: dict[tuple[int, int], Ensemble]
    aggregate: str = "mean_probs"
    salt: str | None = ""  # what the plan's ids are keyed with (`id_hash`); never written to plan.json

    def model(self, constituents: Ensemble) -> Aggregate:
        """The deployed aggregate of `constituents`, empty shards left out, with this state attached."""
        sizes = self.plan.sizes()
        agg = Aggregate(constituents, self.aggregate, [n > 0 for n in sizes], weights=sizes)
        agg.shard_state = self
        return agg

    def checkpoint_digest(self, k: int, r: int) -> str:
        """The rows checkpoint (k, r) trained on: shard k's slices 0..r of this plan."""
        return rows_digest(self.plan.sample_ids[self.plan.rows_of(k, r)].tolist())


class NotSharded(ValueError):
    """Method `sisa` asked of an original that was not trained in shards: bad input, one line with the fix."""


NOT_SHARDED = ("this original is one model, not an aggregate of shards with their checkpoints (a shard_state): "
               "set train.sharding.shards (docs/sharding.md) and run the train stage again (`dvc repro train`)")


def unlearn_state(model: Aggregate, forget_keys: Sequence[str], recipe: TrainRecipe,
                  progress: bool | str = False) -> tuple[Aggregate, SliceReport, dict[int, int]]:
    """`sisa` on a deployed aggregate with its `shard_state`: the forgotten rows (named by `id_hash`) leave the
    plan; each affected shard retrains from the checkpoint before its first affected slice and its later
    checkpoints are replaced. Returns (the new aggregate with its new state, the report, {shard: first slice})."""
    st = getattr(model, "shard_state", None)
    if st is None:
        raise NotSharded(NOT_SHARDED)
    forget = st.plan.positions(forget_keys)
    missing = len(set(map(str, forget_keys))) - len(forget)
    if missing:
        raise ValueError(f"sisa: {missing} of {len(set(map(str, forget_keys)))} forgotten row(s) are not in the "
                         f"shard plan (forgotten already, or not training rows of this original)")
    checkpoints = dict(st.checkpoints)

    def keep(k: int, r: int, member: Ensemble) -> None:
        checkpoints[(k, r)] = member.select(0).cpu()

    new, report, first = sisa_unlearn(model.constituents, lambda k, r: st.checkpoints[(k, r)], st.plan, forget,
                                      st.X, st.y, recipe, checkpoint=keep, progress=progress)
    keep_rows = np.ones(len(st.plan.shard), dtype=bool)
    keep_rows[forget] = False
    idx = torch.as_tensor(np.flatnonzero(keep_rows))
    after = ShardState(st.plan.without(forget), st.X.index_select(0, idx), st.y.index_select(0, idx), checkpoints,
                       st.aggregate, st.salt)
    return after.model(new), report, first
