"""A griffe extension for the API reference (mkdocs.yml, mkdocstrings' `extensions`): a bulleted or numbered list
in a docstring renders as a list.

The docstrings are shown as Markdown (docstring_style null), and Markdown starts a list only after a blank line;
the code's docstrings write a list right under the sentence that introduces it ("Each is:\\n- ..."), which
Markdown folds into that paragraph. The extension adds the blank line before such a list (never inside a code
block), so the docstrings stay as they read in the code."""

from __future__ import annotations

import re

import griffe

LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d{1,2}[.)])\s+\S")
FENCE = re.compile(r"^\s*(```|~~~)")


def blank_line_before_lists(text: str) -> str:
    """`text` with an empty line before each list that follows a line of prose."""
    out: list[str] = []
    in_list = in_code = False
    for line in text.split("\n"):
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            item = bool(LIST_ITEM.match(line))
            if item and not in_list and out and out[-1].strip():
                out.append("")
            if item:
                in_list = True
            elif not line.strip():
                in_list = False
        out.append(line)
    return "\n".join(out)


class ListsRender(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = blank_line_before_lists(obj.docstring.value)
