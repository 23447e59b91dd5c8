"""`python -m flows.session CMD ...`: run CMD (e.g. `dvc repro`) with ONE temporary Prefect server.

Every DVC stage is a process of its own. Without `PREFECT_API_URL`, each of them starts a temporary Prefect
server (8-15 s each on these machines: a uvicorn process plus SQLite migrations) and stops it again when
its flow ends. This wrapper starts one such server, gives its URL to every stage through `PREFECT_API_URL`,
and stops it when CMD ends: the flow runs are as real as before (same API, stored in `$PREFECT_HOME`, so
`make server` shows them in the Prefect UI afterwards), but the server starts once.

Nothing outlives it: the server and CMD are started with the Linux parent-death signal, so even a
`kill -9` of this wrapper stops them, and SIGTERM / Ctrl-C stop CMD and the server before it exits.

It also times the stages: DVC's "Running stage 'x':" lines mark where each stage begins, and a table of
the wall time per stage is printed at the end. With `PREFECT_API_URL` already set (a running server),
CMD runs against that server and only the timing is added.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

STAGE_LINE = re.compile(r"^Running stage '([^']+)'")
SKIPPED_LINE = re.compile(r"^Stage '([^']+)' (?:didn't change, skipping|is cached - skipping)")


def _die_with_parent() -> None:
    """In the child, before exec: ask the kernel to SIGTERM it when its parent dies (even by SIGKILL)."""
    os.setpgrp()  # its own process group: the stages it starts are stopped with it (os.killpg)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the SIGTERM handler below still covers the usual cases
        pass


def start_temporary_server():
    """A temporary Prefect server (Prefect's own SubprocessASGIServer) that dies with this process."""
    from prefect.server.api import server as prefect_server

    class Server(prefect_server.SubprocessASGIServer):
        def _run_uvicorn_command(self):
            # Prefect starts uvicorn with a plain Popen: add the parent-death signal to that one call.
            real_popen = subprocess.Popen
            subprocess.Popen = lambda *a, **kw: real_popen(*a, preexec_fn=_die_with_parent, **kw)
            try:
                return super()._run_uvicorn_command()
            finally:
                subprocess.Popen = real_popen

    server = Server()
    server.start()
    return server


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_timed(cmd: list[str], env: dict) -> tuple[int, list[tuple[str, float]]]:
    """Run `cmd`, pass its output through line by line, and time the stages it announces."""
    env = {**env, "PYTHONUNBUFFERED": "1"}  # lines arrive as they are printed, so the stage times are right
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            preexec_fn=_die_with_parent)
    stages: list[tuple[str, float]] = []
    current, since = None, time.perf_counter()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            m = STAGE_LINE.match(line)
            if m:
                now = time.perf_counter()
                if current is not None:
                    stages.append((current, now - since))
                current, since = m.group(1), now
            elif SKIPPED_LINE.match(line):
                stages.append((SKIPPED_LINE.match(line).group(1) + " (skipped)", 0.0))
    except KeyboardInterrupt:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # CMD and the stage processes it started
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        raise
    rc = proc.wait()
    if current is not None:
        stages.append((current, time.perf_counter() - since))
    return rc, stages


def main(argv: list[str] | None = None) -> int:
    cmd = list(sys.argv[1:] if argv is None else argv)
    if not cmd:
        print("usage: python -m flows.session CMD [ARGS...]   (e.g. python -m flows.session dvc repro)",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    started = time.perf_counter()
    env = dict(os.environ)
    server, server_s = None, 0.0
    if not env.get("PREFECT_API_URL"):
        server = start_temporary_server()
        server_s = time.perf_counter() - started
        env["PREFECT_API_URL"] = server.api_url
        print(f"one temporary Prefect server for every stage: {server.api_url} (up in {server_s:.1f} s)", flush=True)
    try:
        rc, stages = run_timed(cmd, env)
    finally:
        if server is not None:
            server.stop()
    total = time.perf_counter() - started
    print("\nwall time per stage:")
    if server is not None:
        print(f"  {'prefect server start':<24} {server_s:6.1f} s")
    for name, seconds in stages:
        print(f"  {name:<24} {seconds:6.1f} s")
    print(f"  {'total':<24} {total:6.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
