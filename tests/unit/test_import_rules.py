"""The layers (docs/design.md, "Layout"): the pure core unlearning/ <- adapters/ (MLflow, DVC, Great Expectations,
plots, the clock) <- tasks/ (the Prefect stages and their work) <- flows/ (flows, CLI). Each imports only the layers
below it; the core imports no orchestration or tracking; one adapter imports mlflow (and the champion's loader);
only tasks/ and flows/ import Prefect; no import cycles among the project's modules, imports inside functions
included; bench/ imports no test code; deploy/ imports the standard library and the one shared pid check."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_CORE = {"prefect", "prefect_dask", "mlflow", "dvc", "great_expectations", "matplotlib", "scipy"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_imports_no_orchestration_or_tracking():
    offenders = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & (FORBIDDEN_IN_CORE | set(LAYERS[1:])))
                 for p in (ROOT / "unlearning").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_exactly_one_module_imports_mlflow():
    """The tracking adapter; besides it only the champion's loader, which runs inside MLflow's own serving (it
    travels in the model's code/ folder and turns the core's bad-input errors into MlflowException)."""
    users = sorted(str(p.relative_to(ROOT)) for d in (*LAYERS, "bench")
                   for p in (ROOT / d).rglob("*.py") if "mlflow" in imported_roots(p))
    assert users == ["adapters/champion_loader.py", "adapters/tracking.py"]
    assert imported_roots(ROOT / "adapters" / "champion_loader.py") <= {"__future__", "mlflow", "unlearning"}


def test_only_tasks_and_flows_import_prefect():
    users = {str(p.relative_to(ROOT)).split("/")[0] for d in (*LAYERS, "bench")
             for p in (ROOT / d).rglob("*.py") if imported_roots(p) & {"prefect", "prefect_dask"}}
    assert users <= {"tasks", "flows"}


def test_each_layer_imports_only_the_layers_below_it():
    """core <- adapters <- tasks <- flows, one way (imports inside functions count too): an adapter never
    imports a stage or a flow, a stage never imports a flow."""
    offenders = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & set(LAYERS[i + 1:]))
                 for i, layer in enumerate(LAYERS) for p in (ROOT / layer).rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_adapters_hold_no_prefect_and_tasks_no_tracking_client():
    """Where each kind of code lives: Prefect in tasks/ and flows/ only; mlflow, dvc's API and great_expectations
    in adapters/ only (tasks/ reach them through the adapters)."""
    for p in (ROOT / "adapters").rglob("*.py"):
        assert not imported_roots(p) & {"prefect", "prefect_dask"}, p
    for d in ("tasks", "flows"):
        for p in (ROOT / d).rglob("*.py"):
            assert not imported_roots(p) & {"mlflow", "dvc", "great_expectations", "matplotlib"}, p


# --- no import cycles among the project's modules ----------------------------------------------------------------
LAYERS = ("unlearning", "adapters", "tasks", "flows")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for d in LAYERS for p in (ROOT / d).rglob("*.py")}


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, at module level or inside a function: `import a.b`, `from a import b`
    (b a module or a name in a), relative imports resolved against the package. A name resolves to the most
    specific module that exists (`from unlearning.data.registry import DataError` -> unlearning.data.registry);
    the parent packages a dotted import also runs are not counted (their __init__ re-exports would make every
    package a cycle with its own modules)."""

    def deepest(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {deepest(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]) if node.level \
                else node.module or ""
            base = base.strip(".")
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else deepest(base) for a in node.names}
    return {m for m in found if m and m != name}


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module are the import cycles."""
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected_components(graph) == [["a", "b", "c"]]
    modules = {"pkg": ROOT / "pkg/__init__.py", "pkg.x": ROOT / "pkg/x.py", "pkg.y": ROOT / "pkg/y.py"}
    source = "def f():\n    from . import y\n    from .y import thing\n    import pkg.x.missing\n"
    assert imported_modules("pkg.x", _FakePath(source), modules) == {"pkg.y"}   # relative, inside a function


class _FakePath:
    """A module's source without a file: what imported_modules reads of a path."""

    name = "x.py"

    def __init__(self, text: str):
        self._text = text

    def read_text(self) -> str:
        return self._text


# Cycles known and not broken yet: each entry is a debt, listed so that no NEW cycle can slip in. Remove an entry
# once the cycle is broken (the test then fails until the entry goes, so the list only shrinks).
KNOWN_CYCLES: list[list[str]] = []


def test_no_import_cycles_counting_imports_inside_functions():
    """An import inside a function only hides a cycle: the modules still depend on each other. Break one by
    moving the piece both need into a module both import (unlearning/models/losses.py, unlearning/data/dataset.py)."""
    cycles = strongly_connected_components(import_graph())
    new = [c for c in cycles if c not in KNOWN_CYCLES]
    assert new == [], f"import cycles (counting imports inside functions): {new}"
    broken = [c for c in KNOWN_CYCLES if c not in cycles]
    assert broken == [], f"no longer a cycle: remove it from KNOWN_CYCLES: {broken}"


