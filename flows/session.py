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

import logging
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


class NoServerDocsHint(logging.Filter):
    """Prefect logs "Starting temporary server on URL\nSee https://www.prefect.io/docs/... for more information
    on running a dedicated Prefect server." at INFO on every start of a temporary server (each `unlearn run`,
    each `python -m flows.<stage>`). Keeps the first line; the docs hint goes (the README says how to run a
    dedicated server: `make server`). Every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if isinstance(msg, str) and msg.startswith("Starting temporary server") and "\nSee " in msg:
            record.msg = msg.split("\n", 1)[0]
        return True


def quiet_server_hint() -> None:
    """Install `NoServerDocsHint` on the logger Prefect's temporary server logs with ("prefect"), once."""
    logger = logging.getLogger("prefect")
    if not any(isinstance(f, NoServerDocsHint) for f in logger.filters):
        logger.addFilter(NoServerDocsHint())


def start_temporary_server():
    """A temporary Prefect server (Prefect's own SubprocessASGIServer) that dies with this process."""
    from prefect.server.api import server as prefect_server

    quiet_server_hint()

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


GIT_HINT = ["\n", "To track the changes with git, run:\n", "\n", None, "\n", "To enable auto staging, run:\n", "\n",
            "\tdvc config core.autostage true\n"]  # None: the "\tgit add <files>" line


class DvcGitHint:
    """DVC ends `dvc repro` with an 8-line block, "To track the changes with git, run: git add dvc.lock" and
    "To enable auto staging, run: dvc config core.autostage true". This project's policy (README, "dvc.lock"):
    the repository ships without dvc.lock, you commit it with your data version when you want to keep a run,
    and auto staging stays off (it would stage files in your git index on every run). The block becomes one
    line saying that; any output that does not match the block exactly passes through unchanged."""

    def __init__(self):
        self.held: list[str] = []

    def feed(self, line: str) -> list[str]:
        """The lines to print now for one line of DVC output."""
        expected = GIT_HINT[len(self.held)]
        if (line == expected) or (expected is None and line.startswith("\tgit add ")):
            self.held.append(line)
            if len(self.held) < len(GIT_HINT):
                return []
            files = self.held[3].strip()[len("git add "):]
            self.held = []
            return [f"DVC updated {files}: it records what this run was built from; commit it with your data "
                    f"version when you want to keep this run (`git add {files}`; README, \"dvc.lock\")\n"]
        out, self.held = self.held, []
        return out + (self.feed(line) if out else [line])

    def flush(self) -> list[str]:
        out, self.held = self.held, []
        return out


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_timed(cmd: list[str], env: dict) -> tuple[int, list[tuple[str, float]]]:
    """Run `cmd`, pass its output through line by line, and time the stages it announces."""
    env = {**env, "PYTHONUNBUFFERED": "1"}  # lines arrive as they are printed, so the stage times are right
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            preexec_fn=_die_with_parent)
    stages: list[tuple[str, float]] = []
    current, since = None, time.perf_counter()
    hint = DvcGitHint()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            for shown in hint.feed(line):
                sys.stdout.write(shown)
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
    for shown in hint.flush():
        sys.stdout.write(shown)
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
