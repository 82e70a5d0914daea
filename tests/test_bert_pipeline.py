"""Pre-training and fine-tuning through the real runner: BERT masking, a masked-LM run, SQuAD and MNLI
fine-tuned from it (`model.init_from` and the `pretrain` stage), one-line refusals of a bad init_from,
exact resume of a fine-tuning run, the loaders of both tasks on files in the official layouts, the
experiments' sweeps, and our parameter counts against the paper's."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from sparse_runner import example_scores
from sparse_runner.checks import ConfigError
from sparse_runner.config import validate
from sparse_runner.pretrained import load_encoder, resolve
from sparse_runner.run import DirectoryInUse, directory_lock, pretrain_dir, run
from sparse_runner.tasks import build_task
from sparse_runner.tasks.bert_text import CLS_ID, SEP_ID
from sparse_runner.tasks.masked_lm import mask_tokens
from sparse_runner.tasks.squad import SquadTask
from tests.conftest import compose_config, on_train_batch, simulated_crash, sparse_run
from tests.test_faults import _hold_lock, one_error_line
from tests.test_language_modeling import sentences, write_corpus

MODEL = ["model=fixed_head", "model.d_model=32", "model.num_heads=2", "model.head_size=16", "model.ffn_dim=64", "model.num_layers=2",
         "model.positions=learned"]
TRAINER = ["trainer.batch_size=16", "trainer.max_steps=8", "trainer.eval_every=4", "trainer.warmup_steps=2", "trainer.log_every=2",
           "trainer.progress=false", "trainer.num_threads=1", "trainer.lr=3e-3", "trainer.analysis=false"]
MLM = ["task=mlm_sotu", "task.source=files", "task.vocab_size=60", "task.max_length=32", "task.max_positions=64"]


def config(cache_dir, *overrides):
    return validate(compose_config([*MODEL, *TRAINER, *overrides], cache_dir=cache_dir, tiny=False))


# ---------------------------------------------------------------------------------------- data files
def write_squad(directory: Path, seed: int = 0) -> Path:
    """train-v1.1.json / dev-v1.1.json in the official layout: each question asks for the object of one
    sentence of the paragraph, which is its answer (dev questions get two gold answers)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name, articles in (("train-v1.1.json", 30), ("dev-v1.1.json", 4)):
        data = []
        for a in range(articles):
            paragraphs = []
            for p in range(2):
                lines = sentences(rng, 4)
                context = " ".join(lines)
                qas = []
                for q, line in enumerate(lines[:2]):
                    obj = line.split(" ", 3)[-1].rstrip(".") if line.count(" ") >= 3 else line
                    start = context.index(line) + line.index(obj)
                    answers = [{"text": obj, "answer_start": start}]
                    if name.startswith("dev"):
                        answers.append({"text": obj.split()[-1], "answer_start": start + obj.rindex(obj.split()[-1])})
                    qas.append({"id": f"{name[:3]}-{a}-{p}-{q}", "question": f"what does {line.split(' ', 2)[1]} {line.split()[2]}?", "answers": answers})
                paragraphs.append({"context": context, "qas": qas})
            data.append({"title": f"article {a}", "paragraphs": paragraphs})
        (directory / name).write_text(json.dumps({"version": "1.1", "data": data}))
    return directory


