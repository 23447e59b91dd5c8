"""Deletion requests: reading CSV/Parquet files and the structural pandera schema (docs/design.md §3).

A request file has `request_id, sample_id, requested_at, reason` and optionally `objective`. The
structural checks live here (pure core, about a second with the imports); the checks against the manifest
(ids exist, name training rows, not already deleted) run as a Great Expectations suite at the task
boundary, only once the structure is valid (tasks/request_check.py). Problems are collected, never raised
one at a time, so each stage reports every problem it finds, one line each.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors

from unlearning.ids import CONTROL_CHARACTERS

OBJECTIVES = ("retrain_equivalence", "suppression")
REQUIRED_COLUMNS = ("request_id", "sample_id", "requested_at", "reason")
REQUEST_SUFFIXES = (".csv", ".parquet")

REQUEST_SCHEMA = pa.DataFrameSchema(
    {
        "request_id": pa.Column(str, pa.Check.str_length(min_value=1), nullable=False, unique=True),
        "sample_id": pa.Column(str, pa.Check.str_length(min_value=1), nullable=False, unique=True),
        "requested_at": pa.Column(str, pa.Check(lambda s: parse_timestamps(s).notna(), element_wise=False,
                                                name="parses_as_timestamp"), nullable=False),
        "reason": pa.Column(str, pa.Check.str_length(min_value=1), nullable=False),
        "objective": pa.Column(str, pa.Check.isin(list(OBJECTIVES)), required=False, nullable=True),
    },
    strict=True, name="deletion_request",
)


def parse_timestamps(values: pd.Series) -> pd.Series:
    """ISO 8601 timestamps (date only, or with time and zone) to UTC; unparseable values become NaT."""
    return pd.to_datetime(values, format="ISO8601", utc=True, errors="coerce")


class RequestValidationError(ValueError):
    """A deletion request file failed validation; `problems` lists every failure."""

    def __init__(self, path: str | Path, problems: list[str], note: str | None = None):
        self.path, self.problems, self.note = str(path), list(problems), note
        body = "\n".join(f"  - {p}" for p in self.problems) + (f"\n  note: {note}" if note else "")
        super().__init__(f"deletion request {self.path} rejected ({len(self.problems)} problem(s); nothing was "
                         f"changed):\n{body}")


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def is_request_file_name(name: str) -> bool:
    """A request file by its suffix, case-insensitively (`X.CSV` is a CSV file)."""
    return Path(name).suffix.lower() in REQUEST_SUFFIXES


def _parquet_type_problems(raw: pd.DataFrame) -> list[str]:
    """Columns whose Parquet type is not text: ids written as integers lose leading zeros and formatting,
    bytes are not text at all. Reported like any other problem (the values are still read as text)."""
    problems = []
    for col in raw.columns:
        dtype = raw[col].dtype
        values = [v for v in raw[col].tolist() if v is not None and v == v]
        if any(isinstance(v, (bytes, bytearray, memoryview)) for v in values):
            problems.append(f"column '{col}': Parquet type is bytes (binary); write it as a UTF-8 string column")
        elif col in ("request_id", "sample_id", "reason", "objective") and (
                pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)):
            problems.append(f"column '{col}': Parquet type is {dtype} (not text); ids and reasons must be strings "
                            f"(write them as a string column, e.g. df['{col}'].astype(str))")
    return problems


def read_request_file(path: str | Path, suffix: str | None = None) -> pd.DataFrame:
    """Read a request file with every column as text (ids stay strings; types are checked later). Parquet
    columns that are not text are noted in `df.attrs["type_problems"]` (reported by `structural_problems`).
    `suffix`: the format, when the name does not end in it (a kept copy `a.csv.2`, see `kept_request_suffix`)."""
    path = Path(path)
    suffix = suffix or path.suffix.lower()
    if suffix not in REQUEST_SUFFIXES:
        raise RequestValidationError(path, [f"file type '{path.suffix}' is not supported; use .csv or .parquet"])
    type_problems: list[str] = []
    if suffix == ".csv":
        widths = field_count_problems(path)
        if widths:  # the columns of those rows cannot be told apart: nothing more is checked
            raise RequestValidationError(path, widths)
    try:
        if suffix == ".csv":
            # index_col=False: a row with one field too many must never turn its first field into the index
            df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""], index_col=False)
        else:
            raw = pd.read_parquet(path)
            type_problems = _parquet_type_problems(raw)
            df = raw.map(lambda v: v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v)
            df = df.astype("string").astype(object)
    except pd.errors.EmptyDataError:
        raise RequestValidationError(path, [f"the file is empty; a request file has the header "
                                            f"{','.join(REQUIRED_COLUMNS)} and one row per request"]) from None
    except UnicodeDecodeError as e:
        raise RequestValidationError(path, [f"cannot read file: it is not UTF-8 text ({e.reason} at byte {e.start}); "
                                            f"save it as UTF-8 (CSV UTF-8 in a spreadsheet)"]) from None
    except Exception as e:  # unreadable file: report it like any other problem
        raise RequestValidationError(path, [f"cannot read file: {str(e).splitlines()[0] if str(e) else type(e).__name__}"]) from None
    df = df.where(df.notna(), None)
    df.attrs["type_problems"] = type_problems
    return df


MAX_ROWS_NAMED = 10


def field_count_problems(path: str | Path) -> list[str]:
    """Data rows whose number of fields differs from the header's, one line per field count. pandas would read
    them silently: a row with one field too many shifts every value one column left (its first field becomes
    the row index), a short row gets empty trailing values. Blank lines are skipped, as pandas skips them, so
    row numbers match the other problems'. A file that is not UTF-8 CSV is left to the reader's own error."""
    import csv

    bad: dict[int, list[int]] = {}
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                return []
            row = 0
            for fields in reader:
                if not fields:
                    continue
                row += 1
                if len(fields) != len(header):
                    bad.setdefault(len(fields), []).append(row)
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    problems = []
    for width, rows in sorted(bad.items()):
        more = f" and {len(rows) - MAX_ROWS_NAMED} more" if len(rows) > MAX_ROWS_NAMED else ""
        problems.append(f"{rows_text(rows[:MAX_ROWS_NAMED])}{more}: {width} field(s), but the header has "
                        f"{len(header)} ({', '.join(header)}); quote a value that holds a comma (\"a,b\") and "
                        f"give every row one value per column (an empty value is written as nothing between commas)")
    return problems


ROWS_SHOWN = 20  # a problem line names at most this many rows (a 100k-row file made one line of 679 KB)


def rows_text(rows: list[int]) -> str:
    """Data-row numbers as a problem line names them (1 = the first row after the header), in the given order;
    past ROWS_SHOWN, the first ones and how many more."""
    if len(rows) == 1:
        return f"row {rows[0]}"
    more = f" and {len(rows) - ROWS_SHOWN} more" if len(rows) > ROWS_SHOWN else ""
    return f"rows {', '.join(map(str, rows[:ROWS_SHOWN]))}{more}"


def _rows_hint(indices) -> str:
    """The rows of a frame's (0-based) index labels; "file" when none is a row number."""
    rows = sorted({int(i) + 1 for i in indices if isinstance(i, (int, float)) and i == i})
    return rows_text(rows) if rows else "file"


