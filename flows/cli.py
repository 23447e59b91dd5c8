"""`unlearn`: the command line of the unlearning pipeline.

Heavy packages (prefect, mlflow, great_expectations) are imported only by the subcommand that needs them,
so `unlearn --help` and `unlearn methods` answer at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EPILOG = """examples:
  unlearn run                          process every request file in the inbox (params.yaml)
  unlearn run requests/inbox/x.csv     process one request file
  unlearn validate FILE                check a request file (pandera + Great Expectations), change nothing
  unlearn audit FILE                   leverage diagnostics for a proposed forget set, change nothing
  unlearn methods                      list the unlearning methods, their arguments and defaults
  unlearn status                       champion model, deleted samples, ledger
  unlearn verify-erasure [BATCH]       re-check every store for forgotten rows; exit 1 if any remain
  unlearn erase                        finish erasures left pending by `dvc repro` or a crash
  unlearn serve                        schedule + inbox-triggered deployments (needs a Prefect server)
  unlearn reset                        start over: archive state/ and cache/ (ledger kept), after a prompt
  unlearn init myproj --dataset table --path data.csv --id-column id --label-column y
                                       scaffold a project folder for your own table (or image folder)
"""

RESET_DESCRIPTION = """Start over from the current params.yaml.

Moves the state folder (production model, live manifest, ledger of applied erasures, champion) and the
ensemble cache to base.paths.archive_dir/<UTC time>/ beside them. Nothing is deleted: the archived ledger
keeps every applied erasure, and reset says how many and where. Request files still in the inbox are
applied again to the fresh state by the next `unlearn run` (or `dvc repro`); erased rows stay erased
(base.paths.tombstones is kept: prepare leaves them out). The MLflow registry alias
(tracking.alias, @champion) is moved back to the trained original when models/original.pt matches the
current params, else removed (--keep-alias leaves it).

Use it when `unlearn run` stops with "was built from other params or data" (a changed dataset, model or
recipe), or to start over on purpose. Asks for confirmation; --yes skips the prompt (required without a
terminal)."""

RESET_EPILOG = """examples:
  unlearn reset                        show what would move, ask, then archive and start over
  unlearn reset --yes && dvc repro     non-interactive (CI, scripts), then rebuild for the current params
  unlearn --params other/params.yaml reset --yes --keep-alias
"""

INIT_DESCRIPTION = """Scaffold a project folder for your own data.

Writes DIR/params.yaml (this pipeline's defaults, with `prepare` set for your data; validated before
anything is written), DIR/dvc.yaml (stages prepare -> train -> deletion running the installed package's
flows), an empty DIR/requests/inbox/ and a DIR/.gitignore, then runs `git init` (when DIR is in no git
repository) and `dvc init`. The data path is stored relative to DIR when the data lies inside DIR, else
absolute. Refuses to overwrite an existing params.yaml."""

INIT_EPILOG = """examples:
  unlearn init churn --dataset table --path churn/customers.csv --id-column customer_id \\
      --label-column churned --group-column household --feature-columns age,tenure,spend
  unlearn init photos --dataset image_folder --path /data/photos      (one sub-folder per class)
  unlearn init mymodel --dataset table --path t.parquet --id-column id --label-column y \\
      --arch custom --factory my_model:build    (my_model.py in the project folder)