def write_mnli(directory: Path, seed: int = 0) -> Path:
    """multinli_1.0_{train,dev_matched,dev_mismatched}.jsonl: entailment = the same sentence, contradiction =
    another subject, neutral = another object (a learnable toy), genres as in MNLI; one '-' row."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", 240), ("dev_matched", 30), ("dev_mismatched", 30)):
        rows = []
        for i in range(n):
            s = sentences(rng, 1)[0]
            label = ["entailment", "neutral", "contradiction"][i % 3]
            h = {"entailment": s, "neutral": s.rsplit(" ", 2)[0] + " the big tree.", "contradiction": "nobody " + s.split(" ", 2)[-1]}[label]
            rows.append({"gold_label": label, "sentence1": s, "sentence2": h, "genre": "fiction" if name != "dev_mismatched" else "letters",
                         "pairID": str(i), "promptID": str(i)})
        rows.append({"gold_label": "-", "sentence1": "a", "sentence2": "b", "genre": "fiction", "pairID": "x", "promptID": "x"})
        (directory / f"multinli_1.0_{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert_data")
    return {"corpus": write_corpus(root / "corpus"), "squad": write_squad(root / "squad"), "mnli": write_mnli(root / "mnli")}


@pytest.fixture(scope="module")
def pretrained(data, tmp_path_factory, cache_dir) -> Path:
    """A finished tiny masked-LM run."""
    run_dir = tmp_path_factory.mktemp("mlm_run")
    run(config(cache_dir, *MLM, f"task.data_dir={data['corpus']}", "trainer.max_steps=80", "trainer.eval_every=40", "trainer.warmup_steps=10"), run_dir)
    return run_dir


def squad_args(data) -> list[str]:
    return ["task=squad", "task.source=files", f"task.data_dir={data['squad']}", "task.max_length=48", "task.doc_stride=16",
            "task.max_query_length=12", "task.val_size=4", "task.vocab_size=60"]


def mnli_args(data) -> list[str]:
    return ["task=mnli", "task.source=files", f"task.data_dir={data['mnli']}", "task.max_length=40", "task.val_size=30", "task.vocab_size=60"]


# ------------------------------------------------------------------------------------------ masking
def test_bert_masking_proportions_and_rules():
    tokens = torch.randint(4, 100, (400, 64))
    lengths = torch.randint(3, 65, (400,))
    tokens[:, 0] = CLS_ID
    tokens[torch.arange(400), lengths - 1] = SEP_ID
    tokens[torch.arange(64)[None, :] >= lengths[:, None]] = 0
    g = torch.Generator().manual_seed(0)
    inputs, chosen = mask_tokens(tokens, lengths, mask_prob=0.15, replace=(0.8, 0.1), mask_id=100, vocab_size=100, generator=g)
    real = torch.arange(64)[None, :] < lengths[:, None]
    assert not chosen[~real].any() and not chosen[tokens == CLS_ID].any() and not chosen[tokens == SEP_ID].any()
    assert chosen.any(dim=1).all()  # at least one prediction per example
    share = chosen.sum() / (real & (tokens != CLS_ID) & (tokens != SEP_ID)).sum()
    assert 0.14 < share < 0.17
    masked, kept = (inputs[chosen] == 100).float().mean(), (inputs[chosen] == tokens[chosen]).float().mean()
    assert 0.77 < masked < 0.83 and 0.07 < kept < 0.14  # kept: the 10 % left alone, plus random draws of the same id
    assert torch.equal(inputs[~chosen], tokens[~chosen])
    again = mask_tokens(tokens, lengths, mask_prob=0.15, replace=(0.8, 0.1), mask_id=100, vocab_size=100, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again[0], inputs) and torch.equal(again[1], chosen)


# ---------------------------------------------------------------------------------- pre-training run
def test_masked_lm_run_learns_and_leaves_its_tokenizer(pretrained, data, cache_dir):
    m = json.loads((pretrained / "metrics.json").read_text())
    assert m["status"] == "completed" and m["task_family"] == "mlm"
    assert m["metrics"]["test/accuracy"] > m["metrics"]["test/majority_accuracy"]  # a toy grammar: beaten in 80 steps
    assert (pretrained / "outputs" / "tokenizer.model").is_file()
    assert m["task_info"]["tokenizer"]["vocab_size"] == 60
    # Evaluation masks are drawn once: two passes over the validation split see the same batches.
    task = build_task(config(cache_dir, *MLM, f"task.data_dir={data['corpus']}"))
    a, b = (task.make_batch("val", np.arange(5), torch.device("cpu")) for _ in range(2))
    assert torch.equal(a["inputs"], b["inputs"]) and torch.equal(a["chosen"], b["chosen"])
    x = task.examples["train"][0]
    assert x[0] == CLS_ID and x[-1] == SEP_ID and len(x) <= 32


# ------------------------------------------------------------------------------------ fine-tuning
@pytest.mark.parametrize("family", ["squad", "mnli"])
def test_fine_tuning_starts_from_the_pretrained_encoder(family, pretrained, data, cache_dir, tmp_path):
    args = squad_args(data) if family == "squad" else mnli_args(data)
    cfg = config(cache_dir, *args, f"model.init_from={pretrained}")
    task = build_task(cfg)
    assert str(task.tokenizer.path) == str(pretrained / "outputs" / "tokenizer.model")
    model = task.build_model(cfg.model)
    record = load_encoder(model, task.pretrained, {})
    saved = torch.load(pretrained / "checkpoints" / "best.pt", weights_only=True)["model"]
    for name, tensor in model.encoder.state_dict().items():
        expected = saved[f"encoder.{name}"]
        assert torch.equal(tensor, expected[: tensor.shape[0]] if name == "positions" else expected), name
    assert record["run_dir"] == str(pretrained) and record["step"] == torch.load(pretrained / "checkpoints" / "best.pt", weights_only=True)["step"]
    loaded = {"step": record["step"], "sha256": hashlib.sha256((pretrained / "checkpoints" / "best.pt").read_bytes()).hexdigest()}
    assert record["sha256"] == loaded["sha256"]

    run(cfg, tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["status"] == "completed" and m["pretraining"]["run_dir"] == str(pretrained)
    assert {k: m["pretraining"][k] for k in loaded} == loaded  # exactly the checkpoint that was loaded
    assert m["pretraining"]["num_parameters"] == json.loads((pretrained / "metrics.json").read_text())["num_parameters"]
    if family == "squad":
        assert 0 <= m["metrics"]["test/f1"] <= 100 and 0 <= m["metrics"]["test/exact_match"] <= m["metrics"]["test/f1"] + 1e-9
        predictions = json.loads((tmp_path / "outputs" / "predictions.json").read_text())
        assert len(predictions) == m["dataset_sizes"]["test"] == 16
    else:
        assert {"test/accuracy", "test/accuracy_mismatched", "test/majority_accuracy"} <= set(m["metrics"])
        assert m["task_info"]["skipped_without_gold_label"] == 3 and m["task_info"]["test_mismatched"] == 30
    # the per-example record (SQuAD: per question F1; MNLI: right or not, matched examples) gives the metric back
    record = example_scores.read(open(tmp_path / "test_examples.npz", "rb"))
    assert record.metric == m["primary_metric"] and record.value() == pytest.approx(m["metrics"][record.metric], rel=1e-9, abs=1e-9)


def test_fine_tuning_resumes_exactly(pretrained, data, cache_dir, tmp_path, monkeypatch):
    cfg = config(cache_dir, *squad_args(data), f"model.init_from={pretrained}")
    run(cfg, tmp_path / "straight")
    with monkeypatch.context() as patch:
        on_train_batch(patch, SquadTask, 6, simulated_crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run(cfg, tmp_path / "resumed")
    run(cfg, tmp_path / "resumed")
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("straight", "resumed"))
    assert b["status"] == "completed" and a["metrics"] == b["metrics"]
    def losses(d):  # every logged value but the timings
        lines = [json.loads(line) for line in (tmp_path / d / "log.jsonl").read_text().splitlines()]
        return [{k: v for k, v in line.items() if "per_s" not in k and "wait" not in k} for line in lines]

    assert losses("straight") == losses("resumed")


def test_bad_init_from_is_one_line(pretrained, data, cache_dir, tmp_path):
    def refused(value, *more):
        with pytest.raises(ConfigError) as info:
            build_task(config(cache_dir, *mnli_args(data), f"model.init_from={value}", *more))
        assert "\n" not in str(info.value) and str(info.value).startswith("model.init_from")
        return str(info.value)

    assert "no such file" in refused(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert "not a finished run" in refused(tmp_path / "empty")
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert "neither a run directory nor a .pt" in refused(tmp_path / "weights.bin")
    # A checkpoint that would run code when unpickled is never executed (weights_only), only refused.
    evil = tmp_path / "evil_run"
    (evil / "checkpoints").mkdir(parents=True)
    for name in ("config.yaml", "metrics.json"):
        (evil / name).write_bytes((pretrained / name).read_bytes())
    (evil / "outputs").mkdir()
    (evil / "outputs" / "tokenizer.model").write_bytes((pretrained / "outputs" / "tokenizer.model").read_bytes())

    class Exploit:
        def __reduce__(self):
            return (print, ("exploited",))

    (evil / "checkpoints" / "best.pt").write_bytes(pickle.dumps({"model": Exploit()}))
    cfg = config(cache_dir, *mnli_args(data), f"model.init_from={evil}")
    task = build_task(cfg)
    with pytest.raises(ConfigError, match=r"^model.init_from: cannot read .*best.pt") as info:
        load_encoder(task.build_model(cfg.model), task.pretrained, {})
    assert "\n" not in str(info.value)
    # An encoder of another geometry names the keys that differ.
    cfg = config(cache_dir, *mnli_args(data), f"model.init_from={pretrained}", "model.head_size=8")
    task = build_task(cfg)
    from sparse_runner.run import fingerprint

    with pytest.raises(ConfigError, match=r"model.head_size=16 there, 8 here") as info:
        load_encoder(task.build_model(cfg.model), task.pretrained, fingerprint(cfg))
    assert "\n" not in str(info.value)


def test_bad_init_from_on_the_command_line_writes_nothing(pretrained, data, cache_dir, tmp_path):
    out = tmp_path / "out"
    result = sparse_run([*MODEL, *TRAINER, *mnli_args(data), "model.d_model=64", f"model.init_from={pretrained}", f"paths.output_dir={out}"],
                        cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 2, result.stderr[-2000:]
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("sparse-run: error: model.init_from:") and "model.d_model=32 there, 64 here" in message
    assert not list(out.rglob("metrics.json")) and not list(out.rglob("*.pt"))


def test_init_from_a_run_that_is_running_now_is_refused_in_one_line(pretrained, data, cache_dir, tmp_path):
    """A source being re-run may be rewriting its checkpoints and tokenizer: its lock (held by another
    process, as a running sparse-run holds it) is respected, for the directory and a .pt inside it."""
    holder = _hold_lock(pretrained)
    in_use = f"model.init_from: {pretrained} is in use by a running sparse-run (pid {holder.pid})"
    try:
        out = tmp_path / pretrained.name
        result = sparse_run([*MODEL, *TRAINER, *mnli_args(data), f"model.init_from={pretrained}", f"paths.output_dir={out}"],
                            cwd=tmp_path, cache_dir=cache_dir)
        assert result.returncode == 2, result.stderr[-2000:]
        line = one_error_line(result)
        assert line.startswith(f"sparse-run: error: {in_use}"), line
        assert not list(out.rglob("metrics.json")) and not list(out.rglob("*.pt"))
        # A .pt inside it: the same refusal (the command line prints it as above), from the task that reads the source.
        with pytest.raises(ConfigError) as info:
            build_task(config(cache_dir, *mnli_args(data), f"model.init_from={pretrained / 'checkpoints' / 'best.pt'}"))
        assert str(info.value).startswith(in_use) and "\n" not in str(info.value), str(info.value)
    finally:
        holder.kill()
        holder.wait()
    # While a fine-tuning run reads the source (from its task to its encoder), a re-run of the source waits its turn.
    cfg = config(cache_dir, *mnli_args(data), f"model.init_from={pretrained}")
    task = build_task(cfg)
    with pytest.raises(DirectoryInUse, match="is being read by a sparse-run that starts from it"):
        with directory_lock(pretrained):
            pass
    load_encoder(task.build_model(cfg.model), task.pretrained, {})
    with directory_lock(pretrained):  # read: free again
        pass


def test_init_from_is_refused_by_tasks_without_an_encoder_to_start(pretrained, cache_dir):
    with pytest.raises(ConfigError, match=r"^model.init_from: task family 'listops' does not use this key"):
        validate(compose_config([f"model.init_from={pretrained}"], cache_dir=cache_dir))


# ------------------------------------------------------------------------------ the pretrain stage
def test_pretrain_stage_runs_once_and_fine_tuning_starts_from_it(data, cache_dir, tmp_path):
    out = tmp_path / "out"
    stage = ["pretrain=mlm_cpu", *[f"pretrain.{a}" for a in MLM[1:]], f"pretrain.task.data_dir={data['corpus']}",
             *[f"pretrain.{a}" for a in TRAINER], f"paths.output_dir={out}"]
    cfg = config(cache_dir, *mnli_args(data), *stage)
    started = time.perf_counter()
    run(cfg, tmp_path / "mnli")
    call_s = time.perf_counter() - started
    directory = pretrain_dir(cfg)
    assert directory.parent == out / "pretrain" and json.loads((directory / "metrics.json").read_text())["status"] == "completed"
    m = json.loads((tmp_path / "mnli" / "metrics.json").read_text())
    assert m["status"] == "completed" and m["pretraining"]["run_dir"] == str(directory)
    assert m["config"]["pretrain"]["task"]["family"] == "mlm"
    # The stage's time is its own, recorded in `pretraining`: the fine-tuning run's time starts after it. So is
    # the code it ran (the report counts its commits among the fine-tuning run's).
    stage_metrics = json.loads((directory / "metrics.json").read_text())
    stage_keys = ("wall_time_s", "cpu_time_s", "device", "git_commit", "provenance")
    assert {k: m["pretraining"][k] for k in stage_keys} == {k: stage_metrics[k] for k in stage_keys}
    assert stage_metrics["provenance"] and stage_metrics["provenance"][0]["from_step"] == 0
    assert 0 < m["wall_time_s"] <= call_s - stage_metrics["wall_time_s"]
    stamp = (directory / "checkpoints" / "best.pt").stat().st_mtime_ns
    run(config(cache_dir, *squad_args(data), *stage), tmp_path / "squad")  # the same model: the same stage, not trained again
    assert (directory / "checkpoints" / "best.pt").stat().st_mtime_ns == stamp
    assert json.loads((tmp_path / "squad" / "metrics.json").read_text())["pretraining"]["run_dir"] == str(directory)
    # Another head size is another pre-training run.
    assert pretrain_dir(config(cache_dir, *mnli_args(data), *stage, "model.head_size=8")) != directory


def test_pretrain_stage_is_checked_before_anything_runs(data, cache_dir):
    with pytest.raises(ConfigError, match=r"^pretrain.trainer.lr: must be > 0"):
        config(cache_dir, *mnli_args(data), "pretrain=mlm_cpu", "pretrain.trainer.lr=-1")
    with pytest.raises(ConfigError, match=r"^model.init_from: is set .* and so is a pretrain stage"):
        config(cache_dir, *mnli_args(data), "pretrain=mlm_cpu", "model.init_from=/tmp")
    with pytest.raises(ConfigError, match=r"^pretrain.task.family: 'mnli' is not a pre-training task"):
        config(cache_dir, *mnli_args(data), "pretrain=mlm_cpu", "pretrain.task.family=mnli")


def test_table_experiments_sweep_both_fine_tuning_tasks():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sparse_runner.cli import _config_sweeps, job_override_lists
    from sparse_runner.config import CONF_DIR

    overrides = ["experiment=bhojanapalli2020_table2b_cpu", "model.head_size=32,64,128,256"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        extra = _config_sweeps(overrides, compose)
        assert extra == ["finetune=squad_cpu,mnli_cpu"]
        jobs = job_override_lists(overrides + extra, multirun=True)
        assert len(jobs) == 8
        families = {validate(compose(config_name="config", overrides=job)).task.family for job in jobs}
        assert families == {"squad", "mnli"}
        # A command-line value of the swept key wins over the experiment's sweep.
        assert _config_sweeps([*overrides, "finetune=mnli_cpu"], compose) == []
    GlobalHydra.instance().clear()


# ------------------------------------------------------------------------------------ loaders
def test_squad_files_make_windows_that_hold_every_answer(data, cache_dir):
    task = build_task(config(cache_dir, *squad_args(data)))
    assert task.sizes() == {"train": 104, "val": 16, "test": 16}  # 4 held-out articles x 4 questions
    assert task.data_info["source"] == "release"
    for split in ("train", "val"):  # every question's answer lies wholly inside one of its windows
        found = {f.example_index for f in task.features[split] if f.start_position > 0}
        assert found == set(range(len(task.examples[split])))


def test_mnli_files_hold_matched_and_mismatched_test_pairs(data, cache_dir):
    task = build_task(config(cache_dir, *mnli_args(data)))
    assert task.sizes() == {"train": 210, "val": 30, "test": 60}
    test = task.pairs["test"]
    assert test.matched.sum() == 30 and (~test.matched).sum() == 30
    tokens = task.examples["test"][0]
    assert tokens[0] == CLS_ID and tokens[-1] == SEP_ID and list(tokens).count(SEP_ID) == 2


# --------------------------------------------------------------------------------- parameter counts
@pytest.mark.parametrize("overrides", [
    [],
    ["normaliser=alpha_entmax"],
    ["model.positions=sinusoidal", "model.norm_first=false"],
])
def test_bert_parameter_formula_counts_the_masked_lm(data, cache_dir, overrides):
    from sparse_runner.reporting.papers.bhojanapalli2020.bert import bert_parameters

    cfg = config(cache_dir, *MLM, f"task.data_dir={data['corpus']}", *overrides)
    m = cfg.model
    model = build_task(cfg).build_model(m)
    assert sum(p.numel() for p in model.parameters()) == bert_parameters(
        d_model=m.d_model, num_layers=m.num_layers, num_heads=m.num_heads, head_size=m.head_size, ffn_dim=m.ffn_dim, vocab_size=61,
        max_positions=64, learned_positions=m.positions == "learned", norm_first=m.norm_first, learned_alpha=m.normaliser == "alpha_entmax",
    )


@pytest.mark.parametrize("experiment, sweep, published", [
    ("bhojanapalli2020_table1", {"num_heads": 8}, 336e6),
    ("bhojanapalli2020_table1", {"num_heads": 32}, 336e6),
    ("bhojanapalli2020_table2a", {"num_heads": 32}, 319e6),
    ("bhojanapalli2020_table2b", {"head_size": 32}, 130e6),
    ("bhojanapalli2020_table2b", {"head_size": 256}, 218e6),
])
def test_gpu_presets_have_the_published_parameter_counts(experiment, sweep, published):
    """The GPU presets' masked-LM models, built on the meta device (no memory), within 1 % of the paper's counts."""
    from sparse_runner.models.bert import build_masked_lm

    cfg = validate(compose_config([f"experiment={experiment}", *(f"model.{k}={v}" for k, v in sweep.items())], tiny=False))
    with torch.device("meta"):
        model = build_masked_lm(cfg.model, vocab_size=cfg.pretrain.task.vocab_size + 1, max_length=cfg.pretrain.task.max_positions, pad_id=0)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - published) / published < 0.01, count


def test_rdrop_on_span_logits_stays_finite(pretrained, data, cache_dir, tmp_path):
    """R-Drop compares the two passes' start and end distributions over positions; padding must not
    turn the KL into NaN."""
    cfg = config(cache_dir, *squad_args(data), f"model.init_from={pretrained}", "regulariser=rdrop", "trainer.max_steps=4")
    run(cfg, tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines() if "train/loss" in line]
    assert lines and all(np.isfinite(line["train/loss"]) and np.isfinite(line["train/rdrop_kl"]) for line in lines)


def test_resume_ignores_keys_declared_result_neutral_since_the_checkpoint():
    """A run fingerprinted before `pretrain.trainer.num_threads` & co. were declared result-neutral
    still resumes (they were 'auto', None ... then; they are absent now)."""
    from sparse_runner.training.trainer import fingerprint_difference

    saved = {"model.d_model": 128, "pretrain.trainer.device": "auto", "pretrain.trainer.num_threads": None, "trainer.progress": "auto"}
    assert fingerprint_difference(saved, {"model.d_model": 128}) == ""
    assert "model.d_model" in fingerprint_difference(saved, {"model.d_model": 64})
