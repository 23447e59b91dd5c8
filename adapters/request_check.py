"""Deletion-request validation without Prefect: the checks `unlearn validate`, `unlearn run` and the deletion
flow share (tasks/validation.py wraps them as the Prefect task).

One tool per kind of rule, each problem one line (the row, the value, the fix; the error names the file):
1. the cheap checks (well under a second): ledger conflicts, the pandera schema (unlearning/requests.py:
   columns, types, empty and duplicate values, timestamps), one objective per file, no future times;
2. only when stage 1 found nothing: the Great Expectations suite of the rules that need the live manifest
   or the erasure record: each id exists and is not deleted (manifest status or tombstone). A validation row
   is a legitimate request (its data subject does not know the split): it is erased, not trained on
   (`FileCheck.n_validation` counts them; docs/requests.md). GX checks a lookup frame (one row per request: `in_manifest`, `split`, `deleted`) built here
   in pandas, so the suite is a few small, fixed expectations that each defect fails exactly once.

Linear time (bench/request_validation.py: 10^6 rows in about 15 s with under 1 GB, GX's import included):
every check is one vectorized pass (Arrow kernels over the text columns, one hash join with the manifest);
no Python step per row but reading a CSV's field counts and keying ids with deletion.hash_sample_ids. Past
GX_MAX_ROWS rows, Great Expectations validates a seeded sample of the lookup frame while the same rules in
pandas (`rule_failures`) cover every row; the summary and the GX result (`sample`) say so (`gx_sample`).

The suite, its data source, validation definition and checkpoint are persisted with the project in a GX
file context (`base.paths.gx_dir`, default `gx/`, committed; created when missing); every run builds its
Data Docs offline into `gx/uncommitted/data_docs/requests/<time>-<file>/` (returned as `data_docs`).
Importing GX alone costs 3-5 s, so a file with a structural defect answers in about a second.

`live_state` reads what the checks need (manifest, ledger) without torch or Prefect, so
`unlearn validate` answers in about a second before any server starts."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from unlearning.io import read_json_file
from unlearning.privacy.ledger import hash_sample_id
from unlearning.privacy.salt import is_keyed
from unlearning.requests import (
    REQUIRED_COLUMNS, RequestValidationError, arrow_text, entry_problem, future_problems, ledger_matches, look_alike_forms,
    objective_problems, read_request_file, rows_text, structural_problems,
)

# Said under the problems of a file that failed stage 1: the manifest rules have not run yet.
MANIFEST_NOT_CHECKED = ("the ids were not yet checked against the manifest (exist, name training rows, not deleted "
                        "already): Great Expectations runs those checks once the problems above are fixed")

# --- the Great Expectations suite ------------------------------------------------------------------------
GX_NAME = "deletion_request"  # the suite, its validation definition and its checkpoint
GX_SOURCE, GX_ASSET, GX_BATCH = "requests", "request_file", "whole_file"
# Every failing row, named by its row number in the file and its (keyed) sample id.
GX_RESULT_FORMAT = {"result_format": "COMPLETE", "unexpected_index_column_names": ["row", "sample_id"]}
DOCS_KEEP = 20  # Data Docs folders (and stored validation results) kept in gx/uncommitted; MLflow keeps all
MAX_ROW_LINES = 20  # per rule; the rest of a rule's rows share one line
# Great Expectations validates at most this many rows of the lookup frame (a seeded sample past it: gx_sample)
GX_MAX_ROWS, GX_SAMPLE_SEED = 20_000, 0

# rule -> (column of the lookup frame, allowed values, the expectation's note). An unknown id is null in
# `deleted` (GX skips nulls): so each defect fails one expectation only.
MANIFEST_RULES = {
    "exists": ("in_manifest", [True],
               "The sample_id is a row of the live manifest (or was erased by an earlier batch: 'not_deleted' "
               "reports it)."),
    "not_deleted": ("deleted", [False],
                    "A known sample_id is not deleted already: manifest status 'deleted', or tombstoned by an "
                    "earlier batch's erasure."),
}
# Rules a project's persisted suite (gx/, scaffolded by an earlier version) may still hold, removed from it on
# load: "training_sample" refused a validation row, which a request now erases (not trained on, nothing to unlearn).
RETIRED_RULES = ("training_sample",)


@dataclass
class Lookup:
    """What GX checks (`frame`: row, request_id, sample_id keyed like the ledger, in_manifest, split,
    deleted) and what the problem lines say, each a Series by row number: the value as written (`value`), the
    batch that deleted it (`deleted_by`), whether it was erased (`erased`). `known`: the manifest's ids (the
    look-alike suggestions of an unknown id look them up)."""
    frame: pd.DataFrame
    value: pd.Series
    deleted_by: pd.Series
    erased: pd.Series
    example_ids: list[str]
    left_out: str = ""  # left_out_note: rows prepare left out (an absent id may be one of them)
    known: ManifestIds | None = None
    plain_ids: bool = True  # False with hashed ids: a line never names another id in plain text


class ManifestIds:
    """The manifest's ids, asked one id at a time (`id in ids`): a look-alike's normalized forms."""

    def __init__(self, ids):
        self.ids = ids  # an Arrow string array

    def __contains__(self, value: str) -> bool:
        import pyarrow as pa
        import pyarrow.compute as pc

        return bool(pc.is_in(pa.array([value], type=pa.large_string()), value_set=self.ids)[0].as_py())


def look_alike(value: str, known: ManifestIds | None) -> tuple[str, str] | None:
    """(the manifest id `value` imitates, how it differs), or None: `value` is not itself an id of `known`
    but one of its look-alike forms (unlearning.requests.look_alike_forms) is."""
    if known is None or not isinstance(value, str):
        return None
    for form, how in look_alike_forms(value):
        if form != value and form in known:
            return form, how
    return None


KEY_CHUNK = 100_000  # ids keyed at a time: the Python strings of one chunk live at once, not of the whole file


def keyed_ids(ids: pd.Series, key) -> pd.Series:
    """`key` of every id (the salted hash with deletion.hash_sample_ids), as text stored in Arrow: made chunk by
    chunk, so a 10^6-row file never holds 10^6 Python strings at once. The identity key copies nothing."""
    if key("x") == "x" and key("sha256:x") == "sha256:x":
        return ids
    import pyarrow as pa

    text = arrow_text(ids)
    chunks = [pa.array([key(s) for s in text.slice(i, KEY_CHUNK).to_pylist()], type=pa.large_string())
              for i in range(0, len(text), KEY_CHUNK)]
    return pa.chunked_array(chunks, type=pa.large_string()).to_pandas().set_axis(ids.index)


def lookup_frame(df: pd.DataFrame, manifest: pd.DataFrame, key=lambda s: s, tombstoned: set[str] | None = None,
                 ledger: list[dict] | None = None, left_out: str = "") -> Lookup:
    """One row per request (df's index + 1 = the file's row number): where its sample id stands in the live
    manifest and the tombstones. `key`: the ledger's id form (the salted hash with deletion.hash_sample_ids),
    used for the tombstones and for the ids GX (its results, its Data Docs) gets to see. Vectorized, in Arrow:
    one hash join with the manifest, each id keyed once, no Python string per row (`for_gx` makes the
    object frame Great Expectations reads, of its rows only)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = arrow_text(df["sample_id"].astype(str)).to_pandas().set_axis(df.index)
    known_ids = arrow_text(manifest["sample_id"].astype(str))
    # The manifest row of each id (its first row, for an id the manifest repeats), -1 for an unknown id.
    at = pc.fill_null(pc.index_in(arrow_text(ids), value_set=known_ids), -1).to_numpy(zero_copy_only=False)
    found = pa.array(at >= 0)
    take = pa.array(np.where(at >= 0, at, 0)) if len(known_ids) else None

    def column(name: str) -> pd.Series:  # `name` of each id's manifest row, null for an unknown id
        if name not in manifest or take is None:
            return pd.Series(None, index=ids.index, dtype=object)
        values = pc.if_else(found, pc.take(arrow_text(manifest[name]), take), pa.scalar(None, pa.large_string()))
        return values.to_pandas().set_axis(ids.index)

    split, status, by_batch = column("split"), column("status"), column("deleted_in_batch")
    keyed = keyed_ids(ids, key)
    erased = keyed.isin(tombstoned) if tombstoned else pd.Series(False, index=ids.index)
    known = split.notna() | erased
    deleted = ((status == "deleted").fillna(False) | erased).astype(object).where(known, None)
    rows = pd.Index(df.index.astype(int) + 1, name="row")
    # .array: the text columns stay in Arrow (no Python string per row)
    frame = pd.DataFrame({"row": np.asarray(rows), "request_id": df["request_id"].array if "request_id" in df
                          else None, "sample_id": keyed.array, "in_manifest": known.to_numpy(dtype=object),
                          "split": split.array, "deleted": deleted.to_numpy()})
    ledger_batch = {str(e.get("sample_id")): e.get("batch_id") for e in (ledger or [])}
    own = by_batch.where(by_batch.notna() & (by_batch != ""), None)  # the manifest's batch, else the ledger's
    batches = own.where(own.notna(), keyed.map(ledger_batch)) if ledger_batch else own
    return Lookup(frame, ids.set_axis(rows), batches.set_axis(rows),
                  pd.Series(erased.to_numpy(dtype=bool), index=rows), known_ids[:2].to_pylist(), left_out,
                  ManifestIds(known_ids), key("x") == "x")