then: cd DIR && dvc repro && unlearn status
"""


def _params(args):
    from flows.common import use_project_path
    from unlearning.config import load_params

    params = load_params(args.params)
    use_project_path(params)  # a custom model factory module beside params.yaml imports from any folder
    return params


def _preflight_tracking(args) -> None:
    """Before the heavy imports: an unreachable tracking server fails in seconds, with the fix."""
    import urllib.request

    from unlearning.config import load_params

    uri = load_params(args.params).mlflow_tracking_uri()
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5).close()
        except Exception as e:
            raise ConnectionError(f"MLflow tracking server {uri} is unreachable ({getattr(e, 'reason', e)}); start it "
                                  f"(`make ui`, or `mlflow server --host 127.0.0.1 --port 5000 ...`) or unset "
                                  f"MLFLOW_TRACKING_URI to use the project's SQLite store; nothing was changed") from None


def cmd_run(args) -> int:
    _preflight_tracking(args)
    from flows.deletion_batch import run

    results = run(args.request, args.params)
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "metrics"}))
    rejected = [r["file"] for r in results if r["status"] == "rejected"]
    if rejected:
        print(f"error: {len(rejected)} file(s) rejected and moved to requests/rejected/ with an error report: "
              f"{rejected}", file=sys.stderr)
        return 2
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
    """The same validation path as `unlearn run` (flows.deletion_batch.check_file); changes nothing."""
    from flows.deletion_batch import check_file
    from tasks.state import load_state

    params = _params(args)
    state = load_state.fn(params, "cpu")
    fc = check_file(Path(args.file), params, state)
    print(fc.summary(), file=sys.stdout if fc.status != "invalid" else sys.stderr)
    return 0 if fc.status != "invalid" else 1


def cmd_verify_erasure(args) -> int:
    from flows.common import tracker_for
    from tasks.erasure import verify_erasure

    params = _params(args)
    tracker = None
    if os.environ.get("MLFLOW_TRACKING_URI") or params.path("mlflow_db").exists():
        from tasks.tracking import preflight

        preflight(params.mlflow_tracking_uri())
        tracker = tracker_for(params)
    problems, checks = verify_erasure(params, args.batch, tracker)
    for c in checks:
        print(json.dumps(c))
    if problems:
        for p in problems:
            print(f"NOT ERASED: {p}", file=sys.stderr)
        return 1
    print(f"erasure verified{' for ' + args.batch if args.batch else ''}: {len(checks)} store(s) checked, no "
          f"forgotten raw row or id left")
    return 0


def cmd_erase(args) -> int:
    """Finish pending erasures (after `dvc repro`, or a crash), under the batch lock."""
    from flows.common import tracker_for
    from flows.deletion_batch import reconcile
    from tasks.tracking import preflight
    from unlearning.io import exclusive_lock

    params = _params(args)
    preflight(params.mlflow_tracking_uri())
    state_dir = params.path("state_dir")
    with exclusive_lock(state_dir.with_name(f".{state_dir.name}.lock"), 10):
        notes = reconcile(params, tracker_for(params)) if (state_dir / "champion.json").exists() else []
    for n in notes or ["nothing pending"]:
        print(n)
    return 0


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
    if os.environ.get("MLFLOW_TRACKING_URI") or params.path("mlflow_db").exists():
        from flows.common import tracker_for
        from tasks.tracking import preflight

        preflight(params.mlflow_tracking_uri())  # state/ decides: the alias follows champion.json
        before, changed = tracker_for(params).reconcile_alias(params.tracking.registered_model, params.tracking.alias,
                                                              champion.get("model_version"))
        if changed:
            print(f"reconciled @{params.tracking.alias}: v{before} -> v{champion.get('model_version')}")
    manifest = read_state_manifest(state_dir / "manifest.csv")
    ledger = read_ledger(state_dir / "ledger.jsonl")
    deleted = int((manifest["status"] == "deleted").sum())
    print(f"champion: {params.tracking.registered_model} v{champion['model_version']} (@{params.tracking.alias}), "
          f"method {champion['method']}, batch {champion['batch_id']}")
    from unlearning.erasure import read_tombstones

    print(f"manifest: {len(manifest)} samples, {deleted} deleted; ledger: {len(ledger)} request(s) in "
          f"{len({e['batch_id'] for e in ledger})} batch(es); erased (tombstoned): "
          f"{len(read_tombstones(params.path('tombstones')))}")
    print(f"MLflow store: {params.mlflow_tracking_uri()}; UI: `make ui` then open http://127.0.0.1:5000")
    return 0


def cmd_serve(args) -> int:
    from flows.serve import ServerUnavailable, main as serve_main

    try:
        return serve_main(args.params)
    except ServerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _confirm(question: str) -> bool | None:
    """True/False from the terminal; None when there is no terminal to ask."""
    if not sys.stdin.isatty():
        return None
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _inbox_coverage(params, request_ids: set[str]) -> tuple[int, int]:
    """(request files in the inbox, how many of `request_ids` they hold)."""
    from unlearning.requests import list_request_files, read_request_file

    files, found = list_request_files(params.path("inbox")), set()
    for f in files:
        try:
            df = read_request_file(f)
        except Exception:  # an unreadable file: the next run reports it
            continue
        if "request_id" in df.columns:
            found |= set(df["request_id"].astype(str))
    return len(files), len(request_ids & found)


def cmd_reset(args) -> int:
    import os

    from unlearning.ledger import read_ledger

    params = _params(args)
    state_dir, cache_dir, archive_dir = params.path("state_dir"), params.path("cache_dir"), params.path("archive_dir")
    present = [p for p in (state_dir, cache_dir) if p.exists()]
    if not present:
        print(f"nothing to reset: neither {state_dir} nor {cache_dir} exists")
        return 0
    n_ledger = len(read_ledger(state_dir / "ledger.jsonl"))
    print(f"reset moves {' and '.join(str(p) for p in present)} to {archive_dir}/<UTC time>/; the ledger's "
          f"{n_ledger} applied erasure(s) are kept there")
    if not args.yes:
        answer = _confirm("Archive the state and start over from the current params?")
        if answer is None:
            print("error: unlearn reset needs confirmation and stdin is not a terminal; pass --yes to reset "
                  "without the prompt (nothing changed)", file=sys.stderr)
            return 2
        if not answer:
            print("reset cancelled; nothing changed")
            return 1

    from tasks.state import archive_state, original_path, original_version_if_current
    from unlearning.io import LockTimeout

    try:
        result = archive_state(params)
    except LockTimeout as e:
        print(f"error: a deletion batch is running ({e}); nothing changed, try again when it ends", file=sys.stderr)
        return 2
    for src, dest in result["moved"].values():
        print(f"archived {src} -> {dest}")
    ledger = result["ledger"]
    if result["ledger_path"] is not None:
        batches = len({e.get("batch_id") for e in ledger})
        print(f"ledger: {len(ledger)} applied erasure(s) in {batches} batch(es) kept in {result['ledger_path']}; "
              f"the new state starts with an empty ledger")
    if ledger:
        n_files, covered = _inbox_coverage(params, {str(e["request_id"]) for e in ledger})
        line = (f"erasures: the fresh state holds none of them; the next `unlearn run` (or `dvc repro`) processes "
                f"the {n_files} request file(s) in {params.path('inbox')} again, which hold {covered} of the "
                f"{len(ledger)} archived request(s)")
        if covered < len(ledger):
            line += f"; re-submit the other {len(ledger) - covered} from {result['ledger_path']}"
        print(line)
    original_version = original_version_if_current(params)
    rc = 0
    name, alias = params.tracking.registered_model, params.tracking.alias
    if args.keep_alias:
        print(f"MLflow: {name}@{alias} left as is (--keep-alias); it is not rolled back automatically")
    elif not os.environ.get("MLFLOW_TRACKING_URI") and not params.path("mlflow_db").exists():
        print(f"MLflow: no store at {params.path('mlflow_db')}; no @{alias} alias to change")
    else:
        from tasks.tracking import reset_alias

        try:
            before, after = reset_alias(params.mlflow_tracking_uri(), name, alias, original_version)
        except Exception as e:  # the store is unreachable: the archive is done, say what is left
            print(f"MLflow: could not change {name}@{alias} ({e}); move or remove it by hand")
            rc = 1
        else:
            was = f"was v{before}" if before else "was unset"
            if after:
                print(f"MLflow: {name}@{alias} now points to v{after}, the trained original ({was})")
            elif before:
                print(f"MLflow: removed {name}@{alias} ({was}); the next promoted batch or `unlearn train` sets it")
            else:
                print(f"MLflow: {name} has no @{alias}; nothing to change")
    if original_version is None:
        print(f"next: `dvc repro` (or `unlearn prepare`, `unlearn train`, `unlearn run`): {original_path(params)} is "
              f"missing or was trained from other params")
    else:
        print(f"next: `unlearn run` (or `dvc repro`) builds a new state from {original_path(params)} and the "
              f"current params")
    return rc


def _column_list(value: str) -> list[str]:
    cols = [c.strip() for c in value.split(",") if c.strip()]
    if not cols:
        raise argparse.ArgumentTypeError("expected column names separated by commas, e.g. age,income")
    return cols


def cmd_init(args) -> int:
    from flows.scaffold import scaffold

    for line in scaffold(args.dir, args.dataset, args.path, id_column=args.id_column, label_column=args.label_column,
                         group_column=args.group_column, feature_columns=args.feature_columns,
                         split_column=args.split_column, arch=args.arch, factory=args.factory, vcs=not args.no_vcs):
        print(line)
    return 0


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
    s = sub.add_parser("verify-erasure", help="re-check every store for forgotten raw rows and ids (exit 1 if any)")
    s.add_argument("batch", nargs="?", metavar="BATCH", help="one batch id (default: every batch in the ledger)")
    s.set_defaults(fn=cmd_verify_erasure)
    sub.add_parser("erase", help="finish pending erasures (after `dvc repro`, or a crash)").set_defaults(fn=cmd_erase)
    sub.add_parser("serve", help="serve scheduled and inbox-triggered deployments").set_defaults(fn=cmd_serve)
    raw = argparse.RawDescriptionHelpFormatter
    s = sub.add_parser("reset", help="start over: archive state/ and cache/ (the ledger is kept), after a prompt",
                       description=RESET_DESCRIPTION, epilog=RESET_EPILOG, formatter_class=raw)
    s.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (needed without a terminal)")
    s.add_argument("--keep-alias", action="store_true",
                   help="leave the MLflow registry alias (tracking.alias) where it is")
    s.set_defaults(fn=cmd_reset)
    s = sub.add_parser("init", help="scaffold a project folder for your own data (table or image folder)",
                       description=INIT_DESCRIPTION, epilog=INIT_EPILOG, formatter_class=raw)
    s.add_argument("dir", metavar="DIR", help="project folder to create (may exist; must not hold a params.yaml)")
    s.add_argument("--dataset", required=True, choices=["table", "image_folder"],
                   help="table: one row per sample (CSV or Parquet); image_folder: one sub-folder per class")
    s.add_argument("--path", required=True, metavar="FILE|DIR", help="the table file (CSV or Parquet), or the image folder; relative to the current folder")
    s.add_argument("--id-column", metavar="C", help="table: the stable sample id column (required for a table)")
    s.add_argument("--label-column", metavar="C", help="table: the class label column (required for a table)")
    s.add_argument("--group-column", metavar="C",
                   help="table: a column grouping entangled samples (e.g. one person's rows); default: none")
    s.add_argument("--feature-columns", metavar="A,B", type=_column_list,
                   help="table: the feature columns, comma-separated; default: every other column")
    s.add_argument("--split-column", metavar="C",
                   help="table: a train/val column; default: a seeded split by prepare.val_fraction")
    s.add_argument("--arch", choices=["mlp", "custom"], default="mlp",
                   help="model: the built-in MLP (default), or your own factory (--factory)")
    s.add_argument("--factory", metavar="MODULE:FUNCTION",
                   help="--arch custom: the function that builds the model, e.g. my_model:build")
    s.add_argument("--no-vcs", action="store_true", help="skip `git init` and `dvc init`")
    s.set_defaults(fn=cmd_init)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from flows.scaffold import ScaffoldError
    from unlearning.config import ConfigError
    from unlearning.fingerprint import StateMismatch
    from unlearning.requests import RequestValidationError

    try:
        return args.fn(args)
    except (ConfigError, RequestValidationError, FileNotFoundError, StateMismatch, ScaffoldError, PermissionError,
            ConnectionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # fail fast, one line: an unreachable store, or a failure after the commit
        if type(e).__name__ in ("TrackingUnavailable", "AfterCommitError", "LockTimeout"):
            print(f"error: {e}", file=sys.stderr)
            return 3 if type(e).__name__ == "AfterCommitError" else 2
        raise


if __name__ == "__main__":
    sys.exit(main())