def _row_hint(index) -> str:
    return _rows_hint([index])


def _header_problems(df: pd.DataFrame) -> tuple[pd.DataFrame | None, list[str]]:
    """A header defect reported once, as its cause (not as every column it makes missing or unexpected):
    a file separated by ';' / tab / '|' (one column whose name holds the required names), and column names
    that differ from the schema's only in case or surrounding spaces (renamed here so the row checks still
    run). Returns (the frame to check further, or None when nothing more can be checked; problems)."""
    allowed = list(REQUEST_SCHEMA.columns)
    cols = [str(c) for c in df.columns]
    if len(cols) == 1:
        for sep, name in ((";", "';'"), ("\t", "tabs"), ("|", "'|'")):
            parts = [c.strip().lower() for c in cols[0].split(sep)]
            if len(parts) > 1 and any(c in parts for c in REQUIRED_COLUMNS):
                return None, [f"header {cols[0]!r}: the columns are separated by {name}, not commas; write the "
                              f"file as CSV (',' between columns)"]
    renames = {c: c.strip().lower() for c in cols
               if c not in allowed and c.strip().lower() in allowed and c.strip().lower() not in cols}
    if not renames:
        return df, []
    listed = ", ".join(f"{a!r} -> {b!r}" for a, b in renames.items())
    return df.rename(columns=renames), [f"column name(s) must be lowercase without spaces: rename {listed}"]


