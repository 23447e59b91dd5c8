"""Generate docs/configuration.md: every key of params.yaml, from the pydantic models of unlearning/config.py
(type, allowed values, default, description) and the comments of params.yaml (what the key is for).

    python docs/gen_params.py           # rewrite docs/configuration.md
    python docs/gen_params.py --check   # exit 1 when the page is not what it would generate

`make docs` runs it before building the site; tests/unit/test_docs.py checks that the page lists every key of
the models and no key they lack, so a new key without a regenerated page fails the fast tests."""

from __future__ import annotations

import argparse
import json
import re
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from unlearning.config import Params  # noqa: E402  (the repository root is on the path only now)

PAGE = ROOT / "docs" / "configuration.md"
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")
COMMENT_LINE = re.compile(r"^(?P<indent> *)#\s?(?P<text>.*)$")


def nested_model(annotation) -> type[BaseModel] | None:
    """The config model a field holds (also inside `X | None`), or None for a leaf value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


def type_text(annotation) -> str:
    """`a` | `b` for a Literal, readable names for the rest (list[int], str | None, ...)."""
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(annotation))
    text = getattr(annotation, "__name__", None) if typing.get_origin(annotation) is None else None
    text = text or str(annotation).replace("typing.", "")
    text = re.sub(r"<class '(\w+)'>", r"\1", text).replace("NoneType", "None")
    text = re.sub(r"\b(?:[a-z_]\w*\.)+([A-Z]\w*)", r"\1", text)   # unlearning.policy.selection_policy.Rule -> Rule
    text = re.sub(r"Literal\[([^\]]*)\]", lambda m: " | ".join(m.group(1).replace("'", "").split(", ")), text)
    return f"`{text}`".replace("|", "\\|")


def leaf_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, object, str]]:
    """(dotted key, annotation, description) of every leaf field, in declaration order."""
    out = []
    for name, field in model.model_fields.items():
        if name == "root" and model is Params:
            continue  # the params file's folder, set by the loader: not a key of the file
        key = f"{prefix}{name}"
        sub = nested_model(field.annotation)
        if sub is not None:
            out += leaf_fields(sub, f"{key}.")
        else:
            out.append((key, field.annotation, field.description or ""))
    return out


def yaml_comments(text: str) -> dict[str, str]:
    """Dotted key -> the comment on its line of params.yaml, joined with the comment-only lines right below it
    that are indented deeper than the key (a comment continued on the next lines)."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last_key, last_indent = None, -1
    for line in text.splitlines():
        m = KEY_LINE.match(line)
        if m:
            indent = len(m["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, m["key"]))
            key = ".".join(k for _, k in stack)
            rest = m["rest"]
            hash_at = rest.find(" #") if not rest.lstrip().startswith("#") else rest.find("#")
            comments[key] = rest[hash_at:].lstrip(" #").strip() if hash_at >= 0 else ""
            last_key, last_indent = key, indent
            continue
        c = COMMENT_LINE.match(line)
        if c and last_key is not None and len(c["indent"]) > last_indent:
            before, more = comments[last_key], c["text"].strip()
            joint = ". " if before and more[:1].isupper() and before[-1] not in ".:;,(" else " "
            comments[last_key] = (before + joint + more).strip()
            continue
        last_key = None  # a list item, a blank line or a top comment ends the continuation
    return comments


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def default_at(defaults: dict, key: str):
    for part in key.split("."):
        defaults = defaults[part]
    return defaults


def default_text(value) -> str:
    """The default as JSON (YAML reads it back); a long one (the rule list) is left to params.yaml."""
    text = json.dumps(value)
    if len(text) > 60:
        return f"{len(value)} entries: see `params.yaml`" if isinstance(value, (list, dict)) else "see `params.yaml`"
    return f"`{text}`".replace("|", "\\|")


def render() -> str:
    comments = yaml_comments((ROOT / "params.yaml").read_text())
    lines = ["# Configuration reference", "",
             "<!-- generated by `python docs/gen_params.py` from unlearning/config.py and params.yaml; "
             "edits here are overwritten -->", "",
             "Everything lives in `params.yaml`, validated by `unlearning/config.py` on load: an unknown key or a "
             "bad value stops every command with one line naming the key path, the value and what is allowed. "
             "Every default below equals the value in `params.yaml` (a test holds them equal), so deleting a "
             "key changes nothing. Switch to Fashion-MNIST with `prepare.dataset: fashion_mnist` (Debian "
             "package `dataset-fashion-mnist`; `prepare.targets: super` trains on the five super-classes; "
             "`prepare.max_train` subsamples). Prepared features are stored as a `.npy` file opened "
             "memory-mapped (a 60,000 x 784 store opens in about 0.1 s).", ""]
    defaults = Params().model_dump(mode="json", exclude={"root"})
    section = None
    for key, annotation, description in leaf_fields(Params):
        top = key.split(".")[0]
        if top != section:
            section = top
            lines += ["", f"## {top}", ""]
            if comments.get(top):
                lines += [cell(comments[top]), ""]
            lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        meaning = comments.get(key) or description   # params.yaml's comment first, else the model's description
        lines.append(f"| `{key}` | {type_text(annotation)} | {default_text(default_at(defaults, key))} | "
                     f"{cell(meaning)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not up to date")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run `python docs/gen_params.py`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(ROOT)} ({page.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
