"""What flows/session.py and flows/warm.py share: the environment names a session passes to its commands, the
parent-death signal, and the Prefect API probe. Stdlib only; its own module so that the session (which starts
workers) and the worker's client (which joins a session: flows.session.join_session) do not import each other.
Whether a pid runs is adapters/pids.py pid_alive, which deploy/team.py shares."""

from __future__ import annotations

import os
import signal
import urllib.request  # here, not in the session's watcher thread (see _PRCTL)

ENV_SOCKET = "UNLEARN_WARM_WORKER"
ENV_WAIT_FOR_API = "UNLEARN_WAIT_FOR_API"  # set by flows.session while its temporary server may still be starting
ENV_TEMPORARY_SERVER = "UNLEARN_TEMPORARY_SERVER"  # flows.session's server's API URL: it ends with the session


def _libc_prctl():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: SIGTERM handlers and the socket's EOF cover the usual cases
        return None


# Resolved at import, not in a forked child: a child forked while another thread holds the import lock (the
# session's server watcher) would wait for it forever on `import ctypes`.
_PRCTL = _libc_prctl()


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (even by SIGKILL); Linux only. Safe to call
    between fork and exec (no import, no lock)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def prefect_api_answers(api_url: str) -> bool:
    """One `/health` request to a Prefect API (`.../api`): True when it answers."""
    try:
        urllib.request.urlopen(api_url.rstrip("/") + "/health", timeout=2).close()
        return True
    except Exception:
        return False
