"""Tables that used to load wrongly without a word: features beyond float32, the text 'NA' read as a gap,
labels merged by their number, ids no request can name, a saved pandas index, a byte order mark.
Each table is a few rows written in tmp_path; warnings are errors (a RuntimeWarning was the only sign)."""

import warnings

import numpy as np
import pandas as pd
import pytest

from unlearning.data import DataError, apply_preprocessing, load_dataset, load_prepared, write_prepared

pytestmark = pytest.mark.filterwarnings("error")


def csv(tmp_path, text: str, name="t.csv", **table):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_dataset("table", path=str(path), **{"id_column": "id", "label_column": "y", **table})


def lines(row, n=12) -> str:
    return "\n".join(row(i) for i in range(n)) + "\n"


# --- 1. features that are not finite float32 ---------------------------------------------------------
def test_huge_but_finite_column_standardizes_without_overflow(tmp_path):
    """1e12 .. 1e232: the squares of the plain std overflow (it fell back to 1.0 and features.npy held inf)."""
    ds = csv(tmp_path, "id,x,y\n" + lines(lambda i: f"r{i},{10.0 ** (12 + 20 * i)},{i % 2}"))
    prep = ds.meta["preprocessing"]
    assert np.isfinite(ds.X).all() and prep["stds"]["x"] > 1e200
    assert np.isfinite(apply_preprocessing(pd.DataFrame({"x": [1e232, 1e12]}), prep)).all()
    edge = csv(tmp_path, "id,x,y\n" + lines(lambda i: f"r{i},{1.7e308 * (-1) ** i},{i % 2}"), name="edge.csv")
    assert np.isfinite(edge.X).all() and set(np.round(edge.X[:, 0], 5)) == {-1.0, 1.0}


def test_ordinary_columns_keep_their_exact_statistics(tmp_path):
    """The overflow-safe path is only taken when needed: recorded means/stds (the dataset identity) stay."""
    x = np.random.default_rng(0).normal(40, 10, 12).round(2)
    ds = csv(tmp_path, "id,x,y,s\n" + lines(lambda i: f"r{i},{x[i]},{i % 2},{'train' if i < 10 else 'val'}"),
             split_column="s")
    assert ds.meta["preprocessing"]["means"]["x"] == float(x[:10].mean())
    assert ds.meta["preprocessing"]["stds"]["x"] == float(x[:10].std())


def test_feature_beyond_float32_after_standardizing_is_a_named_error(tmp_path):
    """Training rows all 1.0 (std 0 -> 1), a validation row of 1e300: standardized it is inf in float32."""
    text = "id,x,y,s\n" + lines(lambda i: f"r{i},{1e300 if i == 11 else 1.0},{i % 2},{'val' if i > 9 else 'train'}")
    with pytest.raises(DataError) as e:
        csv(tmp_path, text, split_column="s")
    msg = str(e.value)
    assert "'x'" in msg and "'r11'" in msg and "1e+300" in msg and "float32" in msg
    assert "log" in msg and "prepare.table.feature_columns" in msg


def test_prepare_stage_refuses_instead_of_writing_inf(tmp_path):
    from tasks.training import prepare_dataset
    from unlearning.config import parse_params

    (tmp_path / "t.csv").write_text("id,x,y,s\n" + lines(
        lambda i: f"r{i},{1e300 if i == 11 else 1.0},{i % 2},{'val' if i > 9 else 'train'}"))
    params = parse_params({"prepare": {"dataset": "table", "table": {"path": "t.csv", "id_column": "id",
                                                                     "label_column": "y", "split_column": "s"}}},
                          root=tmp_path)
    with pytest.raises(DataError, match="do not fit a float32 feature"):
        prepare_dataset.fn(params)
    assert not (tmp_path / "prepared" / "features.npy").exists()


