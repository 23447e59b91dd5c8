"""adapters/mlflow_ui.py: the MLflow UI's page carries the script that opens an experiment on its batch runs
(the browser test, tests/e2e/test_operations.py, checks what the UI then shows)."""

from __future__ import annotations

import asyncio
import json

from adapters.mlflow_ui import ASSISTANT_OPENED_KEY, WORKFLOW_KEY, SeededPage, seed_script

PAGE = b'<!doctype html><html><head><title>MLflow</title><script defer src="main.js"></script></head></html>'
VIEW = {"searchFilter": "tags.stage = 'deletion_batch'", "selectedColumns": ["tags.`method`"], "note": "</script>"}


def serve(path: str, headers: list | None = None, views=lambda: {"7": VIEW}):
    """One GET through SeededPage over an app that answers PAGE (with caching headers): (messages, request seen)."""
    seen, sent = {}, []

    async def inner(scope, receive, send):
        seen.update(scope)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", b"%d" % len(PAGE)),
                                (b"etag", b"abc")]})
        await send({"type": "http.response.body", "body": PAGE[:40], "more_body": True})
        await send({"type": "http.response.body", "body": PAGE[40:]})

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": headers or []}
    asyncio.run(SeededPage(inner, views)(scope, None, send))
    return sent, seen


def test_the_page_gets_the_seed_script_first_in_its_head():
    sent, seen = serve("/", headers=[(b"if-none-match", b"abc"), (b"accept", b"text/html")])
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    headers = dict(start["headers"])
    assert body.startswith(b"<!doctype html><html><head><script>") and body.endswith(PAGE[PAGE.index(b"<title>"):])
    assert int(headers[b"content-length"]) == len(body) and b"etag" not in headers
    assert seen["headers"] == [(b"accept", b"text/html")]  # no 304 for a page cached without the script
    script = body[len(b"<!doctype html><html><head>"):body.index(b"</script>") + len(b"</script>")].decode()
    assert script == seed_script({"7": VIEW})
    seeds = json.loads(script[script.index("v=") + 2:script.index(";for")].replace("<\\/", "</"))
    assert json.loads(seeds['MLflowLocalStorage-1.1-ExperimentPage-["7"]-ReactComponentState']) == VIEW
    assert json.loads(seeds[WORKFLOW_KEY]) == "machine_learning" and json.loads(seeds[ASSISTANT_OPENED_KEY]) is True
    assert "if(s.getItem(k)===null)" in script  # a reviewer's own choice stays


def test_other_requests_pass_through_and_a_store_error_still_serves_the_page():
    sent, _ = serve("/static-files/main.js")
    assert b"".join(m.get("body", b"") for m in sent[1:]) == PAGE

    def broken():
        raise OSError("store down")

    sent, _ = serve("/", views=broken)
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert WORKFLOW_KEY.encode() in body and b"ExperimentPage" not in body


def test_the_script_cannot_be_closed_by_a_value():
    assert "</script>" not in seed_script({"7": VIEW})[:-len("</script>")]
