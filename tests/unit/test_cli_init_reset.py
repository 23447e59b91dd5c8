"""`unlearn init`, `unlearn reset` and the state/params binding of `load_state` (fast: no Prefect server, no
training; models are stubbed where a checkpoint would be read)."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from flows.cli import main
from tests.helpers import ROOT, make_project
from unlearning.config import Prepare, load_params
from unlearning.privacy.fingerprint import StateMismatch

HAS_TABLE = "table" in Prepare.model_fields
HAS_IMAGE_FOLDER = "image_folder" in Prepare.model_fields


def write_csv(path, n=12):
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pd.DataFrame({"customer": [f"c{i:03d}" for i in range(n)], "churned": rng.integers(0, 2, n),
                  "household": [f"h{i // 2}" for i in range(n)], "age": rng.integers(18, 90, n),
                  "spend": rng.random(n).round(3), "note": ["x"] * n}).to_csv(path, index=False)
    return path


def init_args(target, csv, *extra):
    return ["init", str(target), "--dataset", "table", "--path", str(csv), "--id-column", "customer",
            "--label-column", "churned", "--group-column", "household", "--feature-columns", "age,spend", *extra]


# --- unlearn init ------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_TABLE, reason="prepare.table (TableSource) is not in unlearning/config.py yet")
def test_init_scaffolds_a_table_project(tmp_path, capsys):
    target = tmp_path / "churn"
    csv = write_csv(target / "data" / "customers.csv")
    assert main(init_args(target, csv)) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "dvc init" in out and "git init" in out

    params = load_params(target / "params.yaml")  # parses and validates
    assert params.root == target.resolve()
    assert params.prepare.dataset == "table"
    table = params.prepare.table
    assert params.prepare.table.path == "data/customers.csv"  # relative to the project folder
    assert (table.id_column, table.label_column, table.group_column) == ("customer", "churned", "household")
    assert list(table.feature_columns) == ["age", "spend"] and table.split_column is None
    assert table.missing == "error"
    assert params.train == load_params(ROOT / "params.yaml").train

    stages = yaml.safe_load((target / "dvc.yaml").read_text())["stages"]
    assert list(stages) == ["prepare", "train", "qualify", "deletion"]
    assert [s["cmd"] for s in stages.values()] == ["python -m flows.warm run flows.prepare",
                                                   "python -m flows.warm run flows.train",
                                                   "python -m flows.warm run flows.qualify",
                                                   "python -m flows.warm run flows.deletion_batch"]
    # qualified mode's table, its own target: `dvc repro deletion` never runs it
    assert stages["qualify"]["outs"] == ["models/qualification.json"] and "qualify" in stages["qualify"]["params"]
    assert "models/qualification.json" not in stages["deletion"]["deps"]
    assert stages["prepare"]["deps"] == ["${prepare.table.path}"]  # the path is written once, in params.yaml
    deps = [d for s in stages.values() for d in s["deps"]]
    assert not any(d.startswith(("flows", "tasks", "unlearning")) for d in deps)  # no repo sources in DIR
    assert "train" in stages["train"]["params"] and "prepare" in stages["prepare"]["params"]

    assert (target / "requests" / "inbox" / ".gitkeep").exists()
    ignored = (target / ".gitignore").read_text().splitlines()
    for entry in ("/state", "/cache/", "/mlflow.db", "/mlartifacts/", "/archive/", "/.prefect/", "/data/prepared",
                  "/models/*.pt"):
        assert entry in ignored
    assert (target / ".git").is_dir() and (target / ".dvc").is_dir()

    # never overwrites
    before = (target / "params.yaml").read_text()
    assert main(init_args(target, csv)) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (target / "params.yaml").read_text() == before


def test_init_refuses_an_existing_params_yaml(tmp_path, capsys):
    (tmp_path / "params.yaml").write_text("base: {}\n")
    csv = write_csv(tmp_path / "t.csv")
    assert main(init_args(tmp_path, csv, "--no-vcs")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "refusing to overwrite" in err
    assert (tmp_path / "params.yaml").read_text() == "base: {}\n"


def test_init_writes_nothing_when_the_params_would_not_validate(tmp_path, monkeypatch, capsys):
    import flows.scaffold as scaffold

    monkeypatch.setattr(scaffold, "base_params_text", lambda: "train:\n  epochz: 3\n")
    csv = write_csv(tmp_path / "src" / "t.csv")
    target = tmp_path / "proj"
    assert main(init_args(target, csv, "--no-vcs")) == 2
    err = capsys.readouterr().err
    assert "nothing written" in err and "epochz" in err
    assert not target.exists()


def test_init_checks_columns_and_required_args(tmp_path, capsys):
    csv = write_csv(tmp_path / "t.csv")
    target = tmp_path / "p"
    args = ["init", str(target), "--dataset", "table", "--path", str(csv), "--id-column", "nope",
            "--label-column", "churned", "--no-vcs"]
    assert main(args) == 2
    assert "no column(s) ['nope']" in capsys.readouterr().err
    assert main(["init", str(target), "--dataset", "table", "--path", str(csv), "--no-vcs"]) == 2
    assert "--id-column and --label-column" in capsys.readouterr().err
    assert main(init_args(target, csv, "--arch", "custom", "--no-vcs")) == 2
    assert "--factory module:function" in capsys.readouterr().err
    assert not target.exists()


@pytest.mark.skipif(not HAS_TABLE, reason="prepare.table (TableSource) is not in unlearning/config.py yet")
def test_init_outside_data_path_is_absolute(tmp_path):
    from flows.scaffold import scaffold

    csv = write_csv(tmp_path / "elsewhere" / "t.csv")
    scaffold(tmp_path / "p", "table", csv, id_column="customer", label_column="churned", vcs=False)
    params = load_params(tmp_path / "p" / "params.yaml")
    assert params.prepare.table.path == str(csv.resolve())
    assert yaml.safe_load((tmp_path / "p" / "dvc.yaml").read_text())["stages"]["prepare"]["deps"] == [
        "${prepare.table.path}"]

@pytest.mark.skipif(not HAS_TABLE, reason="prepare.table (TableSource) is not in unlearning/config.py yet")
def test_init_and_prepare_read_excels_csv_utf8_alike(tmp_path, capsys):
    """Excel's "CSV UTF-8" starts with a byte order mark: init read the first column as '\\ufeffcustomer'."""
    from unlearning.data import load_dataset

    plain = write_csv(tmp_path / "plain.csv", n=20)
    bom = tmp_path / "excel.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert main(init_args(tmp_path / "p", bom, "--no-vcs")) == 0
    table = load_params(tmp_path / "p" / "params.yaml").prepare.table
    ds = load_dataset("table", **{**table.model_dump(), "path": str(bom)})
    assert ds.sample_id[0] == "c000" and ds.meta["preprocessing"]["columns"] == ["age", "spend"]
    bom.write_bytes("customer,churned\nc\xe9,1\n".encode("latin-1"))
    assert main(init_args(tmp_path / "q", bom, "--no-vcs")) == 2
    assert "not UTF-8 text" in capsys.readouterr().err and not (tmp_path / "q").exists()



