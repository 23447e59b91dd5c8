"""Team deployment: a Prefect server and an MLflow server (serving artifacts), both on one PostgreSQL cluster.

    python deploy/team.py [--dir .team] db      # init + start a project-local PostgreSQL cluster, create the databases
    python deploy/team.py [--dir .team] up      # db + Prefect server + MLflow server, in the background
    python deploy/team.py [--dir .team] env     # the client's environment (eval "$(... env)")
    python deploy/team.py [--dir .team] status  # what runs, on which port, with which pid
    python deploy/team.py [--dir .team] down    # stop both servers and the cluster (the data stays)

`make team-db / team-up / team-env / team-status / team-down` call it. Everything lives in one folder
(default `.team/`, git-ignored):

    pg/data            the PostgreSQL cluster (owned by the `postgres` system user when run as root: PostgreSQL
                       refuses to run as root), listening on 127.0.0.1:<pg port> only, no Unix socket, password auth
    pg.password        the role's password (mode 600); the servers get their database URLs from the environment,
                       so the password never appears on a command line
    artifacts/         the MLflow server's artifact store (`--artifacts-destination`): clients upload and download
                       over HTTP (`mlflow-artifacts:/` URIs), nothing is written to a client's disk
    prefect-home/      the Prefect server's home (its settings; its database is the `prefect` database)
    team.json          ports and host of the last `up`; *.pid and *.log of each process

Standard library only: it starts the `prefect` and `mlflow` command-line servers as processes and imports
neither (the import rules keep Prefect in flows/ and tasks/, MLflow in adapters/tracking.py).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROLE = "team"
DATABASES = ("prefect", "mlflow")
OFFLINE = {"DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
           "DVC_NO_ANALYTICS": "1"}
SYSTEM_USER = "unlearn-pg"  # created only when running as root on a machine without Debian's `postgres` user


class TeamError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"team: {msg}", flush=True)


# --- PostgreSQL --------------------------------------------------------------------------------------------
def pg_bin(name: str) -> str:
    """A PostgreSQL server program: from PATH (initdb, pg_ctl are linked into /usr/local/bin on this image),
    else Debian's /usr/lib/postgresql/<newest>/bin (the `postgresql` package does not put them on PATH)."""
    found = shutil.which(name)
    if found:
        return found
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True):
        if os.access(Path(folder) / name, os.X_OK):
            return str(Path(folder) / name)
    raise TeamError(f"PostgreSQL's `{name}` was not found: install Debian's server package "
                    f"(`apt-get install -y postgresql`)")


def pg_user() -> str | None:
    """Who runs PostgreSQL: None (this user) unless root. As root: $TEAM_PG_USER, else Debian's `postgres`,
    else a system user created for it."""
    if os.geteuid() != 0:
        return None
    for name in (os.environ.get("TEAM_PG_USER"), "postgres"):
        if name:
            try:
                pwd.getpwnam(name)
                return name
            except KeyError:
                if name == os.environ.get("TEAM_PG_USER"):
                    raise TeamError(f"TEAM_PG_USER={name} does not exist") from None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        log(f"creating system user {SYSTEM_USER} to run PostgreSQL (it refuses to run as root)")
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
                       check=True)
    return SYSTEM_USER


def as_pg(cmd: list[str]) -> list[str]:
    user = pg_user()
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


def chown_to_pg(path: Path) -> None:
    user = pg_user()
    if user:
        shutil.chown(path, user, user if _has_group(user) else None)


