"""`unlearn`: the command line of the unlearning pipeline.

Heavy packages (prefect, mlflow, great_expectations) are imported only by the subcommand that needs them,
so `unlearn --help` and `unlearn methods` answer at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

from flows.errors import (  # noqa: F401 (re-exported)
    ENV_DEBUG, EXIT_BAD_INPUT, EXIT_ERASE_UNFINISHED, EXIT_FAILURE, EXIT_GATE_REJECTED, EXIT_HELD, exit_code,
)

EPILOG = """exit codes: 0 done (or nothing to do), 2 bad input (params, request file, unreachable store),
            3 the gate rejected every candidate, 1 any other failure; `unlearn status`: 4 an erase is
            unfinished (`unlearn erase` finishes it), 5 a batch is held for review (`unlearn approve`)

examples:
  unlearn run                          process every request file in the inbox (params.yaml)
  unlearn run requests/inbox/x.csv     process one request file
  unlearn validate FILE                check a request file (pandera + Great Expectations), change nothing
  unlearn audit FILE                   leverage diagnostics for a proposed forget set, change nothing
  unlearn methods                      list the unlearning methods, their arguments and defaults
  unlearn status                       champion model, deleted samples, ledger
  unlearn ui                           the MLflow UI over the project's store, opening on the batch runs
  unlearn up / unlearn down            keep / stop a Prefect server and warm worker for this project
  unlearn ids --split train --head 5   sample ids a request file may name
  unlearn verify-erasure [BATCH]       re-check every store for forgotten rows; exit 1 if any remain
  unlearn lookup ID                    was this sample id erased, when and by which batch (from its salted hash)
  unlearn erase                        finish erasures left pending by `dvc repro` or a crash
  unlearn approve FILE                 promote a batch held for review (requests/held/FILE), finish its erase
  unlearn repro [TARGET]               dvc repro, unlearn erase, unlearn status: one Prefect server for all
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

APPROVE_DESCRIPTION = """Promote a batch held for review, and finish its erase.

A batch no candidate passed (a validation floor the exact retrain still missed, or a warning quality.refuse
names) is held in requests/held/ beside FILE.held.json, never refused: the champion keeps serving its rows
meanwhile (`unlearn status` says so). Approving runs it again as an exact retrain (the same rows and seed:
the model the held report measured) with the floors off, promotes it, erases the rows from every store and
moves FILE to requests/processed/. Exit 0 when applied."""

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
  unlearn init photos --dataset image_folder --path /data/photos --arch cnn   (one sub-folder per class;
                                       image_size and grayscale are read from the images)
  unlearn init mymodel --dataset table --path t.parquet --id-column id --label-column y \\
      --arch custom --factory my_model:build    (my_model.py in the project folder)
  unlearn init shop --dataset table --path orders.csv --id-column order_id --label-column returned \
      --shard-by customer_id    (sharded by customer: one customer's deletion retrains one shard)
then: cd DIR && unlearn repro   (dvc repro, unlearn erase and unlearn status, one Prefect server for all)
"""


def _params(args):
    from flows.common import use_project_path
    from unlearning.config import load_params

    params = load_params(args.params)
    use_project_path(params)  # a custom model factory module beside params.yaml imports from any folder
    return params


def _preflight_tracking(args) -> None:
    """Before the heavy imports: an unreachable tracking server or a damaged SQLite store fails in a second,
    with the fix (exit 2)."""
    from adapters.store_check import tracking_store_problem
    from unlearning.config import load_params

    params = load_params(args.params)
    problem = tracking_store_problem(params.mlflow_tracking_uri())
    if problem:
        raise ConnectionError(problem)
    _refuse_a_lost_store(params)


def cmd_run(args) -> int:
    _precheck_request(args)
    _preflight_tracking(args)
    from flows.deletion_batch import report_results, run
    from flows.common import prefect_api
    from unlearning.config import load_params
    from unlearning.policy.selection import check_method_config

    check_method_config(load_params(args.params).deletion)  # ConfigError: exit 2, before the server starts

    with prefect_api():
        results = run(args.request, args.params)
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "metrics"}))
    return report_results(results)


def cmd_prepare(args) -> int:
    from flows.prepare import prepare
    from flows.common import prefect_api

    with prefect_api():
        prepare(args.params)
    return 0


def cmd_train(args) -> int:
    from flows.train import train
    from flows.common import prefect_api

    with prefect_api():
        train(args.params)
    return 0


def _live_state(params):
    """The live manifest and ledger for the request checks: read without torch or Prefect when the state's
    recorded fingerprint matches (about a second); otherwise (no state yet, an old state, a mismatch) the
    deletion flow's own load_state, which says what is wrong."""
    from adapters.request_check import LiveState, live_state

    live = live_state(params)
    if live is None:
        from tasks.state import StateSettings, load_state

        state = load_state.fn(StateSettings.of(params), "cpu")
        live = LiveState(state.manifest, state.ledger, state.prepared.info)
    return live


def _precheck_request(args) -> None:
    """`unlearn run FILE` with a file outside the inbox (which the flow never moves: it raises the file's
    problems): the file's checks run here, before the Prefect server starts, so a bad file answers with the
    lines the flow would print and no traceback, in about a second (the cheap checks, then the manifest rules
    evaluated with pandas: unknown ids, validation rows, ids deleted or erased already); only a file they pass
    imports Great Expectations (its import then serves the flow's own check too). Inbox files are left to the
    flow: it moves a bad one to
    requests/rejected/ with its report, after the earlier inbox files."""
    if not args.request:
        return
    from adapters.request_check import check_file_for, live_state

    params = _params(args)
    path, inbox = Path(args.request), params.path("inbox")
    from unlearning.requests import in_inbox

    if in_inbox(path, inbox):
        return
    if path.exists() or path.is_symlink():  # a missing file: the flow says so
        _request_file(args.request, inbox)  # a symlink or a directory: refused as the flow refuses it
    try:
        live = live_state(params)
    except FileNotFoundError:  # no prepared data: the flow says what to run first
        return
    if live is not None:
        fc = check_file_for(path, params, live, gx_when_invalid=False)
        if fc.status == "invalid":
            raise fc.error()


def cmd_validate(args) -> int:
    """The same checks as `unlearn run` (adapters.request_check, the arguments of tasks.batch_path.check_file);
    changes nothing. Great Expectations (3-5 s to import) runs only for a file that passed the cheap checks and
    the manifest rules evaluated with pandas (`gx_when_invalid=False`): a bad file answers in about a second."""
    from adapters.request_check import check_file_for
    from unlearning.progress import Progress

    params = _params(args)
    # a line on stderr every 10 s past the first 2 (10^6 rows take about 14 s): the check itself calls no tick
    with Progress(1, "unlearn validate", unit="files", enabled=None, after_s=2.0, heartbeat_s=1.0) as bar:
        bar.stage("checking the file")
        fc = check_file_for(_request_file(args.file, params.path("inbox")), params, _live_state(params),
                            gx_when_invalid=False)
        bar.update()
    return print_check(fc, args.json)


def _settle_interrupted_swaps(params) -> None:
    """Every command's first step: a state swap a kill left half done (a `.state.previous`) is completed or
    rolled back (unlearning.io.settle_interrupted_swaps), said on stderr, before anything reads state/."""
    from unlearning.io import settle_interrupted_swaps

    for note in settle_interrupted_swaps(params.path("state_dir"), params.path("prepared_dir")):
        print(f"note: {note}", file=sys.stderr)


def _request_file(name: str, inbox: Path | None = None) -> Path:
    """The request file a command names; a missing one is a one-line error (exit 2) before anything else is
    read (not a "rejected" file, and not a complaint about the project's prepared data). A symlink, a
    directory or a FIFO is refused here, before a byte is read, by the rule of the deletion flow
    (unlearning.requests.entry_problem; `inbox`: a symlink naming a staged file in it is an inbox entry)."""
    from unlearning.requests import RequestValidationError, entry_problem

    path = Path(name)
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"{name}: no such request file")
    refused = entry_problem(path, inbox)
    if refused:
        raise RequestValidationError(path, [refused])
    return path


