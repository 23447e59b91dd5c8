"""The batch plan: which candidates a batch tries, how each is certified, which reference models it trains,
what that costs in units of one retrain of the user's model, and its peak memory (docs/design.md §4.6).

A batch plans before it trains anything. The planner is a pure function of cheap facts: the ordered candidate
list of the selection rules (unlearning/policy/selection_policy.py), the objective, the config slices, and two measurements of
this model on this device (`Timing`, `Footprint`: a short probe in tasks/planning.py). It returns a `Plan`
whose steps the shell executes in order and whose predictions the batch logs beside the actuals.

How a candidate is certified:
- an exact method (`retrain`) trains ONE model on the retain set. It is exact unlearning by construction, so it
  needs no oracles or shadows; the gate compares its accuracy with the original's (`certificate = "exact"`).
  `validation.audit_retrain` certifies it against oracles as well (`"audit"`).
- under `suppression` every gate check is an absolute bound or relative to the original: no references
  (`"absolute"`).
- an approximate candidate under `retrain_equivalence` gets the sequential certificate
  (unlearning/sequential.py): references in looks (`validation.looks`, then `n_oracles`/`n_shadows`), rejected
  at the first decisive look, accepted only at the last (`"sequential"`).

The policy weighs cost (`deletion.weigh_cost`): accepting an approximate candidate trains at least
n_oracles + n_shadows reference models and runs the method on the original and on the shadows, so when that
costs more than the exact retrain it would replace, the planner goes straight to retrain and says why. A
candidate named explicitly (`deletion.method`) is honoured.

Costs come from timings on this model on this device (unlearning/planning/costs.py): the references from the probe's
cost curve (one step's seconds against members per chunk: linear on a CPU, flat on a GPU until the device
fills, docs/gpu.md), a method from a timed run of it on a sample of the batch's rows. Chunks are sized
by the device's memory: `validation.memory_mb` on a CPU, `validation.gpu_memory_mb` (or the free device memory)
on CUDA.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

from unlearning.config import (
    EXACT_RETRAIN, SHARDED_EXACT, CertificateKind, ConfigError, Gate, Validation, method_traits, sharded_original_problem,
)
from unlearning.planning.costs import CostCurve, DeviceMemory, ProbeConditions, choose_chunk, cuda_chunk_cap, sig
from unlearning.sequential import alpha_schedule, permutations_for

MB = 1024 * 1024
CPU_CHUNK = 32  # members per chunk at most on a CPU when validation.chunk_size is null (auto)


class PlanRefused(ConfigError):
    """The plan cannot run within the declared budget: nothing was trained; the message names the key."""


@dataclass(frozen=True)
class Timing:
    """Seconds of this model on this device (tasks/planning.py measures them with a short probe).

    `curve`: one training step's seconds against members per chunk (unlearning/planning/costs.py); `steps`: optimizer
    steps of one retrain (epochs x minibatches of the retain rows), so a chunk of k members trains in
    curve.seconds(k) x steps. `method_retrains`: a method's run on one model (the original), in retrains,
    timed on this model. Without a curve a member costs `member_seconds` whatever the chunk."""

    retrain_seconds: float  # one plain retrain of one member on the retain rows, the whole recipe
    member_seconds: float  # one reference member trained inside an ensemble chunk, the whole recipe
    eval_seconds_per_member: float  # one member's forward pass over the evaluated rows
    source: str = "probe"
    curve: CostCurve | None = None
    steps: int = 0
    method_retrains: dict[str, float] = field(default_factory=dict)
    conditions: ProbeConditions | None = None  # what the probe ran under and how far its rounds agreed

    @property
    def range(self) -> tuple[float, float]:
        """The plan's range on what the probe prices: its fastest and slowest round against their median, at least
        half the spread the rounds were allowed either way (rounds that agreed within 1 % say little of the load
        the batch will meet)."""
        if self.conditions is None:
            return 1.0, 1.0
        c, half = self.conditions, self.conditions.max_spread / 2
        return min(c.low, 1.0 - half), max(c.high, 1.0 + half)

    @property
    def member_in_retrains(self) -> float:
        """A reference member's cost in units of one retrain (< 1 where members train vectorized)."""
        return self.member_seconds / max(self.retrain_seconds, 1e-9)

    def references_seconds(self, n: int, chunk: int, workers: int = 1) -> float:
        """Seconds to train `n` members of one role in chunks of at most `chunk` on `workers` side by side."""
        if n <= 0:
            return 0.0
        if self.curve is None or self.steps <= 0:
            return n * self.member_seconds / max(workers, 1)
        return sum(self.curve.seconds(k) for k in balanced_chunks(n, chunk, workers)) * self.steps / max(workers, 1)

    def references_retrains(self, n: int, chunk: int) -> float:
        """`n` members' compute in retrains (one worker: the cost, not the wall time)."""
        return self.references_seconds(n, chunk) / max(self.retrain_seconds, 1e-9)

    def vectorized(self, n: int, chunk: int) -> float:
        """What a pass over `n` members costs against one member (1 <= it <= n): a method run on n shadows at
        once, in units of its run on one model."""
        if n <= 0:
            return 0.0
        if self.curve is None:
            return float(n)
        return sum(self.curve.seconds(k) for k in balanced_chunks(n, chunk)) / max(self.curve.seconds(1), 1e-12)

    def lines(self, chunk: int) -> list[str]:
        """Where the costs come from, in words: the curve, its source, the planned chunk."""
        out = []
        if self.curve is not None:
            out += self.curve.lines()
            per = self.curve.seconds(chunk) / max(chunk, 1) / max(self.curve.seconds(1), 1e-12)
            out.append(f"planned chunk {chunk} member(s): a member costs {sig(per)} of a retrain inside it "
                       f"(one retrain {sig(self.retrain_seconds, 3)} s = {self.steps} steps)")
        for m, r in self.method_retrains.items():
            out.append(f"method {m}: {sig(r)} retrain(s) on one model (timed on a sample of the batch's rows)")
        if self.conditions is not None:
            out.append(self.conditions.line())
        return out

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("curve", "conditions")}
        d["curve"] = self.curve.to_dict() if self.curve is not None else None
        d["conditions"] = self.conditions.to_dict() if self.conditions is not None else None
        return d


