"""The package's layers: no module imports from a layer above its own (function-level imports included),
so each layer can be read, tested and replaced from the bottom up. README.md's layout section draws them."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sparse_runner"

# Lowest first. A module belongs to the longest prefix listed; it may import its own layer and those below.
LAYERS: list[tuple[str, ...]] = [
    ("sparse_runner", "sparse_runner.checks", "sparse_runner.io", "sparse_runner.registry", "sparse_runner.run_metrics",
     "sparse_runner.identity", "sparse_runner.cpp_build"),          # torch-free basics, the run record, naming
    ("sparse_runner.attention",),                                   # normaliser × pattern × geometry
    ("sparse_runner.data", "sparse_runner.tokenization", "sparse_runner.metrics"),   # sources, pieces, scores
    ("sparse_runner.models", "sparse_runner.analysis"),             # networks built from attention; statistics
    ("sparse_runner.decoding", "sparse_runner.checkpoint", "sparse_runner.pretrained"),   # checkpoints, fine-tuning
    ("sparse_runner.tasks",),                                       # task families: data -> batches -> losses, metrics
    ("sparse_runner.training",),                                    # the loop, regularisers, DDP
    ("sparse_runner.config",),                                      # the typed schema and validation
    ("sparse_runner.run", "sparse_runner.cluster"),
    ("sparse_runner.cli",),
]
# Beside the stack: the report reads metrics.json and must not import torch, so only the basics and the
# analysis' torch-free bins and figures.
REPORTING = "sparse_runner.reporting"
REPORTING_MAY_IMPORT = ("sparse_runner.analysis.bins", "sparse_runner.analysis.figures")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int | None:
    best, found = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    return found


def is_module(name: str) -> bool:
    """Whether `name` is a module or a subpackage of the package (not a name defined in one)."""
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("sparse_runner"):
            # `from sparse_runner import checkpoint` imports the submodule, not the package's layer
            found |= {f"{node.module}.{a.name}" if layer(f"{node.module}.{a.name}") is not None and
                      is_module(f"{node.module}.{a.name}") else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("sparse_runner")}
    return found


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The sets of modules that import each other, directly or through others (TYPE_CHECKING imports
    included): the strongly connected components of `graph` (module -> the modules it imports) with more
    than one module, each sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in graph.get(module, ()):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(circles)


def private_imports(path: Path, module: str) -> list[str]:
    """The private names (`_name`) that the module at `path` imports from a module outside its own package."""
    package = module.rpartition(".")[0] if path.name != "__init__.py" else module
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("sparse_runner"):
            outside = node.module != package and not node.module.startswith(package + ".")
            found += [f"{module} -> {node.module}.{a.name}" for a in node.names if outside and a.name.startswith("_")]
    return found


def test_every_module_has_a_layer():
    modules = [module_name(p) for p in PACKAGE.rglob("*.py")]
    assert [m for m in modules if layer(m) is None and not m.startswith(REPORTING)] == []


def test_no_module_imports_from_a_layer_above_its_own():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        for target in sorted(imports(path)):
            if module.startswith(REPORTING):
                if not (target.startswith(REPORTING) or layer(target) == 0 or target.startswith(REPORTING_MAY_IMPORT)):
                    upward.append(f"{module} -> {target} (the report is torch-free: basics only)")
            elif target.startswith(REPORTING) or layer(target) > layer(module):
                upward.append(f"{module} (layer {layer(module)}) -> {target} (layer {layer(target)})")
    assert upward == []


def test_the_check_finds_an_upward_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from sparse_runner.run import run\n")
    assert layer("sparse_runner.data.corpora") < layer(next(iter(imports(source))))


def test_no_layer_takes_a_module_out_of_a_package_in_another_layer():
    """A layer names whole packages: a module listed apart from its package's layer would be an exception."""
    prefixes = [(prefix, index) for index, names in enumerate(LAYERS) for prefix in names if prefix != "sparse_runner"]
    carved = [f"{inner} (layer {i}) inside {outer} (layer {o})" for inner, i in prefixes for outer, o in prefixes
              if inner.startswith(outer + ".") and i != o]
    assert carved == []


def test_no_module_imports_a_private_name_from_another_package():
    """What two packages share is public: a `_name` is its own package's business."""
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in private_imports(path, module_name(path))]
    assert found == []


def test_the_check_finds_a_private_import(tmp_path):
    source = tmp_path / "cache.py"
    source.write_text("def f():\n    from sparse_runner.attention.kernels import _helper\n")
    assert private_imports(source, "sparse_runner.training.cache") == ["sparse_runner.training.cache -> sparse_runner.attention.kernels._helper"]
    assert private_imports(source, "sparse_runner.attention.kernels.cache") == []


def test_no_modules_import_each_other():
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {module: {target for target in imports(path) if target in modules and target != module}
             for module, path in modules.items()}
    assert import_circles(graph) == []


def test_the_check_finds_an_import_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_every_paper_is_a_subpackage():
    """reporting/papers/ holds one subpackage per paper (its tables, published numbers and runs together); the
    claims table, gathered from every paper, is the one module beside them."""
    from sparse_runner.reporting.papers import PAPERS

    papers = PACKAGE / "reporting" / "papers"
    assert sorted(path.stem for path in papers.glob("*.py")) == ["__init__", "all_claims"]
    ours = {name: paper for name, paper in PAPERS.items() if paper.__name__.startswith("sparse_runner.")}
    assert {name for name, paper in ours.items() if not hasattr(paper, "__path__")} == {"claims"}
    assert set(ours) >= {"claims", "lra", "correia2019", "bhojanapalli2020", "ernie_sparse"}


def test_every_name_the_papers_define_is_read_somewhere():
    """No dead code in the report's papers: each top-level function, class and constant is read by the package,
    the tests or the scripts (a paper's CITATION, CLAIMS, tables and sections are read through the registry)."""
    read_through_registry = {"CITATION", "CLAIMS", "tables", "sections"}
    # Every word of every source, counted once: `\bNAME\b` matches exactly the maximal runs of word characters
    # that equal NAME, so its count there is what a regex search for each name through every file would find.
    words = Counter(word for folder in ("sparse_runner", "tests", "scripts") for path in (PACKAGE.parent / folder).rglob("*.py")
                    for word in re.findall(r"\w+", path.read_text(encoding="utf-8")))
    unread = []
    for path in sorted((PACKAGE / "reporting" / "papers").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [target.id for target in targets if isinstance(target, ast.Name)]
            else:
                continue
            for name in set(names) - read_through_registry:
                if words[name] < 2:   # its definition alone
                    unread.append(f"{module_name(path)}.{name}")
    assert unread == []
