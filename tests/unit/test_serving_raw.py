"""The champion serves raw rows (unlearning/data/preparation.py, unlearning/serving.py, adapters/tracking.py): the
preparation recorded with the model is the prepare stage's own (same numbers, checked against a float64 hand
computation), odd input gets one clear error, and a real MLflow store's registered model answers raw rows with
the predictions of the prepared features."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from unlearning.data import DataError, load_dataset, load_prepared, write_prepared
from unlearning.data.preparation import example_rows, prepare_raw, raw_inputs, recipe_after, recipe_of
from unlearning.data.sources import image_features, read_images
from unlearning.data.store import rewrite_without

N = 40


def raw_table(n: int = N, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    zone = rng.choice(["north", "south", "east"], n).astype(object)
    zone[5] = "ISLAND-ONLY-C5"  # a category only row c5 has (erased below)
    return pd.DataFrame({"cid": [f"c{i}" for i in range(n)], "age": rng.integers(18, 80, n),
                         "spend": rng.normal(100, 30, n).round(2), "zone": zone, "vip": rng.choice([True, False], n),
                         "churned": np.where(rng.random(n) > 0.5, "yes", "no")})


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A team's CSV, prepared by the prepare stage's functions into a store, and the raw rows read back in the
    store's row order."""
    root = tmp_path_factory.mktemp("table")
    raw_table().to_csv(root / "customers.csv", index=False)
    ds = load_dataset("table", path=str(root / "customers.csv"), id_column="cid", label_column="churned",
                      val_fraction=0.25)
    write_prepared(ds, root / "prepared")
    prepared = load_prepared(root / "prepared")
    raw = pd.read_csv(root / "customers.csv").set_index("cid").loc[prepared.manifest["sample_id"]].reset_index()
    return {"root": root, "prepared": prepared, "raw": raw, "recipe": recipe_of(prepared.info)}


def test_raw_rows_give_the_prepared_features_exactly(table):
    prepared, raw, recipe = table["prepared"], table["raw"], table["recipe"]
    X = prepare_raw(raw, recipe)
    assert X.dtype == np.float32 and np.array_equal(X, np.asarray(prepared.X))
    # float64 reference by hand: (x - mean of the training rows) / their population std; one-hot, sorted categories
    train = (prepared.manifest["split"] == "train").to_numpy()
    cols = []
    for c in ("age", "spend"):
        x = raw[c].to_numpy(np.float64)
        cols.append((x - x[train].mean()) / x[train].std())
    cols += [(raw["zone"] == v).to_numpy(np.float64) for v in sorted(raw_table()["zone"].unique())]
    cols += [(raw["vip"].map(str) == v).to_numpy(np.float64) for v in ("False", "True")]
    np.testing.assert_allclose(X, np.stack(cols, axis=1), atol=1e-6)
    # the raw table's own types: an integer column is `long` (pandas' int64 passes MLflow's check as it is)
    assert raw_inputs(recipe) == [("age", "long"), ("spend", "double"), ("zone", "string"), ("vip", "boolean")]
    assert prepared.info["feature_types"] == dict(raw_inputs(recipe))


def test_column_order_and_extra_columns_do_not_matter(table):
    raw, recipe = table["raw"], table["recipe"]
    shuffled = raw[["vip", "churned", "zone", "spend", "cid", "age"]].assign(note="ignored")
    assert np.array_equal(prepare_raw(shuffled, recipe), prepare_raw(raw, recipe))
    as_records = raw.head(3).to_dict("records")  # a list of row dicts works too
    assert np.array_equal(prepare_raw(as_records, recipe), prepare_raw(raw.head(3), recipe))


