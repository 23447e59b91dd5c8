"""The docs site and the README: `mkdocs build --strict` passes (a broken link, a missing page or a missing anchor
fails it), every page of the nav is built, the README's links reach existing pages, and the configuration
reference lists every key of params.yaml's models, no more."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs"))

import gen_params  # noqa: E402  (docs/gen_params.py: the generator of the configuration reference)

# The pages a newcomer needs; each is in the nav and built.
PAGES = ["index.md", "getting-started.md", "own-data.md", "sharding.md", "requests.md", "certificate.md", "methods.md",
         "erasure.md", "operations.md", "review.md", "troubleshooting.md", "configuration.md", "evidence.md",
         "methods-equivalence.md", "design.md", "gpu.md"]
# The API reference of the core (mkdocstrings): one page per area, each rendering the modules it names.
API_PAGES = {"api/index.md": [], "api/plan.md": ["unlearning.planning.plan", "unlearning.planning.costs"],
             "api/acceptance.md": ["unlearning.certificate.acceptance", "unlearning.certificate.equivalence"],
             "api/sequential.md": ["unlearning.sequential"],
             "api/gate.md": ["unlearning.certificate.gate", "unlearning.policy.selection_policy", "unlearning.policy.selection"],
             "api/leverage.md": ["unlearning.leverage.diagnostics"], "api/partition.md": ["unlearning.batch.partition"],
             "api/methods.md": ["unlearning.methods.registry"], "api/metrics.md": ["unlearning.metrics.klom", "unlearning.metrics.epsilon"],
             "api/models.md": ["unlearning.models.ensemble"], "api/data.md": ["unlearning.data.store"],
             "api/erasure.md": ["unlearning.privacy.ledger", "unlearning.privacy.erasure"], "api/requests.md": ["unlearning.requests"],
             "api/ensembles.md": ["unlearning.ensembles"], "api/config.md": ["unlearning.config"],
             "api/qualification.md": ["unlearning.certificate.qualification"], "api/sharding.md": ["unlearning.sharding"],
             "api/licensing.md": ["unlearning.licensing.memorization", "unlearning.licensing.decision"],
             "api/batch.md": ["unlearning.batch.rows", "unlearning.policy.history"], "api/serving.md": ["unlearning.serving"],
             "api/studies.md": ["unlearning.studies.digits"], "api/support.md": ["unlearning.io"],
             "api/stores.md": ["tasks.stores", "tasks.stores.base", "tasks.stores.dvc"]}
PAGES += list(API_PAGES)


def nav_pages() -> list[str]:
    def pages(entries) -> list[str]:
        out = []
        for entry in entries:
            for value in (entry.values() if isinstance(entry, dict) else [entry]):
                out += pages(value) if isinstance(value, list) else [value]
        return out

    return pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def test_the_nav_holds_every_page_and_each_exists():
    assert sorted(nav_pages()) == sorted(PAGES)
    missing = [p for p in PAGES if not (ROOT / "docs" / p).is_file()]
    assert not missing, f"pages in the nav but not in docs/: {missing}"


def test_mkdocs_build_strict_builds_every_page(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    for page in PAGES:
        built = tmp_path / "site" / (f"{page[:-len('index.md')]}index.html" if page.endswith("index.md")
                                     else f"{page[:-3]}/index.html")
        assert built.is_file(), f"{page} was not built"
    for page, modules in API_PAGES.items():  # mkdocstrings rendered each module (its heading's anchor)
        html = (tmp_path / "site" / page.replace(".md", "/index.html").replace("index/index.html", "index.html")
                ).read_text()
        assert all(f'id="{m}"' in html for m in modules), page
    # A docstring's list renders as a list (docs/griffe_lists.py), not folded into the sentence above it.
    plan = (tmp_path / "site" / "api" / "plan" / "index.html").read_text()
    assert re.search(r"How a candidate is certified:</p>\s*<ul>", plan)


def documented_modules() -> set[str]:
    return {m for page in (ROOT / "docs" / "api").glob("*.md")
            for m in re.findall(r"^::: ([\w.]+)", page.read_text(), flags=re.MULTILINE)}


def test_every_core_module_and_store_has_an_api_page():
    """Every module of the core (unlearning/) and of the erasure's stores (tasks/stores/) is rendered by a page of
    docs/api/ (a package's __init__ and a private module excepted)."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts) for d in ("unlearning", "tasks/stores")
               for p in (ROOT / d).rglob("*.py") if p.name != "__init__.py" and not p.name.startswith("_")}
    missing = sorted(modules - documented_modules())
    assert not missing, f"modules without an API page (add `::: module` to a page of docs/api/): {missing}"


def test_a_list_under_its_sentence_gets_its_blank_line():
    from griffe_lists import blank_line_before_lists

    assert blank_line_before_lists("Each is:\n- a\n- b\n  more of b\nAfter.") == \
        "Each is:\n\n- a\n- b\n  more of b\nAfter."
    assert blank_line_before_lists("Steps:\n1. one\n2. two") == "Steps:\n\n1. one\n2. two"
    unchanged = ["Prose.\n\n- a", "a - b is not a list", "```\nx = 1\n- 2\n```", "See §4.5 and\n4.6 here"]
    assert [blank_line_before_lists(t) for t in unchanged] == unchanged


def test_the_readme_is_short_and_its_links_reach_pages():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert "docs/getting-started.md" in local and "docs/design.md" in local
    assert not [link for link in local if "shared/" in link]
    broken = [link for link in local if not (ROOT / link).exists()]
    assert not broken, f"README links to missing files: {broken}"
    # the one results table is generated between these markers (bench/batch_cost.py)
    assert text.index("<!-- bench:batch_cost:begin -->") < text.index("<!-- bench:batch_cost:end -->")


def test_the_configuration_reference_lists_every_key_and_no_other():
    page = (ROOT / "docs" / "configuration.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", page, flags=re.M))
    keys = {key for key, _, _ in gen_params.leaf_fields(gen_params.Params)}
    missing, stale = sorted(keys - listed), sorted(listed - keys)
    assert not missing and not stale, (f"docs/configuration.md is out of date (missing {missing}, stale {stale}): "
                                       f"run `python docs/gen_params.py`")


def test_every_params_yaml_key_is_a_documented_leaf_or_section():
    """A key written in params.yaml is either a documented leaf or a section above documented leaves."""
    keys = {key for key, _, _ in gen_params.leaf_fields(gen_params.Params)}
    in_yaml = set(gen_params.yaml_comments((ROOT / "params.yaml").read_text()))
    undocumented = sorted(k for k in in_yaml
                          if k not in keys and not any(leaf.startswith(k + ".") for leaf in keys)
                          and not any(k.startswith(leaf + ".") for leaf in keys))   # inside a dict-valued leaf
    assert not undocumented


@pytest.mark.parametrize("marker", ["<!-- report:begin", "<!-- report:end -->"])
def test_the_evidence_page_holds_the_generated_section(marker):
    from unlearning.config import load_params

    params = load_params(ROOT / "params.yaml")
    assert params.report.readme == "docs/evidence.md"
    assert marker in (ROOT / params.report.readme).read_text()