# --- 2. 'NA', 'None', 'null' are text ----------------------------------------------------------------
def test_na_is_an_id_a_class_and_a_category(tmp_path):
    """Namibia ('NA') as id, as class and, when the team says so (prepare.table.missing_markers without it), as a
    category; then only an empty cell is missing in a text column."""
    text = "id,region,x,y\n" + lines(lambda i: f"{'NA' if i == 3 else f'r{i}'},{['NA', 'EU', 'None'][i % 3]},"
                                               f"{i},{['NA', 'EU'][i % 2]}")
    ds = csv(tmp_path, text, missing="drop", missing_markers=["?"])
    assert "NA" in set(ds.sample_id) and len(ds.sample_id) == 12 and ds.meta["n_dropped_missing"] == 0
    assert ds.fine_class_names == ["EU", "NA"]
    assert ds.meta["preprocessing"]["feature_names"] == ["region=EU", "region=NA", "region=None", "x"]
    write_prepared(ds, tmp_path / "prep")
    back = load_prepared(tmp_path / "prep").manifest  # the manifest reads 'NA' back as the id and class it is
    assert back["sample_id"].tolist() == list(ds.sample_id) and set(back["class_name"]) == {"EU", "NA"}
    assert set(back["group"]) == {"EU", "NA"}
    with pytest.raises(DataError, match=r"row 5 \(no id\)|'r5'") as e:
        csv(tmp_path, text.replace("r5,", ",", 1).replace("\nr6,NA,", "\nr6,,"), name="gap.csv", missing_markers=["?"])
    assert "'r6'" in str(e.value) and "'id' 1, 'region' 1" in str(e.value)


@pytest.mark.parametrize("marker", ["?", "NA", "N/A", "   ", " ? "])
def test_a_missing_marker_in_a_text_column_is_missing_not_a_category(tmp_path, marker):
    """Adult's `workclass` holds '?' for 'unknown': not a category of its own (nor a shard of its own). A text
    feature column's empty, spaces-only or marker cell is missing, and prepare.table.missing decides: refused by
    default, in one line naming the column, the count and the rows; dropped (and counted) with missing: drop."""
    text = "id,workclass,age,y\n" + lines(lambda i: f"r{i},{marker if i in (2, 7) else ['Private', 'State'][i % 2]},"
                                                   f"{'?' if i == 4 else 30 + i},{i % 2}")
    with pytest.raises(DataError) as e:
        csv(tmp_path, text)
    msg = str(e.value)
    assert "rows with missing values: 3 (cells per column: 'workclass' 2, 'age' 1)" in msg, msg
    assert "'r2'" in msg and "'r7'" in msg and "'r4'" in msg and "missing: drop" in msg
    ds = csv(tmp_path, text, missing="drop")
    assert ds.meta["n_dropped_missing"] == 3 and len(ds.sample_id) == 9
    assert ds.meta["missing_markers_found"] == {"workclass": 2, "age": 1}
    assert ds.meta["preprocessing"]["feature_names"] == ["workclass=Private", "workclass=State", "age"]
    assert ds.meta["feature_types"]["age"] == "long"  # a number column but for its '?'


def test_na_in_a_column_of_numbers_or_booleans_is_missing(tmp_path):
    """Where 'NA' can only mean a gap (every other value a number, or a boolean), it is one, as before."""
    text = "id,x,flag,y\n" + lines(lambda i: f"r{i},{'NA' if i == 2 else i},{'null' if i == 4 else i % 3 == 0},"
                                             f"{i % 2}")
    with pytest.raises(DataError) as e:
        csv(tmp_path, text)
    msg = str(e.value)
    assert "'r2'" in msg and "'r4'" in msg and "'x'" in msg and "'flag'" in msg and "missing: drop" in msg
    ds = csv(tmp_path, text, missing="drop")
    assert len(ds.sample_id) == 10 and ds.meta["n_dropped_missing"] == 2
    assert ds.meta["preprocessing"]["feature_names"] == ["x", "flag=False", "flag=True"]