def _has_group(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise TeamError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    return res


class Team:
    def __init__(self, folder: Path, host: str, pg_port: int, prefect_port: int, mlflow_port: int,
                 mlflow_workers: int = 1, timeout: float = 180):
        self.dir = folder.resolve()
        self.host, self.pg_port, self.prefect_port, self.mlflow_port = host, pg_port, prefect_port, mlflow_port
        self.mlflow_workers, self.timeout = mlflow_workers, timeout
        self.pg_dir = self.dir / "pg"
        self.data = self.pg_dir / "data"
        self.password_file = self.dir / "pg.password"
        self.artifacts = self.dir / "artifacts"
        self.prefect_home = self.dir / "prefect-home"

    # where clients connect: $TEAM_CLIENT_HOST, else the bind address (for 0.0.0.0, this machine's name)
    @property
    def client_host(self) -> str:
        return os.environ.get("TEAM_CLIENT_HOST") or (socket.getfqdn() if self.host in ("0.0.0.0", "::") else self.host)

    @property
    def prefect_api_url(self) -> str:
        return f"http://{self.client_host}:{self.prefect_port}/api"

    @property
    def mlflow_tracking_uri(self) -> str:
        return f"http://{self.client_host}:{self.mlflow_port}"

    def password(self) -> str:
        return self.password_file.read_text().strip()

    def db_url(self, database: str, driver: str) -> str:
        return f"postgresql+{driver}://{ROLE}:{self.password()}@127.0.0.1:{self.pg_port}/{database}"

    def save(self) -> None:
        (self.dir / "team.json").write_text(json.dumps(
            {"host": self.host, "pg_port": self.pg_port, "prefect_port": self.prefect_port,
             "mlflow_port": self.mlflow_port}, indent=2) + "\n")

    # --- database ----------------------------------------------------------------------------------------
    def pg_running(self) -> bool:
        res = subprocess.run(as_pg([pg_bin("pg_ctl"), "-D", str(self.data), "status"]), capture_output=True, text=True)
        return res.returncode == 0

    def init_db(self) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pg_dir.mkdir(exist_ok=True)
        if not self.password_file.exists():
            self.password_file.touch(mode=0o600)
            self.password_file.write_text(secrets.token_urlsafe(24) + "\n")
        chown_to_pg(self.pg_dir)
        user = pg_user()
        if user and subprocess.run(["runuser", "-u", user, "--", "test", "-w", str(self.pg_dir)]).returncode != 0:
            raise TeamError(f"user {user} (PostgreSQL refuses to run as root) cannot write {self.pg_dir}: every "
                            f"folder above it must be searchable by others (chmod o+x), or pick --dir elsewhere")
        pwfile = self.pg_dir / ".pwfile"  # readable by the cluster's owner for initdb only
        pwfile.write_text(self.password() + "\n")
        chown_to_pg(pwfile)
        pwfile.chmod(0o600)
        try:
            log(f"initdb {self.data} (role {ROLE}, password auth)")
            run(as_pg([pg_bin("initdb"), "-D", str(self.data), "-U", ROLE, "--auth=scram-sha-256",
                       f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C.UTF-8"]))
        finally:
            pwfile.unlink(missing_ok=True)

    def start_db(self) -> None:
        self.init_db()
        if not self.pg_running():
            if port_in_use(self.pg_port):
                raise TeamError(f"port {self.pg_port} is taken: set TEAM_PG_PORT (or --pg-port) to a free one")
            log(f"starting PostgreSQL on 127.0.0.1:{self.pg_port}")
            # Loopback TCP only; no Unix socket (the Debian default folder belongs to the system cluster).
            opts = f"-c listen_addresses=127.0.0.1 -c port={self.pg_port} -c unix_socket_directories=''"
            run(as_pg([pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.pg_dir / "postgres.log"), "-w",
                       "-t", str(int(self.timeout)), "-o", opts, "start"]))
        existing = self.psql("SELECT datname FROM pg_database").split()
        for db in DATABASES:
            if db not in existing:
                log(f"creating database {db}")
                self.psql(f"CREATE DATABASE {db}")

    def psql(self, sql: str) -> str:
        env = {**os.environ, "PGPASSWORD": self.password()}
        return run(["psql", "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", ROLE, "-d", "postgres", "-v",
                    "ON_ERROR_STOP=1", "-tAc", sql], env=env).stdout

    def stop_db(self) -> None:
        if (self.data / "PG_VERSION").exists() and self.pg_running():
            log("stopping PostgreSQL")
            run(as_pg([pg_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]))

    # --- servers -----------------------------------------------------------------------------------------
    def servers(self) -> dict:
        py = sys.executable
        base = {**os.environ, **OFFLINE, "PYTHONUNBUFFERED": "1"}
        for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
            base.pop(key, None)
        return {
            "prefect": {
                "cmd": [py, "-m", "prefect", "server", "start", "--host", self.host, "--port", str(self.prefect_port)],
                "env": {**base, "PREFECT_HOME": str(self.prefect_home),
                        "PREFECT_API_DATABASE_CONNECTION_URL": self.db_url("prefect", "asyncpg")},
                "health": f"http://127.0.0.1:{self.prefect_port}/api/health", "port": self.prefect_port,
                "marker": "prefect"},
            "mlflow": {
                # The store URI comes from the environment (MLflow's own variable): no password on a command line.
                # psycopg2 named explicitly: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3.
                # adapters.mlflow_ui: `mlflow server` whose page opens the experiment on its batch runs.
                "cmd": [py, "-m", "adapters.mlflow_ui", "server", "--host", self.host, "--port", str(self.mlflow_port),
                        "--workers", str(self.mlflow_workers), "--serve-artifacts",
                        "--artifacts-destination", str(self.artifacts)],
                "env": {**base, "MLFLOW_BACKEND_STORE_URI": self.db_url("mlflow", "psycopg2")},
                "health": f"http://127.0.0.1:{self.mlflow_port}/health", "port": self.mlflow_port,
                "marker": "mlflow"},
        }

    def pid_of(self, name: str) -> int | None:
        """The pid in <name>.pid when that process is still the server started here (not a reused pid)."""
        path = self.dir / f"{name}.pid"
        try:
            pid = int(path.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            return None
        return pid if name in cmdline and "server" in cmdline else None

    def start_servers(self) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.prefect_home.mkdir(parents=True, exist_ok=True)
        started = {}
        for name, spec in self.servers().items():
            if self.pid_of(name):
                log(f"{name} server already running (pid {self.pid_of(name)})")
                continue
            if port_in_use(spec["port"]):
                raise TeamError(f"port {spec['port']} for the {name} server is taken (another `make server`/`make ui`?): "
                                f"stop it or set {name.upper()}_PORT")
            logf = open(self.dir / f"{name}.log", "ab")
            proc = subprocess.Popen(spec["cmd"], env=spec["env"], cwd=self.dir, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)  # its own group: stopped as one
            (self.dir / f"{name}.pid").write_text(f"{proc.pid}\n")
            started[name] = proc
            log(f"started {name} server (pid {proc.pid}, log {self.dir / (name + '.log')})")
        deadline = time.monotonic() + self.timeout
        for name, spec in self.servers().items():
            while not http_ok(spec["health"]):
                proc = started.get(name)
                if proc is not None and proc.poll() is not None:
                    raise TeamError(f"the {name} server exited ({proc.returncode}):\n{tail(self.dir / f'{name}.log')}")
                if time.monotonic() > deadline:
                    raise TeamError(f"the {name} server was not healthy after {self.timeout:.0f} s:\n"
                                    f"{tail(self.dir / f'{name}.log')}")
                time.sleep(1)
            log(f"{name} server healthy: {spec['health']}")

    def stop_servers(self) -> None:
        pids = []
        for name in self.servers():
            pid = self.pid_of(name)
            if pid:
                log(f"stopping {name} server (pid {pid})")
                pids.append(pid)
        stop_groups(pids)
        for name in self.servers():
            (self.dir / f"{name}.pid").unlink(missing_ok=True)

    # --- commands ----------------------------------------------------------------------------------------
    def up(self) -> None:
        self.start_db()
        self.save()
        self.start_servers()
        print(self.env_lines())

    def down(self) -> None:
        errors = []
        for step in (self.stop_servers, self.stop_db):
            try:
                step()
            except Exception as e:  # stop what can be stopped, then report
                errors.append(str(e))
        if errors:
            raise TeamError("\n".join(errors))

    def env_lines(self) -> str:
        return (f"export PREFECT_API_URL={self.prefect_api_url}\n"
                f"export MLFLOW_TRACKING_URI={self.mlflow_tracking_uri}")

    def status(self) -> int:
        db = self.pg_running() if (self.data / "PG_VERSION").exists() else False
        print(f"postgres  127.0.0.1:{self.pg_port}  {'running' if db else 'stopped'}  {self.data}")
        ok = db
        for name, spec in self.servers().items():
            pid, healthy = self.pid_of(name), http_ok(spec["health"])
            ok = ok and healthy
            print(f"{name:<9} {self.host}:{spec['port']}  {'healthy' if healthy else 'down'}"
                  f"{f'  pid {pid}' if pid else ''}  log {self.dir / (name + '.log')}")
        return 0 if ok else 1


# --- helpers -----------------------------------------------------------------------------------------------
def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status == 200
    except Exception:
        return False


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def stop_groups(pids: list[int], grace: float = 10) -> None:
    """SIGTERM the process groups led by pids (each server with its uvicorn workers) together, SIGKILL what is
    left after `grace` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        for pid in pids:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pids = [p for p in pids if alive(p) or group_alive(p)]
            if not pids:
                return
            time.sleep(0.3)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def main(argv: list[str] | None = None) -> int:
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["db", "up", "down", "env", "status"])
    ap.add_argument("--dir", default=env("TEAM_DIR", ".team"), help="the team folder (default .team, $TEAM_DIR)")
    ap.add_argument("--host", default=None, help="address the servers bind to (default 127.0.0.1, $TEAM_HOST)")
    ap.add_argument("--pg-port", type=int, default=None, help="PostgreSQL port (default 54329, $TEAM_PG_PORT)")
    ap.add_argument("--prefect-port", type=int, default=None, help="Prefect port (default 4200, $PREFECT_PORT)")
    ap.add_argument("--mlflow-port", type=int, default=None, help="MLflow port (default 5000, $MLFLOW_PORT)")
    ap.add_argument("--mlflow-workers", type=int, default=int(env("TEAM_MLFLOW_WORKERS", "1")))
    ap.add_argument("--timeout", type=float, default=float(env("TEAM_TIMEOUT", "180")),
                    help="seconds to wait for each server to become healthy")
    a = ap.parse_args(argv)
    folder = Path(a.dir)
    saved = {}
    if a.command != "up" and (folder / "team.json").exists():  # env/status/down/db follow the last `up`
        saved = json.loads((folder / "team.json").read_text())

    def pick(cli, key, var, default):
        return cli if cli is not None else (env(var) or saved.get(key) or default)

    team = Team(folder, host=str(pick(a.host, "host", "TEAM_HOST", "127.0.0.1")),
                pg_port=int(pick(a.pg_port, "pg_port", "TEAM_PG_PORT", 54329)),
                prefect_port=int(pick(a.prefect_port, "prefect_port", "PREFECT_PORT", 4200)),
                mlflow_port=int(pick(a.mlflow_port, "mlflow_port", "MLFLOW_PORT", 5000)),
                mlflow_workers=a.mlflow_workers, timeout=a.timeout)
    try:
        if a.command == "db":
            team.start_db()
            team.save()
        elif a.command == "up":
            team.up()
        elif a.command == "down":
            team.down()
        elif a.command == "env":
            print(team.env_lines())
        elif a.command == "status":
            return team.status()
    except TeamError as e:
        print(f"team: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
