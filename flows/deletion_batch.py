"""Flow `deletion_batch`: one deletion request file through the whole pipeline (docs/design.md §1).

validate -> partition -> diagnose -> select -> unlearn -> validate against oracles -> gate
-> promote (MLflow alias) -> append to the ledger -> update the manifest.
All or nothing: the new state is written to a staging folder and swapped in only after the gate passed
and the model was registered; any failure leaves the previous model, manifest and ledger standing.
This module puts the steps in order; the stages are in tasks/stages.py, the batch's path to its accepted
outcome in tasks/batch_path.py, the operations around the batches (preflight, reconcile, processed/) in
tasks/inbox_ops.py.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from prefect import flow

from flows.common import (
    base_parser, device_of, params_or_exit, prefect_api, task_runner_for, tracker_for, ui_hint, use_project_path,
)
from flows.common import deletion_run_name
from flows.errors import EXIT_BAD_INPUT, EXIT_GATE_REJECTED, EXIT_HELD, one_line_errors
from flows.intake import reject  # noqa: F401  (one writer of <name>.error.json; tests and flows import it from here)
from tasks import stages as S
from adapters.dvc_metrics import write_deletion_metrics
from tasks.batch_path import (  # noqa: F401  (tests, benches and `unlearn` import these names from here)
    BatchCounts, apply_not_trained_on, check_file, diagnose_and_partition, diagnostics_unused, erase_batch,
    mark_qualified, open_batch, plan_and_run, qualified_mode, qualified_run, run_name, split_requests,
    wants_diagnostics,
)
from tasks.inbox_ops import (  # noqa: F401  (process_inbox_file looks `processed` up here: tests replace it)
    RequestFileSettings, _expire_request_files, preflight, processed, reconcile, reconcile_if_started,
    redact_erased_ids, resume_erasure,
)
from tasks.batch_settings import BatchSettings
from tasks.licensed_batch import licensed_path
from tasks.lineage import commit_lineage
from tasks.quality import BatchRejected, announce_quality  # a quality refusal is a rejection too
from tasks.reporting import run_logger
from tasks.state import StateSettings, batch_lock, ensure_state, load_state, original_path
from tasks.stores.base import ErasureSettings
from unlearning.config import Params, load_params
from unlearning.io import open_for_writing
from unlearning.batch.records import BatchResult
from unlearning.requests import (
    RequestValidationError, file_sha256, in_inbox, leftover_dot_files, read_request_file, scan_inbox,
)
from unlearning.policy.selection import check_method_config


class AfterCommitError(RuntimeError):
    """A failure after the batch was committed to state/: the batch IS applied; the message says what is not."""


def run_candidates(batch, settings: BatchSettings, state, diagnosed, objective: str, counts):
    """The batch's candidates: the qualified licence (validation.mode qualified), or the plan's steps; (outcome,
    the qualified licence or None)."""
    if qualified_mode(settings.validation, objective):
        return qualified_run(batch, settings, state, diagnosed.rows, objective, diagnosed.report, counts)
    return plan_and_run(batch, settings, state, diagnosed, objective, counts), None


def process_request_file(path: Path, params: Params, device: str) -> BatchResult:
    """One request file through the pipeline (the diagram in tasks/stages.py), all or nothing: validate -> split
    -> licensed inaction (tasks/licensed_batch.py) or diagnose and partition -> run (the plan's steps, or the
    qualified licence) -> quality -> promote -> audit (qualified mode, when due) -> erase -> finish."""
    started = time.perf_counter()
    state = load_state(StateSettings.of(params), device)
    check = check_file(path, params, state)
    if check.status == "already_processed":
        run_logger().info(check.summary())
        return BatchResult(path.name, "already_processed")
    pending = check.pending if check.pending is not None else read_request_file(path)
    settings = BatchSettings.of(params)  # what the batch's stages read, built once (tasks/batch_settings.py)
    batch = open_batch(path, settings, tracker_for(params), state, pending, device, started)
    try:
        requests, objective, invalid = S.validate(batch, check, pending, settings.deletion.objective)
        if invalid is not None:
            raise invalid
        state, requests, forget_ids = split_requests(batch, settings, state, requests, objective)
        if not forget_ids:  # validation rows only: erased, nothing to unlearn, no new model version
            return apply_not_trained_on(batch, settings, state, requests, objective)
        counts = BatchCounts.of(state)  # the state the batch computes on: counted once, read by every step
        licensed, settings = licensed_path(batch, settings, state, requests, forget_ids, objective, counts)
        if licensed is not None:  # licensed inaction (docs/design.md §4.9): the model unchanged, the rows erased
            return licensed
        diagnosed = diagnose_and_partition(batch, settings, state, forget_ids, objective, counts)
        outcome, licensing = run_candidates(batch, settings, state, diagnosed, objective, counts)
        rows = diagnosed.rows
        quality = announce_quality(batch, outcome, state, rows, params.quality)  # said out loud; refused if declared
        promoted = S.promote(batch, settings, state, requests, objective, outcome, rows, counts.n_train,
                             warnings=quality)
        if licensing is not None:
            mark_qualified(batch, settings.tracking, settings.paths, promoted.version, outcome.method, licensing)
            if licensing.audit_due and licensing.qualifies(outcome.method):
                from flows.qualify import audit_after_promotion  # its own flow run; the alias has moved

                promoted = audit_after_promotion(batch, params, settings, state, rows, objective, outcome.method,
                                                 licensing, promoted, requests, device)
        erasure = erase_batch(batch, settings, requests["sample_id"].tolist(), promoted.version)
        S.finish(batch, outcome, promoted, erasure)
    except BaseException as e:
        # no candidate passed: the batch is held for a person, never refused (tasks/held.py)
        S.fail(batch, e, rejected=isinstance(e, BatchRejected), held=isinstance(e, BatchRejected))
        if batch.committed:  # say what was applied and what was not
            raise AfterCommitError(f"{path.name}: batch {batch.batch_id} WAS applied (state/ holds the new model, "
                                   f"manifest and ledger); what failed afterwards is not: {type(e).__name__}: {e}. "
                                   f"The next run reconciles the registry alias and finishes the erasure") from e
        raise
    return BatchResult(path.name, "applied", batch.batch_id, outcome.method, promoted.version, batch.parent,
                       outcome.tracked_metrics())


def files_to_process(request_path: str | None, inbox: Path) -> list[Path]:
    """Every inbox file in name order; for a triggered run, the inbox files up to and including its own.

    Name order is arrival order (name request files with a sortable timestamp prefix). A run triggered by
    file c that starts before the run for an earlier file b processes b first, and b's own run then finds
    nothing left to do: batches apply in order, each exactly once, whatever order the runs start in."""
    pending = scan_inbox(inbox)[0]
    if request_path is None:
        return pending
    path = Path(request_path)
    if path.resolve().parent != inbox.resolve():
        return [path]
    # (a file already moved to processed/ or rejected/ by an earlier run, or an entry scan_inbox refused, is
    # not processed again)
    return [p for p in pending if p.name <= path.name]


@flow(name="deletion_batch", flow_run_name=deletion_run_name)  # `deletion <request file>` in the Prefect UI
def deletion_batch(request_path: str | None = None, params_path: str = "params.yaml",
                   overrides: dict | None = None, dvc_commit: bool = False) -> list[BatchResult]:
    """Process one request file, or (without `request_path`) every file in the inbox, in name order.

    Holds the pipeline's batch lock throughout: one batch per model at a time. Deployment runs pass
    `dvc_commit=True` to record the new state in the DVC cache (dvc repro does that itself).
    Inbox files: applied ones move to requests/processed/, rejected ones (validation or gate) to
    requests/rejected/ with <name>.error.json, and the later files proceed. A file outside the inbox is never
    moved; its rejection raises."""
    params = load_params(params_path, overrides)
    check_method_config(params.deletion)
    use_project_path(params)
    device = device_of(params)
    preflight(params)
    log = run_logger()
    state_dir, inbox = params.path("state_dir"), params.path("inbox")
    with batch_lock(params.project_paths, params.operations.lock_timeout_seconds):
        erasure = ErasureSettings.of(params)
        for note in resume_erasure(erasure):  # an erase a kill stopped: finished before anything reads the state
            log.info(note)
        # A state that holds no batch and was built from other params or data follows the retrained original
        # (ensure_state rewrites only such a state), before the registry alias is reconciled with it.
        if (state_dir / "model.pt").exists() and ensure_state(StateSettings.of(params), device):
            log.info(f"{state_dir} held no batch and was built from other params or data: it now starts from "
                     f"the retrained {original_path(params.project_paths)}")
        for note in reconcile_if_started(erasure, StateSettings.of(params), resume=False):
            log.info(note)
        in_scope = request_path is None or in_inbox(Path(request_path), inbox)
        if in_scope:
            report_leftover_dot_files(inbox)
        results = reject_unreadable_entries(inbox, params) if in_scope else []
        results += [process_inbox_file(f, params, device, inbox) for f in files_to_process(request_path, inbox)]
        created = ensure_state(StateSettings.of(params), device)  # every file rejected on a first run: the state (a DVC output) exists
        if all(r.get("reason") == "not a request file" for r in results):  # no request file was among them
            log.info(f"no request files in {inbox}; nothing to do"
                     + ("; state initialised from the trained original" if created else ""))
        write_deletion_metrics(params.project_paths)
        if dvc_commit and params.operations.dvc_commit and any(r["status"] == "applied" for r in results):
            commit_applied(params, results)
    log.info(ui_hint(params, tracker_for(params).batches_url_hint() if results else ""))
    return final_state(results)


def final_state(results: list[BatchResult]):
    """The results, or, when a file was rejected or left in the inbox, a Completed state named so: a deployment
    run shows "Completed with rejections" in the Prefect UI (not a plain green "Completed" an operator would
    pass over), with the files in its message; the caller still gets the results."""
    from prefect.states import Completed

    waiting = [f"{r['file']} ({r['status']}{': ' + r['reason'] if r.get('reason') else ''})" for r in results
               if r["status"] in ("rejected", "changed", "held")]
    if not waiting:
        return results
    return Completed(name="Completed with rejections", data=results,
                     message=f"{len(waiting)} of {len(results)} file(s) not applied: {'; '.join(waiting)}")


def report_leftover_dot_files(inbox: Path) -> None:
    """Temporary dot-files left unchanged in the inbox (a writer that never renamed its file): never processed
    nor moved, so each run says so rather than leaving a request there unseen."""
    for entry, age in leftover_dot_files(inbox):
        run_logger().warning(f"{entry.name} in {inbox}: a temporary file left unchanged for {age / 60:.0f} min, "
                             f"never processed: if its writer stopped, rename it (without the leading dot) to "
                             f"drop it, or delete it")


def reject_unreadable_entries(inbox: Path, params: Params) -> list[BatchResult]:
    """Inbox entries that are not request files (unknown suffix, folder, symlink out): moved, with the reason;
    one result each, like a rejected request file (`unlearn run` exits 2 for them too)."""
    results = []
    for entry, why in scan_inbox(inbox)[1]:
        dest = reject(entry, params, why)
        run_logger().warning(f"{entry.name}: {why}; moved to {dest}")
        results.append(BatchResult(entry.name, "rejected", error=why, moved_to=str(dest),
                                   reason="not a request file", exit_code=EXIT_BAD_INPUT))
    return results


def process_inbox_file(f: Path, params: Params, device: str, inbox: Path) -> BatchResult:
    """One file; an inbox file that fails validation or the gate moves to rejected/ and later files proceed.

    An inbox file whose content changed while it was processed (a writer still appending: not an atomic drop)
    is neither moved nor rejected: it stays in the inbox with what was applied of it recorded in the ledger,
    and the next run (the watcher announces it again once it stops changing) applies the rest. A file another
    process still holds open for writing is not read at all (`still_open`)."""
    from_inbox = in_inbox(f, inbox)
    if from_inbox and (writers := open_for_writing(f)):
        return still_open(f, writers)
    before = file_sha256(f) if from_inbox and f.is_file() else None
    try:
        r = BatchResult.of(process_request_file(f, params, device))
    except (RequestValidationError, BatchRejected) as e:
        if not from_inbox:
            raise
        if changed_since(f, before):
            return still_changing(f, BatchResult(f.name, "changed", error=str(e), exit_code=EXIT_BAD_INPUT), "checked")
        if isinstance(e, BatchRejected):
            return held(f, params, e)
        dest = reject(f, params, e)
        # an id erased already (by an earlier batch) never stays plain there
        redact_erased_ids(RequestFileSettings.of(params), [dest])
        run_logger().info(f"{e}\n{f.name}: rejected, moved to {dest} (report {dest.name}.error.json); "
                          f"later files proceed")
        return BatchResult(f.name, "rejected", error=str(e), moved_to=str(dest), reason="validation",
                           exit_code=EXIT_BAD_INPUT)
    if from_inbox:
        if changed_since(f, before):
            return still_changing(f, r.but(status="changed", applied_status=r.status, exit_code=EXIT_BAD_INPUT),
                                  "processed")
        try:
            r = r.but(moved_to=str(processed(f, RequestFileSettings.of(params))))
        except OSError as e:  # the batch is in state/ already: not "bad input, nothing changed" (exit 2)
            if r.get("status") != "applied":
                raise
            raise AfterCommitError(f"{f.name}: batch {r.get('batch_id')} WAS applied (state/ holds the new model, "
                                   f"manifest and ledger); NOT done: moving the file to requests/processed/ "
                                   f"({type(e).__name__}: {e}). Fix that folder's permissions; the next run finds the "
                                   f"file processed already, moves it and finishes the erasure") from e
    return r


def held(f: Path, params: Params, error: BatchRejected) -> BatchResult:
    """An inbox file no candidate of whose batch passed: held for a person in requests/held/ (tasks/held.py), not
    rejected; the champion keeps serving meanwhile, and `unlearn status` says so."""
    from tasks.held import hold, serving_line, tag_serving_champion
    from unlearning.io import read_json_file

    champion_file = params.path("state_dir") / "champion.json"
    tracker = tracker_for(params)
    # the state's champion; on a first run (no state yet) the trained original the alias names
    version = (read_json_file(champion_file).get("model_version") if champion_file.exists()
               else tracker.alias_version(params.tracking.registered_model, params.tracking.alias))
    dest = hold(f, params.project_paths, error, version)
    if version is not None:
        tag_serving_champion(tracker, params.project_paths, params.tracking, version)
    run_logger().warning(f"{error}\n{f.name}: HELD for review, moved to {dest} (report {dest.name}.held.json): an "
                         f"erasure is never refused for the model's quality; {serving_line(version)}. "
                         f"`unlearn approve {dest.name}` promotes the exact retrain and finishes the erase")
    return BatchResult(f.name, "held", batch_id=getattr(error, "batch_id", None), run_id=getattr(error, "run_id", None),
                       error=str(error), moved_to=str(dest), reason="gate",
                       exit_code=EXIT_HELD)


def changed_since(path: Path, sha256: str | None) -> bool:
    return sha256 is not None and path.is_file() and file_sha256(path) != sha256


def still_open(path: Path, writers: list[int]) -> BatchResult:
    """An inbox file another process still holds open for writing: its last row may be half written (a cut
    reason still parses), and the writer's later rows would follow the file into processed/ unread. Nothing of it
    is applied; it stays in the inbox for the next run."""
    run_logger().warning(f"{path.name} is still open for writing by process(es) {writers}: nothing of it was "
                         f"applied, it stays in {path.parent}; the next run takes it once it is closed (drop files "
                         f"atomically: write a dot-file and rename it)")
    return BatchResult(path.name, "changed", reason=f"open for writing by process(es) {writers}",
                       exit_code=EXIT_BAD_INPUT)


def still_changing(path: Path, result: BatchResult, what: str) -> BatchResult:
    """The result for a file that changed while it was being checked or processed: it stays in the inbox."""
    applied = result.get("applied_status") == "applied"
    run_logger().warning(
        f"{path.name} changed while it was {what} (a writer is still appending: drop files atomically, write a "
        f"dot-file and rename it): it stays in {path.parent}; "
        + (f"batch {result.get('batch_id')} applied the rows read (the ledger records them), the next run "
           f"applies the rest" if applied else "nothing of it was applied; the next run checks it again"))
    return result.but(moved_to=None)


def commit_applied(params: Params, results: list[BatchResult]) -> None:
    """A deployment's run records the new state in DVC; a failure says what was applied and what was not."""
    try:
        run_logger().info(f"lineage: {commit_lineage(params.project_paths, params.operations)}")
    except Exception as e:
        applied = [r["file"] for r in results if r["status"] == "applied"]
        raise AfterCommitError(f"batch(es) {applied} WERE applied (state/ holds them); NOT done: the DVC "
                               f"commit/push of state/ ({e}); fix it and run `dvc commit -f deletion`") from e


