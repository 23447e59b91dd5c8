import pytest
import yaml

from unlearning.config import ConfigError, load_params, parse_params
from tests.helpers import ROOT


def test_repo_params_yaml_is_valid():
    p = load_params(ROOT / "params.yaml")
    assert p.prepare.dataset == "digits"
    assert p.root == ROOT
    assert p.path("state_dir") == ROOT / "state"


def test_unknown_key_names_the_path_and_allowed_keys():
    with pytest.raises(ConfigError) as e:
        parse_params({"train": {"epoch": 3}})
    msg = str(e.value)
    assert "train.epoch" in msg and "epochs" in msg and "batch_size" in msg


def test_bad_value_names_key_value_and_allowed_values():
    with pytest.raises(ConfigError) as e:
        parse_params({"prepare": {"dataset": "mnist"}, "base": {"device": "tpu"}})
    msg = str(e.value)
    assert "prepare.dataset = 'mnist'" in msg and "'digits'" in msg and "'fashion_mnist'" in msg
    assert "base.device = 'tpu'" in msg and "'cuda'" in msg


def test_range_errors():
    with pytest.raises(ConfigError, match=r"train.epochs = 0"):
        parse_params({"train": {"epochs": 0}})
    with pytest.raises(ConfigError, match=r"hidden"):
        parse_params({"train": {"model": {"hidden": [0]}}})


def test_mlflow_uri_env_override(monkeypatch, tmp_path):
    p = parse_params({}, root=tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert p.mlflow_tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/x.db")
    assert p.mlflow_tracking_uri() == "sqlite:////elsewhere/x.db"


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "params.yaml")


def test_overrides_merge(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": {"epochs": 5}}))
    p = load_params(tmp_path / "params.yaml", {"train": {"lr": 0.1}})
    assert p.train.epochs == 5 and p.train.lr == 0.1


def test_ggn_damping_is_the_recipe_l2_on_the_sum_of_losses_floored_or_the_explicit_lam():
    from unlearning.config import parse_params

    p = parse_params({"train": {"weight_decay": 0.001}, "diagnostics": {"min_lam": 1.0}})
    assert p.ggn_damping(5000) == 5.0 and p.ggn_damping(10) == 1.0   # n * wd, at least min_lam
    assert parse_params({"diagnostics": {"lam": 0.25}}).ggn_damping(5000) == 0.25


@pytest.mark.parametrize("cron", ["0 2 * * *", "*/15 * * * 1-5", "0 9 * * mon-fri", "0 0 1 jan *", "@daily",
                                  "0,30 8-18/2 * * *", "0 0 * * 7"])
def test_cron_forms_that_load(cron):
    assert parse_params({"operations": {"cron": cron}}).operations.cron == cron


@pytest.mark.parametrize("cron,says", [("61 * * * *", "minute field '61'"), ("0 2 * *", "has 4 field(s)"),
                                       ("0 2 * * 8", "day of week field"), ("5-1 * * * *", "runs backwards"),
                                       ("*/0 * * * *", "step '0'"), ("0 2 * * * *", "has 6 field(s)"),
                                       ("H 2 * * *", "minute field 'h'")])
def test_bad_cron_fails_at_load_with_the_key(cron, says):
    # `unlearn serve` read it only when it built the schedule: after its banner, with a traceback
    with pytest.raises(ConfigError, match="operations.cron") as e:
        parse_params({"operations": {"cron": cron}})
    assert says in str(e.value) and "Value error" not in str(e.value)


def test_bad_timezone_fails_at_load_with_the_key():
    with pytest.raises(ConfigError, match="operations.timezone = 'Mars/Olympus': not an IANA time zone"):
        parse_params({"operations": {"timezone": "Mars/Olympus"}})
    assert parse_params({"operations": {"timezone": "Europe/Berlin"}}).operations.timezone == "Europe/Berlin"


def test_a_permutation_test_that_cannot_fail_is_refused():
    # its smallest p-value is 1/(1 + n): 1/51 > 0.01, so no candidate could ever fail the KLoM test
    with pytest.raises(ConfigError, match="n_permutations = 50 cannot give a p-value below alpha = 0.01.*>= 99"):
        parse_params({"gate": {"retrain_equivalence": {"n_permutations": 50}}})
    parse_params({"gate": {"retrain_equivalence": {"n_permutations": 50, "alpha": 0.05}}})
    parse_params({"gate": {"retrain_equivalence": {"n_permutations": 99}}})
