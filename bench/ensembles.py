"""Benchmark: the generic ensemble adapter (torch.func vmap over N stacked members) vs a Python loop of the
same module trained one member at a time, and the fused MLP kernel vs the generic path.

One run on digits (sklearn `load_digits`, X / 16, all 1,797 rows), 1 intra-op thread, warm-up excluded,
prints a table and writes bench/results/ensembles.json:
- MLP (hidden [32]) and CNN (channels [8, 16], in_shape [1, 8, 8]): `train_ensemble(kernel="autograd")` on
  N members at once vs N runs of `train_ensemble(kernel="autograd")` with one member each (the loop is timed
  on `--loop-members` members and extrapolated linearly: every member costs the same). Targets on CPU:
  generic >= 5x the loop for the MLP, >= 3x for the CNN.
- MLP: the fused kernel (`kernel="fused"`, what `kernel="auto"` picks) vs the generic path.
- ResNet (widths [4, 8], BatchNorm), no target (`--resnet-epochs 0` skips it).
- member k of the ensemble vs the loop's model k (max and median over the timed members of max |diff| of the
  parameters): the same members up to float32 rounding (a few CNN members amplify it over the epochs; in
  float64 every member agrees to ~1e-15).
Each timing is the best of `--repeats` runs, the generic and the loop runs interleaved (other processes share
the 2 cores; the load average is recorded).
A row that misses its target (or every row with --profile) gets a torch.profiler breakdown of its steps.
Usage: python bench/ensembles.py [--members 100] [--epochs 3] [--loop-members 25] [--resnet-epochs 1] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from results_io import write_json  # noqa: E402  (bench/ is on sys.path when run as a script)

from unlearning.models import build_model, flat_params, train_ensemble

SPECS = {
    "mlp": {"arch": "mlp", "in_shape": [64], "n_classes": 10, "kwargs": {"hidden": [32]}},
    "cnn": {"arch": "cnn", "in_shape": [1, 8, 8], "n_classes": 10, "kwargs": {"channels": [8, 16]}},
    "resnet": {"arch": "resnet", "in_shape": [1, 8, 8], "n_classes": 10, "kwargs": {"widths": [4, 8]}},
}
TARGETS = {"mlp": 5.0, "cnn": 3.0}  # generic vs loop, CPU


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data / 16.0, dtype=torch.float32), torch.tensor(d.target, dtype=torch.long)


def timed_train(spec: dict, seeds: list[int], X, y, kw: dict):
    """(seconds of training only, the trained ensemble): building the members is not timed."""
    model = build_model(spec, seeds)
    t = time.perf_counter()
    train_ensemble(model, X, y, **kw)
    return time.perf_counter() - t, model


def loop_seconds(spec: dict, seeds: list[int], X, y, kw: dict):
    """The Python loop: one `train_ensemble` run per seed with a single member."""
    total, models = 0.0, []
    for s in seeds:
        dt, m = timed_train(spec, [s], X, y, kw)
        total += dt
        models.append(m)
    return total, models


def step_profile(spec: dict, n_models: int, X, y, kw: dict, rows: int = 640, top: int = 10) -> dict[str, float]:
    """Microseconds per training step by op (self CPU time) over one epoch on `rows` rows."""
    from torch.profiler import ProfilerActivity, profile

    model = build_model(spec, list(range(n_models)))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        cost = train_ensemble(model, X[:rows], y[:rows], **{**kw, "epochs": 1})
    per_op = sorted(((e.key, e.self_cpu_time_total / cost.steps) for e in prof.key_averages()), key=lambda kv: -kv[1])
    return {k: round(v, 1) for k, v in per_op[:top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--loop-members", type=int, default=25, help="loop members timed (then extrapolated to N)")
    ap.add_argument("--resnet-epochs", type=int, default=1, help="epochs of the ResNet row (0 = skip it)")
    ap.add_argument("--repeats", type=int, default=2, help="best of this many runs of each timing (interleaved)")
    ap.add_argument("--profile", action="store_true", help="profile every row, not only those missing a target")
    ap.add_argument("--out", default="bench/results/ensembles.json")
    a = ap.parse_args()

    torch.set_num_threads(1)
    X, y = digits()
    n_members = a.members
    seeds = list(range(n_members))
    loop_n = min(a.loop_members, n_members)
    base_kw = dict(batch_size=a.batch_size, lr=0.01, weight_decay=5e-4, threads=1)
    archs = [("mlp", a.epochs), ("cnn", a.epochs)] + ([("resnet", a.resnet_epochs)] if a.resnet_epochs > 0 else [])
    print(f"digits {tuple(X.shape)}, {n_members} members, batch {a.batch_size}, 1 thread; loop timed on {loop_n} "
          f"members and extrapolated", flush=True)

    # Warm-up (first optimizer imports torch._dynamo, first vmap traces, allocator): not timed.
    for arch, _ in archs:
        for kernel in ("autograd", "fused") if arch == "mlp" else ("autograd",):
            for n in (1, 2):
                timed_train(SPECS[arch], seeds[:n], X[:128], y[:128], {**base_kw, "epochs": 1, "kernel": kernel})

    rows, profiles = [], {}
    for arch, epochs in archs:
        spec, kw = SPECS[arch], {**base_kw, "epochs": epochs, "kernel": "autograd"}
        ens_runs, loop_runs = [], []
        for rep in range(a.repeats):
            print(f"[{arch}] run {rep + 1}/{a.repeats}: generic x{n_members} ...", end=" ", flush=True)
            ens_s, ens = timed_train(spec, seeds, X, y, kw)
            print(f"{ens_s:.2f} s; loop x{loop_n} ...", end=" ", flush=True)
            loop_s, loop_models = loop_seconds(spec, seeds[:loop_n], X, y, kw)
            loop_s *= n_members / loop_n
            print(f"{loop_s:.2f} s (extrapolated)", flush=True)
            ens_runs.append(ens_s)
            loop_runs.append(loop_s)
        ens_s, loop_s = min(ens_runs), min(loop_runs)
        diffs = [float((flat_params(ens)[k] - flat_params(m)[0]).abs().max()) for k, m in enumerate(loop_models)]
        diff = max(diffs)
        ratio = loop_s / ens_s
        target = TARGETS.get(arch)
        row = {"arch": arch, "epochs": epochs, "members": n_members, "generic_seconds": ens_s,
               "loop_seconds_extrapolated": loop_s, "loop_members_timed": loop_n, "generic_vs_loop": ratio,
               "target_min": target, "met": None if target is None else ratio >= target,
               "generic_runs_seconds": ens_runs, "loop_runs_seconds_extrapolated": loop_runs,
               "max_param_diff_member_vs_loop": diff, "median_param_diff_member_vs_loop": statistics.median(diffs),
               "params_per_member": int(flat_params(ens).shape[1])}
        if arch == "mlp":
            print(f"[{arch}] fused x{n_members} ...", end=" ", flush=True)
            fused_s, fused = min((timed_train(spec, seeds, X, y, {**kw, "kernel": "fused"}) for _ in range(a.repeats)),
                                 key=lambda r: r[0])
            print(f"{fused_s:.2f} s", flush=True)
            row.update(fused_seconds=fused_s, fused_vs_generic=ens_s / fused_s, fused_vs_loop=loop_s / fused_s,
                       max_param_diff_fused_vs_generic=float((flat_params(fused) - flat_params(ens)).abs().max()))
        rows.append(row)
        if a.profile or row["met"] is False:
            print(f"[{arch}] profiling one epoch on 640 rows ...", flush=True)
            profiles[arch] = {"generic_us_per_step": step_profile(spec, n_members, X, y, kw),
                              "loop_member_us_per_step": step_profile(spec, 1, X, y, kw)}

    print()
    print(f"{'arch':7s} {'epochs':>6s} {'generic s':>10s} {'loop s':>9s} {'generic/loop':>13s} {'target':>8s}  "
          f"{'result':7s} {'max|diff|':>9s} {'median':>8s}")
    for r in rows:
        target = "-" if r["target_min"] is None else f">= {r['target_min']:.0f}x"
        verdict = "-" if r["met"] is None else ("met" if r["met"] else "NOT MET")
        print(f"{r['arch']:7s} {r['epochs']:6d} {r['generic_seconds']:10.2f} {r['loop_seconds_extrapolated']:9.2f} "
              f"{r['generic_vs_loop']:12.1f}x {target:>8s}  {verdict:7s} {r['max_param_diff_member_vs_loop']:9.1e} "
              f"{r['median_param_diff_member_vs_loop']:8.1e}")
    mlp = next(r for r in rows if r["arch"] == "mlp")
    print(f"fused MLP kernel: {mlp['fused_seconds']:.2f} s = {mlp['fused_vs_generic']:.1f}x the generic path "
          f"({mlp['fused_vs_loop']:.0f}x the loop); "
          f"max |fused - generic| = {mlp['max_param_diff_fused_vs_generic']:.1e}")
    for arch, prof in profiles.items():
        for label, ops in prof.items():
            print(f"profile {arch} {label} (self time):")
            for op, us in ops.items():
                print(f"    {op:45s} {us:10.1f}")

    result = {"dataset": "digits", "n_rows": int(X.shape[0]), "members": n_members, "batch_size": a.batch_size,
              "threads": 1, "repeats": a.repeats, "torch": torch.__version__, "machine": platform.machine(),
              "cpu_count": os.cpu_count(), "load_average_1_5_15": os.getloadavg(), "rows": rows,
              "profiles": profiles}
    write_json(a.out, result)


if __name__ == "__main__":
    main()
