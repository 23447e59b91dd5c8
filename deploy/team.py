"""Team deployment: a Prefect server and an MLflow server (serving artifacts), both on one PostgreSQL cluster.

    python deploy/team.py [--dir .team] db      # init + start a project-local PostgreSQL cluster, create the databases
    python deploy/team.py [--dir .team] up      # db + Prefect server + MLflow server, in the background
    python deploy/team.py [--dir .team] env     # the pipeline client's environment (eval "$(... env)")
    python deploy/team.py [--dir .team] user --name alice --role reviewer   # an MLflow account (password in a file)
    python deploy/team.py [--dir .team] rotate --name pipeline|admin|prefect   # a new password (docs/operations.md)
    python deploy/team.py [--dir .team] status  # what runs, on which port, with which pid
    python deploy/team.py [--dir .team] down    # stop both servers and the cluster (the data stays)

`make team-db / team-up / team-env / team-user / team-status / team-down` call it. Both servers always ask for a
login (docs/operations.md, "Accounts and threat model"): MLflow runs its basic-auth app (users and permissions in
the `mlflow_auth` database, `default_permission = NO_PERMISSIONS`), Prefect checks one shared basic-auth string.
Every secret is generated here into a mode-600 file and reaches a server through its environment, never its
command line (`ps` shows command lines to every user) and never a log. Everything lives in one folder (default
`.team/`, git-ignored), which no other local user can read: every command here runs with umask 077, so the folders
it and the servers create are 0700 and their files 0600 (the artifacts included), and `up` narrows what an older
version left wider (`restrict_modes`). Run as root, PostgreSQL runs as its own user, which must reach its cluster
in pg/: the team folder is then 0711 (others may pass through it, never list or read it).

MLflow's logins go through the project's adapters/tracking.py `team_authenticate` (`authorization_function` in its
config): only the admin changes accounts, roles and permissions, failed logins are throttled per account and per
client, and an unknown account costs a password check like a known one. A right password is checked once per
`MLFLOW_AUTH_CACHE_SECONDS` (MLflow's credential cache), not on every request (0.3 s each: a batch's tracking took
105 s).

    pg/data            the PostgreSQL cluster (owned by the `postgres` system user when run as root: PostgreSQL
                       refuses to run as root), listening on 127.0.0.1:<pg port> only, no Unix socket, password auth
    pg.password        the role's password (mode 600); the servers get their database URLs from the environment,
                       so the password never appears on a command line
    artifacts/         the MLflow server's artifact store (`--artifacts-destination`): clients upload and download
                       over HTTP (`mlflow-artifacts:/` URIs), nothing is written to a client's disk
    prefect-home/      the Prefect server's home (its settings; its database is the `prefect` database)
    prefect.auth       the Prefect server's basic-auth string `team:<password>` (mode 600)
    mlflow-admin.password, mlflow-flask.key   the MLflow admin's password and the auth app's CSRF key (mode 600)
    mlflow-auth.ini    the auth app's config (mode 600: its database URL holds the PostgreSQL password)
    users/<name>.password   each MLflow account's password (mode 600); `pipeline` is made by `up`
    team.json          ports, host and TLS files of the last `up` (no secret); *.pid and *.log of each process

Standard library only (PyYAML, for the experiment's and registered model's names in params.yaml, in `up` and
`user` alone): it starts the `prefect` and `mlflow` command-line servers as processes and talks to them over
REST; it imports neither (the import rules keep Prefect in flows/ and tasks/, MLflow in adapters/tracking.py).

Binding beyond loopback needs TLS (`--tls-cert`/`--tls-key`): the servers' basic auth would otherwise send every
password in clear text over the network. Both servers then serve HTTPS themselves (uvicorn's TLS).
"""

from __future__ import annotations

import argparse
import base64
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

# The project's one liveness check (stdlib only; importing the `adapters` package does nothing else), from this
# checkout whatever Python runs this script. Not from `flows`: its package import sets environment defaults that
# would reach the servers started here.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adapters.pids import pid_alive as alive  # noqa: E402