@pytest.mark.parametrize("change, match", [
    (lambda df: df.drop(columns=["zone"]), r"feature columns \['zone'\] are missing"),
    (lambda df: df.assign(spend=[1.0, None]), r"column 'spend' has no value in rows \[1\]"),
    (lambda df: df.assign(age=["41", "forty"]), r"column 'age' holds text, not a number, in rows \[1\]"),
    (lambda df: df.assign(age=[41, 24.7]), r"column 'age' holds a fractional number in rows \[1\].*never rounded"),
    (lambda df: df.assign(zone=["north", "west"]),
     r"column 'zone': rows \[1\] hold 1 value\(s\) that are not among the fitted categories .*map each to one"),
])
def test_odd_rows_get_one_clear_error(table, change, match):
    rows = table["raw"].head(2).copy()
    with pytest.raises(DataError, match=match):
        prepare_raw(change(rows), table["recipe"])


@pytest.mark.parametrize("change", [
    lambda df: df.drop(columns=["zone"]), lambda df: df.assign(spend=[1.0, None]),
    lambda df: df.assign(age=["41", "Carol Private"]), lambda df: df.assign(age=[41, 24.7]),
    lambda df: df.assign(zone=["north", "Dave Private"]), lambda df: df.assign(spend=[1.0, 1e45]),
])
def test_an_error_quotes_no_value_of_the_rows(table, change):
    """A served row may hold personal fields (a name beside the features): the error names the column, the rows
    and what is wrong, never a value, of that column or any other."""
    rows = table["raw"].head(2).assign(name=["Alice Private", "Bob Private"])
    with pytest.raises(DataError) as e:
        prepare_raw(change(rows), table["recipe"])
    message = str(e.value)
    assert "Private" not in message and "24.7" not in message and "1e+45" not in message
    assert not any(str(v) in message for v in rows["cid"]) and str(rows["spend"].iloc[0]) not in message


def test_text_numbers_are_read_as_numbers(table):
    raw = table["raw"].head(3)
    assert np.array_equal(prepare_raw(raw.assign(age=raw["age"].map(str)), table["recipe"]),
                          prepare_raw(raw, table["recipe"]))


def test_an_erased_category_leaves_the_recipe_and_is_unknown(table, tmp_path):
    prepared, raw = table["prepared"], table["raw"]
    keep = (prepared.manifest["sample_id"] != "c5").to_numpy()
    recipe = recipe_after(table["recipe"], np.asarray(prepared.X), keep)
    assert "ISLAND-ONLY-C5" not in json.dumps(recipe) and "<erased 1>" in recipe["preprocessing"]["categories"]["zone"]
    assert raw_inputs(recipe) == raw_inputs(table["recipe"])  # the width and the signature stay
    # the store rewritten without the row holds the same features as the kept raw rows through the new recipe
    rewrite_without(table["root"] / "prepared", tmp_path / "after", lambda i: i == "c5")
    after = load_prepared(tmp_path / "after")
    assert after.info["preprocessing"] == recipe["preprocessing"]
    assert np.array_equal(prepare_raw(raw[keep], recipe), np.asarray(after.X))
    with pytest.raises(DataError, match="not among the fitted categories") as e:
        prepare_raw(raw[~keep], recipe)
    assert "<erased" not in str(e.value).split("fitted categories")[1]


def test_the_input_example_is_made_from_the_recipe_not_a_row(table):
    example, recipe = example_rows(table["recipe"]), table["recipe"]
    assert list(example.columns) == ["age", "spend", "zone", "vip"] and len(example) == 1
    assert example["age"][0] == round(recipe["preprocessing"]["means"]["age"])  # an integer column: a whole number
    assert example["spend"][0] == pytest.approx(recipe["preprocessing"]["means"]["spend"])
    X = prepare_raw(example, recipe)
    assert X[0, 1] == pytest.approx(0.0, abs=1e-6) and X[0, 2:].sum() == 2  # one zone and one vip value