def print_check(fc, as_json: bool) -> int:
    """A request file's checks as `unlearn validate` prints them (and `unlearn audit` for a bad file): the
    summary (on stderr when invalid) or the JSON object; returns the exit code (2 when invalid)."""
    if as_json:
        print(json.dumps({"file": fc.path, "status": fc.status, "problems": fc.problems, "conflicts": fc.conflicts,
                          "n_rows": fc.n_rows,
                          "to_apply": 0 if fc.status == "invalid" or fc.pending is None else len(fc.pending),
                          "already_processed": fc.skipped, "manifest_checked": fc.manifest_checked}, indent=2))
    else:
        print(fc.summary(), file=sys.stdout if fc.status != "invalid" else sys.stderr)
    return 0 if fc.status != "invalid" else EXIT_BAD_INPUT


def _source_note(check: dict) -> str:
    """The note for forgotten rows still in the team's own source (a table or an image folder)."""
    n = check["forgotten_rows_at_the_source"]
    if check["store"] == "source table":
        held, field = f"your source table {check['path']} still holds {n} forgotten row(s)", "prepare.table.path"
    else:
        shown = ", ".join(check["first_files"]) + (" ..." if n > len(check["first_files"]) else "")
        held, field = (f"your image folder {check['path']} still holds {n} forgotten image(s) ({shown})",
                       "prepare.image_folder.path")
    return (f"{held}: the pipeline never rewrites {field} (the tombstones keep them out of every prepared store). "
            f"If your policy requires deleting them there too: delete them, then `unlearn reset` and `dvc repro` "
            f"(the state was built from data that had them: the next batch would stop with 'built from other "
            f"params or data'; a fresh original is trained without them)")


def _twin_notes(checks: list[dict]) -> list[str]:
    """Forgotten rows whose bytes equal a retained row's (a duplicate row in the data: another person's, kept)."""
    out = []
    for c in checks:
        for t in c.get("identical_to_retained", []):
            more = f" and {t['n_retained'] - len(t['retained'])} more" if t["n_retained"] > len(t["retained"]) else ""
            out.append(f"forgotten row {t['forgotten']} is identical to retained row {', '.join(t['retained'])}{more} "
                       f"(kept): the same values belong to a sample that was not forgotten, so their bytes stay in "
                       f"{c['store']} and its copies; not a failure")
    return out


def cmd_verify_erasure(args) -> int:
    from flows.common import tracker_for
    from tasks.erasure import verify_erasure
    from tasks.stores.base import ErasureSettings

    params = _params(args)
    tracker = None
    if os.environ.get("MLFLOW_TRACKING_URI") or params.path("mlflow_db").exists():
        from adapters.tracking import preflight

        preflight(params.mlflow_tracking_uri())
        tracker = tracker_for(params)
    problems, checks = verify_erasure(ErasureSettings.of(params), args.batch, tracker)
    from adapters.store_check import state_champion_store_problem

    lost = state_champion_store_problem(params)[0]
    if lost:  # the registry checked above is not the one the champion (and the purged versions) lived in
        problems.append("MLflow registry: not verified: " + lost.replace("; nothing was changed", ""))
    for c in checks:
        print(json.dumps(c))
    for line in _twin_notes(checks):
        print(f"  note: {line}")
    if problems:
        for p in problems:
            print(f"NOT ERASED: {p}", file=sys.stderr)
        return 1
    print(f"erasure verified{' for ' + args.batch if args.batch else ''}: {len(checks)} store(s) checked, no "
          f"forgotten raw row left, and no forgotten id in the data, the state or a model")
    for c in checks:
        if c.get("forgotten_rows_at_the_source"):
            print(f"  note: {_source_note(c)}")
    refs = [f"{c['files_naming_forgotten_ids']} file(s) in {c['store']} ({c['path']})" for c in checks
            if c.get("files_naming_forgotten_ids")]
    if refs:
        print(f"  forgotten ids are still named, as references (no row), by the ledger, the tombstones and "
              f"{'; '.join(refs)}; `deletion.hash_sample_ids: true` keeps only salted hashes there")
    return 0


def trainable_ids(params, split: str) -> list[str]:
    """The prepared manifest's ids of `split` a request may still name: neither deleted by a batch (the state
    manifest) nor erased (the tombstones), in manifest order."""
    import pandas as pd

    from unlearning.privacy.erasure import id_key, read_tombstones

    folder = params.path("prepared_dir")
    if not (folder / "manifest.csv").exists():
        raise FileNotFoundError(f"{folder / 'manifest.csv'} not found: run the prepare stage first (`dvc repro "
                                f"prepare` or `unlearn prepare`)")
    m = pd.read_csv(folder / "manifest.csv", dtype=str, keep_default_na=False)
    state = params.path("state_dir") / "manifest.csv"
    deleted = set()
    if state.exists():
        s = pd.read_csv(state, dtype=str, keep_default_na=False)
        deleted = set(s.loc[s["status"] == "deleted", "sample_id"])
    from unlearning.privacy.salt import id_salt

    key = id_key(params.deletion.hash_sample_ids, id_salt(params))
    erased = read_tombstones(params.path("tombstones"))
    return [i for i, sp in zip(m["sample_id"], m["split"])
            if sp == split and i not in deleted and key(i) not in erased]