def for_gx(frame: pd.DataFrame) -> pd.DataFrame:
    """The lookup frame as Great Expectations reads it: object columns, None for a missing value (the rule
    columns' nulls are skipped by its ExpectColumnValuesToBeInSet)."""
    out = frame.astype(object)
    out = out.where(out.notna(), None)
    out["row"] = frame["row"].astype(int)
    return out


@dataclass
class SuiteRun:
    """The suite's verdict, tool-neutral: (rule or expectation type, failing rows, column, detail) per failed
    expectation; the GX result as a dict; the Data Docs folder of this run (None without a project)."""
    failures: list[tuple[str, list[int], str | None, str]]
    described: dict = field(default_factory=dict)
    data_docs: str | None = None


def _suite(gx, gxe):
    suite = gx.ExpectationSuite(name=GX_NAME, meta={"notes": (
        "Deletion-request rules that need the live manifest or the erasure record (adapters/request_check.py "
        "builds the lookup frame). Schema and types are pandera's (unlearning/requests.py).")})
    for rule, (column, allowed, notes) in MANIFEST_RULES.items():
        suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column=column, value_set=allowed, notes=notes,
                                                              meta={"rule": rule}))
    return suite


def _add_definitions(gx, gxe, ctx) -> None:
    """The suite, data source, validation definition and checkpoint, each added only when missing (in a file
    context: written to the project's gx folder)."""
    try:
        suite = ctx.suites.get(GX_NAME)
    except Exception:  # noqa: BLE001  (GX raises DataContextError subclasses that vary by version)
        suite = ctx.suites.add(_suite(gx, gxe))
    retired = [e for e in suite.expectations if (e.meta or {}).get("rule") in RETIRED_RULES]
    for e in retired:
        suite.delete_expectation(e)
    if retired:
        suite.save()
    try:
        source = ctx.data_sources.get(GX_SOURCE)
    except (KeyError, ValueError):
        source = ctx.data_sources.add_pandas(GX_SOURCE)
    try:
        asset = source.get_asset(GX_ASSET)
    except LookupError:
        asset = source.add_dataframe_asset(GX_ASSET)
    try:
        batch = asset.get_batch_definition(GX_BATCH)
    except (KeyError, ValueError, LookupError):
        batch = asset.add_batch_definition_whole_dataframe(GX_BATCH)
    try:
        vd = ctx.validation_definitions.get(GX_NAME)
    except Exception:  # noqa: BLE001
        vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=GX_NAME, data=batch, suite=suite))
    try:
        ctx.checkpoints.get(GX_NAME)
    except Exception:  # noqa: BLE001
        ctx.checkpoints.add(gx.Checkpoint(name=GX_NAME, validation_definitions=[vd], result_format=GX_RESULT_FORMAT))


