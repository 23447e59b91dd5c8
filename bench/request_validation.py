"""Benchmark: how a valid request file's validation scales with its rows, on the two paths that share
adapters.request_check.check_file_for: `unlearn validate` and the deletion flow's check.

For each size N (default 10^4, 10^5, 2 * 10^5, 10^6) the parent writes a synthetic project in a temporary
folder: params.yaml (bench/project_copy.py make_project), a prepared store of N + N/5 training rows and N/10
validation rows (data/prepared: dataset.json, manifest.csv, one feature per row), a state whose champion.json
records the fingerprint of those params and data (so `unlearn validate` reads it as the live state), and a
valid CSV request file of N rows naming training rows (never every retained one). Each path then runs in a
fresh interpreter of its own, so its peak RSS (VmHWM) is its own:
- `cli`: `unlearn validate FILE` itself (flows.cli.main): the imports, the live state (the prepared store and
  its fingerprint, state/manifest.csv), the checks and Great Expectations; `read_state_s` is the live state's
  share;
- `flow`: `check_file_for(...)` on a live state already in memory, as the deletion flow's check_file calls it
  (the flow has loaded its state before).
`seconds` is the path's wall time in its interpreter; `gx_import_s` is Great Expectations' import, a fixed
cost of each process (3-5 s, whatever the rows) included in it. Great Expectations runs on the per-request
lookup table, or on its stated seeded sample past adapters.request_check.GX_MAX_ROWS (column `gx`).

Targets: 10^6 rows answered in <= 20 s with <= 1 GB RSS on both paths; 2 * 10^5 rows in <= 5 s.
Usage: python bench/request_validation.py [--sizes 10000 100000 200000 1000000] [--paths cli flow] [--hash]
                                          [--out bench/results/request_validation.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.perf_counter()  # a child's clock starts with its interpreter (the imports count)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS = {"1000000": {"seconds": 20.0, "rss_mb": 1024.0}, "200000": {"seconds": 5.0}}


def synthetic_manifest(n_request: int):
    """A live manifest with every column the state manifest has: N + N/5 training rows, N/10 validation rows."""
    import numpy as np
    import pandas as pd

    n_train, n_val = n_request + max(n_request // 5, 1), max(n_request // 10, 1)
    n = n_train + n_val
    ids = pd.Series(np.arange(n)).map("sample-{:08d}".format)
    return pd.DataFrame({"sample_id": ids, "split": np.where(np.arange(n) < n_train, "train", "val"),
                         "label": np.arange(n) % 10, "group": "g", "class_name": "c", "status": "retained",
                         "deleted_in_batch": None})


def write_request(path: Path, n: int) -> None:
    import numpy as np
    import pandas as pd

    rows = np.arange(n)
    pd.DataFrame({"request_id": pd.Series(rows).map("req-{:08d}".format),
                  "sample_id": pd.Series(rows).map("sample-{:08d}".format),
                  "requested_at": "2026-11-30T09:00:00Z", "reason": "gdpr art. 17"}).to_csv(path, index=False)


def setup(folder: Path, n: int, hash_ids: bool) -> Path:
    """The synthetic project of one size (see the module docstring); returns its params.yaml."""
    import numpy as np

    from project_copy import make_project  # bench/ is on sys.path when run as a script
    from unlearning.config import load_params
    from unlearning.data.store import initial_state_manifest, manifest_csv_bytes
    from unlearning.privacy.fingerprint import prepared_fingerprint
    from unlearning.io import atomic_write_json

    params_path = make_project(folder, {"deletion": {"hash_sample_ids": hash_ids}}, inbox_files=False)
    params = load_params(params_path)
    state = synthetic_manifest(n)
    manifest = state.drop(columns=["status", "deleted_in_batch"])
    info = {"name": "synthetic", "class_names": [str(c) for c in range(10)], "fine_class_names": None,
            "image_shape": None, "in_shape": [1], "n_features": 1, "n_samples": len(manifest),
            "n_train": int((manifest["split"] == "train").sum()), "n_val": int((manifest["split"] == "val").sum())}
    prepared = params.path("prepared_dir")
    prepared.mkdir(parents=True)
    np.save(prepared / "features.npy", np.zeros((len(manifest), 1), dtype=np.float32))
    np.save(prepared / "labels.npy", manifest["label"].to_numpy(dtype=np.int64))
    manifest.to_csv(prepared / "manifest.csv", index=False)
    atomic_write_json(prepared / "dataset.json", info)
    state_dir = params.path("state_dir")
    state_dir.mkdir(parents=True)
    (state_dir / "manifest.csv").write_bytes(manifest_csv_bytes(initial_state_manifest(manifest)))
    (state_dir / "ledger.jsonl").write_text("")
    (state_dir / "model.pt").write_bytes(b"")  # live_state only asks that it exists
    atomic_write_json(state_dir / "champion.json", {
        "model_version": "1", "method": "original", "batch_id": None,
        "fingerprint": prepared_fingerprint(params.train, params.base.seed, params.root, info, manifest)})
    write_request(folder / "requests.csv", n)
    return params_path


def peak_rss_mb() -> float:
    """This interpreter's peak RSS: VmHWM of its own memory map (ru_maxrss would also count the parent's RSS
    at fork time, which Linux carries across exec: the parent that wrote a 10^6-row project is large)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed_gx_import() -> float:
    t0 = time.perf_counter()
    import great_expectations  # noqa: F401

    return time.perf_counter() - t0


