"""The MLflow UI of `make ui`: MLflow's own server with one script added to its page, so that a reviewer who opens
the experiment from MLflow's experiment list lands on the batch runs, not on MLflow 3's GenAI overview.

What decides the screen (MLflow 3.17.2's UI, read in its bundle mlflow/server/js/build/static/js):

- the experiment page's kind comes from the browser's *workflow type*: the URL's `?workflowType=` or else the
  browser's localStorage `mlflow.workflowType_v1` ("genai" until the reviewer switches it in the side bar). The
  experiment's `mlflow.experimentKind` tag is not read (the feature flag that would read it is hard-wired off),
  and the experiment list links to `#/experiments/<id>` with no parameter;
- the runs table opens on the columns the browser saved for that experiment (localStorage
  `MLflowLocalStorage-1.1-ExperimentPage-["<id>"]-ReactComponentState`: its search filter, order and columns),
  and on Source, Models and Dataset where none is saved.

The script sets both where the browser holds no value yet (a reviewer's own choice stays): the workflow type to
machine learning, the assistant panel as already shown once (it opens by itself on a browser's first visit,
over a third of the table), and, for each experiment that carries the pipeline's `batches` shared view
(adapters/tracking.py `BATCHES_VIEW`), that view as the experiment's saved state. A link with
`?viewStateShareKey=batches&workflowType=machine_learning` (what the pipeline prints) opens the same table on
any MLflow server, this one or not.

Run as `unlearn ui` in any project (`make ui` calls it: `ui_argv` below is the server's command line), or as
`python -m adapters.mlflow_ui [server] [mlflow server options]` (the team's MLflow server of deploy/team.py): the
options are `mlflow server`'s; the app it serves is MLflow's FastAPI app wrapped by `app` below. This module ships
with the package (adapters/), so a project of `unlearn init` opens the same page. What touches MLflow itself (its
server, its store) is in adapters/tracking.py, the one module that imports mlflow.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import sys
from pathlib import Path

WORKFLOW_KEY = "mlflow.workflowType_v1"  # the UI's localStorage key (its hook's key + "_v" + version)
WORKFLOW = "machine_learning"
# The UI opens its assistant panel (350 px of a 1,400 px window) the first time a browser loads it, unless this
# says it did already; the reviewer still opens it from its button.
ASSISTANT_OPENED_KEY = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
EXPERIMENT_STATE_KEY = "MLflowLocalStorage-1.1-ExperimentPage-{}-ReactComponentState"  # {}: JSON of [experiment id]
SKIPPED_HEADERS = (b"if-none-match", b"if-modified-since")  # the page must come back whole to carry the script
DROPPED_HEADERS = (b"content-length", b"etag", b"last-modified", b"cache-control")


def seed_script(views: dict[str, dict]) -> str:
    """The page's first script: the workflow type and each experiment's saved runs-table state, where unset.
    `views`: experiment id -> a runs-table state (searchFilter, orderByKey, orderByAsc, selectedColumns, ...)."""
    seeds = {EXPERIMENT_STATE_KEY.format(json.dumps([eid])): json.dumps(view) for eid, view in views.items()}
    seeds[WORKFLOW_KEY] = json.dumps(WORKFLOW)
    seeds[ASSISTANT_OPENED_KEY] = json.dumps(True)
    # "</" cannot appear inside a <script> element: the JSON's slashes are escaped.
    payload = json.dumps(seeds).replace("</", "<\\/")
    return ("<script>(function(){try{var s=window.localStorage,v=" + payload +
            ";for(var k in v){if(s.getItem(k)===null){s.setItem(k,v[k]);}}}catch(e){}})();</script>")


def with_script(page: bytes, script: str) -> bytes:
    """index.html with `script` first in its <head>: it runs before the UI's deferred bundle reads the storage."""
    marker = b"<head>"
    at = page.find(marker)
    if at < 0:
        return page
    at += len(marker)
    return page[:at] + script.encode() + page[at:]


class SeededPage:
    """ASGI middleware: the UI's page (GET of the root) gets `seed_script`; every other request passes through."""

    def __init__(self, inner, views, prefix: str = ""):
        self.inner, self.views, self.root = inner, views, prefix.rstrip("/") + "/"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET" or scope.get("path") != self.root:
            return await self.inner(scope, receive, send)
        scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers", []) if k.lower() not in SKIPPED_HEADERS]}
        start, chunks = {}, []

        async def capture(message):
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body, headers = b"".join(chunks), list(start.get("headers", []))
            html = any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers)
            if start.get("status") == 200 and html:
                try:
                    views = await asyncio.to_thread(self.views)
                except Exception:  # the store cannot be read: the page still opens (workflow type only)
                    views = {}
                body = with_script(body, seed_script(views))
                headers = [(k, v) for k, v in headers if k.lower() not in DROPPED_HEADERS]
                headers += [(b"content-length", str(len(body)).encode()), (b"cache-control", b"no-cache")]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.inner(scope, receive, capture)


def app():
    """The app factory uvicorn calls in each worker (after `mlflow server` set the store's variables)."""
    from adapters.tracking import batches_views, mlflow_server_app

    inner, prefix = mlflow_server_app()
    return SeededPage(inner, batches_views, prefix)


if __name__ == "__main__":
    from adapters.tracking import run_mlflow_server

    argv = sys.argv[1:]
    if argv[:1] in (["server"], ["ui"]):  # `python -m adapters.mlflow_ui server ...` reads like `mlflow server ...`
        argv = argv[1:]
    run_mlflow_server(argv, "unlearning-review", "adapters.mlflow_ui:app")


APP_NAME, APP_PATH = "unlearning-review", "adapters.mlflow_ui:app"


def port_problem(host: str, port: int) -> str | None:
    """Why the UI cannot listen on host:port (one line, with the fix), or None: `mlflow server` would log the bind
    error and still exit 0."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return (f"port {port} on {host} is taken (another MLflow UI or server?): stop it, or choose another port "
                    f"(`unlearn ui --port {port + 1}`)")
    return None


def experiment_id(db: Path, name: str) -> str | None:
    """The id of the active experiment `name` in the SQLite store `db` (read-only, stdlib), or None."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            row = con.execute("SELECT experiment_id FROM experiments WHERE name = ? AND lifecycle_stage = 'active'",
                              (name,)).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return None if row is None else str(row[0])


def ui_argv(tracking_uri: str, artifacts: Path, host: str, port: int) -> list[str]:
    """`mlflow server`'s options for the project's store: one worker on loopback, its artifacts folder."""
    return ["--backend-store-uri", tracking_uri, "--default-artifact-root", Path(artifacts).resolve().as_uri(),
            "--host", host, "--port", str(port), "--workers", "1"]