LOOKUP_DESCRIPTION = """Was a sample id erased, when and by which batch?

With deletion.hash_sample_ids (the default) no store names an erased id in plain text: ID is hashed with the
project's secret salt (base.paths.salt) and looked up in the ledger (the live one and those `unlearn reset`
archived), the tombstones, the live manifest and the inbox. Answers one of: erased (the batch, the request,
the time, and whether it was unlearned or, a validation row, erased without being trained on), erased with no
ledger record here (tombstoned only), pending (named by an inbox file not applied yet, or its erasure not
finished), not erased (a row of the dataset no request named), never seen. If the salt is lost (and not
restored from state/salt) it cannot answer: exit 1, with what to restore. Changes nothing."""


def cmd_lookup(args) -> int:
    from tasks.lookup import lookup

    params = _params(args)
    found = lookup(params.project_paths, params.deletion.hash_sample_ids, args.id)
    if args.json:
        print(json.dumps(found, indent=2, default=str))
        return 0
    print(f"{args.id!r}: {found['message']}")
    for e in found["entries"][:-1]:  # an id erased, reset, then requested again: every record
        print(f"  also: batch {e['batch_id']} at {e['processed_at']} ({e['ledger']})")
    return 0


def cmd_ids(args) -> int:
    params = _params(args)
    ids = trainable_ids(params, args.split)
    shown = ids[:args.head] if args.head is not None else ids
    if args.json:
        print(json.dumps({"split": args.split, "n": len(ids), "ids": shown}, indent=2))
        return 0
    for i in shown:
        print(i)
    if len(shown) < len(ids):
        print(f"({len(shown)} of {len(ids)} {args.split} ids; a request file names them in its sample_id column)",
              file=sys.stderr)
    return 0


def cmd_erase(args) -> int:
    """Finish pending erasures (after `dvc repro`, or a crash), under the batch lock."""
    from flows.common import tracker_for
    from flows.deletion_batch import reconcile
    from adapters.tracking import preflight
    from tasks.state import StateSettings, batch_lock
    from tasks.stores.base import ErasureSettings

    params = _params(args)
    preflight(params.mlflow_tracking_uri())
    _refuse_a_lost_store(params)
    state_dir = params.path("state_dir")
    with batch_lock(params.project_paths, 10):
        notes = reconcile(ErasureSettings.of(params), tracker_for(params), StateSettings.of(params)) \
            if (state_dir / "champion.json").exists() else []
    for n in notes or ["nothing pending"]:
        print(n)
    return 0


def _held_file(name: str, params) -> Path:
    """The held request file `name` names (its name in requests/held/, or a path there); one line, exit 2, when it is
    not held."""
    from tasks.held import held_batches, held_dir, report_path

    folder = held_dir(params.project_paths)
    path = Path(name) if Path(name).parent != Path(".") else folder / name
    if path.resolve().parent != folder.resolve() or not path.is_file() or path.name.endswith(".held.json"):
        held = [h["file"] for h in held_batches(params.project_paths)]
        raise FileNotFoundError(f"{name}: not a held request file in {folder} (held: {held or 'none'}; "
                                f"`unlearn status` lists them)")
    if not report_path(path).exists():
        print(f"note: {path.name} has no {report_path(path).name} (a kill while it was held): approved all the same",
              file=sys.stderr)
    return path


def cmd_approve(args) -> int:
    """`unlearn approve FILE`: the held batch runs again as an exact retrain with the floors off (tasks/held.py
    approval_overrides), is promoted and erased; the file moves to requests/processed/."""
    params = _params(args)
    path = _held_file(args.file, params)
    _preflight_tracking(args)
    from flows.common import prefect_api, tracker_for
    from flows.deletion_batch import report_results, run
    from tasks.held import approval_overrides, record_approval
    from tasks.inbox_ops import RequestFileSettings, processed

    with prefect_api():
        results = run(str(path), args.params, approval_overrides(bool(params.train.sharding.shards)))
    code = report_results(results)
    if code or results[0]["status"] not in ("applied", "already_processed"):
        return code or EXIT_FAILURE
    record_approval(tracker_for(params), params.project_paths, params.tracking, path, results[0])
    dest = processed(path, RequestFileSettings.of(params))
    for r in results:
        print(json.dumps({**{k: v for k, v in r.items() if k != "metrics"}, "approved": True, "moved_to": str(dest)}))
    return 0


def _refuse_a_lost_store(params) -> None:
    """The store the champion was registered in no longer holds it (adapters.store_check.champion_store_problem):
    reconciling would create or change a new registry; one line, exit 2."""
    from adapters.store_check import state_champion_store_problem

    problem = state_champion_store_problem(params)[0]
    if problem:
        raise ConnectionError(problem)


def cmd_audit(args) -> int:
    from adapters.request_check import check_file_for

    # The file's checks first, as `unlearn validate` runs them: a bad file answers in seconds, before the Prefect
    # server starts, and with --json as JSON (the validate --json object).
    params = _params(args)
    fc = check_file_for(_request_file(args.file), params, _live_state(params), gx_when_invalid=False)
    if fc.status == "invalid":
        return print_check(fc, args.json)
    from flows.audit import audit
    from flows.common import prefect_api

    with prefect_api():
        result = audit(args.file, args.params)
    report = result["report"]
    shown = {k: report[k] for k in AUDIT_READING if k in report}
    if args.json:
        print(json.dumps({"run_id": result["run_id"], **shown}, indent=2, default=float))
        return 0
    print(f"leverage diagnostics of the champion for {args.file} (MLflow run {result['run_id']}):")
    for key, value in shown.items():
        print(f"  {key} = {value if isinstance(value, str) else f'{value:.4g}'}")
        print(textwrap.fill(AUDIT_READING[key], width=100, initial_indent="      ", subsequent_indent="      "))
    return 0


# What each number of `unlearn audit` means, its typical range, and what the pipeline does with it (docs/design.md §4.1).
AUDIT_READING = {
    "solver": "How G_R^-1 was applied: exact (a float64 solve, small models), projected (random projection of "
              "per-sample gradients: keeps the ranking, underestimates magnitudes) or cg (matrix-free).",
    "n_forget": "Samples in the proposed forget set.",
    "self_leverage_trace": "trace(S_F): how strongly the forget samples determine their own outputs. Near 0 for "
                           "typical rows the rest of the data explains; grows with the forget set's size and with "
                           "atypical or memorized rows (tracks the original-vs-retrain gap at Spearman 0.88-0.98 on "
                           "the calibration bench's sets).",
    "self_leverage_spectral_norm": "Largest eigenvalue of S_F: near or above 1 means some direction of the forget "
                                   "set is carried almost only by the forget set itself (a whole class, duplicates).",
    "predicted_gap_do_nothing": "Predicted mean output move of the forget samples from the original to a retrain "
                                "without them: what `do_nothing` would leave behind. The policy keeps the model "
                                "(do_nothing) only when this gap is below half the oracles' own spread (measured in "
                                "a batch, not here); otherwise it retrains.",
    "leakage_ratio": "||C_RF g_F|| / ||S_F g_F||: how much of that move lands on retain samples rather than on the "
                     "forget set (0 = none; typical 0.5-3). Both norms vanish for low-leverage sets, so the ratio is "
                     "unstable there; the policy does not use it.",
}