def _quiet() -> None:
    # GX logs at INFO (e.g. "Created temporary directory ... for ephemeral docs site"): not for our users.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)


def create_gx_project(gx_dir: str | Path) -> Path:
    """The project's GX file context at `gx_dir` with the deletion-request suite, created when missing
    (built in a sibling temporary folder and renamed into place, so a concurrent reader never sees half of
    it). Returns `gx_dir`. Commit it; its `uncommitted/` (validation results, Data Docs) is git-ignored."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    _quiet()
    gx_dir = Path(gx_dir)
    if (gx_dir / "great_expectations.yml").exists():
        return gx_dir
    gx_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gx-new-", dir=gx_dir.parent))
    try:
        ctx = gx.get_context(mode="file", project_root_dir=str(tmp))
        _add_definitions(gx, gxe, ctx)
        try:
            os.rename(tmp / "gx", gx_dir)
        except OSError:
            if not (gx_dir / "great_expectations.yml").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return gx_dir


def _context(gx_dir: str | Path | None):
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    _quiet()
    if gx_dir is None:  # no project: the same suite, in memory (no Data Docs)
        ctx = gx.get_context(mode="ephemeral")
    else:
        ctx = gx.get_context(mode="file", context_root_dir=str(create_gx_project(gx_dir)))
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)  # in memory: the yml is not rewritten
    _add_definitions(gx, gxe, ctx)
    return ctx


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:80] or "request"


def _prune(folder: Path, keep: int) -> None:
    olds = sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.name)[:-keep] if folder.is_dir() else []
    for p in olds:
        shutil.rmtree(p, ignore_errors=True)


def _data_docs(ctx, gx_dir: Path, result_id, run_name: str) -> str:
    """This run's Data Docs (index, the suite's page, the validation's page), built offline from GX's
    packaged templates; the pages link bootstrap/jQuery/fonts from public CDNs at view time (unstyled but
    readable offline). GX's static images and fonts (4 MB, referenced by no page but the favicon) are left
    out. Older runs' folders and stored results beyond DOCS_KEEP are removed."""
    from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier
    from great_expectations.render.renderer.site_builder import SiteBuilder

    root = gx_dir / "uncommitted" / "data_docs" / "requests"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    folder = root / f"{stamp}-{_safe_name(run_name)}"
    SiteBuilder(data_context=ctx, store_backend={"class_name": "TupleFilesystemStoreBackend",
                                                 "base_directory": str(folder)},
                site_name=f"deletion request {run_name}", show_how_to_buttons=False).build(
        resource_identifiers=[result_id, ExpectationSuiteIdentifier(name=GX_NAME)])
    static = folder / "static"
    shutil.rmtree(static / "fonts", ignore_errors=True)
    for img in (static / "images").glob("*") if (static / "images").is_dir() else []:
        if img.name != "favicon.ico":
            img.unlink()
    _prune(root, DOCS_KEEP)
    try:
        store = ctx.validation_results_store
        keys = sorted(store.list_keys(), key=lambda k: str(k.run_id.run_time))
        for k in keys[:-DOCS_KEEP]:
            store.remove_key(k)
    except Exception:  # noqa: BLE001  (housekeeping only)
        pass
    return str(folder)


