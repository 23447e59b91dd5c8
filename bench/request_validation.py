"""Benchmark: how a valid request file's validation scales with its rows (the one path `unlearn validate` and
the deletion flow share: tasks.request_check.check_file_for).

For each size N (default 10^4, 10^5, 2 * 10^5, 10^6) a fresh interpreter builds a synthetic project: params.yaml in a
temporary folder (tests.helpers.make_project), a live manifest of N + N/5 training rows and N/10 validation
rows (so the request never names every retained training row), the live state's manifest.csv written and read
back as `unlearn validate` reads it (`read_state_manifest`), and a valid CSV request file of N rows naming
training rows. It then times, each in its own interpreter (so its peak RSS is its own):
- `cli`: `check_file_for(..., gx_when_invalid=False)`, as `unlearn validate` and `unlearn run FILE` call it;
- `flow`: `check_file_for(...)`, as the deletion flow's check_file calls it (the Great Expectations suite on
  the per-request lookup table, or on its stated sample past tasks.request_check.GX_MAX_ROWS, with Data Docs).
`seconds` = `gx_import_s` (importing Great Expectations: a fixed cost of each process, 3-5 s, whatever the
rows) + `checks_s` (check_file_for itself). `read_state_s` is the time to read the live manifest from state/manifest.csv (the CLI's `live_state` does it
before the checks; the flow has it in memory already). Peak RSS is the interpreter's own (ru_maxrss), imports
and the synthetic manifest included.

Targets: 10^6 rows answered in <= 20 s with <= 1 GB RSS on both paths; 2 * 10^5 rows in <= 5 s.
Usage: python bench/request_validation.py [--sizes 10000 100000 200000 1000000] [--hash]
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


def setup(folder: Path, n: int, hash_ids: bool) -> None:
    """The synthetic project of one size: params.yaml, state/manifest.csv (the live manifest) and the request file."""
    from tests.helpers import make_project
    from unlearning.data.store import manifest_csv_bytes

    make_project(folder / "project", {"deletion": {"hash_sample_ids": hash_ids}}, inbox_files=False)
    (folder / "manifest.csv").write_bytes(manifest_csv_bytes(synthetic_manifest(n)))
    write_request(folder / "requests.csv", n)


def child(folder: Path, n: int, path_kind: str) -> dict:
    """One measurement in this interpreter: read the live manifest as `unlearn validate` does, then time the
    checks of the chosen path. The peak RSS is this interpreter's: what `unlearn validate` would hold."""
    os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))
    from unlearning.config import load_params
    from unlearning.data import read_state_manifest
    import tasks.request_check as rc

    params = load_params(folder / "project" / "params.yaml")
    t0 = time.perf_counter()
    manifest = read_state_manifest(folder / "manifest.csv")
    read_state = time.perf_counter() - t0
    live = rc.LiveState(manifest, [], {"name": "synthetic"})
    t0 = time.perf_counter()
    import great_expectations  # noqa: F401  (timed apart: a cost per process, whatever the rows)

    gx_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    fc = rc.check_file_for(folder / "requests.csv", params, live, gx_when_invalid=(path_kind == "flow"))
    checks = time.perf_counter() - t0
    assert fc.status == "ok" and len(fc.pending) == n, fc.summary()[:2000]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"rows": n, "path": path_kind, "seconds": round(gx_import + checks, 3), "checks_s": round(checks, 3),
            "gx_import_s": round(gx_import, 3), "read_state_s": round(read_state, 3), "peak_rss_mb": round(rss_mb, 1),
            "gx": fc.gx_note or "Great Expectations validated every row"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 200_000, 1_000_000])
    ap.add_argument("--paths", nargs="+", default=["cli", "flow"], choices=["cli", "flow"])
    ap.add_argument("--hash", action="store_true", help="deletion.hash_sample_ids: true (salted-hash ids)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "request_validation.json"))
    ap.add_argument("--child", nargs=3, metavar=("FOLDER", "N", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), int(args.child[1]), args.child[2])))
        return
    rows = []
    print(f"{'rows':>9} {'path':>5} {'seconds':>8} {'checks_s':>8} {'gx_import_s':>11} {'read_state_s':>12} "
          f"{'peak_rss_mb':>11}  gx")
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix="bench-requests-") as tmp:
            setup(Path(tmp), n, args.hash)
            for kind in args.paths:
                out = subprocess.run([sys.executable, __file__, "--child", tmp, str(n), kind], capture_output=True,
                                     text=True, cwd=ROOT)
                if out.returncode:
                    raise SystemExit(f"{n} rows, {kind}: failed:\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append(r)
                print(f"{r['rows']:>9} {r['path']:>5} {r['seconds']:>8.2f} {r['checks_s']:>8.2f} "
                      f"{r['gx_import_s']:>11.2f} {r['read_state_s']:>12.2f} {r['peak_rss_mb']:>11.0f}  {r['gx']}",
                      flush=True)
    from bench.results_io import write_json

    write_json(args.out, {"hash_sample_ids": args.hash, "targets": TARGETS, "results": rows,
                          "load_average": os.getloadavg(), "cpus": os.cpu_count()})


if __name__ == "__main__":
    main()
