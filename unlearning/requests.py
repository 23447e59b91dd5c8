"""Deletion requests: reading CSV/Parquet files and the structural pandera schema (docs/design.md §3).

A request file has `request_id, sample_id, requested_at, reason` and optionally `objective`. The
structural checks live here (pure core, about a second with the imports); the checks against the manifest
(ids exist, not already deleted; a validation row is allowed: erased, not unlearned) run as a Great Expectations suite at the task
boundary, only once the structure is valid (adapters/request_check.py). Problems are collected, never raised
one at a time, so each stage reports every problem it finds, one line each.

Each check is one vectorized pass over a column (Arrow compute kernels on the text columns, pandas on the
rest), so a 10^6-row file is checked in seconds. Hostile and odd input gets its own line with the fix: a
symlink, directory or FIFO (`entry_problem`, the inbox scan's rule too), a file whose bytes are not its
suffix's format or a truncated Parquet file, a nested Parquet column, a repeated header row, text a
spreadsheet would run as a formula (`FORMULA_COLUMNS`), and, at the manifest check, an id that is a
look-alike of a manifest id (`look_alike_forms`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors

from unlearning.privacy.ids import CONTROL_CHARACTERS
from unlearning.io import dangling_symlink_problem
from unlearning.privacy.salt import is_keyed

OBJECTIVES = ("retrain_equivalence", "suppression")
REQUIRED_COLUMNS = ("request_id", "sample_id", "requested_at", "reason")
REQUEST_SUFFIXES = (".csv", ".parquet")
TEXT_COLUMNS = ("request_id", "sample_id", "reason", "objective")

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


PARQUET_MAGIC = b"PAR1"  # a Parquet file starts and ends with it


def _signature_problem(path: Path, suffix: str) -> str | None:
    """A file whose bytes say it is not what its name says, or a truncated Parquet file: one line with the fix
    (pyarrow's own error names neither). Read from the file's first and last 4 bytes."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(max(size - 4, 0))
            tail = f.read(4)
    except OSError:
        return None  # the reader says what is wrong
    if suffix == ".csv":
        return ("this is a Parquet file (it starts with the Parquet signature PAR1), not CSV text: name it "
                ".parquet") if head == PARQUET_MAGIC else None
    if size == 0:
        return None  # the empty-file line
    if head != PARQUET_MAGIC:
        return ("not a Parquet file (it does not start with the Parquet signature PAR1): if it is CSV, name it "
                ".csv; otherwise write it again with a Parquet writer (e.g. df.to_parquet)")
    if size < 12 or tail != PARQUET_MAGIC:
        return ("a truncated Parquet file (it has no Parquet footer: its write or copy did not finish); write or "
                "copy it again")
    return None


def _parquet_type_problem(col: str, dtype) -> str | None:
    """A Parquet column whose type is not text: ids written as integers lose leading zeros and formatting,
    bytes are not text at all, a nested column (struct, list, map) holds no single value per row."""
    import pyarrow.types as pat

    if pat.is_dictionary(dtype):
        dtype = dtype.value_type
    if pat.is_string(dtype) or pat.is_large_string(dtype) or pat.is_null(dtype):
        return None
    if pat.is_binary(dtype) or pat.is_large_binary(dtype) or pat.is_fixed_size_binary(dtype):
        return f"column '{col}': Parquet type is bytes (binary); write it as a UTF-8 string column"
    if pat.is_nested(dtype):
        return (f"column '{col}': Parquet type is {dtype} (a nested column), not text; a request file has flat "
                f"columns of text, one value per row: write '{col}' as a string column")
    if col in TEXT_COLUMNS and (pat.is_integer(dtype) or pat.is_floating(dtype) or pat.is_boolean(dtype)
                                or pat.is_decimal(dtype)):
        return (f"column '{col}': Parquet type is {dtype} (not text); ids and reasons must be strings "
                f"(write them as a string column, e.g. df['{col}'].astype(str))")
    return None


def _read_parquet(path: Path) -> tuple[pd.DataFrame, list[str]]:
    """Every column as text, and the columns whose Parquet type is not text (reported like any other problem:
    the values are still read, as text, so the other checks run too). Types are read from the file's schema,
    not from its values: one look per column, whatever the rows."""
    import pyarrow.parquet as pq
    import pyarrow.types as pat

    table = pq.read_table(path)
    problems = [p for f in table.schema if (p := _parquet_type_problem(f.name, f.type))]
    columns = {}
    for f, column in zip(table.schema, table.columns):
        dtype = f.type.value_type if pat.is_dictionary(f.type) else f.type
        if pat.is_binary(dtype) or pat.is_large_binary(dtype) or pat.is_fixed_size_binary(dtype):
            values = [v.decode("utf-8", "replace") if v is not None else None for v in column.to_pylist()]
            columns[f.name] = pd.Series(values, dtype=object)
        elif pat.is_nested(dtype):
            columns[f.name] = pd.Series([None if v is None else str(v) for v in column.to_pylist()], dtype=object)
        else:
            columns[f.name] = column.to_pandas().astype("string").astype(object)
    return pd.DataFrame(columns, columns=table.column_names), problems


def read_request_file(path: str | Path, suffix: str | None = None) -> pd.DataFrame:
    """Read a request file with every column as text (ids stay strings; types are checked later). Parquet
    columns that are not text are noted in `df.attrs["type_problems"]` (reported by `structural_problems`).
    `suffix`: the format, when the name does not end in it (a kept copy `a.csv.2`, see `kept_request_suffix`)."""
    path = Path(path)
    suffix = suffix or path.suffix.lower()
    if suffix not in REQUEST_SUFFIXES:
        raise RequestValidationError(path, [f"file type '{path.suffix}' is not supported; use .csv or .parquet"])
    type_problems: list[str] = []
    mislabeled = _signature_problem(path, suffix)
    if mislabeled:
        raise RequestValidationError(path, [mislabeled])
    if suffix == ".csv":
        widths = field_count_problems(path)
        if widths:  # the columns of those rows cannot be told apart: nothing more is checked
            raise RequestValidationError(path, widths)
    try:
        if suffix == ".csv":
            # index_col=False: a row with one field too many must never turn its first field into the index
            df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""], index_col=False)
        else:
            df, type_problems = _read_parquet(path)
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
    row numbers match the other problems'. A row whose quote (") is never closed swallows the lines after it
    as one value: that row is named by its quote, not by its field count alone (`unclosed_quote_problem`). A
    file that is not UTF-8 CSV is left to the reader's own error."""
    import csv

    bad: dict[int, list[int]] = {}
    quoted: list[str] = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            lines: list[str] = []  # the physical lines of the record being read (a quoted value spans several)

            def physical():
                for line in f:
                    lines.append(line)
                    yield line

            reader = csv.reader(physical())
            header = next(reader, None)
            if not header:
                return []
            row, first_line = 0, reader.line_num + 1
            lines.clear()
            for fields in reader:
                raw, start, first_line = "".join(lines), first_line, reader.line_num + 1
                lines.clear()
                if not fields:
                    continue
                row += 1
                if len(fields) != len(header) and raw.count('"') % 2:
                    quoted.append(unclosed_quote_problem(row, start, reader.line_num, len(fields), header))
                elif len(fields) != len(header):
                    bad.setdefault(len(fields), []).append(row)
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    problems = quoted
    for width, rows in sorted(bad.items()):
        more = f" and {len(rows) - MAX_ROWS_NAMED} more" if len(rows) > MAX_ROWS_NAMED else ""
        problems.append(f"{rows_text(rows[:MAX_ROWS_NAMED])}{more}: {width} field(s), but the header has "
                        f"{len(header)} ({', '.join(header)}); quote a value that holds a comma (\"a,b\") and "
                        f"give every row one value per column (an empty value is written as nothing between commas)")
    return problems


