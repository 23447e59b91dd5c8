"""Which unlearners a batch tries, in order (DESIGN §4.5).

`deletion.method` names one method, or `auto` to walk the ordered rule list `deletion.rules` over the
batch's facts (objective, diagnostics, budget). `deletion.fallback` follows; exact `retrain` is always
the last candidate, so the gate always has something exact to fall back to.
"""

from __future__ import annotations

from unlearning.config import Params


def candidate_methods(params: Params, facts: dict) -> dict:
    d = params.deletion
    fired, skipped = [], []
    if d.method == "auto":
        from unlearning.policy import select_methods

        sel = select_methods(d.rules, facts)
        first, fired, skipped = list(sel.candidates), list(sel.fired), list(sel.skipped)
    else:
        first = [d.method]
        fired = [("explicit", f"deletion.method = {d.method!r}")]
    ordered = list(dict.fromkeys([*first, *d.fallback]))
    ordered = [m for m in ordered if m != "retrain"] + ["retrain"]
    return {"candidates": ordered, "fired": fired, "skipped": skipped, "facts": facts}
