"""Shared by the benches: write a result dict as JSON (bench/results/ by default) and say where; write a generated
table between its two markers in the README or a docs page."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def write_json(path: str | Path, result: dict) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=float))
    print(f"wrote {out}")
    return out


def write_between(path: str | Path, begin: str, end: str, text: str) -> bool:
    """Replace what stands between the lines `begin` and `end` of `path` by `text`; a file without both markers
    is left as it is, and stderr says so. Returns whether it wrote."""
    path = Path(path)
    body = path.read_text()
    if begin not in body or end not in body:
        print(f"{path}: no {begin} ... {end} markers; not written", file=sys.stderr)
        return False
    head, rest = body.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text.rstrip()}\n{end}{tail}")
    return True


def read_runs(paths: list[str]) -> list[dict]:
    """The JSON results a bench's `--tables FILE...` rewrites the docs tables from."""
    return [json.loads(Path(f).read_text()) for f in paths]


def dataset_parser(doc: str | None, rows: int = 8000):
    """The argument parser of a bench over digits and Fashion-MNIST: `--datasets` and `--rows` (Fashion-MNIST's
    training rows); the bench adds its own options."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="digits,fashion_mnist")
    ap.add_argument("--rows", type=int, default=rows, help="Fashion-MNIST training rows")
    return ap