# ------------------------------------------------------------------------------------------------ images
def write_images(root):
    from PIL import Image

    rng = np.random.default_rng(1)
    for cls in ("dots", "bars"):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            grey = rng.integers(0, 256, (9, 7), dtype=np.uint8)
            if i % 2:  # RGBA with some transparent pixels: composited over black by the preparation
                rgba = np.dstack([grey, grey[::-1], 255 - grey, np.where(grey > 128, 255, 0).astype(np.uint8)])
                Image.fromarray(rgba, mode="RGBA").save(root / cls / f"{i}.png")
            else:
                Image.fromarray(grey, mode="L").save(root / cls / f"{i}.png")


@pytest.mark.parametrize("grayscale", [True, False])
def test_images_as_paths_bytes_or_arrays_give_the_prepared_features(tmp_path, grayscale):
    from PIL import Image

    write_images(tmp_path / "imgs")
    ds = load_dataset("image_folder", path=str(tmp_path / "imgs"), image_size=[5, 4], grayscale=grayscale)
    write_prepared(ds, tmp_path / "prepared")
    prepared = load_prepared(tmp_path / "prepared")
    recipe = recipe_of(prepared.info)
    assert recipe == {"kind": "image", "column": "image", "image_size": [5, 4], "grayscale": grayscale}
    assert raw_inputs(recipe) == [("image", "binary")]
    paths = [tmp_path / "imgs" / f"{i}.png" for i in prepared.manifest["sample_id"]]
    X = np.asarray(prepared.X)
    assert np.array_equal(read_images(paths, [5, 4], grayscale), X)
    as_bytes = [p.read_bytes() for p in paths]
    as_arrays = [np.asarray(Image.open(p)) for p in paths]
    for images in ([str(p) for p in paths], as_bytes, as_arrays, pd.DataFrame({"image": as_bytes})):
        assert np.array_equal(prepare_raw(images, recipe), X)
    assert image_features(as_arrays, [5, 4], grayscale).shape == (len(paths), (1 if grayscale else 3) * 20)
    with pytest.raises(DataError, match=r"1 images could not be read: 'image 1 \(not an image file"):
        prepare_raw([as_bytes[0], b"not an image"], recipe)
    example = example_rows(recipe)
    assert np.array_equal(prepare_raw(example, recipe), np.zeros((1, X.shape[1]), np.float32))


# ------------------------------------------------------------------------------------- through MLflow
@pytest.fixture(scope="module")
def registry(table, tmp_path_factory):
    """A real SQLite MLflow store holding the table champion, logged with its preparation."""
    from adapters.tracking import Tracker
    from unlearning.models import build_model, train_ensemble

    root = tmp_path_factory.mktemp("mlflow")
    prepared = table["prepared"]
    tracker = Tracker(f"sqlite:///{root}/mlflow.db", "serving-raw", root / "mlartifacts")
    run_id = tracker.start_run("train")
    model = build_model({"arch": "mlp", "in_shape": prepared.in_shape, "n_classes": prepared.n_classes,
                         "kwargs": {"hidden": [8]}}, [0])
    train_ensemble(model, prepared.tensor(), torch.as_tensor(prepared.label), epochs=3, batch_size=16, lr=0.05)
    version = tracker.log_model(run_id, model, "tbl", class_names=prepared.info["class_names"],
                                preparation=table["recipe"])
    tracker.set_alias("tbl", "champion", version)
    tracker.end_run(run_id)
    return {"tracker": tracker, "model": model}


def load_champion(registry):
    import mlflow.pyfunc

    from adapters.tracking import fluent_store

    with fluent_store(registry["tracker"].tracking_uri):
        return mlflow.pyfunc.load_model("models:/tbl@champion"), mlflow.models.get_model_info("models:/tbl@champion")


