"""One place for each fact: every default of the config models equals params.yaml (deleting a key from
params.yaml must not change behaviour), and every key of params.yaml is a config field."""

from pathlib import Path

import yaml

from unlearning.config import Params

ROOT = Path(__file__).resolve().parents[2]


def differences(yaml_value, default, path=""):
    if isinstance(yaml_value, dict) and isinstance(default, dict):
        out = []
        for key in sorted(set(yaml_value) | set(default)):
            if key not in yaml_value:
                if default[key] is not None:  # optional sections (prepare.table) may stay commented out
                    out.append(f"{path}{key}: only in the config model (default {default[key]!r})")
            elif key not in default:
                out.append(f"{path}{key}: only in params.yaml")
            else:
                out += differences(yaml_value[key], default[key], f"{path}{key}.")
        return out
    return [] if yaml_value == default else [f"{path[:-1]}: params.yaml {yaml_value!r} != default {default!r}"]


def test_config_defaults_equal_params_yaml():
    from_yaml = Params(**yaml.safe_load((ROOT / "params.yaml").read_text())).model_dump(mode="json", exclude={"root"})
    defaults = Params().model_dump(mode="json", exclude={"root"})
    assert differences(from_yaml, defaults) == []
