"""Import contract: the layers core -> privacy -> training -> certify -> attacks -> serving -> CLI/API point one way.

A module may import modules of its own layer or of a layer below it, never one above. Every import our code
makes counts, wherever it is written: at module level, inside functions and methods, under ``if TYPE_CHECKING``,
and ``importlib.import_module("literal")`` calls (an ``import_module`` of a computed name cannot be read from
the source; only the CLI does that, and the CLI is the top layer). The check reads the source with :mod:`ast`; it
imports nothing.

There are no exceptions: the test fails on any import against the order, and
:func:`test_a_planted_back_import_is_caught` shows it does on each way of writing one.
"""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("transdenoiser", "training", "certify", "serving")

# The layers, lowest first. A module may import its own layer and the layers before it in this tuple.
LAYERS = ("core", "privacy", "training", "certify", "attacks", "serving", "cli")

# Module (path from the repository root) -> layer; the first matching pattern wins. docs/DESIGN.md ("Layers")
# shows the same table.
LAYER_OF = (
    # CLI/API: the command line, the Python API and the demo; every cli.py and *_cli.py
    ("transdenoiser/cli.py", "cli"),
    ("transdenoiser/__main__.py", "cli"),
    ("transdenoiser/api.py", "cli"),
    ("transdenoiser/demo.py", "cli"),
    ("transdenoiser/__init__.py", "cli"),  # the package's face: transdenoiser.Smooth etc. are the API
    ("*/cli.py", "cli"),
    ("*_cli.py", "cli"),
    # core: errors, runtime, lock, TOML, progress, argument types and checks; checkpoints, models, denoisers, data
    ("transdenoiser/*", "core"),
    ("training/checkpoint.py", "core"),
    ("training/models.py", "core"),
    ("training/model_registry.py", "core"),
    ("training/classifiers.py", "core"),
    ("training/denoisers.py", "core"),
    ("training/datasets.py", "core"),
    ("training/linear_probe.py", "core"),
    # privacy: DP-SGD's clipping and noise, privacy accounting and reports, the audit's analysis (no training loop)
    ("training/privacy/*", "privacy"),
    # training: the training arms and their loop, baselines, convex heads, the privacy audit's run
    ("training/*", "training"),
    # certify: randomized smoothing, certification runs and reports; attacks: the adversarial attacks on top
    ("certify/attacks/*", "attacks"),
    ("certify/*", "certify"),
    # serving: the BentoML service, its bundle, limits and validation
    ("serving/*", "serving"),
)

def layer_of(module: str) -> str:
    for pattern, layer in LAYER_OF:
        if fnmatch.fnmatchcase(module, pattern):
            return layer
    raise KeyError(f"{module} is in no layer: add it to LAYER_OF in tests/test_import_layers.py")


def module_path(root: Path, dotted: str) -> str | None:
    """The file (relative to ``root``) that ``import dotted`` loads, or None if it is not one of ours."""
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(root).as_posix()
    return None


def imported_names(tree: ast.AST, root: Path) -> set[str]:
    """Every dotted module name of ours that ``tree`` imports, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from a import b` imports a.b when b is a module, else a
                submodule = f"{node.module}.{alias.name}"
                names.add(submodule if module_path(root, submodule) else node.module)
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return {name for name in names if name.split(".")[0] in PACKAGES}


def import_edges(root: Path) -> set[tuple[str, str]]:
    """(importing module, imported module) for every import between our modules under ``root``."""
    edges = set()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = path.relative_to(root).as_posix()
            for name in imported_names(ast.parse(path.read_text(), filename=str(path)), root):
                target = module_path(root, name)
                assert target is not None, f"{module} imports {name}, which is no module of ours"
                if target != module:
                    edges.add((module, target))
    return edges


def violations(root: Path) -> set[tuple[str, str]]:
    """The imports that point from a layer to a layer above it."""
    return {(module, target) for module, target in import_edges(root)
            if LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(module))}


def _describe(pairs: set[tuple[str, str]]) -> str:
    return "\n".join(f"  {m} ({layer_of(m)}) imports {t} ({layer_of(t)})" for m, t in sorted(pairs))


def test_every_module_is_in_a_layer():
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            assert layer_of(path.relative_to(ROOT).as_posix()) in LAYERS


def test_no_back_import():
    found = violations(ROOT)
    assert not found, ("imports against the layer order core -> training -> certify -> attacks -> serving -> CLI/API "
                     f"(move the code down, or pass the dependency in):\n{_describe(found)}")


@pytest.mark.parametrize("source", [
    "from serving.service import app\n",  # module level
    "def f():\n    import serving.service\n",  # inside a function
    "class C:\n    def m(self):\n        from serving import service\n",  # inside a method, `from package import`
    "import importlib\n\ndef f():\n    return importlib.import_module('serving.service')\n",
])
def test_a_planted_back_import_is_caught(tmp_path, source):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "serving" / "service.py").write_text("app = None\n")
    (tmp_path / "training" / "checkpoint.py").write_text(source)
    assert violations(tmp_path) == {("training/checkpoint.py", "serving/service.py")}


def import_cycles(root: Path) -> list[list[str]]:
    """The groups of our modules that import each other in a ring (strongly connected components of more than
    one module, Tarjan's algorithm), imports inside functions included."""
    graph: dict[str, set[str]] = {}
    for module, target in import_edges(root):
        graph.setdefault(module, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycle():
    found = import_cycles(ROOT)
    assert not found, "modules that import each other in a ring (imports inside functions count):\n" + "\n".join(
        "  " + ", ".join(group) for group in found)


def test_a_planted_cycle_is_caught(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "training" / "a.py").write_text("import training.b\n")
    (tmp_path / "training" / "b.py").write_text("def f():\n    from training import a\n")
    assert import_cycles(tmp_path) == [["training/a.py", "training/b.py"]]
