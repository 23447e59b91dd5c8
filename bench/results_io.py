"""Shared by the benches: write a result dict as JSON (bench/results/ by default) and say where."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: str | Path, result: dict) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=float))
    print(f"wrote {out}")
    return out