def cmd_methods(args) -> int:
    from unlearning.methods import describe_methods

    for row in describe_methods():
        print(f"{row['name']:<16} {row['summary']}")
        for arg, default in row["args"].items():
            print(f"    {arg} = {default!r}")
    return 0


STATUS_KEYS = ("champion", "state_dir", "retraining_debt", "debt_bounds", "registered_model", "alias", "n_samples",
               "n_deleted", "n_requests", "n_batches", "n_erased", "mlflow_tracking_uri", "notes", "warnings",
               "quality_warnings", "erasure_pending", "held", "feature_columns", "qualified", "resident")


def _state_against_params(params, champion: dict) -> tuple[list[str], str | None]:
    """(warnings, note): whether the next batch can run on state/ with the current params and data. A state
    built from other ones stops the next batch (the warning names what changed), except a state that holds
    no batch yet: that follows the retrained original at the next batch (the note says so), and the registry
    alias must not be moved back to it meanwhile."""
    from unlearning.data import load_prepared
    from unlearning.privacy.fingerprint import describe_mismatch, matches, prepared_fingerprint

    recorded = champion.get("fingerprint")
    if recorded is None or not (params.path("prepared_dir") / "dataset.json").exists():
        return [], None
    prepared = load_prepared(params.path("prepared_dir"))
    current = prepared_fingerprint(params.train, params.base.seed, params.root, prepared.info,
                                   prepared.manifest)  # tasks.state.current_fingerprint
    if matches(recorded, current):
        return [], None
    # torch and Prefect (3-5 s): a mismatch only
    from tasks.state import StateSettings, original_path, stale_unbatched_state

    if stale_unbatched_state(StateSettings.of(params), prepared, current):
        return [], (f"{params.path('state_dir')} holds no batch and was built from other params or data: the next "
                    f"batch starts from the retrained {original_path(params.project_paths)}, and @{params.tracking.alias} "
                    f"follows it then")
    return [f"the next batch will stop: {params.path('state_dir')} was built from other params or data than the "
            f"current ones: {'; '.join(describe_mismatch(recorded, current))}; restore them, or start over with "
            f"`unlearn reset`"], None


def _erasure_pending(params) -> list[str]:
    if not params.erasure.enabled:
        return []
    from functools import partial

    from tasks.pending import pending_erasures  # without the stores' imports (MLflow, DVC, torch)
    from unlearning.privacy.salt import id_salt

    return pending_erasures(params.project_paths, params.deletion, partial(id_salt, params))


def _feature_columns(params) -> dict | None:
    """Which columns feed the model, from dataset.json (a table prepared since it records them), else None."""
    from unlearning.io import read_json_file

    path = params.path("prepared_dir") / "dataset.json"
    info = read_json_file(path) if path.exists() else {}
    if "feature_columns" not in info:
        return None
    source = info.get("source") or {}
    return {"feature_columns": info["feature_columns"], "group_column": source.get("group_column"),
            "group_as_feature": bool(source.get("group_as_feature"))}


def _print_quality_pending_features(status: dict) -> None:
    """The lines of `unlearn status` a newcomer must not miss: what the champion cost, an unfinished erasure and
    which columns feed the model."""
    for w in status["quality_warnings"]:
        print(f"quality warning (champion's batch): {w}")
    for line in status["erasure_pending"]:
        print(f"erasure pending: {line}; run `unlearn erase` to finish it (then `unlearn verify-erasure`)")
    from tasks.held import age_text, serving_line

    version = (status.get("champion") or {}).get("model_version")
    for h in status.get("held", []):
        failed = "; ".join(h["failing_checks"][:2]) or "no candidate passed the gate"
        print(f"held for review {age_text(h['age_seconds'])}: {h['file']} (batch {h['batch_id']}, since "
              f"{h['held_at'][:19]}Z): {failed}; {serving_line(version)}; `{h['approve']}` promotes the exact "
              f"retrain and finishes the erase")
    cols = status["feature_columns"]
    if cols:
        group = cols["group_column"]
        role = "" if not group else (f"; the group column {group!r} is one of them" if cols["group_as_feature"] else
                                     f"; the group column {group!r} is not (prepare.table.group_as_feature: false)")
        print(f"model inputs: {len(cols['feature_columns'])} column(s) {_short_list(cols['feature_columns'])}{role}")


def _short_list(names: list[str], n: int = 12) -> str:
    return "[" + ", ".join(names[:n]) + (f", ... {len(names) - n} more" if len(names) > n else "") + "]"


