"""The architecture, enforced: which package may import which, and modules kept small.

han/           the model library (PyTorch + spaCy)          imports nothing of ours
model_store/   the BentoML model store                      han
monitoring/    the way back: log, feedback, monitor, shadow han, model_store
registry/      han-model, beside the model store            han, model_store, monitoring
training/      han-train (Lightning)                        han, model_store
service/       the BentoML service                          han, model_store, monitoring
scoring/       han-score                                    han, model_store
labeling/      han-label, a CLI over the others             han, model_store, monitoring, registry, scoring, training
tests/, benchmarks/  never the serving entry points (service.run, service.service)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

OURS = {"han", "model_store", "monitoring", "registry", "training", "service", "scoring", "labeling", "tests",
        "benchmarks"}
ALLOWED = {
    "han": set(),
    "model_store": {"han"},
    "monitoring": {"han", "model_store"},
    "registry": {"han", "model_store", "monitoring"},
    "training": {"han", "model_store"},
    "service": {"han", "model_store", "monitoring"},
    "scoring": {"han", "model_store"},
    "labeling": {"han", "model_store", "monitoring", "registry", "scoring", "training"},
}
# han-model (registry/cli.py) runs a comparison with training.compare, imported inside the one function
# that compares, so that `han-model status` and the rest never load training.
LAZY_EXCEPTIONS = {"registry/cli.py": {"training.compare", "training.compare.compare",
                                       "training.compare.format_comparison"}}
FORBIDDEN_THIRD_PARTY = {"han": {"pytorch_lightning", "lightning", "bentoml", "_bentoml_sdk", "_bentoml_impl"}}
ENTRY_POINTS = {"service.run", "service.service"}  # tests and benchmarks start these as processes


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of the file (function-level imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def python_files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_it_may(package: str) -> None:
    assert python_files(package), f"{package}/ has no modules"
    wrong = []
    for path in python_files(package):
        for name in imports(path) - LAZY_EXCEPTIONS.get(str(path.relative_to(REPO)), set()):
            top = name.split(".")[0]
            if (top in OURS and top != package and top not in ALLOWED[package]) or (
                top in FORBIDDEN_THIRD_PARTY.get(package, set())
            ):
                wrong.append(f"{path.relative_to(REPO)} imports {name}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("folder", ["tests", "benchmarks"])
def test_tests_and_benchmarks_take_no_helpers_from_the_serving_entry_points(folder: str) -> None:
    wrong = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in python_files(folder)
        for name in imports(path)
        if any(name == entry or name.startswith(entry + ".") for entry in ENTRY_POINTS)
    ]
    assert not wrong, "\n".join(wrong)


def test_modules_stay_small() -> None:
    big = [
        f"{path.relative_to(REPO)}: {n} lines"
        for package in ALLOWED
        for path in python_files(package)
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 400
    ]
    assert not big, "\n".join(big)


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The parser catches imports inside functions too, where a careless one would hide."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from service.run import wait_ready\n    import bentoml\n")
    assert {"service.run", "service.run.wait_ready", "bentoml"} <= imports(module)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_circles() -> None:
    """No module of ours reaches itself through imports (function-level ones too): each package reads
    from its foundations up."""
    files = {_module_name(path): path for package in ALLOWED for path in python_files(package)}

    def resolve(name: str) -> str | None:  # "scoring.formats.Chunk" -> "scoring.formats"
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {module: {m for name in imports(path) if (m := resolve(name)) and m != module}
             for module, path in files.items()}
    circles, done = [], set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            circles.append(" -> ".join([*trail[trail.index(module):], module]))
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*trail, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert not circles, "\n".join(circles)


def test_han_loads_its_public_names_on_first_use() -> None:
    """``han.environment`` and ``han.methods`` import without torch and spaCy, and every name of ``han.__all__``
    (read from han/__init__.py's one list) resolves."""
    code = ("import sys, han.environment, han.methods; heavy = sorted({'torch', 'spacy'} & set(sys.modules)); "
            "import han; print(heavy, bool(han.__all__) and all(getattr(han, n) for n in han.__all__))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "True"], out


def test_bentoml_internals_are_reached_only_by_the_one_guarded_module() -> None:
    """service/deadline.py patches BentoML's response timeout (checked against its version); nothing else
    of ours imports ``bentoml._internal``."""
    reaching = [str(path.relative_to(REPO)) for package in (*ALLOWED, "tests", "benchmarks")
                for path in python_files(package) if any(m.startswith("bentoml._internal") for m in imports(path))]
    assert reaching == ["service/deadline.py"]


def test_the_explanation_methods_are_named_once() -> None:
    """han.methods lists them; the attributions implement exactly those (attention is the model's own) and
    the web page offers exactly those."""
    import re

    from han.attribution import _METHODS
    from han.methods import DEFAULT_METHOD, METHODS

    assert {DEFAULT_METHOD, *_METHODS} == set(METHODS)
    page = (REPO / "service" / "static" / "index.html").read_text(encoding="utf-8")
    assert tuple(re.findall(r'<option value="(\w+)"', page)) == METHODS