# --- 3. labels as written ------------------------------------------------------------------------------
@pytest.mark.parametrize("values, classes", [
    (["01", "1", "2"], ["01", "1", "2"]),     # were merged into '1', '2'
    (["007", "7"], ["007", "7"]),             # was "every row has the label '7'"
    ([str(c) for c in range(12)], [str(c) for c in range(12)]),  # numbers in numeric order, not '10' < '2'
    (["b", "a10", "a2"], ["a10", "a2", "b"]),  # text in text order
    (["0.0", "1.0", "10.0"], ["0", "1", "10"]),  # pandas' float format of an int column with gaps, as before
])
def test_labels_are_read_as_text_and_ordered_deterministically(tmp_path, values, classes):
    n = 4 * len(values)
    ds = csv(tmp_path, "id,x,y\n" + lines(lambda i: f"r{i},{i},{values[i % len(values)]}", n))
    assert ds.fine_class_names == classes
    named = dict(zip(sorted(values, key=lambda v: (float(v), v)), classes)) if values[0][0].isdigit() else {}
    assert [ds.fine_class_names[c] for c in ds.fine_label] == [named.get(v, v) for v in
                                                                (values[i % len(values)] for i in range(n))]


def test_group_and_split_columns_are_text_too(tmp_path):
    text = "id,x,y,g,s\n" + lines(lambda i: f"r{i},{i},{i % 2},{['01', '1'][i // 6]},"
                                           f"{'val' if i % 4 == 0 else 'train'}")
    ds = csv(tmp_path, text, group_column="g", split_column="s")
    assert set(ds.group) == {"01", "1"}
    write_prepared(ds, tmp_path / "prep")
    assert set(load_prepared(tmp_path / "prep").manifest["group"]) == {"01", "1"}  # not merged on reading back


def test_parquet_numeric_labels_stay_numbers(tmp_path):
    df = pd.DataFrame({"id": [f"r{i}" for i in range(60)], "x": np.arange(60.0), "y": np.arange(60) % 12 * 5})
    df.to_parquet(tmp_path / "t.parquet", index=False)
    ds = load_dataset("table", path=str(tmp_path / "t.parquet"), id_column="id", label_column="y")
    assert ds.fine_class_names == [str(5 * c) for c in range(12)]
    with pytest.raises(DataError, match="non-integer numbers"):
        csv(tmp_path, "id,x,y\n" + lines(lambda i: f"r{i},{i},{i / 7:.3f}"))


# --- 4. ids a request can name -------------------------------------------------------------------------
@pytest.mark.parametrize("bad, fix", [(" sp5 ", "strip the spaces"), ('"sp\n5"', "control character"),
                                      ("sp\t5", "control character")])
def test_ids_that_no_request_could_name_are_refused(tmp_path, bad, fix):
    text = "id,x,y\n" + lines(lambda i: f"{bad if i == 5 else f'r{i}'},{i},{i % 2}")
    with pytest.raises(DataError) as e:
        csv(tmp_path, text)
    msg = str(e.value)
    assert fix in msg and "row 5" in msg and "prepare.table.id_column = 'id'" in msg and "erased" in msg


