"""`unlearn`: the command line of the unlearning pipeline.

Heavy packages (prefect, mlflow, great_expectations) are imported only by the subcommand that needs them,
so `unlearn --help` and `unlearn methods` answer at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EPILOG = """examples:
  unlearn run                          process every request file in the inbox (params.yaml)
  unlearn run requests/inbox/x.csv     process one request file
  unlearn validate FILE                check a request file (pandera + Great Expectations), change nothing
  unlearn audit FILE                   leverage diagnostics for a proposed forget set, change nothing
  unlearn methods                      list the unlearning methods, their arguments and defaults
  unlearn status                       champion model, deleted samples, ledger
  unlearn serve                        schedule + inbox-triggered deployments (needs a Prefect server)
"""


def _params(args):
    from unlearning.config import load_params

    return load_params(args.params)


def cmd_run(args) -> int:
    from flows.deletion_batch import run

    results = run(args.request, args.params)
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "metrics"}))
    return 0


def cmd_prepare(args) -> int:
    from flows.prepare import prepare

    prepare(args.params)
    return 0


def cmd_train(args) -> int:
    from flows.train import train

    train(args.params)
    return 0


def cmd_validate(args) -> int:
    from tasks.state import load_state
    from tasks.validation import check_request_frame
    from unlearning.requests import read_request_file

    params = _params(args)
    state = load_state.fn(params, "cpu")
    check = check_request_frame(read_request_file(args.file), state.manifest)
    if check.ok:
        print(f"{args.file}: valid ({len(read_request_file(args.file))} request(s))")
        return 0
    print(f"{args.file}: {len(check.problems)} problem(s):")
    for p in check.problems:
        print(f"  - {p}")
    return 1


def cmd_audit(args) -> int:
    from flows.audit import audit

    result = audit(args.file, args.params)
    print(json.dumps({"run_id": result["run_id"], **{k: result["report"][k] for k in (
        "solver", "n_forget", "leakage_ratio", "self_leverage_spectral_norm", "self_leverage_trace",
        "predicted_gap_do_nothing")}}, indent=2))
    return 0


def cmd_methods(args) -> int:
    from unlearning.methods import describe_methods

    for row in describe_methods():
        print(f"{row['name']:<16} {row['summary']}")
        for arg, default in row["args"].items():
            print(f"    {arg} = {default!r}")
    return 0


def cmd_status(args) -> int:
    from unlearning.data import read_state_manifest
    from unlearning.ledger import read_ledger

    params = _params(args)
    state_dir = params.path("state_dir")
    if not (state_dir / "champion.json").exists():
        print(f"no batch processed yet ({state_dir} is empty); run `make run` or `unlearn run`")
        return 0
    champion = json.loads((state_dir / "champion.json").read_text())
    manifest = read_state_manifest(state_dir / "manifest.csv")
    ledger = read_ledger(state_dir / "ledger.jsonl")
    deleted = int((manifest["status"] == "deleted").sum())
    print(f"champion: {params.tracking.registered_model} v{champion['model_version']} (@{params.tracking.alias}), "
          f"method {champion['method']}, batch {champion['batch_id']}")
    print(f"manifest: {len(manifest)} samples, {deleted} deleted; ledger: {len(ledger)} request(s) in "
          f"{len({e['batch_id'] for e in ledger})} batch(es)")
    print(f"MLflow store: {params.mlflow_tracking_uri()}; UI: `make ui` then open http://127.0.0.1:5000")
    return 0


def cmd_serve(args) -> int:
    from flows.serve import ServerUnavailable, main as serve_main

    try:
        return serve_main(args.params)
    except ServerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="unlearn", description="MLOps pipeline for machine unlearning: validate deletion "
                                "batches, diagnose leverage, unlearn, validate against oracle retrains, gate, log.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", default="params.yaml", help="params.yaml to use (default: ./params.yaml)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("run", help="process deletion request files (all in the inbox, or one)")
    s.add_argument("request", nargs="?", help="one request file (CSV or Parquet)")
    s.set_defaults(fn=cmd_run)
    sub.add_parser("prepare", help="prepare the dataset (stage prepare)").set_defaults(fn=cmd_prepare)
    sub.add_parser("train", help="train and register the original model (stage train)").set_defaults(fn=cmd_train)
    s = sub.add_parser("validate", help="validate a request file without changing anything")
    s.add_argument("file")
    s.set_defaults(fn=cmd_validate)
    s = sub.add_parser("audit", help="leverage diagnostics for a proposed forget set, without changing anything")
    s.add_argument("file", help="a request file naming the proposed forget set")
    s.set_defaults(fn=cmd_audit)
    sub.add_parser("methods", help="list unlearning methods with their arguments").set_defaults(fn=cmd_methods)
    sub.add_parser("status", help="show the champion, the deletions and the ledger").set_defaults(fn=cmd_status)
    sub.add_parser("serve", help="serve scheduled and inbox-triggered deployments").set_defaults(fn=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from unlearning.config import ConfigError
    from unlearning.requests import RequestValidationError

    try:
        return args.fn(args)
    except (ConfigError, RequestValidationError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
