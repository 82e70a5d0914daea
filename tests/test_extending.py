"""docs/extending.md's examples run end to end as another package would ship them: the modules in a package
of their own, registered through entry points (a .dist-info on the path, as `pip install` leaves it), the
YAML files on Hydra's search path (`pkg://my_package.conf`), trained for a few steps by the real CLI."""

from __future__ import annotations

import json
import sys
import re
from pathlib import Path

from tests.conftest import sparse_run
from tests.test_docs import ROOT, example_files

STEPS = ["trainer.max_steps=4", "trainer.eval_every=2", "trainer.batch_size=8", "trainer.warmup_steps=1",
         "trainer.analysis=false", "model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.ffn_dim=64",
         "trainer.num_threads=1"]
# The example task's own keys, set to a few batches: its 1,000 validation and test examples took most of the run.
SMALL_SPLITS = ["task.num_train=256", "task.num_val=64", "task.num_test=64"]


def install_examples(root: Path) -> dict[str, str]:
    """Write every example of docs/extending.md into `root/my_package` (+ its dist-info); returns
    {registry group: module} of what was installed."""
    package = root / "my_package"
    (package / "conf").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "conf" / "__init__.py").write_text("")
    entry_points: dict[str, list[str]] = {}
    for files in example_files(ROOT / "docs" / "extending.md").values():
        for rel, content in files.items():
            if rel.startswith("conf/"):
                target = package / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content)
                continue
            module = Path(rel).stem
            (package / f"{module}.py").write_text(content)
            kind = rel.split("/")[1]  # sparse_runner/<tasks|attention|training>/...
            group = "sparse_runner.tasks" if kind == "tasks" else "sparse_runner.regularisers" if kind == "training" else (
                "sparse_runner.patterns" if re.search(r"@register_pattern\(", content) else "sparse_runner.normalisers")
            entry_points.setdefault(group, []).append(f"{module} = my_package.{module}")
    info = root / "my_package-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-package\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(f"[{g}]\n" + "\n".join(lines) + "\n\n" for g, lines in entry_points.items()))
    return {g: ", ".join(lines) for g, lines in entry_points.items()}


def test_the_extending_examples_train_as_an_installed_package(tmp_path, cache_dir, monkeypatch):
    installed = install_examples(tmp_path / "site")
    assert set(installed) == {"sparse_runner.tasks", "sparse_runner.patterns", "sparse_runner.normalisers", "sparse_runner.regularisers"}, installed
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}:{ROOT}")
    result = sparse_run(["task=match_ends", "pattern=strided", "normaliser=temp_softmax", "geometry=fixed_head", "regulariser=z_loss",
                         "model.head_size=16", *STEPS, *SMALL_SPLITS, "trainer.log_every=1", "hydra.searchpath=[pkg://my_package.conf]"],
                        cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs" / "runs").iterdir()
    assert run_dir.name.startswith("match_ends_temp_softmax_strided_h2_dp16_z_loss_seed0_")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "completed" and 0.0 <= metrics["metrics"]["test/accuracy"] <= 1.0
    assert metrics["config"]["model"]["regulariser_options"] == {"weight": 1.0e-4}
    logged = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert [line["train/z_loss"] for line in logged if "train/z_loss" in line], "the regulariser's stat reaches the step log"


def test_a_regulariser_is_one_module_in_the_package_and_one_yaml(tmp_path, cache_dir, monkeypatch):
    """docs/extending.md's regulariser as this repository adds one: a module in sparse_runner/training/regularisers/
    (found because the registry imports every module of that package) and conf/regulariser/z_loss.yaml."""
    from sparse_runner.training import regularisers

    files = example_files(ROOT / "docs" / "extending.md")["A regulariser"]
    package = tmp_path / "regularisers"
    package.mkdir()
    (package / "z_loss.py").write_text(files["sparse_runner/training/regularisers/z_loss.py"])
    (tmp_path / "conf" / "regulariser").mkdir(parents=True)
    (tmp_path / "conf" / "regulariser" / "z_loss.yaml").write_text(files["conf/regulariser/z_loss.yaml"])
    # The module is one more file of the package (its search path gains the folder), as a file added there would be.
    # The registry as the package alone fills it (another test of this session may have added a z_loss of its own),
    # then loaded again with the folder on the package's path, as a first import in a new process would.
    items = {name: obj for name, obj in regularisers.REGULARISERS.load().items() if name != "z_loss"}
    monkeypatch.delitem(sys.modules, "sparse_runner.training.regularisers.z_loss", raising=False)
    monkeypatch.setattr(regularisers, "__path__", [*regularisers.__path__, str(package)])
    monkeypatch.setattr(regularisers.REGULARISERS, "_items", items)
    monkeypatch.setattr(regularisers.REGULARISERS, "_loaded", False)
    from sparse_runner.config import validate
    from sparse_runner.run import run
    from tests.conftest import TINY, compose_config

    cfg = validate(compose_config([*TINY, "regulariser=z_loss", "trainer.max_steps=4", "trainer.eval_every=2", "trainer.log_every=1",
                                   f"hydra.searchpath=[file://{tmp_path / 'conf'}]"], cache_dir=cache_dir, tiny=False))
    run(cfg, tmp_path / "run")
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert sum("train/z_loss" in line for line in logged) == 4


def test_an_unknown_component_names_the_installed_ones(tmp_path, cache_dir, monkeypatch):
    install_examples(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}:{ROOT}")
    result = sparse_run(["model.normaliser=temp_softmaxx", "hydra.searchpath=[pkg://my_package.conf]"], cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 2
    assert "temp_softmax" in result.stderr and "alpha_entmax" in result.stderr, result.stderr