ROLE = "team"
DATABASES = ("prefect", "mlflow", "mlflow_auth")  # mlflow_auth: the MLflow auth app's users and permissions
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MLFLOW_ADMIN = "admin"
PREFECT_USER = "team"  # the user part of Prefect's one shared basic-auth string
PIPELINE = "pipeline"  # the account `up` makes and `env` prints
# What each MLflow account may do on the project's experiment and registered model (and nothing else: the
# default permission is NO_PERMISSIONS). MANAGE, not EDIT, for the pipeline: erasure deletes runs' model
# artifacts and purges old model versions, which need the delete right (mlflow/server/auth/permissions.py).
ROLES = {"pipeline": "MANAGE", "reviewer": "READ"}
# A verified password is cached this long by the auth app (in its process; a password change clears it): MLflow
# checks it with a slow hash (about 0.3 s here), and a batch makes hundreds of requests.
MLFLOW_AUTH_CACHE_SECONDS = 300
TEAM_UMASK = 0o077  # what this module and the servers create: 0700 folders, 0600 files
ROOT = Path(__file__).resolve().parents[1]  # the project: the MLflow server imports its login check from it
OFFLINE = {"DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
           "DVC_NO_ANALYTICS": "1"}
SYSTEM_USER = "unlearn-pg"  # created only when running as root on a machine without Debian's `postgres` user


class TeamError(RuntimeError):
    pass


class MlflowAnswer(TeamError):
    """An HTTP error answer of the MLflow server (`code`: its status)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def tracking_names(params: Path) -> tuple[str, str]:
    """The experiment's and the registered model's names in the project's params file (`tracking`)."""
    import yaml  # the project's venv has it; `env`, `status` and `down` run without it

    try:
        tracking = (yaml.safe_load(params.read_text()) or {})["tracking"]
        return str(tracking["experiment"]), str(tracking["registered_model"])
    except (OSError, KeyError, TypeError) as e:
        raise TeamError(f"{params}: cannot read tracking.experiment and tracking.registered_model ({e!r}); "
                        f"pass --params with the project's params.yaml") from None


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


