"""Whether a process runs, from the kernel's process table: the one liveness check of the sessions (flows/session.py)
and of the team deployment (deploy/team.py).

Standard library only, and in a package whose import does nothing else: deploy/team.py runs under any Python 3
without the project installed, and must not import `flows` (whose package import sets the offline switches in the
environment of the servers it starts)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs: it exists (another user's counts) and is not a zombie (a child that exited
    and was not reaped yet counts as gone). /proc/<pid>/stat reads `pid (comm) state ...`; the state is the
    field after the command name, which may itself hold spaces and parentheses (`(my (odd) name)`), so it is
    found after the last `)`, not by splitting the line on spaces."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = process_state(pid)
    if state is None:  # gone between the two looks, or no /proc (not Linux): then the signal's answer stands
        return not os.path.isdir("/proc/self")
    return state != "Z"


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, D, Z, ...); None when the process or /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return stat_state(f.read())
    except OSError:
        return None


def stat_state(stat_line: str) -> str:
    """The state field of a /proc/<pid>/stat line: the first field after the command name's closing `)`."""
    return stat_line.rsplit(")", 1)[1].split()[0]
