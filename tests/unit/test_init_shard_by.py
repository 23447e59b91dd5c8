"""`unlearn init --shard-by COLUMN`: a project whose original trains sharded by a customer column
(train.sharding, docs/sharding.md); fast: nothing is trained."""

from __future__ import annotations

import pytest
import yaml

from flows.cli import main
from tests.unit.test_cli_init_reset import write_csv
from unlearning.config import load_params


def test_init_shard_by_a_customer_column(tmp_path, capsys):
    target = tmp_path / "shop"
    csv = write_csv(target / "data" / "orders.csv")
    args = ["init", str(target), "--dataset", "table", "--path", str(csv), "--id-column", "customer",
            "--label-column", "churned", "--feature-columns", "age,spend", "--no-vcs"]
    assert main(["init", str(tmp_path / "bad"), *args[2:], "--shard-by", "postcode"]) == 2
    assert "--shard-by postcode" in capsys.readouterr().err and not (tmp_path / "bad" / "params.yaml").exists()
    assert main([*args, "--shard-by", "household", "--shards", "3", "--slices", "2"]) == 0
    assert "3 shards x 2 slices by column 'household'" in capsys.readouterr().out
    params = load_params(target / "params.yaml")
    s = params.train.sharding
    assert (s.shards, s.slices, s.by, s.column, s.aggregate) == (3, 2, "column", "household", "mean_probs")
    # the written file names every key of train.sharding, the skew bound the warning is judged against included
    written = yaml.safe_load((target / "params.yaml").read_text())["train"]["sharding"]
    assert written["max_skew"] == s.max_skew == 3.0 and set(written) == set(type(s).model_fields)
    assert params.prepare.table.group_column == "household"  # grouped by it, and no model input
    assert "household" not in params.prepare.table.feature_columns
    # the sharded original's checkpoints are an output of train
    assert "models/shards" in yaml.safe_load((target / "dvc.yaml").read_text())["stages"]["train"]["outs"]


def test_init_shard_by_refuses_the_id_column_and_a_shard_column_the_model_would_read(tmp_path, capsys):
    csv = write_csv(tmp_path / "orders.csv")
    base = ["init", str(tmp_path / "p"), "--dataset", "table", "--path", str(csv), "--id-column", "customer",
            "--label-column", "churned", "--no-vcs"]
    assert main([*base, "--shard-by", "customer"]) == 2
    assert "that is the id column" in capsys.readouterr().err
    assert main([*base, "--group-column", "note", "--shard-by", "household"]) == 2
    assert "household would be a model input" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse's own usage error
        main([*base, "--shard-by", "household", "--shards", "0"])
    assert e.value.code == 2 and "expected a whole number >= 1" in capsys.readouterr().err
    assert not (tmp_path / "p" / "params.yaml").exists()