# --- secrets -----------------------------------------------------------------------------------------------
def write_secret(path: Path, value: str) -> None:
    """`value` into `path`, mode 600 from its first byte (a temporary file renamed over it: a reader sees the
    old secret or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    os.replace(tmp, path)


def secret(path: Path, make=lambda: secrets.token_urlsafe(24)) -> str:
    """The secret in `path`, generated into it (mode 600) the first time."""
    if not path.exists():
        write_secret(path, make())
    return path.read_text().strip()


def basic_auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise TeamError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    return res


class Team:
    def __init__(self, folder: Path, host: str, pg_port: int, prefect_port: int, mlflow_port: int,
                 mlflow_workers: int = 1, timeout: float = 180, tls_cert: str | None = None,
                 tls_key: str | None = None, params: Path = Path("params.yaml")):
        self.dir = folder.resolve()
        self.params = params
        self.host, self.pg_port, self.prefect_port, self.mlflow_port = host, pg_port, prefect_port, mlflow_port
        self.mlflow_workers, self.timeout = mlflow_workers, timeout
        self.tls_cert = str(Path(tls_cert).resolve()) if tls_cert else None
        self.tls_key = str(Path(tls_key).resolve()) if tls_key else None
        self.pg_dir = self.dir / "pg"
        self.data = self.pg_dir / "data"
        self.password_file = self.dir / "pg.password"
        self.artifacts = self.dir / "artifacts"
        self.prefect_home = self.dir / "prefect-home"
        self.prefect_auth_file = self.dir / "prefect.auth"
        self.mlflow_admin_file = self.dir / "mlflow-admin.password"
        self.mlflow_key_file = self.dir / "mlflow-flask.key"
        self.auth_ini = self.dir / "mlflow-auth.ini"
        self.users_dir = self.dir / "users"

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    # where clients connect: $TEAM_CLIENT_HOST, else the bind address (for 0.0.0.0, this machine's name)
    @property
    def client_host(self) -> str:
        return os.environ.get("TEAM_CLIENT_HOST") or (socket.getfqdn() if self.host in ("0.0.0.0", "::") else self.host)

    # where this machine reaches the servers (health checks, the admin's calls)
    @property
    def local_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "localhost") else self.host

    @property
    def prefect_api_url(self) -> str:
        return f"{self.scheme}://{self.client_host}:{self.prefect_port}/api"

    @property
    def mlflow_tracking_uri(self) -> str:
        return f"{self.scheme}://{self.client_host}:{self.mlflow_port}"

    @property
    def mlflow_local(self) -> str:
        return f"{self.scheme}://{self.local_host}:{self.mlflow_port}"

    def user_file(self, name: str) -> Path:
        return self.users_dir / f"{name}.password"

    def check_exposure(self) -> None:
        """Refuse to listen beyond loopback without TLS: basic auth sends the password with every request."""
        if self.host not in LOOPBACK and not (self.tls_cert and self.tls_key):
            raise TeamError(f"refusing to bind to {self.host} without TLS: the servers' logins would cross the "
                            f"network in clear text. Pass --tls-cert and --tls-key (TEAM_TLS_CERT, TEAM_TLS_KEY; "
                            f"docs/operations.md, \"TLS\"), or bind to 127.0.0.1")
        for what, path in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key)):
            if path and not Path(path).is_file():
                raise TeamError(f"{what} {path} is not a file")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise TeamError("--tls-cert and --tls-key go together: give both, or neither")

    def password(self) -> str:
        return self.password_file.read_text().strip()

    def db_url(self, database: str, driver: str) -> str:
        return f"postgresql+{driver}://{ROLE}:{self.password()}@127.0.0.1:{self.pg_port}/{database}"

    def save(self) -> None:
        (self.dir / "team.json").write_text(json.dumps(
            {"host": self.host, "pg_port": self.pg_port, "prefect_port": self.prefect_port,
             "mlflow_port": self.mlflow_port, "tls_cert": self.tls_cert, "tls_key": self.tls_key}, indent=2) + "\n")

    def write_auth_config(self) -> None:
        """The MLflow auth app's config, rewritten at each `up` (the PostgreSQL port may have changed). The admin's
        password is not in it: the first start takes it from MLFLOW_AUTH_ADMIN_PASSWORD (the environment)."""
        url = self.db_url("mlflow_auth", "psycopg2").replace("%", "%%")  # configparser's interpolation
        write_secret(self.auth_ini, "\n".join([
            "[mlflow]",
            "default_permission = NO_PERMISSIONS",
            f"database_uri = {url}",
            f"admin_username = {MLFLOW_ADMIN}",
            "authorization_function = adapters.tracking:team_authenticate",  # admin-only changes, throttling
            f"auth_cache_ttl_seconds = {MLFLOW_AUTH_CACHE_SECONDS}",
            "grant_default_workspace_access = false"]))

    # --- database ----------------------------------------------------------------------------------------
    def pg_running(self) -> bool:
        res = subprocess.run(as_pg([pg_bin("pg_ctl"), "-D", str(self.data), "status"]), capture_output=True, text=True)
        return res.returncode == 0

    def init_db(self) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o711 if pg_user() else 0o700)  # PostgreSQL's own user passes through it to pg/
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
    def servers(self, secrets_too: bool = False) -> dict:
        """Each server's command, environment (with its secrets only when `secrets_too`: `status` and `down`
        neither read nor create them), health URL and port."""
        py = sys.executable
        base = {**os.environ, **OFFLINE, "PYTHONUNBUFFERED": "1"}
        for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                    "PREFECT_API_AUTH_STRING", "PREFECT_API_KEY"):
            base.pop(key, None)
        if secrets_too:
            prefect_auth = secret(self.prefect_auth_file, lambda: f"{PREFECT_USER}:{secrets.token_urlsafe(24)}")
            prefect_secrets = {"PREFECT_API_DATABASE_CONNECTION_URL": self.db_url("prefect", "asyncpg"),
                               "PREFECT_SERVER_API_AUTH_STRING": prefect_auth, "PREFECT_API_AUTH_STRING": prefect_auth}
            mlflow_secrets = {"MLFLOW_BACKEND_STORE_URI": self.db_url("mlflow", "psycopg2"),
                              "MLFLOW_AUTH_ADMIN_PASSWORD": secret(self.mlflow_admin_file),
                              "MLFLOW_FLASK_SERVER_SECRET_KEY": secret(self.mlflow_key_file,
                                                                       lambda: secrets.token_hex(32))}
        else:
            prefect_secrets = mlflow_secrets = {}
        prefect_cmd = [py, "-m", "prefect", "server", "start", "--host", self.host, "--port", str(self.prefect_port)]
        prefect_env = {}
        mlflow_tls = []
        if self.tls_cert:
            # `prefect server start` has no TLS options: uvicorn runs Prefect's app factory itself, as
            # `prefect server start --background` does (PREFECT__SERVER_FINAL: the full app, services included).
            prefect_cmd = [py, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app",
                           "--host", self.host, "--port", str(self.prefect_port),
                           "--ssl-certfile", self.tls_cert, "--ssl-keyfile", self.tls_key]
            prefect_env = {"PREFECT__SERVER_FINAL": "1"}
            mlflow_tls = ["--uvicorn-opts", f"--ssl-certfile {self.tls_cert} --ssl-keyfile {self.tls_key}"]
        return {
            "prefect": {
                "cmd": prefect_cmd,
                # The auth string for the server's checks, and for its own client calls (the same string).
                "env": {**base, **prefect_env, "PREFECT_HOME": str(self.prefect_home), **prefect_secrets},
                "health": f"{self.scheme}://{self.local_host}:{self.prefect_port}/api/health",
                "port": self.prefect_port, "marker": "prefect"},
            "mlflow": {
                # The store URI comes from the environment (MLflow's own variable): no password on a command line.
                # psycopg2 named explicitly: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3.
                # The auth app (a team server needs logins) rather than adapters.mlflow_ui: an --app-name replaces
                # that page's seeding; the links the pipeline prints (?viewStateShareKey=batches) open the runs table.
                # The auth app reads its config file (mode 600) and, on its first start, the admin's password.
                "cmd": [py, "-m", "mlflow", "server", "--app-name", "basic-auth", "--host", self.host,
                        "--port", str(self.mlflow_port), "--workers", str(self.mlflow_workers), "--serve-artifacts",
                        "--artifacts-destination", str(self.artifacts), *mlflow_tls],
                "env": {**base, "MLFLOW_AUTH_CONFIG_PATH": str(self.auth_ini), **mlflow_secrets,
                        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH")) if p)},
                "health": f"{self.mlflow_local}/health", "port": self.mlflow_port, "marker": "mlflow"},
        }

    def pid_of(self, name: str) -> int | None:
        """The pid in <name>.pid when that process is still the server started here (not a reused pid)."""
        path = self.dir / f"{name}.pid"
        try:
            pid = int(path.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            return None
        return pid if name in cmdline and ("server" in cmdline or "uvicorn" in cmdline) else None

    def restrict_modes(self) -> None:
        """Nobody but this user reads the team folder: folders 0700, files 0600 (what an older `up` made 755 and
        644: the artifact store's model weights among them). PostgreSQL's cluster (pg/) is its own user's, who
        needs to pass through the team folder (0711 then)."""
        self.dir.chmod(0o711 if pg_user() else 0o700)
        for path in self.dir.rglob("*"):
            if path.is_relative_to(self.pg_dir) or path.is_symlink():
                continue
            mode = path.stat().st_mode
            if mode & 0o077:
                path.chmod(stat.S_IMODE(mode) & 0o700)

    def start_servers(self) -> None:
        self.restrict_modes()
        self.write_auth_config()
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.prefect_home.mkdir(parents=True, exist_ok=True)
        started = {}
        for name, spec in self.servers(secrets_too=True).items():
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
            while not http_ok(spec["health"], self.tls_cert):
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

    # --- MLflow accounts (the auth app's REST API, as the admin) ------------------------------------------
    def mlflow_call(self, method: str, path: str, body: dict | None = None, query: dict | None = None) -> dict:
        """One call to the MLflow server as its admin; raises TeamError naming the call and MLflow's answer
        (which holds no secret: the password travels in the header and, for users, the body only)."""
        url = f"{self.mlflow_local}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": basic_auth(MLFLOW_ADMIN, secret(self.mlflow_admin_file)),
            "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30, context=tls_context(self.tls_cert)) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            answer = e.read().decode(errors="replace")[:500]
            raise MlflowAnswer(e.code, f"MLflow {method} {path} answered {e.code}: {answer}") from None
        return json.loads(text) if text.strip() else {}

    def project_resources(self) -> tuple[str, str]:
        """(experiment id, registered model name) of the project's MLflow names (params.yaml `tracking`), made by
        the admin when missing: a grant names an existing resource, and the accounts get no right to anything
        else."""
        experiment, model = tracking_names(self.params)
        try:
            exp_id = self.mlflow_call("GET", "/api/2.0/mlflow/experiments/get-by-name",
                                      query={"experiment_name": experiment})["experiment"]["experiment_id"]
        except MlflowAnswer as e:
            if e.code != 404:
                raise
            log(f"creating MLflow experiment {experiment!r}")
            exp_id = self.mlflow_call("POST", "/api/2.0/mlflow/experiments/create",
                                      {"name": experiment})["experiment_id"]
        try:
            self.mlflow_call("GET", "/api/2.0/mlflow/registered-models/get", query={"name": model})
        except MlflowAnswer as e:
            if e.code != 404:
                raise
            log(f"creating MLflow registered model {model!r}")
            self.mlflow_call("POST", "/api/2.0/mlflow/registered-models/create", {"name": model})
        return exp_id, model

    def user(self, name: str, role: str, rotate: bool = False) -> None:
        """The MLflow account `name` with `role`'s permission (ROLES) on the project's experiment and registered
        model; its password generated into users/<name>.password. An existing account keeps its password
        unless `rotate` (or its file is gone), and gets the role's permission in place of any earlier one."""
        if role not in ROLES:
            raise TeamError(f"role {role!r} is not one of {', '.join(ROLES)}")
        if not name.replace("-", "").replace("_", "").isalnum() or name == MLFLOW_ADMIN:
            raise TeamError(f"account name {name!r}: use letters, digits, - and _ (and not {MLFLOW_ADMIN!r})")
        exp_id, model = self.project_resources()
        self.users_dir.mkdir(mode=0o700, exist_ok=True)
        path = self.user_file(name)
        try:
            self.mlflow_call("GET", "/api/2.0/mlflow/users/get", query={"username": name})
            exists = True
        except MlflowAnswer as e:
            if e.code != 404:
                raise
            exists = False
        if not exists:
            password = secrets.token_urlsafe(24)
            self.mlflow_call("POST", "/api/2.0/mlflow/users/create", {"username": name, "password": password})
            write_secret(path, password)
            log(f"created MLflow account {name} ({role}); its password is in {path}")
        elif rotate or not path.exists():
            self.rotate_mlflow(name)
        for resource_type, resource_id in (("experiment", exp_id), ("registered_model", model)):
            grant = {"username": name, "resource_type": resource_type, "resource_id": resource_id}
            try:
                self.mlflow_call("POST", "/api/3.0/mlflow/users/permissions/revoke", grant)
            except MlflowAnswer:
                pass  # no earlier grant
            self.mlflow_call("POST", "/api/3.0/mlflow/users/permissions/grant", {**grant, "permission": ROLES[role]})
        log(f"MLflow account {name}: {ROLES[role]} on experiment {exp_id} and registered model {model!r}")

    def rotate_mlflow(self, name: str) -> None:
        """A new password for the MLflow account `name` (the admin's too): set on the server, then written to
        its file (the admin's file last, as the call itself logs in with the old one)."""
        password = secrets.token_urlsafe(24)
        body = {"username": name, "password": password}
        if name == MLFLOW_ADMIN:  # MLflow asks for the current password when an account changes its own
            body["current_password"] = secret(self.mlflow_admin_file)
        self.mlflow_call("PATCH", "/api/2.0/mlflow/users/update-password", body)
        write_secret(self.mlflow_admin_file if name == MLFLOW_ADMIN else self.user_file(name), password)
        log(f"new password for MLflow account {name} (in its file)")

    def rotate(self, what: str) -> None:
        if what == "prefect":
            write_secret(self.prefect_auth_file, f"{PREFECT_USER}:{secrets.token_urlsafe(24)}")
            log("new Prefect auth string written; it takes effect when the Prefect server restarts "
                "(make team-down team-up); clients then need the new PREFECT_API_AUTH_STRING (make -s team-env)")
        else:
            self.rotate_mlflow(what)

    # --- commands ----------------------------------------------------------------------------------------
    def up(self) -> None:
        self.check_exposure()
        tracking_names(self.params)  # a params file without the names fails before anything starts
        self.start_db()
        self.save()
        self.start_servers()
        self.user(PIPELINE, "pipeline")
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

    def env_lines(self, account: str = PIPELINE) -> str:
        """The client's variables; each secret by reference to its file (`$(cat ...)`), never the secret itself:
        this output lands in terminals, logs and shell histories."""
        lines = [f"export PREFECT_API_URL={self.prefect_api_url}",
                 f"export MLFLOW_TRACKING_URI={self.mlflow_tracking_uri}",
                 f'export PREFECT_API_AUTH_STRING="$(cat {self.prefect_auth_file})"',
                 f"export MLFLOW_TRACKING_USERNAME={account}",
                 f'export MLFLOW_TRACKING_PASSWORD="$(cat {self.user_file(account)})"']
        if self.tls_cert:  # the servers' certificate, for a self-signed one (both clients verify TLS)
            lines += [f"export MLFLOW_TRACKING_SERVER_CERT_PATH={self.tls_cert}",
                      f"export PREFECT_API_SSL_CERT_FILE={self.tls_cert}"]
        return "\n".join(lines)

    def status(self) -> int:
        db = self.pg_running() if (self.data / "PG_VERSION").exists() else False
        print(f"postgres  127.0.0.1:{self.pg_port}  {'running' if db else 'stopped'}  {self.data}")
        ok = db
        for name, spec in self.servers().items():
            pid, healthy = self.pid_of(name), http_ok(spec["health"], self.tls_cert)
            ok = ok and healthy
            print(f"{name:<9} {self.host}:{spec['port']}  {'healthy' if healthy else 'down'}"
                  f"{f'  pid {pid}' if pid else ''}  log {self.dir / (name + '.log')}")
        return 0 if ok else 1


# --- helpers -----------------------------------------------------------------------------------------------
def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def tls_context(cert: str | None) -> ssl.SSLContext | None:
    """For this machine's own calls to its servers over HTTPS: their certificate is trusted as given (a
    self-signed one included); the host name is not checked, as these calls go to loopback."""
    if not cert:
        return None
    ctx = ssl.create_default_context(cafile=cert)
    ctx.check_hostname = False
    return ctx


def http_ok(url: str, cert: str | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3, context=tls_context(cert)) as r:
            return r.status == 200
    except Exception:
        return False


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


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
    os.umask(TEAM_UMASK)  # everything created from here on, the servers' files included, is this user's alone
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["db", "up", "down", "env", "user", "rotate", "status"])
    ap.add_argument("--dir", default=env("TEAM_DIR", ".team"), help="the team folder (default .team, $TEAM_DIR)")
    ap.add_argument("--host", default=None, help="address the servers bind to (default 127.0.0.1, $TEAM_HOST)")
    ap.add_argument("--pg-port", type=int, default=None, help="PostgreSQL port (default 54329, $TEAM_PG_PORT)")
    ap.add_argument("--prefect-port", type=int, default=None, help="Prefect port (default 4200, $PREFECT_PORT)")
    ap.add_argument("--mlflow-port", type=int, default=None, help="MLflow port (default 5000, $MLFLOW_PORT)")
    ap.add_argument("--mlflow-workers", type=int, default=int(env("TEAM_MLFLOW_WORKERS", "1")))
    ap.add_argument("--timeout", type=float, default=float(env("TEAM_TIMEOUT", "180")),
                    help="seconds to wait for each server to become healthy")
    ap.add_argument("--tls-cert", default=None, help="PEM certificate both servers serve HTTPS with ($TEAM_TLS_CERT); "
                    "required to bind beyond loopback")
    ap.add_argument("--tls-key", default=None, help="its private key ($TEAM_TLS_KEY)")
    ap.add_argument("--params", type=Path, default=Path(__file__).resolve().parents[1] / "params.yaml",
                    help="the project's params file: the MLflow experiment and registered model the accounts get "
                         "rights on (tracking.experiment, tracking.registered_model)")
    ap.add_argument("--name", help="user: the MLflow account; rotate: an account, `admin` or `prefect`")
    ap.add_argument("--role", choices=sorted(ROLES), help="user: what the account may do (docs/operations.md)")
    ap.add_argument("--rotate", action="store_true", help="user: a new password for an existing account")
    a = ap.parse_args(argv)
    if a.command in ("user", "rotate") and not a.name:
        ap.error(f"{a.command} needs --name")
    if a.command == "user" and not a.role:
        ap.error(f"user needs --role ({' or '.join(sorted(ROLES))})")
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
                mlflow_workers=a.mlflow_workers, timeout=a.timeout,
                tls_cert=pick(a.tls_cert, "tls_cert", "TEAM_TLS_CERT", None),
                tls_key=pick(a.tls_key, "tls_key", "TEAM_TLS_KEY", None), params=a.params)
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
        elif a.command == "user":
            team.user(a.name, a.role, rotate=a.rotate)
        elif a.command == "rotate":
            team.rotate(a.name)
        elif a.command == "status":
            return team.status()
    except TeamError as e:
        print(f"team: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