def unclosed_quote_problem(row: int, start: int, end: int, width: int, header: list[str]) -> str:
    """A row whose quote (") opens a value that does not close where the row ends: the CSV reader took the
    following lines (to the next quote, or to the end of the file) as part of that one value."""
    spans = f"lines {start}-{end}" if end > start else f"line {start}"
    return (f"row {row} (file {spans}): a quote (\") opens a value that is never closed on its line, so "
            + (f"the {end - start} line(s) after it were read as part of that one value; " if end > start else "")
            + f"the row has {width} field(s), the header {len(header)} ({', '.join(header)}); close the quote "
            f"(\"a,b\"), or remove it, or double a quote meant inside a quoted value (\"\")")


ROWS_SHOWN = 20  # a problem line names at most this many rows (a 100k-row file made one line of 679 KB)
MAX_VALUE_LINES = 20  # repeated values (or requests) named one line each; the rest share one line


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
    import pyarrow.compute as pc

    # a request repeats only where both ids repeat: one count in Arrow answers the common case (unique ids)
    if any(pc.count_distinct(_arrow_text(df[c]), mode="all").as_py() == len(df) for c in ("request_id", "sample_id")):
        return df, []
    keys = df[["request_id", "sample_id"]]
    both = keys.notna().all(axis=1)
    dup = both & keys.duplicated(keep=False)
    if not dup.any():
        return df, []
    problems = []
    groups = keys[dup].groupby(["request_id", "sample_id"], sort=False)
    for n, ((rid, sid), group) in enumerate(groups):
        if n == MAX_VALUE_LINES:
            problems.append(f"{groups.ngroups - MAX_VALUE_LINES} more request(s) appear more than once; keep one row "
                            f"of each")
            break
        problems.append(f"{_rows_hint(group.index)}: the same request (request_id {rid!r}, sample_id {sid!r}) "
                        f"appears {len(group)} times; keep one row")
    repeat = dup & keys.duplicated(keep="first")  # every repeat after a request's first row
    return df.loc[~repeat.to_numpy()], problems


