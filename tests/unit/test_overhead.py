"""unlearning/overhead.py: the batch's fixed costs beside the plan's training (measured file, else defaults)."""

from __future__ import annotations

import json

from unlearning.overhead import DEFAULT_FIXED_S, FILE, PARTS, batch_wall_seconds, fixed_costs, write_fixed_costs


def test_a_measured_file_is_read_and_a_bad_one_falls_back_to_the_defaults(tmp_path):
    assert fixed_costs(tmp_path)[0] == DEFAULT_FIXED_S
    path = write_fixed_costs(tmp_path, {"stage": 7.04, "erase": 2.96, "other": 1})
    assert path == tmp_path / FILE and json.loads(path.read_text()) == {"stage": 7.0, "erase": 3.0}
    costs, source = fixed_costs(tmp_path)
    assert costs == {"stage": 7.0, "erase": 3.0} and source == str(path)
    path.write_text(json.dumps({"stage": -1, "erase": 2}))
    assert fixed_costs(tmp_path)[0] == DEFAULT_FIXED_S
    path.write_text("{not json")
    assert fixed_costs(tmp_path)[0] == DEFAULT_FIXED_S


def test_the_wall_time_is_the_training_plus_every_fixed_part():
    wall = batch_wall_seconds(1.5, {"stage": 7.0, "erase": 3.0})
    assert set(PARTS) <= set(wall)
    assert wall["fixed"] == 10.0 and wall["wall"] == 11.5 and wall["training"] == 1.5
