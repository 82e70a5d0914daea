"""The documentation cannot drift from the code.

(a) Every command line in a shell block of README.md and docs/*.md that runs the CLI (`sparse-run ...`,
    `torchrun ... -m sparse_runner.cli ...`, `srun ... sparse-run ...`, `bash scripts/demo.sh ...`) goes
    through the CLI's own pre-flight: Hydra's argument parser, then composition and validation of the
    command's jobs. Continuation lines are joined. A `<placeholder>` or `$VAR` in a command stands for a path
    of the reader's; it is replaced by a temporary directory that holds the (empty) files the data checks
    look for, so the command is checked rather than skipped. A command that is meant to be refused says so
    in a comment on its line (`# refused: why`), and must raise ConfigError.
    Example files in the docs (a fenced block right after a line that names its path, `` `conf/x/y.yaml`: ``)
    are written to a temporary tree as shown, their modules imported and their YAML put on Hydra's search
    path, so that the commands of the same `##` section compose with them.
    A command written in several places is composed once. A sweep is composed on a covering subset of its
    jobs (every swept value in at least one job) rather than on the full product, to keep this fast; every
    other pre-flight step (the parser, the experiment's own sweeps, the multirun base config) runs as in
    the CLI.
(b) README.md has at most 250 lines.
(c) No doc points to the engineers' reference files or tells history.
(d) Every relative link points to an existing file.

Fast: configs are composed, nothing is trained.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparse_runner import cli
from sparse_runner.checks import ConfigError
from sparse_runner.cli import _hydra_args, preflight

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
SHELL = {"bash", "sh", "shell", "console", "zsh"}
EXAMPLE_CAPTION = re.compile(r"^\**`((?:sparse_runner|conf)/[\w./-]+\.(?:py|yaml))`\**:?\s*$")
REFUSED = re.compile(r"#\s*refused\b")
# A path of the reader's: `<run dir>`, `$SCRATCH`, `${DATA}`. (`$(...)` is a command substitution, not one.)
PLACEHOLDER = re.compile(r"<[A-Za-z][^<>\n]*>|\$\{\w+\}|\$[A-Za-z_]\w*")
SHELL_OPERATORS = {"&", "&&", "|", "||", ";", ">", ">>", "<"}
READER_DIR = "@READER_DIR@"
# What the data checks of the task families look for in a data directory (empty files satisfy them).
RELEASE_FILES = [
    *(f"basic_{split}.tsv" for split in ("train", "val", "test")),  # LRA ListOps
    *(f"new_aan_pairs.{split}.tsv" for split in ("train", "eval", "test")),  # LRA Retrieval
]


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    lines: tuple[str, ...]
    caption: str | None  # the last non-blank line before the opening fence
    section: str  # the `##` heading the block is under


@dataclass(frozen=True)
class DocCommand:
    doc: Path
    line: int
    text: str  # the logical line, continuations joined, comments kept
    refused: bool
    section: str
    argv: tuple[str, ...]  # what the CLI receives; placeholders are READER_DIR

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def fenced_blocks(doc: Path) -> list[Block]:
    blocks, lines, opened, previous, section = [], doc.read_text(encoding="utf-8").splitlines(), None, None, ""
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if not match:
            if opened is not None:
                opened[3].append(line)
            elif line.strip():
                previous = line.strip()
                if line.startswith("## "):
                    section = line[3:].strip()
            continue
        if opened is None:
            opened = (match.group(1), number, match.group(2).lower(), [], previous)
        elif match.group(1).startswith(opened[0][0]) and len(match.group(1)) >= len(opened[0]) and not match.group(2):
            blocks.append(Block(doc, opened[1], opened[2], tuple(opened[3]), opened[4], section))
            opened, previous = None, None
        else:
            opened[3].append(line)
    assert opened is None, f"{doc.name}:{opened[1]}: fenced block never closed"
    return blocks


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """(line number, text) with backslash continuations joined."""
    out, pending, start = [], "", None
    for offset, line in enumerate(block.lines, 1):
        number = block.line + offset
        if start is None:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending, start = "", None
    if pending:
        out.append((start, pending))
    return out


def runner_argv(tokens: list[str]) -> list[str] | None:
    """The arguments the CLI receives, or None when the line does not run it."""
    for i, token in enumerate(tokens):
        if token in SHELL_OPERATORS or re.match(r"^\d?>", token):
            tokens = tokens[:i]
            break
    for i, token in enumerate(tokens):
        if token == "sparse-run" or token.endswith("/sparse-run") or token.endswith("scripts/demo.sh"):
            return tokens[i + 1 :]
        if token == "-m" and tokens[i + 1 : i + 2] == ["sparse_runner.cli"]:
            return tokens[i + 2 :]
    return None


def doc_commands() -> list[DocCommand]:
    found = []
    for doc in DOCS:
        for block in fenced_blocks(doc):
            if block.lang not in SHELL:
                continue
            for number, text in logical_lines(block):
                argv = runner_argv(shlex.split(PLACEHOLDER.sub(READER_DIR, text), comments=True))
                if argv is not None:
                    found.append(DocCommand(doc, number, text, bool(REFUSED.search(text)), block.section, tuple(argv)))
    return found


def example_files(doc: Path) -> dict[str, dict[str, str]]:
    """section -> {path in the repository: content}, for the example files a doc shows."""
    files: dict[str, dict[str, str]] = {}
    for block in fenced_blocks(doc):
        match = EXAMPLE_CAPTION.match(block.caption or "")
        if match:
            section = files.setdefault(block.section, {})
            assert match.group(1) not in section, f"{doc.name}:{block.line}: {match.group(1)} shown twice"
            section[match.group(1)] = "\n".join(block.lines) + "\n"
    return files


COMMANDS = doc_commands()


def _distinct(commands: list[DocCommand]) -> list[list[DocCommand]]:
    """Commands grouped by what the check does with them (the same argv, expectation and examples)."""
    groups: dict[tuple, list[DocCommand]] = {}
    for c in commands:
        examples = (c.doc, c.section) if c.section in example_files(c.doc) else None
        groups.setdefault((c.argv, c.refused, examples), []).append(c)
    return list(groups.values())


DISTINCT = _distinct(COMMANDS)


@pytest.fixture(scope="module")
def reader_dir(tmp_path_factory) -> Path:
    """What a placeholder stands for: a directory with the files the data checks look for."""
    path = tmp_path_factory.mktemp("reader_data")
    for name in RELEASE_FILES:
        (path / name).write_text("")
    return path


BUILT_IN: dict[str, set[str]] = {}  # registered names before the examples are installed


def _registries() -> dict[str, object]:
    from sparse_runner.attention import normalisers, patterns
    from sparse_runner.tasks import registry

    return {"tasks": registry.TASK_FAMILIES, "patterns": patterns.PATTERNS, "normalisers": normalisers.NORMALISERS}


def _names(registry) -> set[str]:
    return set(registry.keys()) if isinstance(registry, dict) else set(registry.names())


def _forget(registry, name: str) -> None:
    getattr(registry, "_items", registry).pop(name, None)


@dataclass
class Installed:
    overrides: list[str]  # what the section's commands need (its YAML on Hydra's search path)
    error: str | None = None  # why its modules did not import


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """Install the example files of every doc section that shows some (modules imported, YAML on a search
    path); yields (doc, section) -> Installed. Everything registered is unregistered afterwards."""
    root = tmp_path_factory.mktemp("doc_examples")
    before = {kind: _names(registry) for kind, registry in _registries().items()}
    BUILT_IN.update(before)
    modules, installed = [], {}
    try:
        for doc in DOCS:
            for number, (section, files) in enumerate(example_files(doc).items()):
                base = root / f"{doc.stem}_{number}"
                error = None
                for rel, content in files.items():
                    target = base / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(content, encoding="utf-8")
                    if rel.startswith("conf/") or error:
                        continue
                    name = rel[: -len(".py")].replace("/", ".")
                    spec = importlib.util.spec_from_file_location(name, target)
                    module = importlib.util.module_from_spec(spec)
                    sys.modules[name] = module
                    modules.append(name)
                    try:
                        spec.loader.exec_module(module)
                    except Exception as exc:  # reported by the commands of this section
                        error = f"{rel}: {type(exc).__name__}: {exc}"
                conf = base / "conf"
                installed[(doc, section)] = Installed([f"hydra.searchpath=[file://{conf}]"] if conf.is_dir() else [], error)
        yield installed
    finally:
        for kind, registry in _registries().items():
            for name in _names(registry) - before[kind]:
                _forget(registry, name)
        for name in modules:
            sys.modules.pop(name, None)


def _overrides(command: DocCommand, reader_dir: Path) -> tuple[list[str], bool]:
    args = _hydra_args([arg.replace(READER_DIR, str(reader_dir)) for arg in command.argv])
    assert not (args.config_path or args.config_name or args.config_dir), f"{command.id}: another config"
    return list(args.overrides), bool(args.multirun)


@pytest.fixture
def covering_sweeps(monkeypatch):
    """preflight composes a covering subset of a sweep's jobs: job i takes the i-th value of every swept
    key (cycling), so every value is composed and validated once."""
    full = cli.job_override_lists

    def covering(overrides: list[str], multirun: bool) -> list[list[str]]:
        jobs = full(overrides, multirun)  # the CLI's own expansion, with its errors
        values = [list(dict.fromkeys(column)) for column in zip(*jobs)]
        width = max((len(v) for v in values), default=1)
        return [[v[i % len(v)] for v in values] for i in range(width)] if jobs and jobs[0] else jobs

    monkeypatch.setattr(cli, "job_override_lists", covering)


@pytest.mark.parametrize("commands", DISTINCT, ids=[g[0].id + (f"+{len(g) - 1}" if len(g) > 1 else "") for g in DISTINCT])
def test_doc_command_composes(commands: list[DocCommand], reader_dir, covering_sweeps, request):
    command = commands[0]
    where = ", ".join(c.id for c in commands)
    overrides, multirun = _overrides(command, reader_dir)
    if command.section in example_files(command.doc):
        installed = request.getfixturevalue("examples")[(command.doc, command.section)]
        if installed.error:
            pytest.fail(f"{where}: the example files of section {command.section!r} do not import: {installed.error}")
        overrides = installed.overrides + overrides
    if command.refused:
        with pytest.raises(ConfigError):
            preflight(overrides, multirun, check_resources=False)
    else:
        try:
            preflight(overrides, multirun, check_resources=False)
        except ConfigError as exc:
            pytest.fail(f"{where}: {command.text.strip()}\n  -> {exc}")


def test_example_components_keep_the_contracts(examples):
    """The example normaliser and pattern do what the docs promise: masked scores get zero weight, a fully
    masked row zeros, and gradients stay finite."""
    import torch

    from sparse_runner.attention.normalisers import build_normaliser
    from sparse_runner.attention.patterns import build_pattern

    errors = [i.error for i in examples.values() if i.error]
    assert not errors, errors
    added = {kind: _names(registry) - BUILT_IN[kind] for kind, registry in _registries().items()}
    assert BUILT_IN, "the examples fixture records the built-in names first"
    assert added["normalisers"] and added["patterns"], added
    scores = torch.randn(2, 3, 4, 5)
    scores[:, :, 0, 2:] = float("-inf")
    scores[:, :, 1, :] = float("-inf")
    for name in added["normalisers"]:
        normaliser = build_normaliser(name, 3)
        x = scores.clone().requires_grad_(True)
        weights = normaliser(x)
        assert torch.all(weights[:, :, 0, 2:] == 0) and torch.all(weights[:, :, 1] == 0), name
        assert torch.allclose(weights[:, :, [0, 2, 3]].sum(-1), torch.ones(2, 3, 3)), name
        (weights * torch.randn_like(weights)).sum().backward()
        grads = [x.grad, *(p.grad for p in normaliser.parameters())]
        assert all(g is None or torch.isfinite(g).all() for g in grads), name
    q, k, v = (torch.randn(2, 2, 20, 8, requires_grad=True) for _ in range(3))
    for name in added["patterns"]:
        out, _, _ = build_pattern(name, global_tokens=1).attend(q, k, v, normaliser=build_normaliser("softmax", 2))
        out.sum().backward()
        assert out.shape == q.shape and torch.isfinite(q.grad).all(), name


def test_covering_sweeps_compose_every_value(covering_sweeps):
    jobs = cli.job_override_lists(["seed=0,1,2", "normaliser=softmax,sparsemax,entmax15,alpha_entmax", "model.d_model=64"], True)
    assert len(jobs) == 4
    assert {j[0] for j in jobs} == {"seed=0", "seed=1", "seed=2"} and len({j[1] for j in jobs}) == 4
    assert all(j[2] == "model.d_model=64" for j in jobs)


def test_the_docs_hold_the_commands_they_should():
    per_doc = {doc.name: sum(c.doc == doc for c in COMMANDS) for doc in DOCS}
    assert per_doc["README.md"] >= 20, per_doc
    assert sum(c.refused for c in COMMANDS) >= 1
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for line in ("bash scripts/demo.sh", "bash scripts/test.sh"):
        assert re.search(rf"^{re.escape(line)}(\s|$)", readme, re.M), line


def test_every_fenced_block_names_its_language():
    # A block without a language could hide a command from the check above.
    unnamed = [f"{b.doc.name}:{b.line}" for doc in DOCS for b in fenced_blocks(doc) if not b.lang]
    assert not unnamed, f"fenced blocks without a language (```bash, ```text ...): {unnamed}"


def test_a_broken_command_is_caught(reader_dir):
    text = "sparse-run normaliser=no_such_normaliser"
    bad = DocCommand(ROOT / "README.md", 0, text, False, "", tuple(runner_argv(shlex.split(text))))
    with pytest.raises(ConfigError):
        preflight(*_overrides(bad, reader_dir), check_resources=False)


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"


FORBIDDEN = {
    "the engineers' reference files": re.compile(r"PAPERS\.md|PERF_BASELINE|DATA\.md|\bshared/"),
}

# Text that tells how the project was rather than what it is. ("used to" meaning "in order to" is written
# "to" or "for", so that the phrase is never ambiguous.)
HISTORY = re.compile(
    r"\bused to\b|\bissues? #?\d+|\b(this|that|next|earlier|previous) (session|issue)s?\b|\bsessions? ago\b"
    r"|\bno longer\b|\bany ?more\b|\bolder\b|\bformerly\b|\bpreviously\b|\b(used|did|as|than) before\b"
    r"|\bbefore (this|that|the) (round|change|cache|fix|split|move|rewrite|refactor)\b|\bfrom before\b"
    r"|\bnow (agrees?|match(es)?)\b|\ban earlier run\b|\bexisted\b|\b(was|were) (added|renamed|removed|introduced)\b"
    r"|\bcame in\b|\bwhen this was written\b|\bmeasured since\b"
    r"|\bold (run|runs|scheme|name|names|key|keys|config|configs|file|files|schema|format)\b|<old run dir>",
    re.I,
)
# Where a history word means something else, by the words around it: (phrase, why it is not history).
NOT_HISTORY = (
    ("older paddles", "Pathfinder's generator: paddles drawn earlier in the same image"),
    ('"scripts are no longer supported"', "the error message of the datasets library, matched as it is written"),
)
# What tells the project's story to a reader: the docs, and the code, configs and scripts it ships.
HISTORY_SCANNED = [*DOCS, *sorted(p for folder in ("sparse_runner", "conf", "scripts") for p in (ROOT / folder).rglob("*")
                                  if p.suffix in (".py", ".cpp", ".yaml", ".sh", ".md") and p.is_file())]


def history_words(text: str) -> list[tuple[int, str]]:
    """(line, phrase) for each history word of `text` outside the NOT_HISTORY phrases."""
    allowed = [range(m.start(), m.end()) for phrase, _ in NOT_HISTORY for m in re.finditer(re.escape(phrase), text)]
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in HISTORY.finditer(text)
            if not any(m.start() in span for span in allowed)]


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_no_reference_files(doc: Path):
    text = doc.read_text(encoding="utf-8")
    problems = [
        f"{doc.name}:{text.count(chr(10), 0, m.start()) + 1}: {what}: {m.group(0)!r}"
        for what, pattern in FORBIDDEN.items()
        for m in pattern.finditer(text)
    ]
    assert not problems, "\n".join(problems)


def test_no_history_in_the_docs_code_configs_or_scripts():
    problems = [f"{path.relative_to(ROOT)}:{line}: {phrase!r}"
                for path in HISTORY_SCANNED for line, phrase in history_words(path.read_text(encoding="utf-8"))]
    assert not problems, "history words (say what is, not how it was):\n" + "\n".join(problems)


@pytest.mark.parametrize("text, found", [
    ("A directory named by an older scheme", ["older"]),
    ("the preset used before it took the current config", ["used before"]),
    ("Before the cache the three ratios were 0.35", ["Before the cache"]),
    ("a key that holds its default now agrees: it was added", ["now agrees", "was added"]),
    ("as R-Drop did before; previously downloaded", ["did before", "previously"]),
    ("an earlier run of the same preset", ["an earlier run"]),
    ("the tokens before the threshold; an earlier report is replaced", []),
    ("a snake keeps clear of its own older paddles", []),
])
def test_history_words_are_found_in_their_history_sense_only(text, found):
    assert [phrase for _, phrase in history_words(text)] == found


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_relative_links_exist(doc: Path):
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the same file
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{doc.name}: links to missing files: {broken}"


def test_the_package_configs_and_scripts_point_only_inside_the_repository():
    """What ships (sparse_runner/, conf/, scripts/) never sends a user to files they do not have."""
    outside = re.compile(r"PAPERS\.md|PERF_BASELINE|DATA\.md|\.\./shared|shared/reference")
    shipped = [p for folder in ("sparse_runner", "conf", "scripts") for p in (ROOT / folder).rglob("*")
               if p.suffix in (".py", ".yaml", ".sh", ".md", ".cpp") and p.is_file()]
    assert shipped
    problems = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in shipped for m in outside.finditer(p.read_text(encoding="utf-8"))]
    assert not problems, problems


def _brace_expand(text: str) -> list[str]:
    """`a_{b,c}_d` -> [a_b_d, a_c_d] (one level per group, groups expanded left to right)."""
    match = re.search(r"\{([^{}]*)\}", text)
    if not match:
        return [text]
    return [word for option in match.group(1).split(",")
            for word in _brace_expand(text[:match.start()] + option + text[match.end():])]


def test_readme_lists_every_experiment_preset():
    """README's `experiment=` row names every file of conf/experiment (brace groups and "their `_cpu` versions"
    expanded), and nothing else."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `experiment=` |"))
    cell = row.split("|")[2]
    named: set[str] = set()
    # items are separated by , or ; outside code spans; "X and their `_cpu` versions" is one item
    for item in re.split(r"[,;](?=(?:[^`]*`[^`]*`)*[^`]*$)", cell):
        codes = re.findall(r"`([^`]+)`", item.replace("their `_cpu` versions", ""))
        names = [word for code in codes for word in _brace_expand(code)]
        named |= set(names)
        if "their `_cpu` versions" in item:
            named |= {f"{name}_cpu" for name in names}
    presets = {path.stem for path in (ROOT / "conf" / "experiment").glob("*.yaml")}
    assert presets - named == set(), f"README's experiment row lacks {sorted(presets - named)}"
    assert named - presets == set(), f"README's experiment row names what is no preset: {sorted(named - presets)}"


