"""A team's table project (`unlearn init`), trained by `dvc repro train`, whose champion is served by
`mlflow models serve -m models:/<name>@champion --env-manager local`: a REST `POST /invocations` with raw rows
(the table's own columns, text categories as text) answers the model's predictions on the prepared features,
and odd rows get an error that names the problem (docs/own-data.md, "Serving raw rows"); a text/csv body of raw
rows is answered like the JSON one, and no answer to any odd request holds a value it sent or a local path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.e2e.test_operations import free_port, start, stop, wait_for

pytestmark = pytest.mark.slow


def customers(n: int = 160, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    plan = rng.choice(["basic", "plus", "family"], n)
    age = rng.integers(18, 80, n)
    spend = (rng.normal(60, 20, n) + np.where(plan == "family", 40, 0)).round(2)
    churn = (spend < 55) ^ (rng.random(n) < 0.1)
    return pd.DataFrame({"customer": [f"cust-{i:04d}" for i in range(n)], "age": age, "spend": spend,
                         "plan": plan, "paperless": rng.random(n) < 0.5,
                         "churned": np.where(churn, "left", "stayed")})


def sh(cmd, cwd, env, timeout=900) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{cmd} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout + res.stderr


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def post_raw(url: str, body: bytes, content_type: str) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, (e.read() or b"").decode(errors="replace")


def test_served_champion_answers_raw_rows(tmp_path):
    from adapters.tracking import fluent_store
    from unlearning.config import load_params
    from unlearning.data import load_prepared

    table = customers()
    (tmp_path / "crm").mkdir()
    table.to_csv(tmp_path / "crm" / "customers.csv", index=False)
    proj = tmp_path / "churn"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        env.pop(key, None)
    sh([sys.executable, "-m", "flows.cli", "init", str(proj), "--dataset", "table",
        "--path", str(tmp_path / "crm" / "customers.csv"), "--id-column", "customer", "--label-column", "churned"],
       Path(__file__).resolve().parents[2], env)
    params_file = proj / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    params.setdefault("train", {}).update(epochs=30)
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    sh([sys.executable, "-m", "flows.session", sys.executable, "-m", "dvc", "repro", "train"], proj, env)

    p = load_params(params_file)
    name = p.tracking.registered_model
    prepared = load_prepared(p.path("prepared_dir"))
    val = prepared.manifest.index[prepared.manifest["split"] == "val"].to_numpy()[:12]
    rows = table.set_index("customer").loc[prepared.manifest["sample_id"].iloc[val]].reset_index()
    import mlflow.pyfunc

    with fluent_store(p.mlflow_tracking_uri()):
        champion = mlflow.pyfunc.load_model(f"models:/{name}@{p.tracking.alias}")
    expected = champion._model_impl.predict_features(np.asarray(prepared.X[val]))  # the prepared features

    port = free_port()
    serve_env = {**env, "MLFLOW_TRACKING_URI": p.mlflow_tracking_uri()}
    server = start([sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{name}@{p.tracking.alias}",
                    "--env-manager", "local", "-p", str(port), "-h", "127.0.0.1"], proj, serve_env,
                   tmp_path / "serve.log")
    try:
        def ping() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(ping, 180, f"mlflow models serve on port {port} ({tmp_path / 'serve.log'})")
        url = f"http://127.0.0.1:{port}/invocations"
        # raw rows as the team holds them: the id and label columns ride along and are ignored
        split = json.loads(rows.to_json(orient="split", index=False))
        status, answer = post(url, {"dataframe_split": split})
        assert status == 200, answer
        got = pd.DataFrame(answer["predictions"])
        assert list(got.columns) == list(prepared.info["class_names"])
        np.testing.assert_allclose(got.to_numpy(), expected.to_numpy(), atol=1e-6)

        # an error names the column, the rows and what is wrong: never a value (a name riding along included)
        named = rows.head(2).assign(name=["Alice Private", "Bob Private"])

        def refused(df) -> str:
            status, answer = post(url, {"dataframe_split": json.loads(df.to_json(orient="split", index=False))})
            assert status == 400 and "Private" not in json.dumps(answer), answer
            return answer["message"]

        assert "feature columns ['plan'] are missing" in refused(named.drop(columns=["plan"]))
        assert "column 'plan': rows [1] hold 1 value(s) that are not among the fitted categories" in \
            refused(named.assign(plan=["basic", "premium"]))
        assert "column 'age' holds a fractional number in rows [1]" in refused(named.assign(age=[41, 24.7]))

        # a text/csv body of the same raw rows is answered like the JSON one
        status, text = post_raw(url, rows.to_csv(index=False).encode(), "text/csv")
        assert status == 200, text
        np.testing.assert_allclose(pd.DataFrame(json.loads(text)["predictions"]).to_numpy(), expected.to_numpy(),
                                   atol=1e-6)
        # no response body, for any input, holds a request value, a column value or a local path
        secret = "ZZSECRET-Carol-Private-4711"
        odd = [(b'{"dataframe_split": {"columns": ["plan"], "data": [["' + secret.encode(), "application/json"),
               (json.dumps({secret: [1]}).encode(), "application/json"),
               (json.dumps({"dataframe_split": json.loads(named.assign(plan=["basic", secret]).to_json(
                   orient="split", index=False))}).encode(), "application/json"),
               (named.assign(age=[41, secret]).to_csv(index=False).encode(), "text/csv"),
               (b"age,plan\n41,basic\n42," + secret.encode() + b",x,y\n", "text/csv"),
               (secret.encode(), f"text/plain; {secret}=1"),
               (b"PAR1" + secret.encode(), "application/vnd.apache.parquet")]
        for body, content_type in odd:
            status, text = post_raw(url, body, content_type)
            assert status in (400, 415), (content_type, status, text)
            for leak in (secret, "Private", str(proj), str(tmp_path), sys.prefix, "site-packages", "Traceback"):
                assert leak not in text, (content_type, leak, text)
    finally:
        stop(server)