def test_the_registered_champion_predicts_raw_rows(table, registry):
    served, info = load_champion(registry)
    prepared, raw = table["prepared"], table["raw"]
    assert [s.name for s in info.signature.inputs.inputs] == [c for c, _ in raw_inputs(table["recipe"])]
    assert info.metadata["input_types"] == dict(raw_inputs(table["recipe"]))
    assert info.signature.outputs.input_names() == ["no", "yes"]
    probs = served.predict(raw)  # the id and label columns ride along: MLflow drops what the signature lacks
    with torch.no_grad():
        reference = torch.softmax(registry["model"](prepared.tensor())[0], dim=-1).numpy()
    assert list(probs.columns) == ["no", "yes"]
    np.testing.assert_allclose(probs.to_numpy(), reference, atol=1e-6)
    features = served._model_impl.predict_features(np.asarray(prepared.X))  # prepared features still served
    np.testing.assert_allclose(probs.to_numpy(), features.to_numpy(), atol=1e-6)
    # the input example is the recipe's row, not a row of the table
    example = served.input_example
    assert list(example.columns) == ["age", "spend", "zone", "vip"]
    pd.testing.assert_frame_equal(example, example_rows(table["recipe"]), check_dtype=False)
    assert not raw["spend"].isin(example["spend"].tolist()).any()


def test_the_registered_champion_refuses_odd_rows_clearly(table, registry):
    from mlflow.exceptions import MlflowException

    served, _ = load_champion(registry)
    rows = table["raw"].head(2)
    rows = rows.assign(name=["Alice Private", "Bob Private"])  # a personal field beside the features
    with pytest.raises(MlflowException, match=r"feature columns \['zone'\] are missing") as e:
        served.predict(rows.drop(columns=["zone"]))
    assert "Private" not in str(e.value)  # MLflow's own check would quote every column of every row
    # the core's DataError reaches MLflow as an MlflowException (adapters/champion_loader.py): a REST client reads it
    with pytest.raises(MlflowException, match=r"rows \[1\] hold 1 value\(s\) that are not among the fitted") as e:
        served.predict(rows.assign(zone=["north", "west"]))
    assert e.value.get_http_status_code() == 400 and "west" not in str(e.value)
    with pytest.raises(MlflowException, match=r"column 'spend' has no value in rows \[0\]"):
        served.predict(rows.assign(spend=[None, 1.0]))
    with pytest.raises(MlflowException, match=r"column 'age' holds a fractional number in rows \[1\]") as e:
        served.predict(rows.assign(age=[41, 24.7]))  # refused, never cut to 24
    with pytest.raises(MlflowException, match=r"column 'age' holds text, not a number, in rows \[1\]") as e:
        served.predict(rows.assign(age=["41", "forty"]))
    assert "Private" not in str(e.value) and "forty" not in str(e.value)


def test_the_checkpoint_carries_the_recipe_and_old_ones_still_load(table, tmp_path):
    from unlearning import serving
    from unlearning.models import build_model

    prepared = table["prepared"]
    model = build_model({"arch": "mlp", "in_shape": prepared.in_shape, "n_classes": 2, "kwargs": {"hidden": [4]}}, [0])
    served = serving._load_pyfunc(str(serving.write_checkpoint(model, tmp_path, ["no", "yes"], table["recipe"])))
    assert served.recipe == table["recipe"]
    np.testing.assert_allclose(served.predict(table["raw"]).to_numpy(),
                               served.predict(np.asarray(prepared.X)).to_numpy(), atol=1e-6)
    (tmp_path / "old").mkdir()
    old = serving._load_pyfunc(str(serving.write_checkpoint(model, tmp_path / "old", ["no", "yes"])))
    assert old.recipe is None and old.predict(np.asarray(prepared.X)).shape == (len(prepared.X), 2)
    # a features model's input example is no row of the store (a validation row may be erased too)
    example = serving.input_example(prepared.X, prepared.manifest)
    assert example.shape == (2, prepared.X.shape[1]) and not example.any()
    with pytest.raises(ValueError, match=r"expected features \[B, 8\]"):  # a features model names the width
        old.predict(np.zeros((2, 3)))