@dataclass(frozen=True)
class Footprint:
    """Bytes that decide peak memory (tasks/planning.py measures them on one plain member)."""

    n_params: int  # parameters of one member
    activation_floats_per_row: int  # floats every module's output holds for one input row (one member)
    data_bytes: int  # the prepared features held in memory
    baseline_bytes: int  # the process before the batch (interpreter, torch, the stores)
    batch_size: int  # train.batch_size
    n_eval_rows: int  # rows the certificate evaluates
    n_classes: int
    device_member_bytes: int | None = None  # CUDA: one member of a chunk in training, peak allocated (measured)

    def member_training_bytes(self) -> int:
        """One member in training: weights, gradients and two optimizer moments (4 x params), plus the
        activations kept for backward and their gradients (2 x floats per row x batch_size), float32."""
        return 4 * (4 * self.n_params + 2 * self.activation_floats_per_row * self.batch_size)

    def logits_bytes(self, n_members: int) -> int:
        """[n_members, n_eval_rows, C] float32 logits held for the certificate."""
        return 4 * n_members * self.n_eval_rows * self.n_classes


@dataclass(frozen=True)
class Step:
    """One candidate and how it is certified. `looks`: (shadows, oracles) per look; () = no references."""

    method: str
    certificate: CertificateKind  # exact | audit | absolute | sequential | qualified (a str: compares as one)
    looks: tuple[tuple[int, int], ...] = ()
    alphas: tuple[float, ...] = ()
    permutations: tuple[int, ...] = ()
    cost_retrains_reject: float = 0.0  # predicted cost when rejected at the first look
    cost_retrains_accept: float = 1.0  # predicted cost when accepted (all looks)
    why: str = ""

    def __post_init__(self):  # "exact" -> CertificateKind.EXACT; an unknown kind fails here, naming the allowed ones
        try:
            object.__setattr__(self, "certificate", CertificateKind(self.certificate))
        except ValueError:
            raise ValueError(f"Step.certificate = {self.certificate!r}; allowed: "
                             f"{[k.value for k in CertificateKind]}") from None

    @property
    def references(self) -> tuple[int, int]:
        """(shadows, oracles) trained at most."""
        return self.looks[-1] if self.looks else (0, 0)


