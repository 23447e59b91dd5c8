"""flows.warm: a real worker process (small import plans), real clients, forked children."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from flows import warm

# A plan's `module:function` entry: the worker calls it once imported, and its children inherit the result.
PROBE = textwrap.dedent("""
    import os

    PRIMED_BY = []

    def prime():
        PRIMED_BY.append(os.getpid())
""")
TARGET = textwrap.dedent("""
    import atexit, json, os, sys

    def main():
        atexit.register(lambda: open(os.environ["ATEXIT_FILE"], "w").write("ran"))
        line = sys.stdin.readline().strip()
        print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[1:], "stdin": line,
                          "cwd": os.getcwd(), "mark": os.environ.get("MARK"),
                          "worker_env": os.environ.get("UNLEARN_WARM_WORKER"),
                          "json_preloaded": "json" in sys.modules,
                          "primed_by": __import__("warm_probe").PRIMED_BY}))
        print("to stderr", file=sys.stderr)
        if sys.argv[1:] == ["fail"]:
            raise SystemExit("error: it failed")
        if sys.argv[1:] == ["sleep"]:
            with open(os.environ["PID_FILE"] + ".tmp", "w") as f:  # then renamed: the test never reads it half-written
                f.write(str(os.getpid()))
            os.replace(os.environ["PID_FILE"] + ".tmp", os.environ["PID_FILE"])
            import time
            time.sleep(60)
        return 7
""")


@pytest.fixture
def worker(tmp_path):
    """A worker whose plans import only `json`, the probe (calling its `prime`, then a function it lacks, which
    the worker reports and skips) and `csv`; its folder, process and the client's environment."""
    folder = tmp_path / "w"
    folder.mkdir()
    (tmp_path / "target_mod.py").write_text(TARGET)
    (tmp_path / "warm_probe.py").write_text(PROBE)
    proc = subprocess.Popen([sys.executable, "-c", f"from flows.warm import serve; serve({str(folder)!r}, "
                             f"early_plan=('json', 'warm_probe:prime', 'warm_probe:absent'), full_plan=('csv',))"],
                            cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not (folder / "full.sock").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    env = {**os.environ, "UNLEARN_WARM_WORKER": str(folder), "MARK": "m1", "ATEXIT_FILE": str(tmp_path / "atexit"),
           "PID_FILE": str(tmp_path / "pid")}
    env.pop("UNLEARN_TIMINGS", None)
    yield folder, proc, env
    proc.terminate()
    proc.wait(timeout=10)


def client(args, cwd, env, stdin="hello\n", timeout=60):
    return subprocess.run([sys.executable, "-m", "flows.warm", "run", "target_mod", *args], cwd=cwd, env=env,
                          input=stdin, capture_output=True, text=True, timeout=timeout)


def test_a_child_of_the_worker_runs_the_target_with_the_clients_argv_stdio_cwd_env_and_exit_code(worker, tmp_path):
    folder, proc, env = worker
    res = client(["a", "b"], tmp_path, env)
    out = json.loads(res.stdout.splitlines()[0])
    assert res.returncode == 7 and "to stderr" in res.stderr
    # forked by the full worker (the early worker's successor), not started by the client
    grandparent = int(open(f"/proc/{out['ppid']}/stat").read().rsplit(")", 1)[1].split()[1])
    assert grandparent == proc.pid
    assert out["argv"] == ["a", "b"] and out["stdin"] == "hello" and out["mark"] == "m1"
    assert os.path.samefile(out["cwd"], tmp_path)
    assert out["worker_env"] is None  # its own subprocesses start cold: no recursion into the worker
    assert out["json_preloaded"]
    assert out["primed_by"] == [proc.pid]  # called once, in the early worker, before the plan went on
    assert (tmp_path / "atexit").read_text() == "ran"  # the fast exit still runs atexit handlers
    assert "running target_mod in this process" not in res.stderr


def test_a_systemexit_message_is_printed_once_and_exits_1(worker, tmp_path):
    _, _, env = worker
    res = client(["fail"], tmp_path, env)
    assert res.returncode == 1 and res.stderr.count("error: it failed") == 1 and "Traceback" not in res.stderr


def test_different_prefect_or_mlflow_settings_run_in_the_clients_own_process_and_say_why(worker, tmp_path):
    _, _, env = worker
    res = client([], tmp_path, {**env, "PREFECT_API_URL": "http://127.0.0.1:9/api"})
    out = json.loads(res.stdout.splitlines()[0])
    assert res.returncode == 7 and out["pid"] != 0
    assert "settings PREFECT_API_URL differ from the worker's: running target_mod in this process" in res.stderr


def test_without_a_worker_the_target_runs_in_process_and_an_unreachable_one_is_reported(tmp_path):
    (tmp_path / "target_mod.py").write_text(TARGET)
    env = {**os.environ, "ATEXIT_FILE": str(tmp_path / "atexit")}
    env.pop("UNLEARN_WARM_WORKER", None)
    (tmp_path / "warm_probe.py").write_text(PROBE)
    res = client([], tmp_path, env)
    assert res.returncode == 7 and "warm worker" not in res.stderr
    assert json.loads(res.stdout.splitlines()[0])["primed_by"] == []
    empty = tmp_path / "empty"
    empty.mkdir()
    res = client([], tmp_path, {**env, "UNLEARN_WARM_WORKER": str(empty)})
    assert res.returncode == 7 and f"no warm worker in {empty}: running target_mod in this process" in res.stderr


def sleeping_client(tmp_path, env):
    """A client whose child sleeps 60 s; returns the client process and the child's pid once it runs."""
    (tmp_path / "pid").unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "flows.warm", "run", "target_mod", "sleep"], cwd=tmp_path, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    proc.stdin.write("x\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while not (tmp_path / "pid").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc, int((tmp_path / "pid").read_text())


def assert_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")


def test_sigterm_to_the_client_stops_the_child(worker, tmp_path):
    _, _, env = worker
    proc, child = sleeping_client(tmp_path, env)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert_gone(child)


def test_a_killed_client_gets_its_child_stopped_by_the_worker(worker, tmp_path):
    _, _, env = worker
    proc, child = sleeping_client(tmp_path, env)
    proc.kill()  # no relay possible: the worker sees the connection close
    proc.wait()
    assert_gone(child)


def test_the_timing_record_names_the_stage(worker, tmp_path):
    _, _, env = worker
    timings = tmp_path / "timings.jsonl"
    res = client([], tmp_path, {**env, "UNLEARN_TIMINGS": str(timings), "DVC_STAGE": "prepare"})
    assert res.returncode == 7
    rec = json.loads(timings.read_text().splitlines()[0])
    assert rec["label"] == "prepare" and rec["compute_s"] == 0 and rec["tracking_s"] == 0


def test_targets_are_routed_early_for_prepare_and_train_and_full_otherwise(tmp_path):
    (tmp_path / "early.sock").write_text("")
    assert warm._socket_for(str(tmp_path), "flows.prepare") == str(tmp_path / "early.sock")
    # no full worker yet and the early one gone: none
    (tmp_path / "early.sock").unlink()
    assert warm._socket_for(str(tmp_path), "flows.deletion_batch", wait_s=0.1) is None
    (tmp_path / "full.sock").write_text("")
    assert warm._socket_for(str(tmp_path), "flows.cli:main") == str(tmp_path / "full.sock")