def run(request_path: str | None = None, params_path: str = "params.yaml", overrides: dict | None = None,
        dvc_commit: bool = False) -> list[BatchResult]:
    """Run the flow with the task runner declared in params.yaml (preflight first: an unreachable store fails in
    seconds, before the flow starts a Prefect server or changes anything)."""
    params = load_params(params_path, overrides)
    preflight(params)
    return deletion_batch.with_options(task_runner=task_runner_for(params))(request_path, params_path, overrides,
                                                                            dvc_commit)


def report_results(results: list[BatchResult]) -> int:
    """One `error:` line on stderr per kind of file not applied, and the exit code of the batch: 2 when a file was
    bad input (or changed while it was processed), 3 when the gate rejected it, 5 when it was held for review
    (no candidate passed: tasks/held.py), else 0. `unlearn run` and the
    DVC stage answer alike, so `dvc repro` fails (and a scheduler sees it) when a file was not applied."""
    rejected = [r for r in results if r["status"] == "rejected"]
    changed = [r["file"] for r in results if r["status"] == "changed"]
    held_files = [r["file"] for r in results if r["status"] == "held"]
    if held_files:
        print(f"error: {len(held_files)} file(s) held for review in requests/held/ (no candidate passed the gate; "
              f"the champion keeps serving their rows): {held_files}; `unlearn approve FILE` promotes the exact "
              f"retrain and finishes the erase (`unlearn status` lists them)", file=sys.stderr)
    if changed:
        print(f"error: {changed} changed while being processed, or were still open for writing (not dropped "
              f"atomically): they stay in the inbox, with what was applied of them in the ledger; run again once "
              f"they are complete", file=sys.stderr)
    if rejected:
        print(f"error: {len(rejected)} file(s) rejected and moved to requests/rejected/ with an error report: "
              f"{[r['file'] for r in rejected]}", file=sys.stderr)
    codes = {r.get("exit_code", 0) for r in results}
    return next((code for code in (EXIT_BAD_INPUT, EXIT_GATE_REJECTED, EXIT_HELD) if code in codes), 0)


def main() -> None:
    """`python -m flows.deletion_batch` (and `python -m flows.warm run flows.deletion_batch` in a DVC stage)."""
    parser = base_parser(__doc__)
    parser.add_argument("request", nargs="?", help="a request file (default: every file in the inbox)")
    a = parser.parse_args()
    params_or_exit(a.params)
    with one_line_errors():  # bad input: exit 2; the gate rejected: 3; after the commit: 1
        # the method names and args before a Prefect server starts, not in a failed task after the oracles trained
        check_method_config(load_params(a.params).deletion)
        with prefect_api():
            code = report_results(run(a.request, a.params))
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