# --- the core takes its slice of the params ------------------------------------------------------------------------
# Core functions that take the whole params by design, and why; every other core function the batch path calls
# takes its slice (params.gate, params.validation, ...). unlearning/studies/ are the benches' study drivers (a
# study is a whole configuration), not the batch path; unlearning/config.py defines Params.
WHOLE_PARAMS_BY_DESIGN = {
    # the project's salt lives beside params.yaml: base.paths (salt, state_dir, tombstones) against the project
    # root, and deletion.hash_sample_ids
    ("unlearning/privacy/salt.py", "project_salt"), ("unlearning/privacy/salt.py", "id_salt"),
}


def whole_params_functions(path: Path) -> list[str]:
    """Functions of `path` with an argument annotated `Params`, or named `params` without an annotation."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        for a in args:
            ann = ast.unparse(a.annotation) if a.annotation is not None else None
            if (ann is not None and ann.strip("'\"").split(".")[-1] == "Params") or (a.arg == "params" and ann is None):
                out.append(node.name)
                break
    return out


def test_the_core_takes_slices_of_the_params_not_the_whole():
    found = {(str(p.relative_to(ROOT)), name) for p in (ROOT / "unlearning").rglob("*.py")
             if "studies" not in p.parts and p.name != "config.py" for name in whole_params_functions(p)}
    assert found - WHOLE_PARAMS_BY_DESIGN == set()


# --- the core's folders --------------------------------------------------------------------------------------------
CORE_ROOT_MAX = 12  # modules at unlearning/'s root, __init__.py included: the rest sit in folders named for a decision


def test_the_cores_root_holds_at_most_twelve_modules_and_every_folder_says_what_it_decides():
    """A reader sees the decisions from the folders (docs/design.md, Layout): the root holds at most CORE_ROOT_MAX
    modules, and every subpackage's __init__ docstring says what it decides and what it reads (or what it holds)."""
    core = ROOT / "unlearning"
    root_modules = sorted(p.name for p in core.glob("*.py"))
    assert len(root_modules) <= CORE_ROOT_MAX, f"{len(root_modules)} modules at unlearning/'s root: {root_modules}"
    for init in sorted(core.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 8, f"{init.relative_to(ROOT)}: say in its docstring what the folder decides"


TASKS_ALLOWED = Path(__file__).with_name("whole_params_tasks.txt")  # the allow-list of tasks/: it only shrinks


def allowed_whole_params_tasks() -> set[tuple[str, str]]:
    lines = [ln.split() for ln in TASKS_ALLOWED.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return {(path, name) for path, name in lines}


def test_tasks_take_slices_of_the_params_save_an_allow_list_that_only_shrinks():
    """A stage's signature says what it reads: a tasks/ function takes its slice of the params (params.erasure,
    params.project_paths, ...). The functions that still take the whole are listed in whole_params_tasks.txt; a new
    one fails, and one that no longer does must leave the list (so it only shrinks, as KNOWN_CYCLES does)."""
    found = {(str(p.relative_to(ROOT)), name) for p in (ROOT / "tasks").rglob("*.py")
             for name in whole_params_functions(p)}
    allowed = allowed_whole_params_tasks()
    assert found - allowed == set(), f"take the slice the function reads instead of the whole Params: {sorted(found - allowed)}"
    assert allowed - found == set(), f"they take a slice now: remove them from {TASKS_ALLOWED.name}: {sorted(allowed - found)}"


def test_the_whole_params_finder_finds_one(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def a(params): ...\ndef b(gate: Gate, params: dict): ...\ndef c(p: 'Params'): ...\n"
                   "def d(p: unlearning.config.Params): ...\n")
    assert whole_params_functions(src) == ["a", "c", "d"]


# --- bench/ and deploy/ --------------------------------------------------------------------------------------------
def imported_names(path: Path) -> set[str]:
    """The dotted names `path` imports (absolute imports only): `import a.b` -> a.b, `from a.b import c` -> a.b."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_bench_imports_no_test_code():
    """A bench measures the product: what it shares with the tests lives in bench/ (bench/project_copy.py)."""
    offenders = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench").rglob("*.py") if "tests" in imported_roots(p))
    assert offenders == []


# deploy/ runs under any Python 3 without the project installed (`make team-env` runs it with the system python):
# the standard library, PyYAML inside the commands that read params.yaml, and the one shared pid check. Never
# `flows`: importing that package sets the offline switches in the environment the servers started here inherit.
DEPLOY_MAY_IMPORT = {"yaml", "adapters.pids"}


def test_deploy_imports_the_standard_library_and_the_shared_pid_check_only():
    for p in (ROOT / "deploy").rglob("*.py"):
        outside = {n for n in imported_names(p) if n.split(".")[0] not in sys.stdlib_module_names | {"__future__"}}
        assert outside <= DEPLOY_MAY_IMPORT, p
    assert imported_roots(ROOT / "adapters" / "pids.py") <= sys.stdlib_module_names | {"__future__"}


def test_deploy_loads_without_site_packages_and_without_flows():
    """Run, not read: the team script imports under `python -I -S` (no site-packages, no PYTHONPATH), and what
    it loaded of the project is the pid check alone."""
    probe = ("import sys; sys.path.insert(0, 'deploy'); import team, adapters.pids; "
             "assert team.alive is adapters.pids.pid_alive; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in {'adapters', 'unlearning', 'tasks', 'flows'}))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['adapters',", "'adapters.pids']"]