@dataclass(frozen=True)
class Plan:
    objective: str
    steps: tuple[Step, ...]
    skipped: tuple[tuple[str, str], ...]  # (method, why) the planner dropped
    chunk_size: int  # members trained together (memory and workers decide it)
    eval_members: int  # members evaluated together
    eval_block_rows: int  # rows per evaluation block
    predicted_seconds: dict[str, float]  # per stage, when the timing is known
    predicted_retrains: float  # the batch's predicted cost in retrains, if its first candidate is taken
    peak_bytes: int
    memory_mb: int
    refusal: str | None = None  # why the plan cannot run (names the key to change)
    notes: tuple[str, ...] = field(default_factory=tuple)
    workers: int = 1  # chunks trained side by side (one on a GPU: its chunks share the device)
    cost_model: tuple[str, ...] = ()  # the cost curve, where it came from, the planned chunk (Timing.lines)

    @property
    def methods(self) -> list[str]:
        return [s.method for s in self.steps]

    def models_to_train(self) -> dict[str, int]:
        """Models the plan trains at most: the exact retrain's one model, oracles and shadows (largest look).
        `sisa` trains no full model: the shards holding the rows retrain from a checkpoint, `sisa_share` of a
        full retrain (docs/design.md, sharding)."""
        out = {EXACT_RETRAIN: 0, "oracles": 0, "shadows": 0}
        for s in self.steps:
            if method_traits(s.method).needs_sharded_original:
                out["sisa_share"] = s.cost_retrains_accept
            elif s.certificate == CertificateKind.EXACT:  # an audited retrain is oracle member 0: trained in the oracles' pass
                out[EXACT_RETRAIN] = 1
            shadows, oracles = s.references
            out["oracles"], out["shadows"] = max(out["oracles"], oracles), max(out["shadows"], shadows)
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["models_to_train"] = self.models_to_train()
        d["peak_mb"] = round(self.peak_bytes / MB, 1)
        return d


def certificate_looks(validation: Validation) -> tuple[tuple[int, int], ...]:
    """(shadows, oracles) per look: the interim looks below the final one, then the final one at
    n_shadows/n_oracles."""
    final = (validation.n_shadows, validation.n_oracles)
    return (*((n, n) for n in validation.looks if n < min(final)), final)


def sequential_step(method: str, validation: Validation, gate: Gate, member: float | Callable[[int], float],
                    method_run: Callable[[int], float] | None = None) -> Step:
    """The sequential certificate's step for `method`: its looks, alpha and permutations per look, and its cost
    in retrains. `member`: one reference member's cost in retrains, or a function of the members of one role
    (Timing.references_retrains: chunks cost less than their members on a GPU); `method_run(n)`: the method's
    runs on the original and on n shadows, in retrains (None: not counted). bench/calibration.py judges with
    it too."""
    looks = certificate_looks(validation)
    g = gate.retrain_equivalence
    alphas = alpha_schedule(g.alpha, len(looks) - 1, validation.interim_alpha_share)
    refs = member if callable(member) else (lambda n: n * member)
    run = method_run or (lambda n: 0.0)

    def cost(look: tuple[int, int]) -> float:
        return refs(look[0]) + refs(look[1]) + run(look[0])

    first, last = looks[0], looks[-1]
    return Step(method, CertificateKind.SEQUENTIAL, looks, alphas, tuple(permutations_for(a, g.n_permutations) for a in alphas),
                cost_retrains_reject=cost(first), cost_retrains_accept=cost(last),
                why=f"approximate: references in looks {[o for _, o in looks]} per role, rejected at the first "
                    f"decisive look, accepted only at the last")