def cmd_status(args) -> int:
    from flows.resident import status_line  # stdlib only
    from unlearning.data import read_state_manifest
    from unlearning.privacy.erasure import read_tombstones
    from unlearning.privacy.ledger import read_ledger

    params = _params(args)
    state_dir = params.path("state_dir")
    if not (state_dir / "champion.json").exists():
        held = _held(params)
        if args.json:  # the same keys as for a project with a state: a script reads one shape
            print(json.dumps({**dict.fromkeys(STATUS_KEYS), "champion": None, "state_dir": str(state_dir),
                              "notes": [], "warnings": [], "mlflow_tracking_uri": params.mlflow_tracking_uri(),
                              "quality_warnings": [], "erasure_pending": [], "held": held,
                              "feature_columns": _feature_columns(params), "resident": _resident(params)}, indent=2))
        else:
            print(f"no batch processed yet ({state_dir} is empty); run `make run` or `unlearn run`")
            for h in held:
                print(f"held for review: {h['file']}; `{h['approve']}` promotes the exact retrain")
            print(status_line(params.root))
        return EXIT_HELD if held else 0
    from unlearning.io import read_json_file

    champion = read_json_file(state_dir / "champion.json")
    notes, warnings, follows_original = [], *_state_against_params(params, champion)
    from adapters.store_check import alias_in_sync, state_champion_store_problem

    problem, note = (None, None) if follows_original else state_champion_store_problem(params)
    if follows_original:
        notes.append(follows_original)
    elif problem:  # shown (also when mlflow.db is gone), and nothing reconciled into a store not the champion's
        warnings.append(problem.replace("; nothing was changed", ""))
    elif alias_in_sync(params, champion.get("model_version")):  # the local store's alias, read without MLflow
        if note:
            notes.append(note)
    elif os.environ.get("MLFLOW_TRACKING_URI") or params.path("mlflow_db").exists():
        from flows.common import tracker_for
        from adapters.tracking import preflight

        preflight(params.mlflow_tracking_uri())  # state/ decides: the alias follows champion.json
        if note:
            notes.append(note)
        before, changed = tracker_for(params).reconcile_alias(params.tracking.registered_model, params.tracking.alias,
                                                              champion.get("model_version"))
        if changed:
            notes.append(f"reconciled @{params.tracking.alias}: v{before} -> v{champion.get('model_version')}")
    manifest = read_state_manifest(state_dir / "manifest.csv")
    ledger = read_ledger(state_dir / "ledger.jsonl")
    from unlearning.policy.history import n_original_train, retraining_debt

    debt = retraining_debt(ledger, n_original_train(manifest, ledger))
    status = {"champion": champion, "state_dir": str(state_dir), "retraining_debt": debt,
              "debt_bounds": params.deletion.debt.model_dump(), "registered_model": params.tracking.registered_model,
              "alias": params.tracking.alias, "n_samples": len(manifest),
              "n_deleted": int((manifest["status"] == "deleted").sum()), "n_requests": len(ledger),
              "n_batches": len({e["batch_id"] for e in ledger}),
              "n_erased": len(read_tombstones(params.path("tombstones"))),
              "mlflow_tracking_uri": params.mlflow_tracking_uri(), "notes": notes, "warnings": warnings,
              "quality_warnings": champion.get("quality_warnings", []), "erasure_pending": _erasure_pending(params),
              "held": _held(params), "feature_columns": _feature_columns(params),
              "qualified": _qualified_status(params), "resident": _resident(params)}
    assert set(status) == set(STATUS_KEYS)
    code = EXIT_ERASE_UNFINISHED if status["erasure_pending"] else EXIT_HELD if status["held"] else 0
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return code
    for note in notes:
        print(note)
    for warning in warnings:
        print(f"warning: {warning}")
    print(f"champion: {status['registered_model']} v{champion['model_version']} (@{status['alias']}), "
          f"method {champion['method']}, batch {champion['batch_id']}")
    print(f"manifest: {status['n_samples']} samples, {status['n_deleted']} deleted; ledger: {status['n_requests']} "
          f"request(s) in {status['n_batches']} batch(es); erased (tombstoned): {status['n_erased']}")
    bounds = params.deletion.debt
    print(f"retraining debt: {debt['batches_since_retrain']} approximate batch(es) and "
          f"{debt['forgotten_since_retrain']} sample(s) ({debt['forgotten_fraction_since_retrain']:.2%} of the "
          f"{debt['n_train']} original training rows) since the last exact retrain; bounds: "
          f"max_batches_since_retrain {bounds.max_batches_since_retrain}, "
          f"max_forgotten_fraction {bounds.max_forgotten_fraction} (deletion.debt); licensed with the model unchanged: "
          f"{debt.get('licensed_since_retrain', 0)} row(s) (licensing.max_debt_rows {params.licensing.max_debt_rows})")
    _print_quality_pending_features(status)
    from unlearning.certificate.qualification import audit_lines

    for line in audit_lines(status["qualified"]):
        print(line)
    for p in champion.get("history", [])[-5:]:
        print(f"  batch {p['step']}: {p['request_file']} -> {p['method']} v{p['model_version']}, forgotten "
              f"{p['forgotten_fraction']:.2%} in all, validation accuracy {p['champion_validation_accuracy']:.3f}, "
              + ("licensed: model unchanged" if p.get("licensed") else
                 f"output gap to oracles {p['champion_output_gap']:.4f}" if p['champion_output_gap'] == p['champion_output_gap']
                 else "exact (no oracles trained)"))
    from flows.common import ui_route

    print(f"MLflow store: {status['mlflow_tracking_uri']}; UI: {ui_route(params, '#/experiments')} (the batch runs: "
          f"the link each batch prints at its end)")
    print(status_line(params.root))
    if code == EXIT_ERASE_UNFINISHED:
        print(f"error: an erase is unfinished ({len(status['erasure_pending'])} line(s) above): `unlearn erase` "
              f"finishes it (exit {code})", file=sys.stderr)
    elif code == EXIT_HELD:
        print(f"error: {len(status['held'])} batch(es) held for review: their rows are not erased yet; `unlearn "
              f"approve FILE` promotes the exact retrain and finishes the erase (exit {code})", file=sys.stderr)
    return code


def _held(params) -> list[dict]:
    from tasks.held import held_batches  # stdlib: without torch

    return held_batches(params.project_paths)


def _resident(params) -> dict | None:
    """`unlearn up`'s resident server and worker of this project (flows/resident.py), without its folder."""
    from flows.resident import read

    info = read(params.root)
    return None if info is None else {k: info[k] for k in ("pid", "api_url", "started", "idle_s") if k in info}


def _qualified_status(params) -> dict:
    """validation.mode qualified: the versions not audited yet and the audit history (state/audits.jsonl)."""
    from tasks.pending import read_audits  # without the certificate's imports (torch, Prefect)
    from unlearning.certificate.qualification import audit_status

    return audit_status(read_audits(params.project_paths))


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


def _finish_pending_erasures(params) -> int:
    """What `unlearn erase` does, before `unlearn reset` archives the state: inside `dvc repro` the erasure of
    models/original.pt (replaced by the champion) and of the prepared store is left pending, and once state/
    is archived no champion is left to replace the original with. A fresh state would then start from the
    original the erased rows were forgotten from. Returns how many pending erasures were finished."""
    champion_file = params.path("state_dir") / "champion.json"
    if not params.erasure.enabled or not champion_file.exists():
        return 0
    from tasks.erasure import erase_pending
    from tasks.state import batch_lock
    from tasks.stores.base import ErasureSettings
    from unlearning.io import read_json_file

    tracker = None
    if _has_tracking_store(params):
        from flows.common import tracker_for

        tracker = tracker_for(params)
    with batch_lock(params.project_paths, 10):
        return len(erase_pending(ErasureSettings.of(params), tracker,
                                 read_json_file(champion_file).get("model_version")))


def _has_tracking_store(params) -> bool:
    """A tracking server named by MLFLOW_TRACKING_URI, or the project's SQLite store once it exists."""
    return bool(os.environ.get("MLFLOW_TRACKING_URI")) or params.path("mlflow_db").exists()