_TEMPLATES_CACHED = False


def cache_data_docs_templates() -> None:
    """Data Docs without recompiling their templates: GX builds a new Jinja environment for every page it
    renders, and compiles the ~55 templates of a request's pages again each time (1.5-1.8 s of a 100-row
    file's 2.4 s check on a 2-core machine). A Jinja bytecode cache (a private per-user folder in the system
    temp, Jinja's own FileSystemBytecodeCache: keyed by template name and source checksum) lets every
    environment, in this process and the next ones, load them compiled. The pages are the same. Once per
    process; the warm worker calls it (flows/warm.py), so each batch it forks inherits it."""
    global _TEMPLATES_CACHED
    if _TEMPLATES_CACHED:
        return
    from great_expectations.render.view.view import DefaultJinjaView
    from jinja2 import FileSystemBytecodeCache

    try:
        cache = FileSystemBytecodeCache()
    except (OSError, RuntimeError):  # no private temp folder to be had: compile as GX does
        return
    init = DefaultJinjaView.__init__

    def init_with_cache(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.env.bytecode_cache = cache

    DefaultJinjaView.__init__ = init_with_cache
    _TEMPLATES_CACHED = True


def run_suite(frame: pd.DataFrame, gx_dir: str | Path | None = None, run_name: str = "request") -> SuiteRun:
    """The persisted suite (the project's `gx_dir`; in memory when None) on the lookup frame, through its
    checkpoint; Data Docs for this run when there is a project."""
    import great_expectations as gx  # 3-5 s import: only here, and only for a file that passed stage 1

    cache_data_docs_templates()

    ctx = _context(gx_dir)
    result = ctx.checkpoints.get(GX_NAME).run(batch_parameters={"dataframe": frame},
                                              run_id=gx.RunIdentifier(run_name=run_name))
    failures, result_id = [], None
    for result_id, vr in result.run_results.items():
        for r in vr.results:
            if r.success:
                continue
            cfg = r.expectation_config
            rule = (cfg.meta or {}).get("rule") or cfg.type
            res = r.result or {}
            if r.exception_info and r.exception_info.get("raised_exception"):
                failures.append((cfg.type, [], cfg.kwargs.get("column"),
                                 f"could not run ({r.exception_info.get('exception_message')})"))
                continue
            rows = [int(d["row"]) for d in (res.get("unexpected_index_list") or []) if isinstance(d, dict)]
            detail = str(cfg.notes or "") if rule not in MANIFEST_RULES else ""
            failures.append((rule, rows, cfg.kwargs.get("column"), detail))
    docs = _data_docs(ctx, Path(gx_dir), result_id, run_name) if gx_dir is not None and result_id else None
    return SuiteRun(failures, result.describe_dict(), docs)


def rule_failures(frame: pd.DataFrame) -> list[tuple[str, list[int], str | None, str]]:
    """MANIFEST_RULES evaluated with pandas on the lookup frame, as the GX suite evaluates its expectations
    (ExpectColumnValuesToBeInSet: a null is skipped, never a failure): (rule, failing rows, column, '') per
    failed rule, in the suite's order. No import of Great Expectations (3-5 s): the CLI's checks reject a bad
    file with it in about a second; a file it passes still goes through the suite, which stays authoritative
    (it holds any expectation a team added to gx/expectations)."""
    failures = []
    for rule, (column, allowed, _notes) in MANIFEST_RULES.items():
        values = frame[column]
        bad = values.notna() & ~values.isin(allowed)
        if bad.any():
            failures.append((rule, [int(r) for r in frame.loc[bad, "row"]], column, ""))
    return failures


def _rule_line(rule: str, row: int, lk: Lookup) -> str:
    value = lk.value[row]
    if rule == "exists":
        alike = look_alike(value, lk.known)
        if alike is not None:
            meant, how = alike
            named = f"did you mean {meant!r}?" if lk.plain_ids else "it is the id of a manifest row once normalized"
            return (f"column 'sample_id' row {row}: value {value!r} is not in the manifest, but it looks like "
                    f"one of its ids ({how}): {named} Write the id exactly as in your data (ids are compared "
                    f"character by character)")
        return (f"column 'sample_id' row {row}: value {value!r} is not in the manifest (this dataset's ids look like "
                f"{lk.example_ids}{lk.left_out}); correct the id or remove the row")
    by = f" by batch {lk.deleted_by[row]}" if lk.deleted_by.get(row) else ""
    how = "erased" if lk.erased.get(row) else "deleted"
    return (f"column 'sample_id' row {row}: value {value!r} was {how} already{by} (see the ledger); nothing is left "
            f"to forget: remove the row")


def problem_lines(run: SuiteRun, lk: Lookup) -> list[str]:
    """One line per failing row (a rule's rows past MAX_ROW_LINES share one line). A file none of whose ids is
    in the manifest (most likely another dataset's) gets one line for the whole file."""
    n = len(lk.frame)
    lines = []
    for rule, rows, column, detail in run.failures:
        if rule not in MANIFEST_RULES:
            values = [lk.frame.loc[lk.frame["row"] == r, column].iloc[0] for r in rows] if column in lk.frame else []
            where = f" {rows_text(rows)}" if rows else ""
            shown = f" (values {values[:10]})" if values else ""
            lines.append(f"manifest: expectation {rule} on column {column!r}{where} failed{shown}"
                         f"{': ' + detail if detail else ''}")
            continue
        if rule == "exists" and n > 1 and len(rows) == n and not any(
                look_alike(lk.value[r], lk.known) for r in rows[:MAX_ROW_LINES]):
            lines.append(f"manifest: column 'sample_id' rows 1-{n} (all): none of the {n} sample ids (e.g. "
                         f"{[lk.value[r] for r in rows[:3]]}) is in this dataset's manifest, whose ids look like "
                         f"{lk.example_ids}{lk.left_out}: the file is probably for another dataset (if it sits in the "
                         f"inbox, move it out)")
            continue
        lines += [f"manifest: {_rule_line(rule, r, lk)}" for r in rows[:MAX_ROW_LINES]]
        rest = rows[MAX_ROW_LINES:]
        if rest:
            lines.append(f"manifest: column 'sample_id' {rows_text(rest)}: {len(rest)} more value(s) fail the same "
                         f"rule ({rule}: {MANIFEST_RULES[rule][2]})")
    return lines


def gx_sample(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The rows Great Expectations validates, and the note that says so when they are a sample: past
    GX_MAX_ROWS rows its run (10^6 rows: minutes, and gigabytes for a COMPLETE result) cannot keep the pace
    of the rest, so it validates a seeded random sample of GX_MAX_ROWS rows while the same rules, evaluated
    with pandas (`rule_failures`), cover every row."""
    n = len(frame)
    if n <= GX_MAX_ROWS:
        return for_gx(frame), ""
    picked = np.sort(np.random.default_rng(GX_SAMPLE_SEED).choice(n, GX_MAX_ROWS, replace=False))
    note = (f"Great Expectations validated a seeded random sample of {GX_MAX_ROWS:,} of the {n:,} rows (seed "
            f"{GX_SAMPLE_SEED}); the manifest rules ({', '.join(MANIFEST_RULES)}) were checked on all {n:,} rows "
            f"with pandas")
    return for_gx(frame.iloc[picked].reset_index(drop=True)), note


def manifest_problems(df: pd.DataFrame, manifest: pd.DataFrame, key=lambda s: s,
                      tombstoned: set[str] | None = None, ledger: list[dict] | None = None,
                      gx_dir: str | Path | None = None, run_name: str = "request",
                      left_out: str = "", gx_when_invalid: bool = True,
                      gx_suite: bool = True) -> tuple[list[str], dict, str | None]:
    """Stage 2: the GX suite on the lookup frame; (problem lines, GX result, Data Docs folder).
    `gx_when_invalid=False` (the CLI): the rules are first evaluated with pandas (`rule_failures`); a file
    they reject gets its lines without the suite (no GX result, no Data Docs); the batch's own check keeps
    the default and records the suite's result for every file. `gx_suite=False` (`unlearn plan`, which applies
    nothing): the rules with pandas only, whatever they find (no GX import: 3-10 s)."""
    lk = lookup_frame(df, manifest, key, tombstoned, ledger, left_out)
    failures = rule_failures(lk.frame) if not (gx_when_invalid and gx_suite) or len(lk.frame) > GX_MAX_ROWS else []
    if (not gx_when_invalid and failures) or not gx_suite:
        return problem_lines(SuiteRun(failures), lk), {}, None
    sample, note = gx_sample(lk.frame)
    run = run_suite(sample, gx_dir, run_name)
    if note:  # the manifest rules' rows come from every row; the sample adds what only GX holds (a team's own rules)
        pandas_rules = {f[0] for f in failures}
        run.failures = failures + [f for f in run.failures if f[0] not in pandas_rules]
        run.described = {**run.described, "sample": {"note": note, "rows_validated_by_gx": len(sample),
                                                     "rows": len(lk.frame), "seed": GX_SAMPLE_SEED,
                                                     "rows_checked_by_pandas": len(lk.frame)}}
    return problem_lines(run, lk), run.described, run.data_docs


@dataclass
class RequestCheck:
    problems: list[str]
    gx_result: dict = field(default_factory=dict)
    manifest_checked: bool = True
    data_docs: str | None = None  # this run's Great Expectations Data Docs folder (index.html inside)
    gx_note: str = ""  # said when Great Expectations validated a sample of the rows (gx_sample)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_request_frame(df: pd.DataFrame, manifest: pd.DataFrame, cheap: list[str] | None = None,
                        gx: bool = True, *, key=lambda s: s, tombstoned: set[str] | None = None,
                        ledger: list[dict] | None = None, gx_dir: str | Path | None = None,
                        run_name: str = "request", left_out: str = "",
                        gx_when_invalid: bool = True, gx_suite: bool = True) -> RequestCheck:
    """pandera, then (when it and the `cheap` problems found nothing, and `gx`) the GX suite. Rows are
    named by `df`'s index + 1 (keep the file's index when rows were left out)."""
    problems = [*(f"schema: {p}" for p in structural_problems(df)), *(cheap or [])]
    problems = list(dict.fromkeys(problems))
    if problems or not gx:
        return RequestCheck(problems=problems, manifest_checked=False)
    if not len(df.columns):
        return RequestCheck(problems=[])
    lines, described, docs = manifest_problems(df, manifest, key, tombstoned, ledger, gx_dir, run_name, left_out,
                                               gx_when_invalid, gx_suite)
    return RequestCheck(problems=lines, gx_result=described, data_docs=docs,
                        gx_note=described.get("sample", {}).get("note", ""))


def raise_if_invalid(path: str, check: RequestCheck) -> None:
    if not check.ok:
        raise RequestValidationError(path, check.problems, None if check.manifest_checked else MANIFEST_NOT_CHECKED)


class RequestConflict(RequestValidationError):
    """A request_id already in the ledger arrives with other content: never skipped, never applied."""


@dataclass
class FileCheck:
    """The one validation of a request file, shared by `unlearn validate` and the deletion flow.

    status: "ok" (pending rows to apply), "already_processed" (every request is in the ledger with the same
    content: nothing to do) or "invalid" (problems, one line each). `manifest_checked` is False when the
    cheap checks failed (or `gx=False`): the GX suite against the manifest did not run. `data_docs`: the
    folder of this run's Great Expectations Data Docs (open index.html; None when GX did not run or there
    was no project folder): the flow logs it to the validate run's MLflow artifacts."""

    path: str
    status: str
    problems: list[str]
    pending: pd.DataFrame | None = None
    skipped: int = 0
    n_rows: int = 0
    gx_result: dict = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    manifest_checked: bool = True
    data_docs: str | None = None
    gx_note: str = ""  # how much of the file Great Expectations validated, when it was a sample
    # pending rows naming a validation row: erased from the stores, not unlearned (no model trained on them)
    n_validation: int = 0

    def error(self) -> RequestValidationError:
        cls = RequestConflict if self.conflicts else RequestValidationError
        return cls(self.path, self.problems, None if self.manifest_checked else MANIFEST_NOT_CHECKED)

    def summary(self) -> str:
        docs = f"\n  data docs: {Path(self.data_docs) / 'index.html'}" if self.data_docs else ""
        docs += f"\n  note: {self.gx_note}" if self.gx_note else ""
        if self.status == "already_processed":
            return (f"{self.path}: all {self.n_rows} request(s) were processed before with the same content; "
                    f"nothing to do")
        if self.status == "ok":
            extra = f" ({self.skipped} already processed with the same content)" if self.skipped else ""
            unchecked = "" if self.manifest_checked else "; not checked against the manifest"
            val = (f"; {self.n_validation} name validation rows: erased from the stores, not unlearned (no model "
                   f"trained on them)" if self.n_validation else "")
            return f"{self.path}: valid ({len(self.pending)} request(s) to apply{extra}{val}{unchecked}){docs}"
        return str(self.error()) + docs