# --- 5. a pandas index saved with the rows -------------------------------------------------------------
def test_a_saved_pandas_index_is_not_a_feature(tmp_path):
    df = pd.DataFrame({"id": [f"r{i}" for i in range(12)], "x": np.arange(12.0) % 5, "y": np.arange(12) // 6})
    df.to_csv(tmp_path / "t.csv")  # without index=False: a nameless first column 0..11, sorted like y
    with pytest.raises(DataError) as e:
        load_dataset("table", path=str(tmp_path / "t.csv"), id_column="id", label_column="y")
    assert "Unnamed: 0" in str(e.value) and "index=False" in str(e.value) and "feature_columns" in str(e.value)
    pd.concat([df.iloc[:6], df.iloc[6:].reset_index(drop=True)]).to_csv(tmp_path / "cat.csv")  # index 0..5 twice
    with pytest.raises(DataError, match="holds row numbers"):
        load_dataset("table", path=str(tmp_path / "cat.csv"), id_column="id", label_column="y")
    ds = load_dataset("table", path=str(tmp_path / "t.csv"), id_column="id", label_column="y", feature_columns=["x"])
    assert ds.meta["preprocessing"]["columns"] == ["x"]
    named = load_dataset("table", path=str(tmp_path / "t.csv"), id_column="Unnamed: 0", label_column="y",
                         group_column="id")
    assert named.sample_id[:2].tolist() == ["0", "1"]  # used as the id, it is no feature


# --- 6. Excel's "CSV UTF-8" ------------------------------------------------------------------------------
def test_a_byte_order_mark_is_skipped(tmp_path):
    (tmp_path / "t.csv").write_bytes(("\ufeffid,x,y\n" + lines(lambda i: f"r{i},{i},{i % 2}")).encode("utf-8"))
    with warnings.catch_warnings():
        ds = load_dataset("table", path=str(tmp_path / "t.csv"), id_column="id", label_column="y")
    assert ds.sample_id[0] == "r0" and ds.meta["preprocessing"]["columns"] == ["x"]
    (tmp_path / "latin.csv").write_bytes("id,x,y\nr\xe9,1,0\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8 text.*CSV UTF-8"):
        load_dataset("table", path=str(tmp_path / "latin.csv"), id_column="id", label_column="y")


def test_the_store_never_writes_a_non_finite_feature(tmp_path):
    """The last guard, for any loader: NaN / inf features are refused by write_prepared, naming the feature."""
    ds = csv(tmp_path, "id,x,y\n" + lines(lambda i: f"r{i},{i},{i % 2}"))
    ds.X[3, 0] = np.inf
    with pytest.raises(DataError, match=r"1 rows have NaN or infinite features in \['x'\]"):
        write_prepared(ds, tmp_path / "prep")
    assert not (tmp_path / "prep" / "features.npy").exists()


def test_a_request_for_a_row_prepare_left_out_says_why_it_is_not_in_the_manifest(tmp_path):
    """A row dropped by `missing: drop` (or past max_train) was never trained on; a request naming it is still
    refused (there is no row to forget), but the message says that prepare left rows out, instead of only
    suggesting a typo."""
    from types import SimpleNamespace

    from adapters.request_check import check_request_file, left_out_note

    ds = csv(tmp_path, "id,x,y\n" + lines(lambda i: f"r{i},{'' if i in (2, 4) else i},{i % 2}"), missing="drop")
    info = {"name": "table", **ds.meta}
    caps = lambda **kw: SimpleNamespace(prepare=SimpleNamespace(**{"max_train": None, "max_val": None, **kw}))  # noqa
    note = left_out_note(caps(), info)
    assert "2 row(s) with a missing value (prepare.table.missing: drop)" in note and "never trained on" in note
    assert "prepare.max_train = 7" in left_out_note(caps(max_train=7), info)
    assert left_out_note(caps(), {"name": "digits"}) == ""  # nothing left out: no note
    manifest = pd.DataFrame({"sample_id": ds.sample_id, "split": ds.split, "label": ds.label, "status": "retained"})
    request = tmp_path / "req.csv"
    request.write_text("request_id,sample_id,requested_at,reason\nq1,r0,2026-11-30T09:00:00Z,gdpr\n"
                       "q2,r2,2026-11-30T09:00:00Z,gdpr\n")
    with warnings.catch_warnings():  # Great Expectations' own import warnings (not under test)
        warnings.simplefilter("ignore", DeprecationWarning)
        import great_expectations  # noqa: F401
    fc = check_request_file(request, manifest, [], left_out=note)
    assert fc.status == "invalid" and len(fc.problems) == 1, fc.problems
    assert "row 2: value 'r2' is not in the manifest" in fc.problems[0] and note in fc.problems[0]
