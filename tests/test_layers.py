"""The package's layers: no module imports from a layer above its own (function-level imports included),
so each layer can be read, tested and replaced from the bottom up. README.md's layout section draws them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sparse_runner"

# Lowest first. A module belongs to the longest prefix listed; it may import its own layer and those below.
LAYERS: list[tuple[str, ...]] = [
    ("sparse_runner", "sparse_runner.checks", "sparse_runner.io", "sparse_runner.registry", "sparse_runner.run_metrics",
     "sparse_runner.identity"),                                     # torch-free basics, the run record, naming
    ("sparse_runner.attention",),                                   # normaliser × pattern × geometry
    ("sparse_runner.data", "sparse_runner.tokenization", "sparse_runner.metrics"),   # sources, pieces, scores
    ("sparse_runner.models", "sparse_runner.analysis"),             # networks built from attention; statistics
    ("sparse_runner.decoding", "sparse_runner.training.checkpoint", "sparse_runner.pretrained"),
    ("sparse_runner.tasks",),                                       # task families: data -> batches -> losses, metrics
    ("sparse_runner.training",),                                    # the loop, regularisers, DDP
    ("sparse_runner.config",),                                      # the typed schema and validation
    ("sparse_runner.run", "sparse_runner.benchmarking", "sparse_runner.cluster"),
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


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("sparse_runner"):
            # `from sparse_runner.training import checkpoint` imports the submodule, not the package's layer
            found |= {f"{node.module}.{a.name}" if layer(f"{node.module}.{a.name}") is not None and
                      (PACKAGE.parent / f"{node.module}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
                      else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("sparse_runner")}
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
