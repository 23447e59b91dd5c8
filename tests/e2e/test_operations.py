"""Unattended operation on real processes (loopback only, bounded in time, stopped by their PIDs):
a Prefect server, `unlearn serve` (deployments + inbox watcher), the MLflow UI and headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.cdp import Browser
from tests.e2e.test_dvc_repro import copy_project, sh
from tests.helpers import FAST, ROOT

pytestmark = pytest.mark.slow
ARTIFACTS = ROOT / "tests" / "artifacts"
# `make screenshots` sets it: the browser test also writes small copies of its screenshots there (docs/img/, the
# pictures of docs/review.md). Unset (`make test-slow`), the test writes under tests/artifacts/ only.
DOCS_SCREENSHOTS = os.environ.get("DOCS_SCREENSHOTS")
DOCS_MAX_BYTES = 200_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def http_ok(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


def start(cmd, cwd, env, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def docs_copy(shot: Path, width: int = 1000) -> None:
    """A copy of a screenshot for the docs (DOCS_SCREENSHOTS): `width` pixels wide, a 128-colour palette, under
    DOCS_MAX_BYTES."""
    if not DOCS_SCREENSHOTS:
        return
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    image.thumbnail((width, 10 * width))
    out = ROOT / DOCS_SCREENSHOTS / shot.name
    out.parent.mkdir(parents=True, exist_ok=True)
    image.quantize(colors=128).save(out, optimize=True)
    assert out.stat().st_size < DOCS_MAX_BYTES, (out, out.stat().st_size)


def ledger(proj: Path) -> list[dict]:
    path = proj / "state" / "ledger.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def drop(proj: Path, name: str, rows: list[tuple[str, str]]) -> None:
    """Write a request file atomically into the inbox (dot-file, then rename)."""
    inbox = proj / "requests" / "inbox"
    tmp = inbox / f".{name}.tmp"
    tmp.write_text("request_id,sample_id,requested_at,reason\n" +
                   "".join(f"{r},{s},2026-11-30T10:00:00Z,gdpr_art17_erasure\n" for r, s in rows))
    tmp.rename(inbox / name)


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    base = tmp_path_factory.mktemp("ops")
    proj = base / "proj"
    copy_project(proj)
    for f in (proj / "requests" / "inbox").iterdir():
        f.unlink()  # start with an empty inbox: files arrive during the test
    params = yaml.safe_load((proj / "params.yaml").read_text())
    from unlearning.config import deep_merge

    (proj / "params.yaml").write_text(yaml.safe_dump(deep_merge(params, FAST), sort_keys=False))
    port, ui_port = free_port(), free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(base / "prefect"), "PREFECT_API_URL": api,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    procs = []
    try:
        server = start([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                       proj, env, base / "server.log")
        procs.append(server)
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "copy"]):
            sh(["git", "-c", "user.email=t@localhost", "-c", "user.name=t", *args], proj, env)
        wait_for(lambda: http_ok(f"{api}/health"), 120, "the Prefect server")
        sh([sys.executable, "-m", "dvc", "repro", "train"], proj, env)
        serve = start([sys.executable, "-m", "flows.cli", "--params", str(proj / "params.yaml"), "serve"], proj, env,
                      base / "serve.log")
        procs.append(serve)
        wait_for(lambda: "deployments are being served" in (base / "serve.log").read_text(), 180, "the deployments")
        yield {"proj": proj, "env": env, "base": base, "ui_port": ui_port, "procs": procs}
    finally:
        for p in reversed(procs):
            stop(p)


def test_watcher_refuses_without_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    res = subprocess.run([sys.executable, "-m", "flows.cli", "serve"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode != 0 and "PREFECT_API_URL is not set" in res.stderr + res.stdout


@pytest.fixture(scope="module")
def first_batch(ops) -> list[dict]:
    """The first request file of the deployment, dropped into the inbox once for the tests that read its batch
    (its ledger entries, its MLflow run, its Prefect flow run), so they pass in any order or alone."""
    proj = ops["proj"]
    n0 = len(ledger(proj))
    t0 = time.monotonic()
    drop(proj, "2026-11-30T1000_a.csv", [("ops-1", "digits-0003"), ("ops-2", "digits-0008")])
    wait_for(lambda: len(ledger(proj)) >= n0 + 2, 300, "the first batch in the ledger", interval=2)
    latency = time.monotonic() - t0
    print(f"file drop -> finished batch: {latency:.1f} s")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "drop_latency.json").write_text(json.dumps({"seconds": latency}))
    return ledger(proj)[n0:]


def test_dropped_file_is_processed(ops, first_batch):
    proj = ops["proj"]
    assert [e["request_id"] for e in first_batch] == ["ops-1", "ops-2"]
    # Lineage: the deployment run committed the new state to the DVC cache.
    # The pipeline's stages (the report stage is separate: never run here, so it shows as changed)
    wait_for(lambda: "Data and pipelines are up to date" in dvc_status(proj, ops["env"]), 60, "a clean `dvc status`",
             interval=2)


def dvc_status(proj: Path, env: dict) -> str:
    """`dvc status` of the pipeline's stages; "" while the deployment's erasure still holds the DVC lock (its
    commit and gc end a few seconds after the ledger entry)."""
    res = subprocess.run([sys.executable, "-m", "dvc", "status", "prepare", "train", "deletion"], cwd=proj, env=env,
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0 and "Unable to acquire lock" in res.stderr + res.stdout:
        return ""
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return res.stdout


def test_two_files_at_once_in_order_exactly_once(ops):
    proj = ops["proj"]
    n0 = len(ledger(proj))
    inbox = proj / "requests" / "inbox"
    for name, rows in (("2026-11-30T1100_b.csv", [("ops-3", "digits-0013")]),
                       ("2026-11-30T1101_c.csv", [("ops-4", "digits-0018")])):
        (inbox / f".{name}").write_text("request_id,sample_id,requested_at,reason\n" +
                                        "".join(f"{r},{s},2026-11-30T11:00:00Z,ccpa\n" for r, s in rows))
    for name in ("2026-11-30T1100_b.csv", "2026-11-30T1101_c.csv"):
        (inbox / f".{name}").rename(inbox / name)
    wait_for(lambda: len(ledger(proj)) >= n0 + 2, 400, "both batches in the ledger", interval=2)
    time.sleep(15)  # any duplicate run would show up now
    ids = [e["request_id"] for e in ledger(proj)]
    assert ids[n0:] == ["ops-3", "ops-4"] and len(ids) == len(set(ids))


def test_mlflow_ui_shows_the_batch(ops, first_batch):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    proj, env, port = ops["proj"], ops["env"], ops["ui_port"]
    from adapters.tracking import Tracker
    from unlearning.config import load_params

    p = load_params(proj / "params.yaml")
    tracker = Tracker(p.mlflow_tracking_uri(), p.tracking.experiment)
    runs = tracker.client.search_runs([tracker.experiment_id], filter_string="tags.stage = 'deletion_batch'",
                                      order_by=["attributes.start_time ASC"])
    for failed in (r for r in runs if r.info.status != "FINISHED"):  # a run Prefect retried (a loaded machine)
        print(f"batch run {failed.info.run_name} {failed.info.status}: {failed.data.tags.get('gate')}")
    run = next(r for r in runs if r.info.status == "FINISHED")
    # What `make ui` runs: MLflow's server with the page script that opens an experiment on its batch runs.
    ui = start([sys.executable, "-m", "adapters.mlflow_ui", "--backend-store-uri", p.mlflow_tracking_uri(),
                "--host", "127.0.0.1", "--port", str(port), "--workers", "1"], proj, env, ops["base"] / "ui.log")
    ops["procs"].append(ui)
    wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 120, "the MLflow UI")
    base = f"http://127.0.0.1:{port}/"
    ARTIFACTS.mkdir(exist_ok=True)
    # One browser for the pages below; each page is waited for until what it must show is rendered (a loaded
    # machine renders MLflow's artifact viewer late, so one fixed virtual-time budget was not enough).
    browser = Browser(chromium, ops["base"] / "chrome", width=1400, height=1400)

    def page(route: str, shot_name: str, *shows: str) -> None:
        """Wait until the rendered body of one UI route contains every string of `shows` (the body: the page's
        seed script in its head holds the batches view's column names too), and screenshot it (kept under
        tests/artifacts/). The page starts from about:blank, so nothing of the route before is read."""
        browser.goto("about:blank")
        browser.wait("location.href === 'about:blank'", "a blank page")
        browser.goto(base + route)
        rendered = " && ".join(f"document.body.innerHTML.includes({json.dumps(s)})" for s in shows)
        browser.wait(f"location.href.startsWith({json.dumps(base)}) && document.body && {rendered}",
                     f"{shows} on {route}")
        shot = ARTIFACTS / shot_name
        browser.screenshot(shot)
        assert shot.stat().st_size > 10_000, shot
        docs_copy(shot)

    try:
        # The batch run page: a readable name and the batch summary as its description.
        assert " @ " in run.info.run_name
        page(tracker.run_url_hint(run.info.run_id), "mlflow_run_page.png",
             run.info.run_name, "Deletion batch", run.data.tags["request_file"], "Forgotten:")
        # A figure of the batch, rendered as an image in the artifact viewer.
        page(tracker.run_url_hint(run.info.run_id, "artifacts/champion_history.png"), "mlflow_history_figure.png",
             '<img alt="champion_history.png"')
        # The chosen candidate's child run: its accuracy per split against the oracles' spread (every candidate
        # has it; an exact retrain trains no references, so it has no KLoM figure).
        [child] = tracker.client.search_runs([tracker.experiment_id], filter_string=(
            f"tags.mlflow.parentRunId = '{run.info.run_id}' and tags.method = '{run.data.tags['method']}'"))
        assert child.info.run_name.startswith("unlearn-")
        page(tracker.run_url_hint(child.info.run_id, "artifacts/accuracy_per_split.png"),
             "mlflow_candidate_accuracy.png", '<img alt="accuracy_per_split.png"')
        # The shared view of the runs table: batch runs with the reviewer's columns.
        page(tracker.batches_url_hint(), "mlflow_batches_view.png",
             *(f'col-id="{column}"' for column in (*REVIEW_COLUMNS, "metrics.`n_forgotten`")))
        # The registered model's description, on its registry page.
        name = p.tracking.registered_model
        description = tracker.client.get_registered_model(name).description
        assert description and "champion" in description
        page(f"#/models/{name}", "mlflow_model_page.png", "The pipeline's classifier")
    finally:
        browser.close()
    # One duration per batch: the run's Duration (end - start), its wall_seconds metric (to 0.1 s) and the
    # summary's wall time are one number.
    run = tracker.client.get_run(run.info.run_id)
    wall = run.data.metrics["wall_seconds"]
    assert wall == round(wall, 1) and run.info.end_time - run.info.start_time == round(wall * 1000)
    assert f"**Wall time:** {wall:.1f} s" in run.data.tags["mlflow.note.content"]
    from_the_experiment_list(chromium, base, ops["base"] / "chrome-fresh", p.tracking.experiment, run, wall)


REVIEW_COLUMNS = ("tags.`method`", "tags.`gate`", "tags.`model_version`", "metrics.`wall_seconds`")


def from_the_experiment_list(chromium: str, base: str, profile: Path, experiment: str, run, wall: float) -> None:
    """A reviewer's first visit (a fresh browser profile, a 1,400 px window): MLflow's experiment list, a click on
    the experiment, and the batches table with the method, gate, version and wall time columns in view (not
    the GenAI overview, not the default Source/Models/Dataset columns, no assistant panel over the table)."""
    browser = Browser(chromium, profile, width=1400, height=900)
    try:
        browser.goto(base + "#/experiments")
        link = f"[...document.querySelectorAll('a[data-testid=experiment-list-item-link]')].find(a => a.textContent === {experiment!r})"
        browser.wait(f"Boolean({link})", "the experiment in MLflow's experiment list")
        browser.screenshot(ARTIFACTS / "mlflow_experiment_list.png")
        browser.eval(f"{link}.click()")
        # The table may first draw MLflow's default columns and then the saved state: wait for the reviewer's
        # columns (a table that never shows them times out here).
        header = ("Object.fromEntries([...document.querySelectorAll('.ag-header-cell[col-id]')].map(h => "
                  "[h.getAttribute('col-id'), [h.getBoundingClientRect().left, h.getBoundingClientRect().right]]))")
        columns = browser.wait(
            f"location.hash.includes('/runs') && (c => {json.dumps(list(REVIEW_COLUMNS))}.every(k => k in c) && c)"
            f"({header})", f"the runs table with the columns {REVIEW_COLUMNS} after a click on the experiment")
        browser.wait(f"document.body.innerText.includes({run.info.run_name!r})", "the batch run in the table")
        shot = ARTIFACTS / "mlflow_experiment_from_list.png"
        browser.screenshot(shot)
        docs_copy(shot)
        width = browser.eval("window.innerWidth")
        text = browser.eval("document.body.innerText")
        hash_ = browser.eval("location.hash")
    finally:
        browser.close()
    assert "/runs" in hash_ and "deletion_batch" in hash_, hash_  # the runs table, filtered to the batch runs
    for column in REVIEW_COLUMNS:
        left, right = columns[column]
        assert 0 <= left and right <= width, (column, left, right, width)  # in view, not scrolled off
    assert "Ask questions about your" not in text  # the assistant panel stayed closed (its button stays)
    assert run.data.tags["method"] in text and "Traces 0" not in text
    assert f"{wall:g}" in text  # the wall time, rounded as logged


def test_flow_runs_are_named_after_the_request_file(ops, first_batch):
    """The Prefect UI lists a deletion run as `deletion <request file>` (the first file dropped above)."""
    import httpx

    res = httpx.post(f"{ops['env']['PREFECT_API_URL']}/flow_runs/filter",
                     json={"flows": {"name": {"any_": ["deletion_batch"]}}}, timeout=30)
    res.raise_for_status()
    names = {r["name"] for r in res.json()}
    assert "deletion 2026-11-30T1000_a" in names, names


def test_prefect_ui_lists_the_flow_run_by_its_request_file(ops, first_batch):
    """The Prefect UI's runs page (a fresh browser, 1,400 px) lists the deletion's flow run by its request file."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    ARTIFACTS.mkdir(exist_ok=True)
    ui = ops["env"]["PREFECT_API_URL"].removesuffix("/api")
    browser = Browser(chromium, ops["base"] / "chrome-prefect", width=1400, height=900)
    try:
        browser.goto(f"{ui}/runs")
        browser.wait("document.body.innerText.includes('deletion 2026-11-30T1000_a')",
                     "the flow run named after its request file in the Prefect UI")
        shot = ARTIFACTS / "prefect_flow_runs.png"
        browser.screenshot(shot)
        docs_copy(shot)
    finally:
        browser.close()


def test_schedule_survives_a_restart_of_serve(ops):
    """Stop the serve process (SIGTERM, like an operator would), check on the server that the cron
    deployment is neither paused nor without its active schedule, then start serve again."""
    import httpx

    env, proj, base = ops["env"], ops["proj"], ops["base"]
    serve = next(p for p in ops["procs"] if "flows.cli" in p.args)
    stop(serve)

    def scheduled_deployment():
        res = httpx.post(f"{env['PREFECT_API_URL']}/deployments/filter",
                         json={"deployments": {"name": {"any_": ["scheduled"]}}}, timeout=10)
        res.raise_for_status()
        return res.json()

    (dep,) = scheduled_deployment()
    assert dep["paused"] is False
    assert [s["active"] for s in dep["schedules"]] == [True]
    assert dep["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    again = start([sys.executable, "-m", "flows.cli", "--params", str(proj / "params.yaml"), "serve"], proj, env,
                  base / "serve2.log")
    ops["procs"].append(again)
    wait_for(lambda: "deployments are being served" in (base / "serve2.log").read_text(), 180, "serve after restart")
    (dep,) = scheduled_deployment()
    assert dep["paused"] is False and [s["active"] for s in dep["schedules"]] == [True]