def cmd_reset(args) -> int:
    from unlearning.privacy.ledger import read_ledger

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

    from tasks.state import StateSettings, archive_state, original_path, original_version_if_current
    from unlearning.io import LockTimeout

    try:
        try:
            finished = _finish_pending_erasures(params)
        except LockTimeout:
            raise
        except Exception as e:  # a damaged state (reset is its documented fix): the archive goes on, and no
            # state starts from an original that holds tombstoned rows (tasks/state.py refuses it, with the fix)
            finished = 0
            print(f"erasure: could not finish the pending erasure first ({type(e).__name__}: {e}); if "
                  f"{original_path(params.project_paths)} was trained on the erased rows, the next batch refuses to start from "
                  f"it and says how to retrain it without them")
        result = archive_state(params.project_paths)
    except LockTimeout as e:
        print(f"error: a deletion batch is running ({e}); nothing changed, try again when it ends", file=sys.stderr)
        return 2
    if finished:
        print(f"erasure: finished {finished} pending erasure(s) first (`unlearn erase`): {original_path(params.project_paths)} is "
              f"now the champion, clean of the erased rows, so the fresh state starts from a model without them")
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
    original_version = original_version_if_current(StateSettings.of(params))
    rc = 0
    name, alias = params.tracking.registered_model, params.tracking.alias
    if args.keep_alias:
        print(f"MLflow: {name}@{alias} left as is (--keep-alias); it is not rolled back automatically")
    elif not _has_tracking_store(params):
        print(f"MLflow: no store at {params.path('mlflow_db')}; no @{alias} alias to change")
    else:
        from adapters.tracking import reset_alias

        try:
            before, after, missing = reset_alias(params.mlflow_tracking_uri(), name, alias, original_version)
        except Exception as e:  # the store is unreachable: the archive is done, say what is left
            print(f"MLflow: could not change {name}@{alias} ({e}); move or remove it by hand")
            rc = 1
        else:
            was = f"was v{before}" if before else "was unset"
            if missing:
                print(f"MLflow: v{original_version}, the trained original, is no longer in the registry (an erasure "
                      f"purged it: it was trained on erased rows); "
                      + (f"removed {name}@{alias} ({was})" if before else f"{name} has no @{alias}")
                      + "; the next promoted batch or `unlearn train` sets it")
            elif after:
                print(f"MLflow: {name}@{alias} now points to v{after}, the version of {original_path(params.project_paths)} ({was})")
            elif before:
                print(f"MLflow: removed {name}@{alias} ({was}); the next promoted batch or `unlearn train` sets it")
            else:
                print(f"MLflow: {name} has no @{alias}; nothing to change")
    if original_version is None:
        print(f"next: `dvc repro` (or `unlearn prepare`, `unlearn train`, `unlearn run`): {original_path(params.project_paths)} is "
              f"missing or was trained from other params")
    else:
        print(f"next: `unlearn run` (or `dvc repro`) builds a new state from {original_path(params.project_paths)} and the "
              f"current params")
    return rc


def cmd_up(args) -> int:
    from flows.resident import up

    return up(Path(args.params).resolve().parent, args.idle_minutes)


def cmd_down(args) -> int:
    from flows.resident import down

    return down(Path(args.params).resolve().parent)


def cmd_ui(args) -> int:
    """`unlearn ui`: the MLflow UI over this project's store, on the page that opens an experiment on its batch runs
    (adapters/mlflow_ui.py), in the foreground until Ctrl-C. A tracking server serves its own UI: its address."""
    from adapters.mlflow_ui import APP_NAME, APP_PATH, experiment_id, port_problem, ui_argv
    from adapters.store_check import sqlite_file
    from unlearning.config import is_tracking_server, load_params

    params = load_params(args.params)
    uri = params.mlflow_tracking_uri()
    if is_tracking_server(uri):
        print(f"the tracking server serves its own UI: open {uri.rstrip('/')}/")
        return 0
    db = sqlite_file(uri)
    if db is not None and not db.exists():
        raise FileNotFoundError(f"no MLflow store at {db} yet: run `unlearn repro` (or `unlearn train`) first, "
                                f"then `unlearn ui`")
    problem = port_problem(args.host, args.port)
    if problem:
        raise ConnectionError(problem)
    eid = experiment_id(db, params.tracking.experiment) if db is not None else None
    from adapters.tracking import batches_url_hint, run_mlflow_server

    page = batches_url_hint(eid) if eid is not None else "#/experiments"
    print(f"MLflow UI of {uri}: http://{args.host}:{args.port}/{page} (the batch runs; Ctrl-C stops it)", flush=True)
    run_mlflow_server(ui_argv(uri, params.path("mlflow_artifacts"), args.host, args.port), APP_NAME, APP_PATH)
    return 0


def _cmd_plan(args) -> int:
    from flows.plan_cli import cmd_plan

    return cmd_plan(args)


def cmd_repro(args) -> int:
    """`unlearn repro [TARGET]`: `dvc repro [TARGET]`, `unlearn erase` and `unlearn status` in one session (one
    temporary Prefect server and one warm worker for every stage and command: flows/session.py), run from the
    folder of the params file. Plain `dvc repro` does the same work (each stage joins one session per run);
    this adds the erasure `dvc repro` leaves pending and the status, as `make run` does."""
    from flows.session import main as session

    bindir = Path(sys.executable).parent
    dvc = str(bindir / "dvc") if (bindir / "dvc").exists() else "dvc"
    unlearn = [str(bindir / "unlearn")] if (bindir / "unlearn").exists() else [sys.executable, "-m", "flows.cli"]
    folder = Path(args.params).resolve().parent
    params = ["--params", Path(args.params).name] if Path(args.params).name != "params.yaml" else []
    if folder != Path.cwd():
        print(f"unlearn repro: in {folder}", flush=True)
        os.chdir(folder)
    target = [args.target] if args.target else []
    return session([dvc, "repro", *target, "--then", *unlearn, *params, "erase", "--then", *unlearn, *params,
                    "status"])


def _column_list(value: str) -> list[str]:
    cols = [c.strip() for c in value.split(",") if c.strip()]
    if not cols:
        raise argparse.ArgumentTypeError("expected column names separated by commas, e.g. age,income")
    return cols


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= 1")
    return int(text)


def cmd_init(args) -> int:
    from flows.scaffold import scaffold

    for line in scaffold(args.dir, args.dataset, args.path, id_column=args.id_column, label_column=args.label_column,
                         group_column=args.group_column, feature_columns=args.feature_columns,
                         split_column=args.split_column, arch=args.arch, factory=args.factory, vcs=not args.no_vcs,
                         shard_by=args.shard_by, shards=args.shards, slices=args.slices):
        print(line)
    return 0


# Subcommands without options of their own: (help, description, examples).
SIMPLE = {
    "prepare": ("prepare the dataset (stage prepare)",
                "Load the dataset named by prepare.dataset, give every sample its stable id, and write the prepared "
                "store (memory-mapped features, manifest, dataset.json) to base.paths.prepared_dir.",
                ["unlearn prepare", "unlearn prepare --params myproj/params.yaml"]),
    "train": ("train and register the original model (stage train)",
              "Train the original with the declared recipe (or load train.init_checkpoint), log it to MLflow and "
              "register it as the first @champion.", ["unlearn train"]),
    "methods": ("list unlearning methods with their arguments",
                "Every registered unlearning method, its one-line summary and its arguments with their defaults "
                "(set them under deletion.method_args.<method>).", ["unlearn methods"]),
    "erase": ("finish pending erasures (after `dvc repro`, or a crash)",
              "Finish an erase a kill stopped between two stores (its journal says which are done), and rewrite the "
              "stores a running `dvc repro` could not rewrite (prepared data, the original), re-commit the DVC "
              "stages and garbage-collect the DVC cache, under the batch lock.",
              ["unlearn erase", "dvc repro && unlearn erase && unlearn verify-erasure"]),
    "serve": ("serve scheduled and inbox-triggered deployments",
              "Serve the `scheduled` (operations.cron) and `on-request-file` deployments and watch the inbox. Needs "
              "a reachable PREFECT_API_URL (`make server`).", ["PREFECT_API_URL=http://127.0.0.1:4200/api unlearn serve"]),
}