def cost_functions(timing: Timing | None, chunk: int, member_in_retrains: float = 1.0
                   ) -> tuple[Callable[[int], float], Callable[[str], Callable[[int], float]]]:
    """(members of one role -> retrains, method -> (shadows -> its runs in retrains)) from the timing; without
    one a member counts `member_in_retrains` and a method's run is not counted."""
    if timing is None:
        return (lambda n: n * member_in_retrains), (lambda method: (lambda n: 0.0))

    def method_run(method: str) -> Callable[[int], float]:
        one = timing.method_retrains.get(method, 0.0)  # the method on one model (the original)
        return lambda n: one * (1.0 + timing.vectorized(n, chunk))  # then on n shadows, vectorized

    return (lambda n: timing.references_retrains(n, chunk)), method_run


def plan_steps(candidates: list[str], objective: str, validation: Validation, gate: Gate, *, weigh_cost: bool,
               explicit: bool, member_in_retrains: float = 1.0, sisa_cost: float | None = None,
               timing: Timing | None = None, chunk: int = CPU_CHUNK,
               ) -> tuple[list[Step], list[tuple[str, str]]]:
    """The steps for the ordered `candidates` (retrain last) and the candidates skipped, with why.

    `member_in_retrains`: one reference member's cost in retrains when there is no `timing` (1 unmeasured);
    `timing`/`chunk`: the measured costs and the planned chunk (references from the cost curve, methods from
    their timed runs). `sisa_cost`: the share of a full retrain `sisa` retrains for this batch
    (unlearning/sharding.py cost_in_retrains); None: the original is not sharded, and `sisa` is skipped with why."""
    refs, method_run = cost_functions(timing, chunk, member_in_retrains)
    # what the exact path this candidate would replace costs: one retrain, or the audited retrain's oracle pass
    audited = validation.audit_retrain and objective == "retrain_equivalence"
    exact_cost = max(1.0, refs(validation.n_oracles)) if audited else 1.0
    steps: list[Step] = []
    skipped: list[tuple[str, str]] = []
    if sisa_cost is not None:  # a sharded original: its exact method alone keeps it sharded; the others see one model
        sharded = [m for m in candidates if method_traits(m).needs_sharded_original]
        others = [m for m in candidates if not method_traits(m).needs_sharded_original]
        if explicit and others and not sharded:
            raise PlanRefused(f"deletion.method = {others[0]!r}: the original is sharded (train.sharding), and only "
                              f"method {SHARDED_EXACT} unlearns it (exactly, for its share of a retrain); set "
                              f"deletion.method: {SHARDED_EXACT} or auto")
        skipped += [(m, f"the original is sharded (train.sharding): {SHARDED_EXACT} unlearns it exactly")
                    for m in others]
        candidates = sharded or [SHARDED_EXACT]
    for method in candidates:
        traits = method_traits(method)
        if traits.needs_sharded_original:  # exact, sharded originals only (e.g. unlearning/methods/sisa.py)
            if sisa_cost is None and explicit:
                raise PlanRefused(sharded_original_problem(method, False))
            if sisa_cost is None:
                skipped.append((method, "the original is one model, not sharded (train.sharding.shards: null)"))
                continue
            steps.append(Step(method, CertificateKind.EXACT, cost_retrains_accept=sisa_cost,
                              why=f"exact by construction: the shards that held the rows retrain from the checkpoint "
                                  f"before their first slice ({sig(sisa_cost, 3)} of a full retrain), checked against "
                                  f"the original's accuracy"))
            break  # nothing after an exact method is ever tried
        if traits.exact:
            steps.append(_audit_step(method, validation, refs) if audited else
                         Step(method, CertificateKind.EXACT, why="exact by construction: one model on the retain "
                                                                 "rows, checked against the original's accuracy"))
            break  # nothing after the exact retrain is ever tried
        if objective == "suppression":
            steps.append(Step(method, CertificateKind.ABSOLUTE, cost_retrains_accept=method_run(method)(0),
                              why="suppression: absolute bounds and the original's accuracy, no references"))
            continue
        step = sequential_step(method, validation, gate, refs, method_run(method))
        if weigh_cost and not explicit and step.cost_retrains_accept > exact_cost:
            n_s, n_o = step.references
            exact = "an exact retrain costs 1" if not audited else f"the audited retrain costs {sig(exact_cost)}"
            skipped.append((method, f"certifying it trains {n_o} oracles and {n_s} shadows and runs it on them "
                                    f"(about {sig(step.cost_retrains_accept)} retrains to accept, "
                                    f"{sig(step.cost_retrains_reject)} to reject at the first look); {exact}: "
                                    f"straight to retrain (deletion.weigh_cost)"))
            continue
        steps.append(step)
    return steps, skipped