def test_promote_registers_the_recipe_without_the_erased_rows_values(tmp_path):
    """tasks/stages.py `preparation_after_erasure`: the recipe a batch's champion is registered with already names a
    category that only this batch's (or a tombstoned) row had `<erased k>`, as the store rewritten by the erasure
    will; the recipe of that store is the same."""
    from tasks.id_key import IdKey
    from tasks.stages import preparation_after_erasure
    from tasks.training import prepare_dataset
    from unlearning.config import parse_params
    from unlearning.privacy.erasure import add_tombstones, id_key

    raw_table().to_csv(tmp_path / "t.csv", index=False)
    params = parse_params({"prepare": {"dataset": "table", "table": {
        "path": "t.csv", "id_column": "cid", "label_column": "churned"}},
        "deletion": {"hash_sample_ids": False}}, root=tmp_path)
    prepare_dataset.fn(params)
    before = load_prepared(params.path("prepared_dir"))
    assert "ISLAND-ONLY-C5" in json.dumps(recipe_of(before.info))
    recipe = preparation_after_erasure(IdKey.of(params), params.deletion, before, ["c5"])
    assert "ISLAND-ONLY-C5" not in json.dumps(recipe)
    assert preparation_after_erasure(IdKey.of(params), params.deletion, before, ["c6"]) == recipe_of(before.info)  # c6's zone stays
    add_tombstones(params.path("tombstones"), map(id_key(False, "table"), ["c5"]))  # a tombstoned row counts too
    assert preparation_after_erasure(IdKey.of(params), params.deletion, before, []) == recipe
    prepare_dataset.fn(params)  # prepare again: the tombstoned row is left out
    assert recipe_of(load_prepared(params.path("prepared_dir")).info) == recipe


def test_features_that_are_not_numbers_are_refused_without_quoting_them():
    from unlearning import serving
    from unlearning.models import build_model

    model = build_model({"arch": "mlp", "in_shape": [2], "n_classes": 2, "kwargs": {"hidden": [3]}}, [1])
    with pytest.raises(ValueError, match=r"expected features \[B, 2\] of numbers") as e:
        serving.probabilities(model, pd.DataFrame({"a": [1.0], "b": ["Erin Private"]}))
    assert "Private" not in str(e.value)


def test_the_scoring_server_cannot_prefix_the_input_to_a_row_error():
    """`mlflow models serve` rewrites an MlflowException's message to "Failed to predict data '<the whole
    input>'. Error: ..."; the champion's bad-row error keeps its one line (and its 400)."""
    from adapters.champion_loader import INVALID_PARAMETER_VALUE, RowError

    e = RowError("raw rows: column 'age' holds text, not a number, in rows [1]", error_code=INVALID_PARAMETER_VALUE)
    e.message = f"Failed to predict data '   name\n0  Alice Private'. \nError: {e.message}"  # what the server does
    assert json.loads(e.serialize_as_json())["message"] == "raw rows: column 'age' holds text, not a number, in rows [1]"
    assert e.get_http_status_code() == 400


SECRET = "ZZSECRET-Alice-Private-77"


@pytest.fixture(scope="module")
def scoring(registry):
    """MLflow's scoring app (`mlflow models serve`'s) around the registered champion, in this process."""
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    served, _ = load_champion(registry)  # loading it guards the scoring server (adapters/champion_loader.py)
    return TestClient(scoring_server.init(served), raise_server_exceptions=False)


def answers_nothing_of_the_request(response, *values: str) -> str:
    """The body, checked: no value of the request, no local path, no stack trace."""
    import os
    import sys

    body = response.text
    for value in (SECRET, *values):
        assert value not in body, body
    for path in (os.getcwd(), sys.prefix, os.path.expanduser("~"), "site-packages", "/tmp/"):
        assert path not in body, body
    assert "Traceback" not in body and "stack_trace" not in body, body
    return body