def validation_mask(manifest: pd.DataFrame, requests: pd.DataFrame) -> np.ndarray:
    """[len(requests)] bool: the request names a validation row of `manifest` (one vectorized hash lookup).
    Such a row is erased (prepared store, manifest, tombstones) but not unlearned: no model trained on it."""
    if "sample_id" not in requests.columns or not len(requests) or "split" not in manifest.columns:
        return np.zeros(len(requests), dtype=bool)
    val = manifest.loc[(manifest["split"] == "val").to_numpy(), "sample_id"].astype(str)
    return requests["sample_id"].astype(str).isin(set(val)).to_numpy()


def nothing_left_problems(manifest: pd.DataFrame, pending: pd.DataFrame) -> list[str]:
    """A batch that names every training row still retained: no retrain (the oracles, the exact retrain
    candidate) has a row to learn from, and the "model" it promoted would be a random initialisation."""
    if "sample_id" not in pending.columns or not len(pending):
        return []
    retained = (manifest["split"] == "train") & (manifest["status"] == "retained")
    if len(pending) < retained.sum():  # each row names one id (unique): fewer rows cannot name every one
        return []
    retained = manifest.loc[retained, "sample_id"]
    if len(retained) and retained.astype(str).isin(set(pending["sample_id"].astype(str))).all():
        return [f"batch: it names all {len(retained)} training rows still retained, so nothing would be left to "
                f"train or retrain on; keep some rows (split the request), or start over on new data "
                f"(`unlearn reset`)"]
    return []