def _audit_step(method: str, validation: Validation, refs: Callable[[int], float]) -> Step:
    """The exact retrain certified against oracles: the retrain IS oracle member 0 (same seed, same rows), so it
    trains as one more member of the oracles' pass, and the audit judges it against the other oracles (retrain
    against retrains: no shadows are needed). Its cost is the oracles' pass, on a GPU little more than one
    retrain (docs/gpu.md)."""
    n = validation.n_oracles
    cost = refs(n)
    return Step(method, CertificateKind.AUDIT, ((0, n),), cost_retrains_reject=cost, cost_retrains_accept=cost,
                why=f"exact retrain audited against oracles (validation.audit_retrain): the retrain is oracle member "
                    f"0 and trains in the oracles' pass of {n} members ({sig(cost)} retrains on this device), judged "
                    f"against the other {n - 1}; no shadows")


def balanced_chunks(n: int, cap: int, workers: int = 1) -> list[int]:
    """Chunk sizes for `n` members: at most `cap` each, a multiple of `workers` chunks where n allows, sizes
    differing by at most one, so no worker idles through the last chunk (80 at cap 32 on 2 workers: 4 x 20,
    not 32/32/16)."""
    if n <= 0:
        return []
    workers = max(1, min(workers, n))
    k = workers * math.ceil(n / (workers * max(cap, 1)))
    k = min(k, n)
    base, extra = divmod(n, k)
    return [base + 1] * extra + [base] * (k - extra)