def arrow_text(values: pd.Series):
    """A text column as an Arrow large_string array (a missing value is null): the checks run as Arrow compute
    kernels, one pass over the column each, instead of a Python call per value (a 10^6-row file). pandas 3
    keeps text in Arrow already (the `str` dtype): then nothing is copied, and no Python string is made."""
    import pyarrow as pa

    try:
        arr = pa.array(values, from_pandas=True)
    except (pa.ArrowException, TypeError, ValueError):  # an object column mixing types: each value as text
        arr = pa.array([None if v is None or v != v else str(v) for v in values], type=pa.large_string())
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) or pa.types.is_null(arr.type)):
        arr = pa.array([None if v is None or v != v else str(v) for v in values], type=pa.large_string())
    return arr.cast(pa.large_string())


_arrow_text = arrow_text


def _mask(flags) -> np.ndarray:
    """An Arrow boolean array as a numpy mask (a null value is never flagged)."""
    import pyarrow.compute as pc

    return pc.fill_null(flags, False).to_numpy(zero_copy_only=False)


def _matches(text, pattern: str) -> np.ndarray:
    """Rows whose value matches the RE2 `pattern` (Arrow's regex engine)."""
    import pyarrow.compute as pc

    return _mask(pc.match_substring_regex(text, pattern))


class _Texts:
    """The frame's text columns as Arrow arrays, converted once for all the checks of one frame."""

    def __init__(self, df: pd.DataFrame):
        self.df, self._cache = df, {}

    def __contains__(self, col: str) -> bool:
        return col in self.df.columns

    def __getitem__(self, col: str):
        if col not in self._cache:
            self._cache[col] = _arrow_text(self.df[col])
        return self._cache[col]

    def rows(self, col: str, mask: np.ndarray) -> list:
        """The index labels of the flagged rows."""
        return self.df.index[mask].tolist()


def _value_line(df: pd.DataFrame, col: str, rows: list, says: str) -> str:
    """One problem line for the flagged rows of a column: the rows, the first value, and what is wrong."""
    return (f"column '{col}' {_rows_hint(rows)}: value {df[col][rows[0]]!r}"
            f"{' (and others)' if len(rows) > 1 else ''} {says}")


def _spaced_ids(texts: _Texts) -> list[str]:
    """Ids with spaces around them: compared exactly, 'digits-0145 ' is an unknown id, and the problem would
    read as a wrong id rather than as the stray space it is (a spreadsheet's padding, a copy-paste)."""
    import pyarrow.compute as pc

    lines = []
    for col in ("request_id", "sample_id"):
        if col not in texts:
            continue
        text = texts[col]
        trimmed = pc.utf8_trim_whitespace(text)
        spaced = _mask(pc.and_(pc.not_equal(trimmed, text), pc.greater(pc.utf8_length(trimmed), 0)))
        # a tab or line break at an end is the control-character line's (one problem, one line)
        rows = texts.rows(col, spaced & ~_matches(text, _CONTROL))
        if rows:
            lines.append(_value_line(texts.df, col, rows, "has spaces around it; remove them (ids are compared "
                                                          "exactly)"))
    return lines