@pytest.mark.skipif(not HAS_IMAGE_FOLDER, reason="prepare.image_folder is not in unlearning/config.py yet")
def test_init_image_folder(tmp_path):
    from flows.scaffold import scaffold

    images = tmp_path / "proj" / "images"
    (images / "cat").mkdir(parents=True)
    scaffold(tmp_path / "proj", "image_folder", images, vcs=False)
    params = load_params(tmp_path / "proj" / "params.yaml")
    assert params.prepare.dataset == "image_folder" and params.prepare.image_folder.path == "images"
    assert params.prepare.section() is params.prepare.image_folder


def test_help_texts_have_examples(capsys):
    for cmd in ("init", "reset"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert "examples:" in out and f"unlearn {cmd}" in out


# --- a hand-built project: prepared folder, state folder ---------------------------------------------


def build_prepared(root, n=10):
    folder = root / "data" / "prepared"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    X, label = rng.random((n, 4), dtype=np.float32), np.arange(n) % 2
    np.save(folder / "features.npy", X)
    np.save(folder / "labels.npy", label.astype(np.int64))
    pd.DataFrame({"sample_id": [f"s{i:02d}" for i in range(n)], "split": ["train"] * (n - 2) + ["val"] * 2,
                  "label": label, "group": [f"g{i}" for i in range(n)],
                  "class_name": [["a", "b"][c] for c in label]}).to_csv(folder / "manifest.csv", index=False)
    (folder / "dataset.json").write_text(json.dumps({
        "name": "toy", "class_names": ["a", "b"], "fine_class_names": ["a", "b"], "image_shape": [2, 2],
        "n_samples": n, "n_train": n - 2, "n_val": 2, "source": "test"}))
    return folder


def stub_models(monkeypatch, extra=None):
    """load_state reads checkpoints through these; the models package is not under test here."""
    import tasks.state as st

    extra = extra or {}
    monkeypatch.setattr(st, "load_model", lambda path, device="cpu": (object(), dict(extra)))
    monkeypatch.setattr(st, "_checkpoint", lambda path: {"extra": dict(extra)})
    monkeypatch.setattr(st, "save_model", lambda model, path, extra=None: open(path, "wb").write(b"stub"))


@pytest.fixture
def project(tmp_path, monkeypatch):
    """params.yaml (repo defaults + fast), the sample inbox, a prepared folder, a state with a 3-entry ledger
    recorded under the current params."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params_path = make_project(tmp_path)
    build_prepared(tmp_path)
    stub_models(monkeypatch)
    from tasks.state import StateSettings, current_fingerprint, write_state
    from unlearning.data import initial_state_manifest, load_prepared

    params = load_params(params_path)
    prepared = load_prepared(params.path("prepared_dir"))
    ledger = [{"request_id": f"req-000{i}", "sample_id": f"s0{i}", "batch_id": "batch-a"} for i in (1, 2, 3)]
    write_state(params.path("state_dir"), object(), initial_state_manifest(prepared.manifest), ledger,
                {"model_version": "3", "method": "finetune", "batch_id": "batch-a"},
                current_fingerprint(StateSettings.of(params), prepared))
    (params.path("cache_dir") / "chunk-1").mkdir(parents=True)
    (params.path("cache_dir") / "chunk-1" / "model.pt").write_bytes(b"x")
    return params_path


def change_params(params_path, **train):
    data = yaml.safe_load(params_path.read_text())
    data["train"].update(train)
    params_path.write_text(yaml.safe_dump(data, sort_keys=False))


def sha16(value) -> str:
    """sha256 of canonical JSON (sorted keys, no spaces), 16 hex characters: the digest unlearning/privacy/fingerprint.py
    documents, written out here from the standard library."""
    import hashlib

    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def expected_fingerprint_digest(params_path) -> str:
    """The fingerprint's digest of the `project` fixture's files, from its documented parts (unlearning/privacy/fingerprint.py,
    docs/design.md): the dataset (dataset.json, class names as counts since the data is the team's own (`source`),
    plus the digest of the sorted "sample_id<TAB>split<TAB>label" manifest rows), the model (train.model) and the
    recipe (the rest of train, plus base.seed); the whole digest is that of the three parts' digests."""
    root = params_path.parent
    info = json.loads((root / "data" / "prepared" / "dataset.json").read_text())
    manifest = pd.read_csv(root / "data" / "prepared" / "manifest.csv", dtype=str)
    rows = sorted(f"{r.sample_id}\t{r.split}\t{r.label}" for r in manifest.itertuples())
    dataset = {**info, "class_names": len(info["class_names"]), "fine_class_names": len(info["fine_class_names"]),
               "manifest_digest": sha16(rows)}
    params = load_params(params_path)
    model = params.train.model.model_dump(mode="json")
    recipe = {**params.train.model_dump(mode="json", exclude={"model"}), "seed": params.base.seed}
    return sha16({"dataset": sha16(dataset), "model": sha16(model), "recipe": sha16(recipe)})


def test_write_state_records_the_fingerprint(project):
    champion = json.loads((project.parent / "state" / "champion.json").read_text())
    assert champion["fingerprint"]["digest"] == expected_fingerprint_digest(project)
    from tasks.state import write_state

    with pytest.raises(ValueError, match="fingerprint"):
        write_state(project.parent / "elsewhere", object(), None, [], {"model_version": "1"})


def test_load_state_accepts_a_matching_state(project):
    from tasks.state import StateSettings, load_state

    state = load_state.fn(StateSettings.of(load_params(project)), "cpu")
    assert state.fingerprint["digest"] == expected_fingerprint_digest(project) and len(state.ledger) == 3
    change_params(project, lr=0.5)  # a recipe key: another digest, and the state is refused
    assert expected_fingerprint_digest(project) != state.fingerprint["digest"]
    with pytest.raises(StateMismatch, match="recipe: lr was"):
        load_state.fn(StateSettings.of(load_params(project)), "cpu")


def test_load_state_raises_after_a_params_change(project, capsys):
    from tasks.state import StateSettings, load_state

    change_params(project, epochs=5)
    with pytest.raises(StateMismatch) as e:
        load_state.fn(StateSettings.of(load_params(project)), "cpu")
    msg = str(e.value)
    assert "recipe: epochs was 12, now 5" in msg and "unlearn reset" in msg and "restore the previous params" in msg

    # the CLI maps it to exit code 2 with one error line
    req = next((project.parent / "requests" / "inbox").glob("*.csv"))
    assert main(["--params", str(project), "validate", str(req)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "epochs was 12, now 5" in err[0]


def test_load_state_raises_when_the_dataset_changed(project):
    from tasks.state import StateSettings, load_state

    info = project.parent / "data" / "prepared" / "dataset.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "source": "other"}))
    with pytest.raises(StateMismatch, match="dataset: source was \"test\", now \"other\""):
        load_state.fn(StateSettings.of(load_params(project)), "cpu")


def test_old_state_without_fingerprint(project):
    """Accepted when nothing can be told; refused when its manifest holds other samples."""
    from tasks.state import StateSettings, load_state

    champion_file = project.parent / "state" / "champion.json"
    champion = json.loads(champion_file.read_text())
    champion.pop("fingerprint")
    champion_file.write_text(json.dumps(champion))
    assert load_state.fn(StateSettings.of(load_params(project)), "cpu").fingerprint["digest"]
    manifest = project.parent / "state" / "manifest.csv"
    m = pd.read_csv(manifest, dtype=str, keep_default_na=False)
    m.loc[0, "sample_id"] = "someone-else"
    m.to_csv(manifest, index=False)
    with pytest.raises(StateMismatch, match="1 sample\\(s\\) not in"):
        load_state.fn(StateSettings.of(load_params(project)), "cpu")


def test_old_state_with_another_architecture(project, monkeypatch):
    import tasks.state as st

    champion_file = project.parent / "state" / "champion.json"
    champion = json.loads(champion_file.read_text())
    champion.pop("fingerprint")
    champion_file.write_text(json.dumps(champion))
    legacy = {"arch": "mlp", "in_dim": 4, "hidden": [16], "n_classes": 2, "image_shape": [2, 2]}  # as params build
    monkeypatch.setattr(st, "_checkpoint", lambda path: {"spec": legacy})
    st.load_state.fn(st.StateSettings.of(load_params(project)), "cpu")
    monkeypatch.setattr(st, "_checkpoint", lambda path: {"spec": {**legacy, "hidden": [99]}})
    with pytest.raises(StateMismatch, match="99"):
        st.load_state.fn(st.StateSettings.of(load_params(project)), "cpu")


def trained_original(tmp_path, monkeypatch):
    """A project with prepared data and a (stub) models/original.pt v1 trained under the current params, no state."""
    from tasks.state import StateSettings, current_fingerprint
    from unlearning.data import load_prepared

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params_path = make_project(tmp_path, inbox_files=False)
    build_prepared(tmp_path)
    params = load_params(params_path)
    stub_models(monkeypatch, {"model_version": "1",
                              "fingerprint": current_fingerprint(StateSettings.of(params), load_prepared(params.path("prepared_dir")))})
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "original.pt").write_bytes(b"stub")
    return params_path, params


def test_first_batch_checks_the_original(tmp_path, monkeypatch):
    """params changed but train not re-run: the original does not match -> retrain hint."""
    from tasks.state import StateSettings, load_state

    params_path, params = trained_original(tmp_path, monkeypatch)
    assert load_state.fn(StateSettings.of(params), "cpu").champion["model_version"] == "1"
    change_params(params_path, model={"hidden": [8]})
    with pytest.raises(StateMismatch) as e:
        load_state.fn(StateSettings.of(load_params(params_path)), "cpu")
    assert "original.pt" in str(e.value) and "model: hidden was [16], now [8]" in str(e.value)
    assert "dvc repro" in str(e.value) and "unlearn train" in str(e.value)


def test_a_state_without_batches_follows_the_retrained_original(tmp_path, monkeypatch):
    """The model changed before any deletion and train re-ran: the state (a copy of the old original, no batch)
    has nothing to keep, so it is rebuilt from the new original; a state holding a batch still refuses."""
    from tasks.state import StateSettings, current_fingerprint, ensure_state, load_state, stale_unbatched_state
    from unlearning.data import load_prepared

    params_path, params = trained_original(tmp_path, monkeypatch)
    assert ensure_state(StateSettings.of(params), "cpu")  # the first run's copy of the original
    assert not stale_unbatched_state(StateSettings.of(params))
    change_params(params_path, model={"hidden": [8]})
    params = load_params(params_path)
    with pytest.raises(StateMismatch):  # train not re-run yet: the original is stale too -> the retrain hint
        load_state.fn(StateSettings.of(params), "cpu")
    assert not stale_unbatched_state(StateSettings.of(params))
    new = current_fingerprint(StateSettings.of(params), load_prepared(params.path("prepared_dir")))
    stub_models(monkeypatch, {"model_version": "2", "fingerprint": new})  # train re-ran: original v2
    assert stale_unbatched_state(StateSettings.of(params))
    from flows.deletion_batch import reconcile
    from tasks.stores.base import ErasureSettings

    class Registry:  # what reconcile asks of the tracker (`unlearn erase`, `unlearn status` run it too)
        def __init__(self):
            self.alias_moves = []

        def reconcile_alias(self, *a):
            self.alias_moves.append(a)
            return None, False

        def fail_stale_runs(self):
            return []

        def tag_unpromoted(self, *a):
            return []

    registry = Registry()
    erasure_off = load_params(params_path, {"erasure": {"enabled": False}})
    reconcile(ErasureSettings.of(erasure_off), registry, StateSettings.of(erasure_off))
    assert registry.alias_moves == []  # @champion stays on the retrained original, not back on state/'s v1
    assert load_state.fn(StateSettings.of(params), "cpu").champion["model_version"] == "2"  # read-only: follows the original
    assert ensure_state(StateSettings.of(params), "cpu")  # and the flow rewrites state/ from it
    champion = json.loads((tmp_path / "state" / "champion.json").read_text())
    assert champion["model_version"] == "2" and champion["fingerprint"]["digest"] == new["digest"]
    assert not stale_unbatched_state(StateSettings.of(params)) and not ensure_state(StateSettings.of(params), "cpu")


def test_a_state_with_a_batch_never_follows_the_original(project, monkeypatch):
    from tasks.state import StateSettings, current_fingerprint, load_state, stale_unbatched_state
    from unlearning.data import load_prepared

    change_params(project, epochs=5)
    params = load_params(project)
    stub_models(monkeypatch, {"model_version": "9",
                              "fingerprint": current_fingerprint(StateSettings.of(params), load_prepared(params.path("prepared_dir")))})
    assert not stale_unbatched_state(StateSettings.of(params))  # its ledger holds 3 erasures: a reset is the user's decision
    with pytest.raises(StateMismatch):
        load_state.fn(StateSettings.of(params), "cpu")


# --- unlearn reset -----------------------------------------------------------------------------------


def test_reset_with_yes_archives_state_and_cache(project, capsys):
    root = project.parent
    assert main(["--params", str(project), "reset", "--yes"]) == 0
    out = capsys.readouterr().out
    assert not (root / "state").exists() and not (root / "cache").exists()
    [archive] = list((root / "archive").iterdir())
    ledger = archive / "state" / "ledger.jsonl"
    assert len(ledger.read_text().splitlines()) == 3
    assert (archive / "cache" / "chunk-1" / "model.pt").exists()
    assert json.loads((archive / "reset.json").read_text())["ledger_entries"] == 3
    assert f"3 applied erasure(s) in 1 batch(es) kept in {ledger}" in out
    assert f"archived {root / 'state'} -> {archive / 'state'}" in out
    assert "hold 3 of the 3 archived request(s)" in out  # the sample inbox file holds req-0001..3
    assert "MLflow: no store at" in out and "next: `dvc repro`" in out
    # a second reset finds nothing; a third after a new state gets its own archive folder
    assert main(["--params", str(project), "reset", "--yes"]) == 0
    assert "nothing to reset" in capsys.readouterr().out


def test_reset_without_yes_and_no_tty_refuses(project, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["--params", str(project), "reset"]) == 2
    captured = capsys.readouterr()
    assert "--yes" in captured.err and "nothing changed" in captured.err
    assert "3 applied erasure(s)" in captured.out
    assert (project.parent / "state" / "ledger.jsonl").exists() and not (project.parent / "archive").exists()


def test_reset_prompt_no_keeps_everything(project, monkeypatch, capsys):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Tty("n\n"))
    assert main(["--params", str(project), "reset"]) == 1
    assert "cancelled" in capsys.readouterr().out
    assert (project.parent / "state").exists()


def test_reset_then_load_state_starts_over(project, monkeypatch):
    """After a params change, reset clears the way: the first batch starts from a matching original."""
    from tasks.state import StateSettings, current_fingerprint, load_state
    from unlearning.data import load_prepared

    from unlearning.privacy.erasure import read_tombstones, tombstones_digest

    change_params(project, epochs=5)
    assert main(["--params", str(project), "reset", "--yes"]) == 0
    params = load_params(project)
    # the original the train stage retrains for the new params, clean of what reset's erasure tombstoned
    clean_of = tombstones_digest(read_tombstones(params.path("tombstones")))
    stub_models(monkeypatch, {"model_version": "7", "clean_of": clean_of,
                              "fingerprint": current_fingerprint(StateSettings.of(params), load_prepared(params.path("prepared_dir")))})
    (project.parent / "models").mkdir()
    (project.parent / "models" / "original.pt").write_bytes(b"stub")
    state = load_state.fn(StateSettings.of(params), "cpu")
    assert state.ledger == [] and state.champion["model_version"] == "7"


@pytest.mark.skipif(not HAS_TABLE, reason="prepare.table (TableSource) is not in unlearning/config.py yet")
def test_init_makes_the_model_file_a_dependency_of_train_wherever_it_lies(tmp_path, capsys, monkeypatch):
    """README order: the model file lies in the current folder at `unlearn init` and is copied in after. An
    edited model file must re-run train (it changes the fingerprint the deletion stage checks)."""
    csv = write_csv(tmp_path / "t.csv")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_model.py").write_text("def build(in_shape, n_classes):\n    raise NotImplementedError\n")
    for name, place in (("beside", tmp_path), ("inside", tmp_path / "inside")):
        if name == "inside":
            place.mkdir()
            (place / "my_model.py").write_text((tmp_path / "my_model.py").read_text())
        target = tmp_path / name if name == "beside" else place
        assert main(init_args(target, csv, "--arch", "custom", "--factory", "my_model:build", "--no-vcs")) == 0
        out = capsys.readouterr().out
        train = yaml.safe_load((target / "dvc.yaml").read_text())["stages"]["train"]
        assert "my_model.py" in train["deps"], (name, train["deps"])
        assert ("note: copy" in out) == (name == "beside"), out