def fit_memory(footprint: Footprint | None, memory_mb: int, chunk_cap: int | None, n_members: int,
               device_memory: DeviceMemory | None = None) -> tuple[int, int, int, int, str | None]:
    """(chunk size, eval members, eval block rows, peak bytes, refusal) under `memory_mb`.

    Peak = baseline + data + the largest of: a training chunk (members x member_training_bytes), the logits the
    certificate holds plus one evaluation block (members x rows x activation floats). On CUDA
    (`device_memory.kind == "cuda"`) the training chunk lives on the device: it is sized from the device's
    budget (validation.gpu_memory_mb, or its free memory) and the measured member footprint, and the host
    budget holds the process, the data and the logits. `chunk_cap` None: no cap besides memory (CPU_CHUNK on
    a CPU). Without a footprint nothing is refused and the configured sizes stand."""
    cuda = device_memory is not None and device_memory.kind == "cuda"
    cap = chunk_cap if chunk_cap is not None else (max(n_members, 1) if cuda else CPU_CHUNK)
    if footprint is None:
        return cap, max(n_members, 1), 8192, 0, None
    budget = memory_mb * MB
    fixed = footprint.baseline_bytes + footprint.data_bytes
    free = budget - fixed
    member = footprint.member_training_bytes()
    if cuda:
        device_member = device_memory.member_bytes or member
        fits, refusal = cuda_chunk_cap(device_memory, footprint.data_bytes, device_member)
        if refusal:
            return 0, 0, 0, footprint.data_bytes + device_member, refusal
        chunk = max(1, min(cap, fits))
        member = 0  # training takes no host memory beyond the data
    elif free < member:
        return 0, 0, 0, fixed + member, (
            f"validation.memory_mb = {memory_mb} cannot hold the batch: the process and data take "
            f"{fixed / MB:.0f} MB and one member in training {member / MB:.0f} MB more; raise validation.memory_mb "
            f"to at least {math.ceil((fixed + member) / MB * 1.1)}, or lower train.batch_size")
    else:
        chunk = max(1, min(cap, free // member))
    logits = footprint.logits_bytes(n_members + 2)  # references + candidate + original
    eval_free = free - logits
    per_row = 4 * max(footprint.activation_floats_per_row, 1)
    if eval_free < per_row * 64:
        return chunk, 0, 0, fixed + logits + per_row * 64, (
            f"validation.memory_mb = {memory_mb} cannot hold the certificate's logits ({logits / MB:.0f} MB for "
            f"{n_members} references on {footprint.n_eval_rows} rows); raise validation.memory_mb to at least "
            f"{math.ceil((fixed + logits) / MB * 1.2)}, or lower validation.n_oracles/n_shadows")
    # members are evaluated in chunks no larger than the training chunks, on row blocks of at most 8192
    eval_members = int(max(1, min(n_members or 1, chunk, eval_free // (per_row * 1024))))
    block = int(max(64, min(8192, eval_free // (per_row * eval_members))))
    peak = fixed + max(chunk * member, logits + eval_members * block * per_row)
    return int(chunk), eval_members, block, int(peak), None


def plan_batch(candidates: list[str], objective: str, validation: Validation, gate: Gate, *, weigh_cost: bool,
               explicit: bool, timing: Timing | None = None, footprint: Footprint | None = None,
               diagnostics_seconds: float = 0.0, workers: int = 1, sisa_cost: float | None = None,
               device_memory: DeviceMemory | None = None) -> Plan:
    """The batch's plan (module docstring). `timing`/`footprint` None: predictions and the memory check are
    left out (said in the notes). `sisa_cost`: see `plan_steps`. `device_memory`: the CUDA device's budget
    (None: a CPU, validation.memory_mb alone). On CUDA the chunks share one device: `workers` is 1 there."""
    cuda = device_memory is not None and device_memory.kind == "cuda"
    workers = 1 if cuda else max(1, workers)
    n_role = max(validation.n_oracles, validation.n_shadows)
    # the chunk: the largest the memory allows for the certificate's references, unless, on a GPU, the cost
    # curve says a smaller one trains them faster (unlearning/planning/costs.py choose_chunk: a curve that steps up where
    # the device fills). On a CPU the largest stands: each chunk also costs a task and a cache entry, which the
    # curve does not see, and a noisy probe must not split the references into many small chunks.
    cap, *_ = fit_memory(footprint, validation.memory_mb, validation.chunk_size, n_role, device_memory)
    curve = timing.curve if timing is not None and cuda else None
    chunk = choose_chunk(curve, n_role, max(cap, 1), workers, balanced_chunks)
    member = timing.member_in_retrains if timing is not None else 1.0
    steps, skipped = plan_steps(candidates, objective, validation, gate, weigh_cost=weigh_cost, explicit=explicit,
                                member_in_retrains=member, sisa_cost=sisa_cost, timing=timing, chunk=chunk)
    n_refs = max((sum(s.references) for s in steps), default=0)
    fitted, eval_members, block, peak, refusal = fit_memory(footprint, validation.memory_mb, chunk, n_refs,
                                                           device_memory)
    chunk = min(chunk, fitted) if fitted else chunk
    notes = []
    if timing is None:
        notes.append("no timing probe: costs are in retrains with a reference member counted as one retrain")
    if footprint is None:
        notes.append("no memory footprint: the memory budget was not checked")
    if cuda:
        notes.append(f"chunks sized by the device's memory ({device_memory.key}: "
                     f"{device_memory.budget_bytes / MB:.0f} MB), one chunk at a time on the device")
    first = steps[0] if steps else None
    seconds = predicted_seconds(first, timing, diagnostics_seconds, workers, chunk)
    retrains = 0.0 if first is None else first.cost_retrains_accept  # an exact step: 1, or sisa's share
    if timing is not None:
        retrains += diagnostics_seconds / max(timing.retrain_seconds, 1e-9)
    cost_model = tuple(timing.lines(chunk)) if timing is not None else ()
    return Plan(objective, tuple(steps), tuple(skipped), chunk, eval_members, block, seconds, retrains, peak,
                validation.memory_mb, refusal, tuple(notes), workers, cost_model)


def predicted_seconds(step: Step | None, timing: Timing | None, diagnostics_seconds: float,
                      workers: int, chunk: int = CPU_CHUNK) -> dict[str, float]:
    """Seconds per stage if `step` (the first candidate) is taken: diagnostics, references, unlearn, certify."""
    if timing is None or step is None:
        return {}
    shadows, oracles = step.references
    refs = timing.references_seconds(shadows, chunk, workers) + timing.references_seconds(oracles, chunk, workers)
    if step.certificate == CertificateKind.EXACT:
        unlearn = timing.retrain_seconds * step.cost_retrains_accept
    else:  # the method on the original and on the shadows (vectorized), from its timed run
        unlearn = timing.retrain_seconds * timing.method_retrains.get(step.method, 0.0) * (
            1.0 + timing.vectorized(shadows, chunk))
    certify = (shadows + oracles + 2) * timing.eval_seconds_per_member
    return {"diagnostics": round(diagnostics_seconds, 3), "references": round(refs, 3),
            "unlearn": round(unlearn, 3), "certify": round(certify, 3),
            "total": round(diagnostics_seconds + refs + unlearn + certify, 3)}


def plan_lines(plan: Plan) -> list[str]:
    """The plan in words, one line each (the console, `unlearn plan`, the batch's Prefect artifact)."""
    lines = [f"objective {plan.objective}; candidates in order: {', '.join(plan.methods) or '(none)'}"]
    for s in plan.steps:
        refs = (f"; references per look (shadows, oracles) {list(s.looks)}, alpha per look "
                f"{[round(a, 5) for a in s.alphas]}" if s.looks else "; no reference models")
        lines.append(f"- {s.method}: {s.certificate} ({s.why}){refs}; cost {sig(s.cost_retrains_accept)} retrains "
                     f"to accept" + (f", {sig(s.cost_retrains_reject)} to reject" if s.certificate == CertificateKind.SEQUENTIAL
                                     else ""))
    for method, why in plan.skipped:
        lines.append(f"- skipped {method}: {why}")
    m = plan.models_to_train()
    sisa = (f"the shards holding the rows, from their checkpoints ({sig(m['sisa_share'], 3)} of a full retrain)"
            if "sisa_share" in m else f"{m[EXACT_RETRAIN]} retrain")
    lines.append(f"models it trains at most: {sisa}, {m['oracles']} oracles, {m['shadows']} shadows "
                 f"(in chunks of {plan.chunk_size}, {plan.workers} at a time)")
    lines += list(plan.cost_model)
    if plan.predicted_seconds:
        lines.append("predicted seconds: " + ", ".join(f"{k} {sig(v, 3)}" for k, v in plan.predicted_seconds.items())
                     + f" (about {sig(plan.predicted_retrains)} retrains)")
    if plan.peak_bytes:
        lines.append(f"predicted peak memory {plan.peak_bytes / MB:.0f} MB of validation.memory_mb = {plan.memory_mb}")
    lines += [f"note: {n}" for n in plan.notes]
    if plan.refusal:
        lines.append(f"refused: {plan.refusal}")
    return lines