def child(folder: Path, n: int, path_kind: str, started: float) -> dict:
    """One measurement in this interpreter (see the module docstring)."""
    import builtins
    import contextlib
    import io

    os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))
    params_path, request = folder / "params.yaml", folder / "requests.csv"
    stamps = {}
    if path_kind == "cli":
        import adapters.request_check as rc
        from flows import cli

        live_state = rc.live_state

        def timed_live_state(params):  # the live state's share of `unlearn validate`
            t0 = time.perf_counter()
            out = live_state(params)
            stamps["read_state_s"] = time.perf_counter() - t0
            assert out is not None, "the synthetic state does not match its params and data (fingerprint)"
            return out

        rc.live_state = timed_live_state
        real_import = builtins.__import__

        def timed_import(name, *args, **kwargs):  # Great Expectations' import, where the checks first ask for it
            if name == "great_expectations" and "great_expectations" not in sys.modules:
                t0 = time.perf_counter()
                module = real_import(name, *args, **kwargs)
                stamps["gx_import_s"] = time.perf_counter() - t0
                return module
            return real_import(name, *args, **kwargs)

        builtins.__import__ = timed_import
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = cli.main(["--params", str(params_path), "validate", str(request)])
        builtins.__import__ = real_import
        assert code == 0 and "valid (" in out.getvalue(), out.getvalue()[-3000:]
        note = out.getvalue().split("note: ")[-1].strip() if "note: " in out.getvalue() else ""
    else:
        from unlearning.config import load_params
        from unlearning.data import load_prepared, read_state_manifest
        import adapters.request_check as rc

        params = load_params(params_path)
        t0 = time.perf_counter()
        live = rc.LiveState(read_state_manifest(params.path("state_dir") / "manifest.csv"), [],
                            load_prepared(params.path("prepared_dir")).info)
        stamps["read_state_s"] = time.perf_counter() - t0
        stamps["gx_import_s"] = _timed_gx_import()
        started = time.perf_counter() - stamps["gx_import_s"]  # the flow: its state is in memory already
        fc = rc.check_file_for(request, params, live)
        assert fc.status == "ok" and len(fc.pending) == n, fc.summary()[:2000]
        note = fc.gx_note
    seconds = time.perf_counter() - started
    rss_mb = peak_rss_mb()
    return {"rows": n, "path": path_kind, "seconds": round(seconds, 3),
            "gx_import_s": round(stamps.get("gx_import_s", 0.0), 3),
            "read_state_s": round(stamps.get("read_state_s", 0.0), 3), "peak_rss_mb": round(rss_mb, 1),
            "gx": note or "Great Expectations validated every row"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 200_000, 1_000_000])
    ap.add_argument("--paths", nargs="+", default=["cli", "flow"], choices=["cli", "flow"])
    ap.add_argument("--hash", action="store_true", help="deletion.hash_sample_ids: true (salted-hash ids)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "request_validation.json"))
    ap.add_argument("--child", nargs=3, metavar=("FOLDER", "N", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), int(args.child[1]), args.child[2], STARTED)))
        return
    rows = []
    print(f"{'rows':>9} {'path':>5} {'seconds':>8} {'gx_import_s':>11} {'read_state_s':>12} {'peak_rss_mb':>11}  gx")
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix="bench-requests-") as tmp:
            setup(Path(tmp), n, args.hash)
            for kind in args.paths:
                out = subprocess.run([sys.executable, __file__, "--child", tmp, str(n), kind], capture_output=True,
                                     text=True, cwd=ROOT)
                if out.returncode:
                    raise SystemExit(f"{n} rows, {kind}: failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append(r)
                print(f"{r['rows']:>9} {r['path']:>5} {r['seconds']:>8.2f} {r['gx_import_s']:>11.2f} "
                      f"{r['read_state_s']:>12.2f} {r['peak_rss_mb']:>11.0f}  {r['gx']}", flush=True)
    from bench.results_io import write_json

    write_json(args.out, {"hash_sample_ids": args.hash, "targets": TARGETS, "results": rows,
                          "load_average": os.getloadavg(), "cpus": os.cpu_count()})


if __name__ == "__main__":
    main()
