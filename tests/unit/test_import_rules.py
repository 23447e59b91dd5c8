"""The pure core never imports orchestration or tracking; exactly one module imports mlflow."""

import ast
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
    offenders = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & (FORBIDDEN_IN_CORE | {"flows", "tasks"}))
                 for p in (ROOT / "unlearning").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_exactly_one_module_imports_mlflow():
    users = [str(p.relative_to(ROOT)) for d in ("unlearning", "tasks", "flows", "bench")
             for p in (ROOT / d).rglob("*.py") if "mlflow" in imported_roots(p)]
    assert users == ["tasks/tracking.py"]


def test_only_tasks_and_flows_import_prefect():
    users = {str(p.relative_to(ROOT)).split("/")[0] for d in ("unlearning", "tasks", "flows", "bench")
             for p in (ROOT / d).rglob("*.py") if imported_roots(p) & {"prefect", "prefect_dask"}}
    assert users <= {"tasks", "flows"}