def _repeated_requests(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Rows that repeat a request (same request_id AND sample_id): ONE line per repeated request, and the
    repeats are left out of the per-column uniqueness checks (which would report the same defect twice)."""
    if not {"request_id", "sample_id"} <= set(df.columns) or len(df) < 2:
        return df, []
    keys = df[["request_id", "sample_id"]]
    both = keys.notna().all(axis=1)
    dup = both & keys.duplicated(keep=False)
    if not dup.any():
        return df, []
    problems, drop = [], []
    for (rid, sid), group in keys[dup].groupby(["request_id", "sample_id"], sort=False):
        problems.append(f"{_rows_hint(group.index)}: the same request (request_id {rid!r}, sample_id {sid!r}) "
                        f"appears {len(group)} times; keep one row")
        drop += list(group.index[1:])
    return df.drop(index=drop), problems


def _text_rows(df: pd.DataFrame, col: str, bad) -> list:
    """The rows of column `col` whose text value `bad(value)` flags (none when the column is absent)."""
    return [i for i, v in df[col].items() if isinstance(v, str) and bad(v)] if col in df.columns else []


def _value_line(df: pd.DataFrame, col: str, rows: list, says: str) -> str:
    """One problem line for the flagged rows of a column: the rows, the first value, and what is wrong."""
    return (f"column '{col}' {_rows_hint(rows)}: value {df[col][rows[0]]!r}"
            f"{' (and others)' if len(rows) > 1 else ''} {says}")


def _spaced_ids(df: pd.DataFrame) -> list[str]:
    """Ids with spaces around them: compared exactly, 'digits-0145 ' is an unknown id, and the problem would
    read as a wrong id rather than as the stray space it is (a spreadsheet's padding, a copy-paste)."""
    return [_value_line(df, col, rows, "has spaces around it; remove them (ids are compared exactly)")
            for col in ("request_id", "sample_id")
            if (rows := _text_rows(df, col, lambda v: v != v.strip() and v.strip()))]


# A time of day without a zone ("2026-11-30T09:00:00") names no instant: it would be taken as UTC, silently.
# A date alone ("2026-11-30") is a day and stays allowed (its midnight, UTC).
_TIME_OF_DAY = re.compile(r"\d[T ]\d{1,2}:\d{2}")
_ZONE_SUFFIX = re.compile(r"(Z|[+-]\d{2}(:?\d{2})?)$")


def _control_characters(df: pd.DataFrame) -> list[str]:
    """Text values holding a line break, tab or other control character (a quoted CSV field may hold a
    newline): they would enter the append-only ledger and the audit trail as they are."""
    return [_value_line(df, col, rows, "holds a control character (a line break or tab); remove it (ids and "
                                       "reasons are one line of text)")
            for col in ("request_id", "sample_id", "reason", "objective")
            if (rows := _text_rows(df, col, CONTROL_CHARACTERS.search))]


def _zoneless_times(df: pd.DataFrame) -> list[str]:
    """`requested_at` values with a time of day but no zone: which instant they name depends on where they
    were written. Unparseable values are the schema's problem (one line there, not two)."""
    rows = _text_rows(df, "requested_at", lambda v: bool(_TIME_OF_DAY.search(v.strip())) and not
                      _ZONE_SUFFIX.search(v.strip()) and parse_timestamps(pd.Series([v])).notna().all())
    if not rows:
        return []
    example = df["requested_at"][rows[0]].strip()
    return [_value_line(df, "requested_at", rows, f"has a time but no time zone; add one (e.g. {example}Z for UTC, "
                                                  f"or an offset such as +01:00)")]


UNIQUE_FIX = {"request_id": "give each request its own request_id",
              "sample_id": "a sample is forgotten once: keep one row for it"}


def structural_problems(df: pd.DataFrame) -> list[str]:
    """Every schema failure of a request frame, one readable line each (a defect once, as its cause)."""
    problems = list(df.attrs.get("type_problems", []))
    df, header = _header_problems(df)
    problems += header
    if df is None:
        return problems
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        problems.append(f"missing column(s) {missing}; required columns: {list(REQUIRED_COLUMNS)}")
    if len(df) == 0:  # no rows; not said for a "header" that names no request column at all (not a request CSV)
        if len(missing) < len(REQUIRED_COLUMNS):
            problems.append("the batch is empty: a request file needs at least one row")
        return problems
    df, repeated = _repeated_requests(df)
    problems += repeated + _spaced_ids(df) + _control_characters(df) + _zoneless_times(df)
    try:
        REQUEST_SCHEMA.validate(df, lazy=True)
    except SchemaErrors as err:
        cases = err.failure_cases
        duplicates: dict[tuple, list] = {}
        for _, fc in cases.iterrows():
            column, check, value = fc.get("column"), str(fc.get("check")), fc.get("failure_case")
            if check.startswith("field_uniqueness") or check == "unique":
                duplicates.setdefault((column, value), []).append(fc.get("index"))
        reported = set()
        for _, fc in cases.iterrows():
            column, check, value = fc.get("column"), str(fc.get("check")), fc.get("failure_case")
            if check.startswith("column_in_dataframe"):
                continue  # already reported as a missing column, with the full list
            if check.startswith("column_in_schema"):
                problems.append(f"unexpected column '{value}'; allowed columns: {list(REQUEST_SCHEMA.columns)}")
            elif check.startswith("field_uniqueness") or check == "unique":
                if (column, value) not in reported:
                    reported.add((column, value))
                    problems.append(f"column '{column}' {_rows_hint(duplicates[(column, value)])}: value {value!r} "
                                    f"appears more than once; ids must be unique ({UNIQUE_FIX.get(column, 'keep one')})")
            elif check == "parses_as_timestamp":
                problems.append(f"column 'requested_at' {_row_hint(fc.get('index'))}: value {value!r} is not a valid "
                                f"timestamp (use ISO 8601, e.g. 2026-11-30T09:00:00Z)")
            elif "dtype" in check:
                problems.append(f"column '{column}': has the wrong type ({check}); values must be text")
            elif check == "not_nullable" or check.startswith("str_length"):
                problems.append(f"column '{column}' {_row_hint(fc.get('index'))}: value is empty; every row needs a {column}")
            elif check.startswith("isin"):
                problems.append(f"column '{column}' {_row_hint(fc.get('index'))}: value {value!r} is not allowed; "
                                f"allowed: {list(OBJECTIVES)}")
            else:
                problems.append(f"column '{column}' {_row_hint(fc.get('index'))}: value {value!r} failed {check}")
    return list(dict.fromkeys(problems))  # de-duplicate, keep order


def coerce_requests(df: pd.DataFrame) -> pd.DataFrame:
    """The validated, typed frame (call after `structural_problems` returned nothing)."""
    out = REQUEST_SCHEMA.validate(df).copy()
    out["requested_at"] = parse_timestamps(out["requested_at"])
    return out


def objective_problems(df: pd.DataFrame) -> list[str]:
    """One batch has one objective: a file whose `objective` column mixes values is a problem."""
    if "objective" not in df.columns:
        return []
    # Only allowed values count: a value outside them is the schema's problem (one line there, not two).
    values = sorted({v for v in df["objective"] if v in OBJECTIVES})
    return [f"column 'objective' mixes {values}; one batch has one objective (split the file)"] if len(values) > 1 else []


def future_problems(df: pd.DataFrame, max_skew_seconds: float, now: pd.Timestamp | None = None) -> list[str]:
    """`requested_at` values later than now + the declared clock-skew tolerance."""
    if "requested_at" not in df.columns or not len(df):
        return []
    now = now if now is not None else pd.Timestamp.now(tz="UTC")
    limit = now + pd.Timedelta(seconds=max_skew_seconds)
    ts = parse_timestamps(df["requested_at"])
    return [f"column 'requested_at' {_row_hint(i)}: value {df['requested_at'].iloc[n]!r} is in the future (later "
            f"than now + deletion.max_clock_skew_seconds = {max_skew_seconds:g} s)"
            for n, (i, t) in enumerate(ts.items()) if t is not pd.NaT and t == t and t > limit]


def batch_objective(df: pd.DataFrame, default: str, path: str | Path = "<batch>") -> str:
    """The batch's objective: the file's `objective` column (one value for the whole file) or the default."""
    if "objective" not in df.columns:
        return default
    problems = objective_problems(df)
    if problems:
        raise RequestValidationError(path, problems)
    values = sorted({v for v in df["objective"] if v})
    return values[0] if values else default


def ledger_matches(df: pd.DataFrame, ledger: list[dict], sample_key=lambda s: s) -> tuple[list[int], list[str]]:
    """Rows of `df` whose request_id is already in the ledger: (positions of rows with the same content,
    conflict lines for rows with different content). Content = sample id (through `sample_key`, e.g. the
    salted hash when the ledger stores hashed ids), requested_at (as a time) and reason."""
    if "request_id" not in df.columns or not ledger:
        return [], []
    by_id = {str(e["request_id"]): e for e in ledger}
    same, conflicts = [], []
    ts = parse_timestamps(df["requested_at"]) if "requested_at" in df.columns else None
    for pos, row in enumerate(df.to_dict("records")):
        entry = by_id.get(str(row.get("request_id")))
        if entry is None:
            continue
        diffs = []
        sid = row.get("sample_id")
        if sid is None or sample_key(str(sid)) != str(entry.get("sample_id")):
            diffs.append(f"sample_id {sid!r} (ledger: {entry.get('sample_id')!r})")
        if ts is not None:
            t_ledger = parse_timestamps(pd.Series([entry.get("requested_at")])).iloc[0]
            if not (ts.iloc[pos] == t_ledger):
                diffs.append(f"requested_at {row.get('requested_at')!r} (ledger: {entry.get('requested_at')!r})")
        if "reason" in row and row.get("reason") != entry.get("reason"):
            diffs.append(f"reason {row.get('reason')!r} (ledger: {entry.get('reason')!r})")
        if diffs:
            conflicts.append(f"request_id {row['request_id']!r} row {pos + 1} conflicts with the ledger entry of batch "
                             f"{entry.get('batch_id')} (file {entry.get('request_file')}, processed "
                             f"{entry.get('processed_at')}): {'; '.join(diffs)}. A request id names one request "
                             f"forever: give a new request a new request_id")
        else:
            same.append(pos)
    return same, conflicts


def in_inbox(path: Path, inbox: Path) -> bool:
    """Whether `path` is an entry of the inbox folder (as given, or after resolving symlinks)."""
    return path.absolute().parent == inbox.absolute() or path.resolve().parent == inbox.resolve()


def scan_inbox(inbox: str | Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(request files in processing order, [(entry, why it is not a request file)]).

    Request files: regular files named *.csv / *.parquet (any case), in name order (use sortable, timestamped
    names), or symlinks to such a file INSIDE the inbox under a dot-name (a staged file). Reported, never
    silently skipped: other suffixes, directories, dangling symlinks, symlinks that leave the inbox, and
    symlinks to another listed inbox file (a second name for the same requests: the target is processed
    under its own name, and the link would then dangle). Dot-files (temporary names of atomic writes,
    .gitkeep) are ignored."""
    inbox = Path(inbox)
    if not inbox.is_dir():
        return [], []
    root = inbox.resolve()
    files, odd = [], []
    for p in sorted(inbox.iterdir()):
        if p.name.startswith("."):
            continue
        if p.is_symlink():
            target = p.resolve()
            if not target.exists():
                odd.append((p, "a dangling symlink"))
                continue
            if target.parent != root:
                odd.append((p, f"a symlink leaving the inbox (to {target}); refused: copy the file into the inbox"))
                continue
            if not target.name.startswith("."):
                odd.append((p, f"a symlink to {target.name}, which is in the inbox itself: a second name for the "
                               f"same requests; refused (its target is processed under its own name)"))
                continue
        if p.is_dir():
            odd.append((p, "a directory, not a request file; put request files directly in the inbox"))
        elif not is_request_file_name(p.name):
            odd.append((p, f"suffix '{p.suffix}' is not a request file type; use .csv or .parquet"))
        elif not p.is_file():
            odd.append((p, "not a regular file"))
        else:
            files.append(p)
    return files, odd


LEFTOVER_AGE_SECONDS = 600.0
KEEP_FILES = (".gitkeep", ".keep")


def leftover_dot_files(inbox: str | Path, min_age_seconds: float = LEFTOVER_AGE_SECONDS) -> list[tuple[Path, float]]:
    """Dot-files in the inbox unchanged for `min_age_seconds` or more, with their age: the temporary name of an
    atomic drop whose writer never renamed it (it crashed, or wrote to the wrong name). Never processed and
    never moved (a writer may still own it): only reported, so a request does not wait there unseen."""
    import time

    inbox = Path(inbox)
    if not inbox.is_dir():
        return []
    now, out = time.time(), []
    for p in sorted(inbox.iterdir()):
        if p.name.startswith(".") and p.name not in KEEP_FILES and p.is_file():
            age = now - p.stat().st_mtime
            if age >= min_age_seconds:
                out.append((p, age))
    return out


def list_request_files(inbox: str | Path) -> list[Path]:
    """Request files in the inbox, in processing order (see `scan_inbox`)."""
    return scan_inbox(inbox)[0]


def kept_request_suffix(path: str | Path) -> str:
    """The format of a request file kept in requests/processed/ or rejected/: a second file of the same name is
    kept as `a.csv.2` (unlearning.io.move_unique), whose format is still .csv."""
    path = Path(path)
    if path.suffix[1:].isdigit():
        path = path.with_suffix("")
    return path.suffix.lower()


def _write_request_frame(df: pd.DataFrame, suffix: str) -> bytes:
    import io

    buffer = io.BytesIO()
    if suffix == ".csv":
        df.to_csv(buffer, index=False)
    else:
        df.to_parquet(buffer, index=False)
    return buffer.getvalue()


def redacted_request_bytes(path: str | Path, key, forgotten: set[str] | None = None) -> bytes | None:
    """The request file with its sample ids in their keyed form (`key`: the ledger's salted hash, with
    deletion.hash_sample_ids): every id, or with `forgotten` (keyed ids) only those whose key is in it. None
    when there is nothing to replace, or the file cannot be read as a request file (nothing to parse ids from).
    Ids already in the keyed form (`sha256:...`) stay as they are."""
    suffix = kept_request_suffix(path)
    try:
        df = read_request_file(path, suffix)
    except RequestValidationError:
        return None
    if "sample_id" not in df.columns:
        return None
    ids = df["sample_id"]
    keyed = ids.map(lambda s: s if not isinstance(s, str) or s.startswith("sha256:") else key(s))
    hit = (keyed != ids) & ids.map(lambda s: isinstance(s, str))
    if forgotten is not None:
        hit &= keyed.isin(forgotten)
    if not hit.any():
        return None
    df = df.copy()
    df.loc[hit, "sample_id"] = keyed[hit]
    return _write_request_frame(df, suffix)


def plain_forgotten_ids(path: str | Path, key, forgotten: set[str]) -> int:
    """How many sample ids of a request file are forgotten (`key(id)` in `forgotten`) and written in plain text."""
    try:
        df = read_request_file(path, kept_request_suffix(path))
    except RequestValidationError:
        return 0
    if "sample_id" not in df.columns:
        return 0
    return int(sum(1 for s in df["sample_id"] if isinstance(s, str) and not s.startswith("sha256:")
                   and key(s) in forgotten))