def test_readme_links_every_doc():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Documentation", 1)[1]
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", section))
    docs = {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")}
    assert docs - linked == set(), f"README's documentation list lacks {sorted(docs - linked)}"


def test_the_guide_names_exactly_the_execution_keys_the_report_ignores():
    from sparse_runner.reporting.presets import EXECUTION_KEYS

    guide = " ".join((ROOT / "docs" / "guide.md").read_text(encoding="utf-8").split())
    listed = re.search(r"how it was executed: ([^)]*)\)", guide)
    assert listed, "docs/guide.md does not list the execution keys"
    assert set(re.findall(r"`([^`]+)`", listed.group(1))) == set(EXECUTION_KEYS)


def test_task_family_is_described_one_way():
    """task.family selects the registered task family, and the report files runs into paper tables by it: the
    schema, the metrics.json schema, the report and the docs say so in one wording, and conf/task/listops.yaml is
    the one task file that comments its family line."""
    wording = re.compile(r"the registered task family.{0,80}?the report\s+(?:#\s*)?files runs into paper tables by it", re.S)
    for path in ("conf/task/listops.yaml", "sparse_runner/tasks/base.py", "sparse_runner/reporting/runs.py",
                 "sparse_runner/run_metrics.py", "docs/tasks.md"):
        assert wording.search(" ".join((ROOT / path).read_text(encoding="utf-8").split())), path
    commented = sorted(path.name for path in (ROOT / "conf" / "task").glob("*.yaml")
                       if re.search(r"^#.*\bfamily\b|^family:.*#", path.read_text(encoding="utf-8"), re.M | re.I))
    assert commented == ["listops.yaml"], commented
