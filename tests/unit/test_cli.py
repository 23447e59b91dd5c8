"""The `unlearn` CLI: global options anywhere, help with examples, --json, one-line errors, exit codes."""

import json

import pytest

from flows.cli import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_GATE_REJECTED, build_parser, exit_code, main
from tests.helpers import make_project


def test_global_options_work_before_and_after_the_subcommand(tmp_path, capsys):
    params = make_project(tmp_path, inbox_files=False)
    assert main(["--params", str(params), "status", "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert main(["status", "--params", str(params), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == before and before["champion"] is None
    from flows.cli import STATUS_KEYS

    assert tuple(before) == STATUS_KEYS  # the keys a state's status has too: one shape for scripts


def test_json_commands_print_json_on_error(tmp_path, capsys):
    missing = str(tmp_path / "nope" / "params.yaml")
    assert main(["status", "--params", missing, "--json"]) == EXIT_BAD_INPUT
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == EXIT_BAD_INPUT and "file not found" in out["error"]


def test_every_subcommand_has_a_description_and_examples():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sub in subparsers.choices.items():
        text = sub.format_help()
        assert sub.description and "examples:" in text, name
        for action in sub._actions:
            if action.dest not in ("help",):
                assert action.help, f"{name} {action.dest} has no help"


def test_bad_input_is_one_line_with_exit_code_2_and_debug_shows_the_traceback(tmp_path, capsys):
    missing = str(tmp_path / "nope" / "params.yaml")
    assert main(["status", "--params", missing]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    with pytest.raises(Exception, match="file not found"):
        main(["status", "--params", missing, "--debug"])


def test_exit_codes_are_the_documented_ones():
    from flows.deletion_batch import AfterCommitError, BatchRejected
    from unlearning.config import ConfigError

    assert exit_code(ConfigError("x")) == EXIT_BAD_INPUT == 2
    assert exit_code(BatchRejected("no candidate passed")) == EXIT_GATE_REJECTED == 3
    assert exit_code(AfterCommitError("applied, then")) == EXIT_FAILURE == 1
    assert exit_code(RuntimeError("unexpected")) is None  # a real bug keeps its traceback
    assert "3 the gate rejected" in build_parser().epilog


def test_a_missing_request_file_is_named_before_anything_else(tmp_path, capsys):
    # a fresh project (no prepared data): the missing file is the error, not the missing features.npy
    params = make_project(tmp_path, inbox_files=False)
    for command in ("validate", "audit"):
        assert main(["--params", str(params), command, str(tmp_path / "nope.csv")]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert err == f"error: {tmp_path / 'nope.csv'}: no such request file\n", err


def test_cuda_on_a_machine_without_a_gpu_is_one_line_before_anything_starts(tmp_path, capsys, monkeypatch):
    """base.device: cuda where no GPU device node exists: the computing commands and `make run`'s session
    answer in one line (exit 2) before a server starts or torch is imported; `status` still reads the state."""
    import time

    import flows.session as session
    import unlearning.config as config

    monkeypatch.setattr(config, "GPU_DEVICE_NODES", (str(tmp_path / "no-such-device*"),))
    params = make_project(tmp_path, inbox_files=False)
    params.write_text(params.read_text().replace("  device: auto", "  device: cuda", 1))
    assert "device: cuda" in params.read_text()
    for command in (["run"], ["prepare"], ["train"]):
        start = time.perf_counter()
        assert main(["--params", str(params), *command]) == EXIT_BAD_INPUT
        assert time.perf_counter() - start < 5
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "base.device = 'cuda'" in err[0] and "'cpu'" in err[0], err
    assert main(["--params", str(params), "status", "--json"]) == 0
    monkeypatch.chdir(params.parent)
    assert "base.device = 'cuda'" in session.params_problem(["dvc", "repro", "deletion"])
    monkeypatch.setattr(config, "GPU_DEVICE_NODES", (str(params),))  # a node exists: torch decides later
    assert session.params_problem(["dvc", "repro", "deletion"]) is None


def test_ui_hint_names_unlearn_ui_in_every_project(tmp_path, monkeypatch):
    # A project of `unlearn init` has no Makefile: its batches said "`mlflow ui ...`", which opens MLflow's GenAI
    # overview; `unlearn ui` opens the batches page there as `make ui` does here.
    from flows.common import ui_route
    from unlearning.config import parse_params

    params = parse_params({}, root=tmp_path)
    monkeypatch.chdir(tmp_path)
    assert ui_route(params, "#/x") == "`unlearn ui`, then open http://127.0.0.1:5000/#/x"
    monkeypatch.chdir(tmp_path.parent)  # elsewhere: the command names the project's params file
    assert ui_route(params).startswith(f"`unlearn --params {tmp_path / 'params.yaml'} ui`")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")  # a tracking server serves its own UI
    assert ui_route(params, "#/x") == "open http://127.0.0.1:5999/#/x"


def test_deletion_flow_runs_are_named_after_the_request_file(tmp_path, monkeypatch):
    import prefect.runtime.flow_run as flow_run

    from flows.common import deletion_run_name
    from flows.deletion_batch import deletion_batch
    from tests.helpers import make_project

    assert deletion_batch.flow_run_name is deletion_run_name
    monkeypatch.setattr(flow_run, "parameters", {"request_path": "/p/requests/inbox/2026-11-30T0900_erasure.csv"},
                        raising=False)
    assert deletion_run_name() == "deletion 2026-11-30T0900_erasure"
    params_path = make_project(tmp_path / "p")  # the whole inbox: its first file and how many follow
    inbox = sorted(p.stem for p in (tmp_path / "p" / "requests" / "inbox").iterdir() if p.suffix == ".csv")
    monkeypatch.setattr(flow_run, "parameters", {"request_path": None, "params_path": str(params_path)})
    expected = f"deletion {inbox[0]}" + (f" +{len(inbox) - 1}" if len(inbox) > 1 else "")
    assert deletion_run_name() == expected
    monkeypatch.setattr(flow_run, "parameters", {"params_path": str(tmp_path / "missing.yaml")})
    assert deletion_run_name() == "deletion inbox"