def _examples(lines: list[str]) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="unlearn", description="MLOps pipeline for machine unlearning: validate deletion "
                                "batches, diagnose leverage, unlearn, validate against oracle retrains, gate, log.",
                                epilog=EPILOG, formatter_class=raw)
    p.add_argument("--params", default="params.yaml", help="params.yaml to use (default: ./params.yaml)")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    # The same global options after the subcommand too (`unlearn status --params X`): SUPPRESS keeps the value
    # given before the subcommand unless one is given after it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--params", default=argparse.SUPPRESS, help="params.yaml to use (default: ./params.yaml)")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of an error")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, help_, description, examples, **kw):
        return sub.add_parser(name, help=help_, description=textwrap.fill(description, 100),
                              epilog=_examples(examples),
                              formatter_class=raw, parents=[common], **kw)

    s = add("run", "process deletion request files (all in the inbox, or one)",
            "Process every request file in the inbox in name order (or one file): validate, diagnose, partition, "
            "unlearn, certify against oracle retrains, promote, erase. Applied files move to requests/processed/, "
            "rejected ones to requests/rejected/ with an error report.",
            ["unlearn run", "unlearn run requests/inbox/2026-12-01T0900_erasure.csv"])
    s.add_argument("request", nargs="?", help="one request file (CSV or Parquet); default: every file in the inbox")
    s.set_defaults(fn=cmd_run)
    for name, (help_, description, examples) in SIMPLE.items():
        add(name, help_, description, examples).set_defaults(fn=globals()[f"cmd_{name}"])
    s = add("repro", "dvc repro, then unlearn erase and unlearn status, with one Prefect server for all",
            "The whole job for a project: `dvc repro [TARGET]` (prepare, train, every request file in the inbox), "
            "then `unlearn erase` (what a running `dvc repro` leaves pending) and `unlearn status`, with one "
            "temporary Prefect server and one warm worker that imports the pipeline once (python -m flows.session; "
            "`make run` is this for the digits demo). Stops at the first command that fails, with its exit code.",
            ["unlearn repro", "unlearn repro deletion", "cp erase_these.csv requests/inbox/ && unlearn repro"])
    s.add_argument("target", nargs="?", metavar="TARGET", help="a stage of dvc.yaml (default: every stage)")
    s.set_defaults(fn=cmd_repro)
    s = add("plan", "the plan a batch of a request file would follow, before anything runs",
            "Check the file, select the candidates as the batch would, time a one-epoch probe of the model on this "
            "machine or device, and print the plan: the candidates in order and how each is certified, the models "
            "it trains, the predicted seconds per stage (and in units of one retrain) and the predicted peak memory "
            "against validation.memory_mb. Changes nothing; exit 2 for a bad file or a plan that cannot fit.",
            ["unlearn plan requests/inbox/2026-12-01T0900_erasure.csv", "unlearn plan FILE --json"])
    s.add_argument("file", help="the request file (CSV or Parquet)")
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    s.set_defaults(fn=_cmd_plan)
    s = add("up", "keep a Prefect server and a warm worker running for this project (batches skip their start)",
            "Start a Prefect server and a warm worker (the pipeline imported once) for this project, in the "
            "background: every later `unlearn repro`, `make run`, `dvc repro` stage and `unlearn` command here uses "
            "them instead of starting its own, so a batch costs its compute and not 10-30 s of start-up. They stop "
            "after --idle-minutes without a command, or with `unlearn down`; `unlearn status` shows them.",
            ["unlearn up && unlearn repro", "unlearn up --idle-minutes 120", "unlearn down"])
    s.add_argument("--idle-minutes", type=float, default=30.0, metavar="M",
                   help="stop after M minutes without a command (default 30)")
    s.set_defaults(fn=cmd_up)
    add("down", "stop this project's resident Prefect server and warm worker (`unlearn up`)",
        "Stop the resident server and worker `unlearn up` started for this project, once the command running in "
        "them (if any) ends.", ["unlearn down"]).set_defaults(fn=cmd_down)
    s = add("ui", "the MLflow UI over this project's store, opening on the batch runs",
            "Serve the MLflow UI over this project's tracking store (base.paths.mlflow_db, or MLFLOW_TRACKING_URI) on "
            "127.0.0.1, with the page script that opens an experiment on its batch runs (method, verdict, model "
            "version columns) rather than MLflow's GenAI overview; prints the link to the batch runs and runs until "
            "Ctrl-C. Against a tracking server it prints the server's address (it serves its own UI).",
            ["unlearn ui", "unlearn ui --port 5001", "unlearn --params myproj/params.yaml ui"])
    s.add_argument("--port", type=_positive_int, default=5000, help="the port on 127.0.0.1 (default 5000)")
    s.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)  # loopback: the store has no login
    s.set_defaults(fn=cmd_ui)
    s = add("validate", "validate a request file without changing anything",
            "Check a request file exactly as `unlearn run` would (schema, ids in the manifest, not deleted, ledger "
            "conflicts, timestamps; validation rows are counted: erased, not unlearned); print one line per problem. An already processed file is "
            "'nothing to do'. Changes nothing.", ["unlearn validate requests/inbox/x.csv", "unlearn validate x.csv --json"])
    s.add_argument("file", help="the request file (CSV or Parquet) to check")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(fn=cmd_validate)
    s = add("audit", "leverage diagnostics for a proposed forget set, without changing anything",
            "Compute the leverage diagnostics (self-leverage, cross-leverage, predicted output gap) of the current "
            "champion for the samples a request file names, log them to MLflow, and explain each number. No model "
            "changes.", ["unlearn audit requests/inbox/x.csv", "unlearn audit x.csv --json"])
    s.add_argument("file", help="a request file naming the proposed forget set")
    s.add_argument("--json", action="store_true", help="print the diagnostics as JSON")
    s.set_defaults(fn=cmd_audit)
    s = sub.add_parser("approve", help="promote a batch held for review (requests/held/FILE) and finish its erase",
                       description=APPROVE_DESCRIPTION, formatter_class=raw, parents=[common],
                       epilog=_examples(["unlearn status   (lists the held files and their age)",
                                         "unlearn approve 2026-12-01T0900_erasure.csv"]))
    s.add_argument("file", metavar="FILE", help="the held request file: its name in requests/held/, or its path")
    s.set_defaults(fn=cmd_approve)
    s = add("status", "show the champion, the deletions and the ledger",
            "The champion model (and its registry alias, reconciled with state/champion.json), the manifest's "
            "deleted and erased samples, and the ledger.", ["unlearn status", "unlearn status --json"])
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    s.set_defaults(fn=cmd_status)
    s = add("ids", "list the sample ids a request may name (not deleted, not erased)",
            "Print the prepared manifest's sample ids of one split, one a line, leaving out those a batch deleted and "
            "those erased: the ids a request file can name in its sample_id column (training rows are unlearned; "
            "validation rows, --split val, are erased without unlearning: docs/requests.md).",
            ["unlearn ids --split train --head 5", "unlearn ids --split val --json"])
    s.add_argument("--split", choices=["train", "val"], default="train", help="which split (default: train)")
    s.add_argument("--head", type=int, metavar="N", help="only the first N ids")
    s.add_argument("--json", action="store_true", help="print {split, n, ids} as JSON")
    s.set_defaults(fn=cmd_ids)
    s = add("verify-erasure", "re-check every store for forgotten raw rows and ids (exit 1 if any)",
            "Search every store (prepared data, models, state, ensemble cache, MLflow artifacts, DVC cache) for the "
            "raw rows and ids of forgotten samples; exit 1 if any remains.",
            ["unlearn verify-erasure", "unlearn verify-erasure batch-5fac2b38cf2d"])
    s.add_argument("batch", nargs="?", metavar="BATCH", help="one batch id (default: every batch in the ledger)")
    s.set_defaults(fn=cmd_verify_erasure)
    s = sub.add_parser("lookup", help="was this sample id erased, when and by which batch (from its salted hash)",
                       description=LOOKUP_DESCRIPTION, formatter_class=raw, parents=[common],
                       epilog=_examples(["unlearn lookup digits-0003", "unlearn lookup alice@example.com --json"]))
    s.add_argument("id", metavar="ID", help="the sample id as your data writes it (a user id, an e-mail address)")
    s.add_argument("--json", action="store_true", help="print the answer as JSON (status, key, ledger records)")
    s.set_defaults(fn=cmd_lookup)
    s = sub.add_parser("reset", help="start over: archive state/ and cache/ (the ledger is kept), after a prompt",
                       description=RESET_DESCRIPTION, epilog=RESET_EPILOG, formatter_class=raw, parents=[common])
    s.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (needed without a terminal)")
    s.add_argument("--keep-alias", action="store_true",
                   help="leave the MLflow registry alias (tracking.alias) where it is")
    s.set_defaults(fn=cmd_reset)
    s = sub.add_parser("init", help="scaffold a project folder for your own data (table or image folder)",
                       description=INIT_DESCRIPTION, epilog=INIT_EPILOG, formatter_class=raw, parents=[common])
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
    s.add_argument("--arch", choices=["mlp", "cnn", "resnet", "custom"], default="mlp",
                   help="model (train.model.arch): the built-in MLP (default), a CNN or a ResNet (images), or your "
                        "own factory (--factory)")
    s.add_argument("--factory", metavar="MODULE:FUNCTION",
                   help="--arch custom: the function that builds the model, e.g. my_model:build")
    s.add_argument("--shard-by", metavar="C",
                   help="table: train the original sharded by this column (a customer or user id; docs/sharding.md): "
                        "deleting one customer's rows retrains one shard, exactly (method sisa)")
    s.add_argument("--shards", type=_positive_int, default=10, metavar="S", help="--shard-by: constituents (default 10)")
    s.add_argument("--slices", type=_positive_int, default=4, metavar="R",
                   help="--shard-by: slices per shard, a checkpoint after each (default 4)")
    s.add_argument("--no-vcs", action="store_true", help="skip `git init` and `dvc init`")
    s.set_defaults(fn=cmd_init)
    return p