@pytest.mark.parametrize("body, content_type, status, says", [
    ('{"dataframe_split": {"columns": ["zone"], "data": [["' + SECRET, "application/json", 400,
     "not valid JSON (line 1, column"),
    ('{"' + SECRET + '": [1, 2]}', "application/json", 400, "exactly one of the fields"),
    ('["' + SECRET + '"]', "application/json", 400, "exactly one of the fields"),
    ("age,zone\n41,north\n42," + SECRET + ",x,y\n", "text/csv", 400, "line 3: 4 fields, the header has 2"),
    ("PAR1" + SECRET, "application/vnd.apache.parquet", 400, "not a table"),
    (SECRET, "text/plain", 415, "unsupported request (HTTP 415)"),
    (SECRET, f"application/json; {SECRET}=1", 415, "unsupported request (HTTP 415)"),
    ("\xff" + SECRET, "text/csv; charset=latin-1", 415, "unsupported request"),
])
def test_the_scoring_server_answers_no_request_value_and_no_path(scoring, body, content_type, status, says):
    got = scoring.post("/invocations", content=body.encode("latin-1"), headers={"Content-Type": content_type})
    assert got.status_code == status and says in answers_nothing_of_the_request(got)


def test_a_row_value_is_never_quoted_back(scoring, table):
    rows = table["raw"].head(2).assign(name=[SECRET, "Bob Private"])
    for bad in (rows.assign(zone=["north", SECRET]), rows.assign(age=[41, SECRET]), rows.drop(columns=["zone"])):
        split = json.loads(bad.to_json(orient="split", index=False))
        got = scoring.post("/invocations", json={"dataframe_split": split})
        assert got.status_code == 400 and "Bob Private" not in answers_nothing_of_the_request(got)
        got = scoring.post("/invocations", content=bad.to_csv(index=False), headers={"Content-Type": "text/csv"})
        body = answers_nothing_of_the_request(got, "Bob Private")
        assert got.status_code == 400 and json.loads(body)["message"] == json.loads(
            scoring.post("/invocations", json={"dataframe_split": split}).text)["message"]  # as the JSON body's
    got = scoring.post("/invocations", content=b"", headers={})  # no content type at all
    assert got.status_code in (400, 415) and answers_nothing_of_the_request(got)


def test_a_csv_body_of_raw_rows_is_answered_like_the_json_one(scoring, table):
    rows = table["raw"].head(6)  # the id and label columns ride along, as in the JSON body
    as_json = scoring.post("/invocations", json={"dataframe_split": json.loads(rows.to_json(orient="split",
                                                                                             index=False))})
    as_csv = scoring.post("/invocations", content=rows.to_csv(index=False), headers={"Content-Type": "text/csv"})
    assert as_json.status_code == as_csv.status_code == 200, as_csv.text
    np.testing.assert_allclose(pd.DataFrame(as_csv.json()["predictions"]).to_numpy(),
                               pd.DataFrame(as_json.json()["predictions"]).to_numpy(), atol=1e-6)


def test_the_model_ships_its_package_as_one_zip_and_loads_from_it(registry, table, tmp_path):
    """A tracking server takes one upload (one login check) per file: the `unlearning` package travels as
    code/unlearning.zip, and a fresh interpreter loading the model imports the package from that zip."""
    import subprocess
    import sys

    import mlflow

    from adapters.tracking import fluent_store

    with fluent_store(registry["tracker"].tracking_uri):
        folder = Path(mlflow.artifacts.download_artifacts("models:/tbl@champion", dst_path=str(tmp_path)))
    code = sorted(p.name for p in (folder / "code").iterdir())
    assert code == ["champion_loader.py", "unlearning.zip"]
    table["raw"].head(3).to_csv(tmp_path / "rows.csv", index=False)
    probe = ("import sys, mlflow.pyfunc, pandas as pd; m = mlflow.pyfunc.load_model(sys.argv[1]); "
             "import unlearning; print(unlearning.__file__); print(m.predict(pd.read_csv(sys.argv[2])).shape)")
    out = subprocess.run([sys.executable, "-c", probe, str(folder), str(tmp_path / "rows.csv")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "unlearning.zip" in out.stdout.splitlines()[0] and out.stdout.splitlines()[1] == "(3, 2)"