# A time of day without a zone ("2026-11-30T09:00:00") names no instant: it would be taken as UTC, silently.
# A date alone ("2026-11-30") is a day and stays allowed (its midnight, UTC).
_TIME_OF_DAY = r"\d[T ]\d{1,2}:\d{2}"
_ZONE_SUFFIX = r"(Z|[+-]\d{2}(:?\d{2})?)$"
_CONTROL = CONTROL_CHARACTERS.pattern  # unlearning.privacy.ids' class, valid RE2 (Arrow's regex engine) as it is
# A spreadsheet reads a cell starting with one of these as a formula (CSV injection: `=cmd|' /C calc'!A0`);
# a leading tab or carriage return is a control character (refused by `_control_characters`).
FORMULA_LEAD = r"^[=+\-@]"
# Refused where the request's own text enters the ledger (request_id, reason; objective is one of a fixed
# set). Not sample_id: a sample id is compared exactly with the manifest, so one that passes is the team's own
# id, already in the prepared data; refusing it would leave that row impossible to erase (unlearning/privacy/ids.py).
FORMULA_COLUMNS = ("request_id", "reason", "objective")


def _control_characters(texts: _Texts) -> list[str]:
    """Text values holding a line break, tab or other control character (a quoted CSV field may hold a
    newline): they would enter the append-only ledger and the audit trail as they are."""
    return [_value_line(texts.df, col, rows, "holds a control character (a line break or tab); remove it (ids "
                                             "and reasons are one line of text)")
            for col in TEXT_COLUMNS if col in texts and (rows := texts.rows(col, _matches(texts[col], _CONTROL)))]


def _formula_text(texts: _Texts) -> list[str]:
    """request_id / reason values starting with = + - @: the ledger and the request file are read back into
    spreadsheets, which would run them as formulas (CSV injection)."""
    return [_value_line(texts.df, col, rows, "starts with '=', '+', '-' or '@', which a spreadsheet runs as a "
                                             "formula; start it with a letter or a digit (e.g. drop the leading "
                                             "character)")
            for col in FORMULA_COLUMNS if col in texts and (rows := texts.rows(col, _matches(texts[col], FORMULA_LEAD)))]


def _zoneless_times(texts: _Texts) -> list[str]:
    """`requested_at` values with a time of day but no zone: which instant they name depends on where they
    were written. Unparseable values are the schema's problem (one line there, not two)."""
    import pyarrow.compute as pc

    if "requested_at" not in texts:
        return []
    stripped = pc.utf8_trim_whitespace(texts["requested_at"])
    candidates = _matches(stripped, _TIME_OF_DAY) & ~_matches(stripped, _ZONE_SUFFIX)
    if candidates.any():  # only those few are parsed one more time
        df = texts.df
        candidates[candidates] = parse_timestamps(df["requested_at"][candidates]).notna().to_numpy()
    rows = texts.rows("requested_at", candidates)
    if not rows:
        return []
    example = texts.df["requested_at"][rows[0]].strip()
    return [_value_line(texts.df, "requested_at", rows, f"has a time but no time zone; add one (e.g. {example}Z "
                                                        f"for UTC, or an offset such as +01:00)")]