# Commands that do not read params.yaml; every other one checks it first, before any heavy import or server,
# so a config error answers in about a second.
NO_PARAMS = {"init", "methods"}
COMPUTES = {"run", "prepare", "train", "audit", "serve"}  # the commands that run models on base.device


# never run in a resident worker (flows/resident.py): `repro` starts its session here, which then uses it
NOT_FORWARDED = {"init", "up", "down", "ui", "methods", "repro"}


def _resident_project(argv: list[str]) -> str | None:
    """The project folder of a command line whose command a resident worker may run (`unlearn up`), else None."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or any(w in NOT_FORWARDED for w in words[:2]):
        return None
    path = "params.yaml"
    for i, a in enumerate(argv):
        if a == "--params" and i + 1 < len(argv):
            path = argv[i + 1]
        elif a.startswith("--params="):
            path = a.split("=", 1)[1]
    return str(Path(path).resolve().parent)


def main(argv: list[str] | None = None) -> int:
    from flows.warm import ENV_SOCKET, forward  # stdlib only

    from flows import warm

    if (argv is None and not warm.IN_CHILD and not os.environ.get(ENV_SOCKET)
            and (project := _resident_project(sys.argv[1:]))):
        from flows.session import use_resident  # `unlearn up`: this project's resident server and worker

        use_resident(os.environ, project)
    if argv is None and os.environ.get(ENV_SOCKET):  # inside `python -m flows.session`: its warm worker
        code = forward("flows.cli:main", sys.argv[1:])
        if code is not None:
            return code
    try:
        return _main(argv)
    finally:  # `make run`'s session times every command (adapters/clock.py); nothing is written outside it
        from adapters import clock

        clock.write_record(clock.stage_label("flows.cli:main"))


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.debug:
        os.environ[ENV_DEBUG] = "1"  # Prefect's console keeps the tracebacks too (flows.errors.KnownErrorsOnce)
    try:
        if args.command not in NO_PARAMS:
            from unlearning.config import ConfigError, device_problem, load_params

            params = load_params(args.params)
            problem = device_problem(params.base) if args.command in COMPUTES else None
            if problem:  # before a server starts or torch is imported
                raise ConfigError(problem)
            _settle_interrupted_swaps(params)
            from tasks.rekey import ensure_current_key

            ensure_current_key(params)  # an older project's salted ids re-keyed once, before any id is compared
        return args.fn(args)
    except BrokenPipeError:  # `unlearn status | head -1`: the reader left; no message, as for any Unix tool
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's flush at exit must not fail on the closed pipe again
        return EXIT_FAILURE
    except Exception as e:
        code = exit_code(e)
        if code is None or args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        if getattr(args, "json", False):  # a `--json` reader gets JSON on stdout whatever happened
            print(json.dumps({"error": str(e), "exit_code": code}))
        return code


if __name__ == "__main__":
    sys.exit(main())