def keyed_mentions(lines: list[str], sample_ids, key) -> list[str]:
    """With deletion.hash_sample_ids the problem lines (logged to MLflow and Prefect, written beside a rejected
    file) name each of the file's sample ids by its keyed form: an id erased earlier and named again must not
    come back in plain text. The lines quote ids with repr(), so repr(id) is what is replaced; the row
    numbers still say which row is meant."""
    if not lines:
        return []
    text = "\n".join(lines)  # at most a few dozen lines: only the ids they quote are replaced
    ids = sorted({s for s in sample_ids if isinstance(s, str) and s and not is_keyed(s)
                  and repr(s) in text}, key=len, reverse=True)
    out = []
    for line in lines:
        for s in ids:
            line = line.replace(repr(s), repr(key(s)))
        out.append(line)
    return out


def check_request_file(path, manifest: pd.DataFrame, ledger: list[dict], *, hash_ids: bool = False,
                       salt: str = "", max_clock_skew_seconds: float = 300.0, now=None,
                       tombstoned: set[str] | None = None, gx: bool = True,
                       gx_dir: str | Path | None = None, left_out: str = "",
                       gx_when_invalid: bool = True, inbox: str | Path | None = None,
                       gx_suite: bool = True) -> FileCheck:
    """Read and validate one request file against the ledger and the live manifest: stage 1 (ledger,
    structure and types, mixed objectives, future times), then, when it found nothing and `gx`, stage 2
    (the GX suite: exists, training row, not deleted or erased). `gx=False` runs stage 1 only (the CLI's
    pre-check). `gx_dir`: the project's GX folder (base.paths.gx_dir; created when missing; Data Docs are
    built there); None runs the same suite in memory, without Data Docs. `gx_when_invalid=False`: a file the
    manifest rules reject (evaluated with pandas first) is answered without the suite (`manifest_problems`).
    `inbox`: the project's inbox (a symlink is read only as an inbox entry naming a staged file: entry_problem)."""
    path = str(path)
    refused = entry_problem(path, inbox)
    if refused:  # a symlink, a directory, a FIFO: refused before a byte of it is read (or quoted)
        return FileCheck(path, "invalid", [refused], manifest_checked=False)
    try:
        df = read_request_file(path)
    except RequestValidationError as e:
        return FileCheck(path, "invalid", e.problems, manifest_checked=False)
    key = (lambda s: hash_sample_id(s, salt)) if hash_ids else (lambda s: s)
    same, conflicts = ledger_matches(df, ledger, key)
    n = len(df)
    if n and len(same) == n and not conflicts:
        return FileCheck(path, "already_processed", [], df.iloc[0:0], skipped=n, n_rows=n)
    keep = np.ones(n, dtype=bool)
    keep[same] = False
    rows = df[keep] if len(same) else df  # the file's index: problems name its row numbers
    rows.attrs = dict(df.attrs)
    cheap = [f"schema: {p}" for p in objective_problems(rows)]
    cheap += [f"schema: {p}" for p in future_problems(rows, max_clock_skew_seconds, now)]
    check = check_request_frame(rows, manifest, cheap, gx=gx and not conflicts, key=key, tombstoned=tombstoned,
                                ledger=ledger, gx_dir=gx_dir, run_name=Path(path).name, left_out=left_out,
                                gx_when_invalid=gx_when_invalid, gx_suite=gx_suite)
    pending = rows.reset_index(drop=True)
    pending.attrs = dict(df.attrs)
    problems = [*conflicts, *check.problems]
    if not problems and check.manifest_checked:
        problems += nothing_left_problems(manifest, pending)
    if hash_ids:
        problems = keyed_mentions(problems, df["sample_id"] if "sample_id" in df.columns else [], key)
    n_val = int(validation_mask(manifest, pending).sum()) if not problems and check.manifest_checked else 0
    return FileCheck(path, "invalid" if problems else "ok", problems, pending, skipped=len(same), n_rows=n,
                     gx_result=check.gx_result, conflicts=conflicts, manifest_checked=check.manifest_checked,
                     data_docs=check.data_docs, gx_note=check.gx_note, n_validation=n_val)