def _repeated_headers(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Data rows that repeat the header (two files joined, each with its header): one line, and those rows are
    left out of the other checks (their 'requested_at' is no timestamp, their ids no ids)."""
    cols = [c for c in REQUIRED_COLUMNS if c in df.columns]
    if len(cols) < 2 or not len(df):
        return df, []
    import pyarrow.compute as pc

    same = np.ones(len(df), dtype=bool)
    for c in cols:  # in Arrow: no Python string per value (a 10^6-row file)
        same &= _mask(pc.equal(pc.utf8_lower(pc.utf8_trim_whitespace(_arrow_text(df[c]))), c))
    if not same.any():
        return df, []
    rows = df.index[same].tolist()
    return df.loc[~same], [f"{_rows_hint(rows)}: repeat(s) the header ({','.join(map(str, df.columns))}); remove "
                           f"{'it' if len(rows) == 1 else 'them'} (files joined with their headers: keep the first "
                           f"header only)"]


UNIQUE_FIX = {"request_id": "give each request its own request_id",
              "sample_id": "a sample is forgotten once: keep one row for it"}


# Letters that look like Latin ones but are not (NFKC keeps them): the dotless i, Cyrillic and Greek capitals
# and small letters with a Latin twin, and the dashes a word processor puts in place of a hyphen.
_CONFUSABLES = str.maketrans({
    "ı": "i", "ȷ": "j", "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "х": "x", "у": "y", "і": "i", "ј": "j",
    "ѕ": "s", "ԁ": "d", "ο": "o", "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P",
    "С": "C", "Т": "T", "Х": "X", "Α": "A", "Β": "B", "Ε": "E", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
    "Ο": "O", "Ρ": "P", "Τ": "T", "Χ": "X", "Υ": "Y", "Ζ": "Z", "‐": "-", "‑": "-", "‒": "-", "–": "-", "—": "-",
    "−": "-"})


def look_alike_forms(value: str) -> list[tuple[str, str]]:
    """The forms an id may have been meant as, each with how `value` differs from it: NFKC-normalized
    (full-width digits, ligatures), without invisible characters (Unicode format characters: zero-width space,
    soft hyphen, byte-order mark), with look-alike letters mapped to their Latin twins; then also lowercased.
    The ids in a request are compared exactly: these forms only name the id a typo-free request meant."""
    import unicodedata

    how = []
    form = unicodedata.normalize("NFKC", value)
    if form != value:
        how.append("full-width or compatibility characters")
    visible = "".join(ch for ch in form if unicodedata.category(ch) != "Cf")
    if visible != form:
        how.append("an invisible character")
    latin = visible.translate(_CONFUSABLES)
    if latin != visible:
        how.append("a letter that only looks Latin, such as a dotless 'ı' or a Cyrillic 'а'")
    forms = [(latin, ", ".join(how) or "the same characters")]
    if latin.lower() != latin:
        forms.append((latin.lower(), ", ".join(how + ["upper-case letters"])))
    return forms


def _schema_lines(cases: pd.DataFrame) -> list[str]:
    """pandera's failure cases as problem lines: one line per (column, check), naming its rows and first value
    (one row: exactly the line of that row), so a 10^6-row file with one defect in every row answers with one
    line, grouped in one pass (not a Python step per failing row); a duplicated id gets one line per value
    (its rows), the values past MAX_VALUE_LINES one more line."""
    lines = []
    cases = cases.assign(check=cases["check"].astype(str))
    for (column, check), group in cases.groupby(["column", "check"], sort=False, dropna=False):
        rows, values = group["index"], group["failure_case"]
        first = values.iloc[0]
        others = " (and others)" if values.nunique(dropna=False) > 1 else ""
        where = _rows_hint(rows)
        if check.startswith("column_in_dataframe"):
            continue  # already reported as a missing column, with the full list
        if check.startswith("column_in_schema"):
            lines += [f"unexpected column '{v}'; allowed columns: {list(REQUEST_SCHEMA.columns)}"
                      for v in dict.fromkeys(values)]
        elif check.startswith("field_uniqueness") or check == "unique":
            fix = UNIQUE_FIX.get(column, "keep one")
            by_value = group.groupby("failure_case", sort=False)["index"]
            for n, (value, value_rows) in enumerate(by_value):
                if n == MAX_VALUE_LINES:
                    rest = by_value.ngroups - MAX_VALUE_LINES
                    lines.append(f"column '{column}': {rest} more value(s) appear more than once; ids must be unique "
                                 f"({fix})")
                    break
                lines.append(f"column '{column}' {_rows_hint(value_rows)}: value {value!r} appears more than once; "
                             f"ids must be unique ({fix})")
        elif check == "parses_as_timestamp":
            lines.append(f"column 'requested_at' {where}: value {first!r}{others} is not a valid timestamp (use ISO "
                         f"8601, e.g. 2026-11-30T09:00:00Z)")
        elif "dtype" in check:
            lines.append(f"column '{column}': has the wrong type ({check}); values must be text")
        elif check == "not_nullable" or check.startswith("str_length"):
            lines.append(f"column '{column}' {where}: value is empty; every row needs a {column}")
        elif check.startswith("isin"):
            lines.append(f"column '{column}' {where}: value {first!r}{others} is not allowed; allowed: "
                         f"{list(OBJECTIVES)}")
        else:
            lines.append(f"column '{column}' {where}: value {first!r}{others} failed {check}")
    return lines


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
    df, headers = _repeated_headers(df)
    df, repeated = _repeated_requests(df)
    texts = _Texts(df)
    problems += headers + repeated + _spaced_ids(texts) + _control_characters(texts) + _formula_text(texts)
    problems += _zoneless_times(texts)
    try:
        REQUEST_SCHEMA.validate(df, lazy=True)
    except SchemaErrors as err:
        problems += _schema_lines(err.failure_cases)
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
    """`requested_at` values later than now + the declared clock-skew tolerance (one line per row, the rows past
    ROWS_SHOWN in one more line)."""
    if "requested_at" not in df.columns or not len(df):
        return []
    now = now if now is not None else pd.Timestamp.now(tz="UTC")
    limit = now + pd.Timedelta(seconds=max_skew_seconds)
    late = (parse_timestamps(df["requested_at"]) > limit).to_numpy(dtype=bool)  # NaT compares False
    positions = np.flatnonzero(late)
    tolerance = f"now + deletion.max_clock_skew_seconds = {max_skew_seconds:g} s"
    lines = [f"column 'requested_at' {_row_hint(df.index[n])}: value {df['requested_at'].iloc[n]!r} is in the "
             f"future (later than {tolerance})" for n in positions[:ROWS_SHOWN]]
    if len(positions) > ROWS_SHOWN:
        rest = [df.index[n] for n in positions[ROWS_SHOWN:]]
        lines.append(f"column 'requested_at' {_rows_hint(rest)}: {len(rest)} more value(s) in the future (later "
                     f"than {tolerance})")
    return lines


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
    salted hash when the ledger stores hashed ids), requested_at (as a time) and reason. Vectorized: only the
    rows whose request_id the ledger holds are keyed, compared and (when they conflict) described."""
    if "request_id" not in df.columns or not ledger:
        return [], []
    by_id = {str(e["request_id"]): e for e in ledger}  # the last entry of a request_id, as before
    rids = df["request_id"].astype(str).where(df["request_id"].notna(), None)
    positions = np.flatnonzero(rids.isin(list(by_id)).to_numpy())
    if not len(positions):
        return [], []
    entries = [by_id[r] for r in rids.iloc[positions]]
    rows = df.iloc[positions]
    sids = rows["sample_id"] if "sample_id" in rows.columns else pd.Series(None, index=rows.index, dtype=object)
    same_sid = np.array([s is not None and s == s and sample_key(str(s)) == str(e.get("sample_id"))
                         for s, e in zip(sids, entries)], dtype=bool)
    if "requested_at" in rows.columns:
        mine = parse_timestamps(rows["requested_at"].reset_index(drop=True))
        theirs = parse_timestamps(pd.Series([e.get("requested_at") for e in entries], dtype=object))
        same_time = (mine == theirs).to_numpy(dtype=bool)  # NaT never equals: an unparseable time differs
    else:
        same_time = np.ones(len(positions), dtype=bool)
    if "reason" in rows.columns:
        same_reason = np.array([r == e.get("reason") for r, e in zip(rows["reason"], entries)], dtype=bool)
    else:
        same_reason = np.ones(len(positions), dtype=bool)
    same = same_sid & same_time & same_reason
    conflicts = []
    differing = np.flatnonzero(~same)
    if len(differing) > ROWS_SHOWN:
        rest = [int(positions[k]) + 1 for k in differing[ROWS_SHOWN:]]
        conflicts_rest = (f"request_id column {rows_text(rest)}: {len(rest)} more request id(s) conflict with their "
                          f"ledger entries (other sample_id, requested_at or reason). A request id names one request "
                          f"forever: give a new request a new request_id")
    for k in differing[:ROWS_SHOWN]:
        pos, entry, row = int(positions[k]), entries[k], rows.iloc[k]
        diffs = []
        if not same_sid[k]:
            diffs.append(f"sample_id {row.get('sample_id')!r} (ledger: {entry.get('sample_id')!r})")
        if not same_time[k]:
            diffs.append(f"requested_at {row.get('requested_at')!r} (ledger: {entry.get('requested_at')!r})")
        if not same_reason[k]:
            diffs.append(f"reason {row.get('reason')!r} (ledger: {entry.get('reason')!r})")
        conflicts.append(f"request_id {row['request_id']!r} row {pos + 1} conflicts with the ledger entry of batch "
                         f"{entry.get('batch_id')} (file {entry.get('request_file')}, processed "
                         f"{entry.get('processed_at')}): {'; '.join(diffs)}. A request id names one request "
                         f"forever: give a new request a new request_id")
    if len(differing) > ROWS_SHOWN:
        conflicts.append(conflicts_rest)
    return [int(p) for p in positions[same]], conflicts


def in_inbox(path: Path, inbox: Path) -> bool:
    """Whether `path` is an entry of the inbox folder (as given, or after resolving symlinks)."""
    return path.absolute().parent == inbox.absolute() or path.resolve().parent == inbox.resolve()


def entry_problem(path: str | Path, inbox: str | Path | None = None) -> str | None:
    """Why `path` is not a file the pipeline reads requests from (None when it is one), by what it is, before a
    byte of it is read: the one rule of the inbox scan (`scan_inbox`), `unlearn validate`, `unlearn run FILE`
    and the deletion flow's check. A symlink is read only as an inbox entry naming a staged dot-file inside
    the inbox (an atomic drop); any other is refused, so no check ever reads (and quotes) a file it leads to
    elsewhere. A directory and anything that is not a regular file (a FIFO, a device) are refused too."""
    path = Path(path)
    inside = inbox is not None and in_inbox(path, Path(inbox))
    if path.is_symlink():
        target = path.resolve()
        if not target.exists():
            return dangling_symlink_problem(path)
        if not inside:
            return (f"a symlink (to {target}); refused, as the deletion flow refuses a symlink leaving its inbox: "
                    f"copy the file itself")
        if target.parent != Path(inbox).resolve():
            return f"a symlink leaving the inbox (to {target}); refused: copy the file into the inbox"
        if not target.name.startswith("."):
            return (f"a symlink to {target.name}, which is in the inbox itself: a second name for the same "
                    f"requests; refused (its target is processed under its own name)")
    if path.is_dir():
        return ("a directory, not a request file; put request files directly in the inbox" if inside else
                "a directory, not a request file; name one request file (.csv or .parquet)")
    if path.exists() and not path.is_file():
        return "not a regular file (a FIFO or a device); a request file is a regular .csv or .parquet file"
    return None


def scan_inbox(inbox: str | Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(request files in processing order, [(entry, why it is not a request file)]).

    Request files: regular files named *.csv / *.parquet (any case), in name order (use sortable, timestamped
    names), or symlinks to such a file INSIDE the inbox under a dot-name (a staged file). Reported, never
    silently skipped: other suffixes, directories, dangling symlinks, symlinks that leave the inbox, and
    symlinks to another listed inbox file (a second name for the same requests: the target is processed
    under its own name, and the link would then dangle); see `entry_problem`. Dot-files (temporary names of
    atomic writes, .gitkeep) are ignored."""
    inbox = Path(inbox)
    if not inbox.is_dir():
        return [], []
    files, odd = [], []
    for p in sorted(inbox.iterdir()):
        if p.name.startswith("."):
            continue
        problem = entry_problem(p, inbox)
        if problem is None and not is_request_file_name(p.name):
            problem = f"suffix '{p.suffix}' is not a request file type; use .csv or .parquet"
        if problem:
            odd.append((p, problem))
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
    Ids already in the keyed form (`hmac-sha256:...`, unlearning/privacy/salt.py `is_keyed`) stay as they are."""
    suffix = kept_request_suffix(path)
    try:
        df = read_request_file(path, suffix)
    except RequestValidationError:
        return None
    if "sample_id" not in df.columns:
        return None
    ids = df["sample_id"]
    keyed = ids.map(lambda s: s if not isinstance(s, str) or is_keyed(s) else key(s))
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
    return int(sum(1 for s in df["sample_id"] if isinstance(s, str) and not is_keyed(s)
                   and key(s) in forgotten))
