"""The core batch path on one device with no servers: plan, references, candidate, sequential certificate,
acceptance (docs/gpu.md, docs/design.md §4.6).

Nothing here imports Prefect, MLflow or DVC (the device machine has none of them): it calls the pure core as the
stages do. Per point (Fashion-MNIST at --rows training rows x one model, the default recipe of params.yaml):
- train the original on D;
- probe the cost curve (unlearning/planning/probe.py) and plan each path (unlearning/planning/plan.py), which predicts its seconds;
- `exact`: one retrain on R (seed: oracle member 0), judged against the original's accuracy;
- `do_nothing`: do_nothing certified sequentially against N shadows and N oracles (looks of params.yaml),
  accepted or rejected;
- `audited_retrain`: the exact retrain trained as oracle member 0 in the oracles' pass, judged against the others.
Each path reports its actual seconds, the plan's predicted seconds, and its cost in retrains (its seconds over
the exact path's training of one model on R, measured in the same process). Writes JSON and, with --docs, the
table in docs/gpu.md between `<!-- bench:gpu_batch:begin -->` and `<!-- bench:gpu_batch:end -->`, naming the
device. `--small`: the digits at a few hundred rows, tiny models, N = 6 (seconds on a CPU; the fast test tier).

Usage: python bench/gpu_batch.py [--points mlp,cnn,resnet] [--rows 60000] [--n 80] [--resnet-epochs 1]
                                 [--device auto] [--fashion-dir DIR] [--out bench/results/gpu_batch.json]
                                 [--docs] [--small]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from unlearning.certificate.acceptance import measure_logits, outcome_from_logits, reference_free_outcome  # noqa: E402
from unlearning.batch.rows import BatchRows, batch_rows, sampled_for_certificate, unlearn_context  # noqa: E402
from unlearning.config import load_params  # noqa: E402
from unlearning.planning.costs import DeviceMemory, method_retrains, sig  # noqa: E402
from unlearning.data import load_dataset  # noqa: E402
from unlearning.data.store import initial_state_manifest, load_prepared, write_prepared  # noqa: E402
from unlearning.devices import resolve_device  # noqa: E402
from unlearning.methods import run_method  # noqa: E402
from unlearning.models import Ensemble, build_model, fit, predict_logits  # noqa: E402
from unlearning.models.training import recipe_from  # noqa: E402
from unlearning.models.zoo import spec_from  # noqa: E402
from unlearning.batch.partition import partition_by_group  # noqa: E402
from unlearning.planning.plan import Footprint, Step, Timing, balanced_chunks, plan_batch, predicted_seconds  # noqa: E402
from unlearning.planning.probe import StepTimer, activation_floats_per_row, curve_within_memory  # noqa: E402
from unlearning.seeds import method_seed, reference_seeds, role_seeds  # noqa: E402
from unlearning.sequential import Criterion, run_looks  # noqa: E402

BEGIN, END = "<!-- bench:gpu_batch:begin -->", "<!-- bench:gpu_batch:end -->"
MB = 2**20
SMALL = {"prepare": {"dataset": "digits", "max_train": 400, "max_val": 100},
         "train": {"epochs": 2, "model": {"hidden": [8], "channels": [4, 8], "widths": [4, 8], "blocks": 1}},
         "validation": {"n_oracles": 6, "n_shadows": 6, "looks": [3], "certificate_rows": 100},
         "gate": {"retrain_equivalence": {"n_permutations": 99, "alpha": 0.05}}}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn, *a, **kw):
    """(fn's result, its seconds), synchronized on CUDA."""
    sync(device)
    t = time.perf_counter()
    out = fn(*a, **kw)
    sync(device)
    return out, time.perf_counter() - t


def point_params(arch: str, args):
    """params.yaml's defaults with the point's dataset, model and references (--small: SMALL on top)."""
    from unlearning.config import deep_merge

    over = {"prepare": {"dataset": "fashion_mnist", "max_train": args.rows, "fashion_mnist_dir": args.fashion_dir},
            "train": {"model": {"arch": arch}},
            "validation": {"n_oracles": args.n, "n_shadows": args.n}}
    if arch == "resnet" and args.resnet_epochs:
        over["train"]["epochs"] = args.resnet_epochs
    if args.small:
        over = deep_merge(over, SMALL)
        over["prepare"].pop("fashion_mnist_dir", None)
    return load_params(ROOT / "params.yaml", over)


def prepare(params, folder: Path):
    p = params.prepare
    ds = load_dataset(p.dataset, seed=params.base.seed, val_fraction=p.val_fraction,
                      fashion_mnist_dir=p.fashion_mnist_dir, max_train=p.max_train, max_val=p.max_val,
                      targets=p.targets)
    write_prepared(ds, folder)
    return load_prepared(folder)


def forget_rows(prepared, n: int, seed: int) -> BatchRows:
    """A random forget set of n training rows; the retain set partitioned by group (as the batch's default)."""
    manifest = initial_state_manifest(prepared.manifest)
    train = np.flatnonzero((manifest["split"] == "train").to_numpy())
    ids = manifest["sample_id"].to_numpy()
    forget = np.sort(np.random.default_rng(seed).choice(train, n, replace=False))
    retain = np.setdiff1d(train, forget)
    groups = manifest["group"].to_numpy() if "group" in manifest.columns else prepared.label
    table = partition_by_group(ids[retain], groups[retain], groups[forget])
    return batch_rows(prepared, manifest, ids[forget].tolist(), table)


class Point:
    """One (data, model) point: its data on the device once, its recipe, seeds and plan inputs."""

    def __init__(self, params, prepared, rows: BatchRows, device: torch.device):
        self.params, self.prepared, self.rows, self.device = params, prepared, rows, device
        self.spec = spec_from(params.train.model, prepared.in_shape, prepared.n_classes)
        self.recipe = recipe_from(params.train)
        X = prepared.tensor().to(device)  # every row, once (a writable float32 copy of the memory map)
        y = torch.as_tensor(np.asarray(prepared.label), dtype=torch.long).to(device)
        self.X, self.y = X, y
        idx = {k: torch.as_tensor(v, device=device) for k, v in
               (("before", rows.before), ("retain", rows.retain))}
        self.D = (X[idx["before"]], y[idx["before"]])
        self.R = (X[idx["retain"]], y[idx["retain"]])
        self.sampled = sampled_for_certificate(rows, params.validation.certificate_rows, params.base.seed)
        eval_rows, _ = self.sampled.eval_rows()
        self.X_eval = X[torch.as_tensor(eval_rows, device=device)]
        v = params.validation
        self.shadow_seeds, self.oracle_seeds = reference_seeds(params.base.seed, 0, v.n_shadows, v.n_oracles)

    def train(self, seeds: list[int], data) -> tuple[Ensemble, float]:
        model = build_model(self.spec, seeds).to(self.device)
        _, seconds = timed(self.device, fit, model, data[0], data[1], self.recipe)
        return model, seconds

    def train_chunks(self, seeds: list[int], data, chunk: int) -> tuple[list[Ensemble], float]:
        """Members in chunks of at most `chunk` (balanced), one chunk at a time on the device."""
        models, seconds, start = [], 0.0, 0
        for size in balanced_chunks(len(seeds), chunk, 1):
            m, s = self.train(seeds[start:start + size], data)
            models.append(m.cpu())
            seconds += s
            start += size
        return models, seconds

    def logits(self, model: Ensemble) -> torch.Tensor:
        return predict_logits(model.to(self.device), self.X_eval)


def probe_timing(pt: Point, methods: list[str], original: Ensemble, mem: DeviceMemory | None
                 ) -> tuple[Timing, Footprint]:
    """The cost curve on a sample of R (as tasks/planning.py probes), do_nothing's timed run, the footprint."""
    params, device = pt.params, pt.device
    n = min(len(pt.rows.retain), max(512, 5 * params.train.batch_size))
    pick = torch.as_tensor(np.random.default_rng(params.base.seed).choice(len(pt.rows.retain), n, replace=False),
                           device=device)
    Xs, ys = pt.R[0][pick], pt.R[1][pick]
    timer = StepTimer(lambda k: build_model(pt.spec, role_seeds(params.base.seed, "bench", k)), Xs, ys, pt.recipe,
                      device)
    member = build_model(pt.spec, role_seeds(params.base.seed, "bench", 1)).module_of(0)
    n_params = sum(p.numel() for p in member.parameters())
    footprint = Footprint(n_params=n_params, activation_floats_per_row=activation_floats_per_row(member,
                                                                                                pt.spec["in_shape"]),
                          data_bytes=int(np.asarray(pt.prepared.X).nbytes), baseline_bytes=0,
                          batch_size=params.train.batch_size, n_eval_rows=len(pt.X_eval),
                          n_classes=pt.prepared.n_classes)
    n_role = max(params.validation.n_oracles, params.validation.n_shadows)
    if mem is None:
        planned = min(8, n_role)
    else:
        planned = max(1, min(n_role, (mem.budget_bytes - footprint.data_bytes) // footprint.member_training_bytes()))
    curve = curve_within_memory(timer, planned)
    curve = dataclasses.replace(curve, source=f"probe on {device}: {n} rows, {timer.describe()}")
    _, eval_s = timed(device, predict_logits, timer.model, pt.X_eval)
    steps = params.train.epochs * math.ceil(len(pt.rows.retain) / params.train.batch_size)
    retrain = curve.seconds(1) * steps
    runs = {}
    for m in methods:
        ctx = unlearn_context(original.to(device), pt.prepared, pt.rows, pt.recipe, method_seed(params.base.seed),
                              progress=False)
        _, s = timed(device, run_method, m, ctx, {})
        runs[m] = method_retrains(s, 1, 1, retrain)  # timed on the batch's own rows: nothing to scale
    timing = Timing(retrain_seconds=retrain, member_seconds=retrain, source=curve.source,
                    eval_seconds_per_member=eval_s / timer.model.n_models, curve=curve, steps=steps,
                    method_retrains=runs)
    return timing, dataclasses.replace(footprint, device_member_bytes=timer.member_bytes)


def device_memory(params, device: torch.device) -> DeviceMemory | None:
    if device.type != "cuda":
        return None
    v = params.validation
    if v.gpu_memory_mb is not None:
        return DeviceMemory("cuda", v.gpu_memory_mb * MB, "validation.gpu_memory_mb")
    free, _ = torch.cuda.mem_get_info(device)
    return DeviceMemory("cuda", int(0.9 * free), "validation.gpu_memory_mb (null: 90% of the free device memory)")


def exact_path(pt: Point, original: Ensemble) -> dict:
    """One retrain on R (oracle member 0's seed), judged against the original's accuracy."""
    t0 = time.perf_counter()
    model, train_s = pt.train(pt.oracle_seeds[:1], pt.R)
    eval_rows, splits = pt.sampled.eval_rows()
    out = reference_free_outcome("retrain", model, pt.logits(model), pt.logits(original),
                                 pt.prepared.label[eval_rows], splits,
                                 pt.prepared.manifest["sample_id"].to_numpy()[eval_rows], pt.params.gate,
                                 "retrain_equivalence", {}, t0)
    sync(pt.device)
    return {"seconds": time.perf_counter() - t0, "train_seconds": train_s, "passed": bool(out.verdict.passed)}


def do_nothing_path(pt: Point, original: Ensemble, plan) -> dict:
    """do_nothing certified sequentially through the core's loop (unlearning/sequential.py run_looks): each look
    trains the new shadows (on D) and oracles (on R) in the plan's chunks, runs the method on the new shadows and
    measures (unlearning/certificate/acceptance.py measure_logits); the loop stops at the first decisive look."""
    params, device, step = pt.params, pt.device, plan.steps[0]
    t0 = time.perf_counter()
    seed = params.base.seed
    ctx = unlearn_context(original.to(device), pt.prepared, pt.sampled, pt.recipe, method_seed(seed), progress=False)
    candidate = run_method("do_nothing", ctx, {}).model
    logits = {"candidate": pt.logits(candidate), "original": pt.logits(original)}
    unlearned, oracles, train_s = [], [], [0.0]
    criterion = Criterion.of_step(params.gate, step)

    def measure(spec):
        done_s, done_o = len(unlearned), len(oracles)
        shadows, s1 = pt.train_chunks(pt.shadow_seeds[done_s:spec.n_shadows], pt.D, plan.chunk_size)
        fresh, s2 = pt.train_chunks(pt.oracle_seeds[done_o:spec.n_oracles], pt.R, plan.chunk_size)
        train_s[0] += s1 + s2
        for sh in shadows:
            sctx = unlearn_context(sh.to(device), pt.prepared, pt.sampled, pt.recipe, method_seed(seed), progress=False)
            unlearned.extend(pt.logits(run_method("do_nothing", sctx, {}).model).unbind(0))
        oracles.extend(torch.cat([pt.logits(o) for o in fresh], 0).unbind(0))
        both = torch.stack(oracles, 0)
        logits.update(oracles=both, oracle_ref=both, accuracy_ref=both, shadow_unlearned=torch.stack(unlearned, 0))
        return measure_logits(logits, pt.prepared, pt.sampled, seed, spec.n_shadows, **criterion.measure_args(spec))

    done = run_looks(criterion, measure)
    sync(device)
    looks = [{"n": lk.n_oracles, "decision": lk.decision} for lk in done.looks]
    return {"seconds": time.perf_counter() - t0, "train_seconds": train_s[0], "looks": looks,
            "decision": "accepted" if done.accepted else "rejected",
            "references_at_stop": done.looks[-1].n_shadows + done.looks[-1].n_oracles}


def audited_retrain_path(pt: Point, original: Ensemble, plan) -> dict:
    """The exact retrain as oracle member 0 of the oracles' pass, judged against the other oracles (retrain
    against retrains: tasks/batch.py unlearn_and_validate)."""
    params = pt.params
    t0 = time.perf_counter()
    n = plan.steps[0].references[1]
    chunks, train_s = pt.train_chunks(pt.oracle_seeds[:n], pt.R, plan.chunk_size)
    oracles = Ensemble.concat(chunks)
    candidate = oracles.select(0)
    others = np.random.default_rng(params.base.seed).permutation(np.arange(1, n)).tolist()
    half = len(others) // 2
    logits = {"candidate": pt.logits(candidate), "original": pt.logits(original), "oracles": pt.logits(oracles)}
    logits.update(shadow_unlearned=logits["oracles"][others[:half]], oracle_ref=logits["oracles"][others[half:]],
                  accuracy_ref=logits["oracles"][others])
    out = outcome_from_logits("retrain", candidate, logits, pt.prepared, pt.sampled, params.gate,
                              "retrain_equivalence", params.base.seed, {}, t0, 0)
    sync(pt.device)
    return {"seconds": time.perf_counter() - t0, "train_seconds": train_s, "passed": bool(out.verdict.passed),
            "oracles": n}


def run_point(arch: str, args, device: torch.device, folder: Path) -> dict:
    params = point_params(arch, args)
    prepared = prepare(params, folder / arch)
    rows = forget_rows(prepared, args.forget, params.base.seed)
    pt = Point(params, prepared, rows, device)
    started = time.perf_counter()
    original, original_s = pt.train([params.base.seed], pt.D)
    mem = device_memory(params.validation, device)
    timing, footprint = probe_timing(pt, ["do_nothing"], original, mem)
    plans = {
        "do_nothing": plan_batch(["do_nothing", "retrain"], "retrain_equivalence", params.validation, params.gate,
                                 weigh_cost=False, explicit=True, timing=timing, footprint=footprint,
                                 device_memory=mem),
        "exact": plan_batch(["retrain"], "retrain_equivalence", params.validation, params.gate, weigh_cost=True,
                            explicit=False, timing=timing, footprint=footprint, device_memory=mem),
        "audited_retrain": plan_batch(["retrain"], "retrain_equivalence",
                                      params.validation.model_copy(update={"audit_retrain": True}), params.gate,
                                      weigh_cost=True, explicit=False, timing=timing, footprint=footprint,
                                      device_memory=mem)}
    paths = {"exact": exact_path(pt, original)}
    retrain_s = paths["exact"]["train_seconds"]  # one retrain of this model on R, measured here
    paths["do_nothing"] = do_nothing_path(pt, original, plans["do_nothing"])
    paths["audited_retrain"] = audited_retrain_path(pt, original, plans["audited_retrain"])
    for name, out in paths.items():
        plan = plans[name]
        predicted = plan.predicted_seconds.get("total", 0.0) - plan.predicted_seconds.get("diagnostics", 0.0)
        if name == "do_nothing":  # priced at the look it stopped (accepted: the last)
            step = plan.steps[0]
            taken = Step("do_nothing", "sequential", step.looks[:len(out["looks"])])
            predicted = predicted_seconds(taken, timing, 0.0, plan.workers, plan.chunk_size)["total"]
        out.update(predicted_seconds=round(predicted, 3), cost_retrains=round(out["seconds"] / retrain_s, 3),
                   predicted_over_actual=round(predicted / max(out["seconds"], 1e-9), 3),
                   chunk=plan.chunk_size, predicted_retrains=round(plan.steps[0].cost_retrains_accept, 3))
        out["seconds"] = round(out["seconds"], 3)
    return {"model": arch, "rows": int(len(rows.before)), "forget": int(len(rows.forget)),
            "epochs": params.train.epochs, "n": params.validation.n_oracles, "retrain_seconds": round(retrain_s, 3),
            "original_seconds": round(original_s, 3), "probe": {"curve": timing.curve.to_dict(),
                                                                 "retrain_seconds": round(timing.retrain_seconds, 3)},
            "paths": paths, "wall_seconds": round(time.perf_counter() - started, 2)}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def table(result: dict) -> str:
    """The docs table: one row per point, measured on the device it names."""
    lines = [f"Measured on {result['device']} (torch {result['torch']}, {result['date']}); "
             f"one retrain = the exact path's training of one model on R, in the same run.", "",
             "| model | rows | epochs | one retrain (s) | exact path / retrain | do_nothing at N | certificate / retrain "
             "| audited retrain / retrain | predicted / actual (exact, do_nothing, audit) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in result["points"]:
        e, d, a = (p["paths"][k] for k in ("exact", "do_nothing", "audited_retrain"))
        lines.append(f"| {p['model']} | {p['rows']:,} | {p['epochs']} | {sig(p['retrain_seconds'], 3)} | "
                     f"{sig(e['cost_retrains'], 3)} | {d['decision']} at {d['looks'][-1]['n']} | "
                     f"{sig(d['cost_retrains'], 3)} | {sig(a['cost_retrains'], 3)} | "
                     f"{sig(e['predicted_over_actual'])}, {sig(d['predicted_over_actual'])}, "
                     f"{sig(a['predicted_over_actual'])} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="mlp,cnn,resnet")
    ap.add_argument("--rows", type=int, default=60_000)
    ap.add_argument("--n", type=int, default=80, help="references per role at the final look")
    ap.add_argument("--forget", type=int, default=100, help="random forget rows")
    ap.add_argument("--resnet-epochs", type=int, default=1, help="the ResNet's epochs (the whole bench fits in "
                                                                 "8 minutes of one H200); 0 = the recipe's")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--fashion-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_batch.json"))
    ap.add_argument("--docs", action="store_true", help="write the table into docs/gpu.md")
    ap.add_argument("--small", action="store_true", help="digits, tiny models, N = 6: seconds on a CPU")
    args = ap.parse_args(argv)
    if args.small:
        args.forget = min(args.forget, 10)
        args.n = 6
    device = resolve_device(args.device, "--device")
    result = {"device": device_name(device), "device_type": device.type, "torch": torch.__version__,
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "small": bool(args.small), "points": []}
    with tempfile.TemporaryDirectory(prefix="gpu-batch-") as tmp:
        for arch in [a for a in args.points.split(",") if a]:
            point = run_point(arch, args, device, Path(tmp))
            result["points"].append(point)
            d = point["paths"]
            print(f"{arch}: one retrain {point['retrain_seconds']:.2f} s; exact {d['exact']['cost_retrains']:.2f}x; "
                  f"do_nothing {d['do_nothing']['decision']} {d['do_nothing']['cost_retrains']:.2f}x (predicted "
                  f"{d['do_nothing']['predicted_seconds']:.2f} s, took {d['do_nothing']['seconds']:.2f} s); audited "
                  f"retrain {d['audited_retrain']['cost_retrains']:.2f}x", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    if args.docs:
        from bench.results_io import write_between

        write_between(ROOT / "docs" / "gpu.md", BEGIN, END, table(result))
    return result


if __name__ == "__main__":
    main()