# --- what the checks need, without torch or Prefect ---------------------------------------------------------

@dataclass
class LiveState:
    manifest: pd.DataFrame
    ledger: list[dict]
    info: dict  # the prepared dataset.json



def left_out_note(params, info: dict) -> str:
    """Why an id of the team's raw data can be missing from the manifest without being a typo: prepare left
    its row out, so no model ever trained on it. '' when prepare left nothing out."""
    reasons = []
    dropped = int(info.get("n_dropped_missing") or 0)
    if dropped:
        reasons.append(f"{dropped} row(s) with a missing value (prepare.table.missing: drop)")
    caps = [f"prepare.{k} = {v}" for k, v in (("max_train", params.prepare.max_train),
                                               ("max_val", params.prepare.max_val)) if v is not None]
    if caps:
        reasons.append(f"the rows past {' and '.join(caps)} (a fixed subsample)")
    if not reasons:
        return ""
    return (f"; prepare left out {' and '.join(reasons)}: an id of those was never trained on, so nothing is "
            f"left to forget")


def _prepared_identity(folder: Path) -> tuple[dict, pd.DataFrame] | None:
    """dataset.json and the prepared manifest's sample_id, split and label columns, read as load_prepared
    reads them (text ids, integer labels): all the fingerprint needs, without the other columns, the schema
    pass or the features. None when they cannot be read so (missing, damaged): load_state then says why."""
    import json

    try:
        info = json.loads((folder / "dataset.json").read_text())
        manifest = pd.read_csv(folder / "manifest.csv", usecols=["sample_id", "split", "label"], keep_default_na=False,
                               dtype={"sample_id": object, "split": object, "label": "int64"})
    except (OSError, ValueError, KeyError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None
    return info, manifest


def live_state(params) -> LiveState | None:
    """The live manifest and ledger as `tasks.state.load_state` would give them, read without a model: from
    a state folder whose recorded fingerprint matches the current params and data. None when only the full
    load can tell (no state yet: the original's checkpoint decides; a state written before fingerprints; a
    mismatch, whose message names what changed; a prepared store that is missing or cannot be read: load_state
    raises its error): the caller then calls load_state. The prepared manifest is read for the fingerprint
    only (its three columns) and let go before the live manifest is read: a 10^6-row project holds one
    manifest at a time."""
    from unlearning.data import read_state_manifest
    from unlearning.privacy.fingerprint import matches, prepared_fingerprint
    from unlearning.io import settle_interrupted_swaps
    from unlearning.privacy.ledger import read_ledger

    state_dir = params.path("state_dir")
    # as load_state does (under the project's lock here: a batch running now keeps its staging folder)
    settle_interrupted_swaps(state_dir, params.path("prepared_dir"))
    champion_file = state_dir / "champion.json"
    if not (state_dir / "model.pt").exists() or not champion_file.exists():
        return None
    recorded = read_json_file(champion_file).get("fingerprint")
    identity = _prepared_identity(params.path("prepared_dir")) if recorded is not None else None
    if identity is None:
        return None
    info, prepared_manifest = identity
    current = prepared_fingerprint(params.train, params.base.seed, params.root, info, prepared_manifest)
    del prepared_manifest, identity
    if not matches(recorded, current):
        return None
    return LiveState(read_state_manifest(state_dir / "manifest.csv"), read_ledger(state_dir / "ledger.jsonl"), info)


def check_file_for(path: str | Path, params, live: LiveState, gx: bool = True,
                   gx_when_invalid: bool = True, gx_suite: bool = True) -> FileCheck:
    """`check_request_file` with the arguments the deletion flow passes (tasks.batch_path.check_file);
    the CLI passes `gx_when_invalid=False` (a bad file answers before Great Expectations is imported)."""
    from unlearning.privacy.erasure import read_tombstones
    from unlearning.privacy.salt import id_salt

    return check_request_file(path, live.manifest, live.ledger, hash_ids=params.deletion.hash_sample_ids,
                              salt=id_salt(params), max_clock_skew_seconds=params.deletion.max_clock_skew_seconds,
                              tombstoned=read_tombstones(params.path("tombstones")), gx=gx,
                              gx_dir=params.path("gx_dir"), left_out=left_out_note(params, live.info),
                              gx_when_invalid=gx_when_invalid, inbox=params.path("inbox"), gx_suite=gx_suite)


__all__ = ["RequestCheck", "FileCheck", "RequestConflict", "LiveState", "Lookup", "SuiteRun", "check_request_file",
           "check_request_frame", "check_file_for", "create_gx_project", "validation_mask", "keyed_mentions", "left_out_note", "live_state", "lookup_frame", "rule_failures",
           "manifest_problems", "problem_lines", "raise_if_invalid", "run_suite", "REQUIRED_COLUMNS",
           "MANIFEST_NOT_CHECKED", "MANIFEST_RULES"]
