"""The one liveness check of a pid (adapters/pids.py), shared by the sessions (flows/session.py) and the team
deployment (deploy/team.py): a running process whose name holds spaces, parentheses and a lone `Z` is alive; an
unreaped child (a zombie) whose name holds spaces is not; a pid that is gone is not."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from adapters.pids import pid_alive, process_state, stat_state

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# the command name of the child: split on spaces, its /proc/<pid>/stat line's third field is "Z"
ODD_NAME = "a Z (b) c"


def child(seconds: float) -> subprocess.Popen:
    """A child that renames itself ODD_NAME (its /proc/self/comm), says so, then lives `seconds`."""
    code = (f"open('/proc/self/comm', 'w').write({ODD_NAME!r}); print('ready', flush=True); "
            f"import time; time.sleep({seconds})")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_the_state_is_read_after_the_last_parenthesis():
    assert stat_state("4242 (a Z (b) c) S 1 4242 4242 0 -1") == "S"
    assert stat_state("4242 (a b c) Z 1 4242 4242 0 -1") == "Z"
    assert stat_state("4242 (python) R 1 2 3") == "R"


def test_a_running_process_with_spaces_in_its_name_is_alive_and_its_zombie_is_not():
    proc = child(60)
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            line = f.read()
        assert f"({ODD_NAME})" in line and line.split()[2] == "Z"  # what a split on spaces took for the state
        assert process_state(proc.pid) in {"S", "R"} and pid_alive(proc.pid)
        proc.kill()
        deadline = time.monotonic() + 10
        while process_state(proc.pid) != "Z" and time.monotonic() < deadline:  # exited, not reaped yet
            time.sleep(0.02)
        assert process_state(proc.pid) == "Z" and not pid_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert not pid_alive(proc.pid) and process_state(proc.pid) is None  # reaped: gone
