"""Every config composes; every bad input ends in one line, exit status 2, nothing written."""

from __future__ import annotations

import pytest

from sparse_runner.cli import preflight
from sparse_runner.config import ConfigError, group_options, validate
from tests.conftest import TINY, compose_config, sparse_run


@pytest.mark.parametrize("group", ["model", "task", "trainer"])
def test_every_group_option_composes_and_validates(group, cache_dir):
    options = group_options(group)
    assert options, f"conf/{group} is empty"
    for option in options:
        if option in LOCAL_FILES_TASKS and group == "task":
            with pytest.raises(ConfigError, match=r"^task\.data_dir: ") as info:
                validate(compose_config([f"{group}={option}"], tiny=False))
            assert "\n" not in str(info.value)
            continue
        validate(compose_config([f"{group}={option}"], tiny=False))


# Tasks that read files the user downloads: without task.data_dir they stop with one line.
LOCAL_FILES_TASKS = ("kftt_ja_en", "translation_files", "lm_files", "lra_retrieval")


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_experiment_composes_and_validates(experiment, tmp_path):
    extra = [f"task.data_dir={tmp_path}"] if experiment in ("correia2019_kftt_ja_en", "lra_retrieval") else []
    for name in ("train", "eval", "test"):  # LRA's AAN files (experiment=lra_retrieval checks they exist)
        (tmp_path / f"new_aan_pairs.{name}.tsv").write_text("1\ta\tb\tx\ty\n")
    cfg = validate(compose_config([f"experiment={experiment}", *extra], tiny=False))
    assert cfg.trainer.max_steps > 0


def test_experiment_states_only_deltas():
    base = compose_config([], tiny=False)
    exp = compose_config(["experiment=lra_listops"], tiny=False)
    assert exp.model.d_model == 512 and exp.task.max_length == 2000
    assert exp.model.normaliser == base.model.normaliser  # untouched keys come from the groups


def test_head_size_null_means_d_model_over_heads(tiny_config):
    from sparse_runner.attention import AttentionSpec, MultiHeadAttention

    cfg = tiny_config("model.d_model=48", "model.num_heads=3")
    assert cfg.model.head_size is None
    layer = MultiHeadAttention(48, AttentionSpec(num_heads=3, head_size=cfg.model.head_size))
    assert layer.head_size == 16
    free = MultiHeadAttention(48, AttentionSpec(num_heads=3, head_size=64))  # free head size: projections widen to 3 * 64
    assert free.q_proj.out_features == 192


BAD_OVERRIDES = {
    "model=nope": ("model=nope", "valid: bigbird, bigbird_sar, entmax, entmax15, ernie_sparse, fixed_head, fixed_head_128, hst, local, softmax, sparsemax, standard_heads"),
    "task=nope": ("task=nope", "valid: arxiv_classification, bible_es_en, hotpotqa", "listops, listops_lra"),
    "experiment=nope": ("experiment=nope", "valid: bhojanapalli2020_lm1b", "correia2019_iwslt17_de_en", "lra_listops", "mt_cpu"),
    "model.foo=1": ("model.foo", "valid keys:"),
    "+model.foo=1": ("model.foo", "valid keys:"),
    "trainer.max_steps=-5": ("trainer.max_steps", "> 0"),
    "trainer.max_steps=abc": ("trainer.max_steps", "not a valid int"),
    "model.head_size=0": ("model.head_size", "> 0"),
    "model.num_heads=3": ("model.num_heads", "does not divide"),
    "model.normaliser=sparsemaxx": ("model.normaliser", "valid: alpha_entmax, entmax15, softmax, sparsemax"),
    "model.normaliser_options.alpha=1.3": ("model.normaliser_options.alpha", "++model.normaliser_options.alpha=VALUE"),
    "++model.normaliser_options.alpha=1.3": ("model.normaliser_options.alpha", "normaliser 'softmax' takes no options"),
    "model.pattern=diagonal": ("model.pattern", "valid: bigbird, causal, dense, hst, local"),
    "trainer.schedule=exp": ("trainer.schedule", "valid: constant, linear, inverse_sqrt, cosine"),
    "trainer.precision=fp8": ("trainer.precision", "valid: fp32, bf16, fp16"),
    "trainer.compile=fast": ("trainer.compile", "valid: false, true, default, reduce-overhead, max-autotune"),
    "trainer.device=tpu": ("trainer.device", "valid: auto, cpu, cuda"),
    "trainer.monitor=val/f1": ("trainer.monitor", "valid:"),
    "task.data_dir=/does/not/exist": ("task.data_dir", "not a directory"),
    "model.dropout=1.5": ("model.dropout", "[0, 1)"),
    "model.pattern_options.block_size=4": ("model.pattern_options.block_size", "+model.pattern_options.block_size=VALUE"),
    "+model.pattern_options.block_size=4": ("model.pattern_options.block_size", "pattern 'dense' takes no options"),
    "model.decoder_layers=2": ("model.decoder_layers", "task family 'listops' does not use this key"),
    "regulariser=dropout": ("regulariser=dropout", "valid: none, rdrop, sar"),
    "model.regulariser=dropout": ("model.regulariser", "valid: none, rdrop, sar"),
    "regulariser=sar": ("model.regulariser", "SAR shifts block boundaries", "pattern 'dense' has none"),
    "+model.regulariser_options.weight=1": ("model.regulariser_options.weight", "regulariser 'none' takes no options"),
    "model.regulariser=rdrop": ("model.regulariser_options", "regulariser 'rdrop' needs task_loss, weight", "regulariser=rdrop"),
    "model.num_heads=2,4": ("is a sweep", "-m"),
    "trainer.max_steps=[": ("trainer.max_steps", ""),
}


def test_a_sweep_over_presets_needs_plus_plus_for_a_key_only_some_presets_have():
    # Hydra composes a multirun's base config with the swept group at its default (model=softmax, no
    # block_size): the plain override would pass every job's check and then fail inside Hydra.
    with pytest.raises(ConfigError, match=r"model.pattern_options.block_size: a multirun first composes .* write it as \+\+model"):
        preflight(TINY + ["model=local,hst", "model.pattern_options.block_size=8"], multirun=True)
    preflight(TINY + ["model=local,hst", "++model.pattern_options.block_size=8"], multirun=True)


# Bad values of an axis's own options, as the registered class checks them.
BAD_OPTIONS = {
    ("normaliser=alpha_entmax", "++model.normaliser_options.alpha=2.5"): ("model.normaliser_options.alpha", "[1, 2]"),
    ("normaliser=alpha_entmax", "++model.normaliser_options.alpha_init=big"): ("model.normaliser_options.alpha_init", "random"),
    ("regulariser=rdrop", "model.regulariser_options.weight=-1"): ("model.regulariser_options.weight", ">= 0"),
    ("regulariser=rdrop", "model.regulariser_options.task_loss=last"): ("model.regulariser_options.task_loss", "valid: both, first"),
    ("model=ernie_sparse", "model.regulariser_options.shift=64"): ("model.regulariser_options.shift", "[0, 64)"),
}


@pytest.mark.parametrize("overrides", list(BAD_OPTIONS))
def test_bad_option_of_an_axis_is_one_clear_line(overrides):
    with pytest.raises(ConfigError) as info:
        preflight(TINY + list(overrides), multirun=False)
    message = str(info.value)
    assert "\n" not in message
    for part in BAD_OPTIONS[overrides]:
        assert part in message, message


# Keys of settings that live elsewhere: one line naming where.
RENAMED = {
    "model.sar.weight=1": "regulariser=sar, with model.regulariser_options.weight",
    "+model.sar.weight=1": "regulariser=sar, with model.regulariser_options.weight",
    "trainer.regulariser=rdrop": "regulariser=NAME (model.regulariser)",
    "trainer.regulariser_weight=0.5": "model.regulariser_options.weight",
    "trainer.rdrop_task_loss=first": "model.regulariser_options.task_loss",
    "model.alpha=1.3": "model.normaliser_options.alpha",
    "model.alpha_init=1.5": "model.normaliser_options.alpha_init",
    "+pretrain.trainer.regulariser=rdrop": "regulariser=NAME (model.regulariser)",
}


@pytest.mark.parametrize("override", list(RENAMED))
def test_a_key_whose_setting_lives_elsewhere_is_refused_naming_the_new_key(override):
    with pytest.raises(ConfigError) as info:
        preflight(TINY + [override], multirun=False)
    key = override.lstrip("+").split("=")[0]
    message = str(info.value)
    assert key.startswith(message.split(":")[0]) and f": not a key; the setting is {RENAMED[override]}" in message, message
    assert "\n" not in message


@pytest.mark.parametrize("override", list(BAD_OVERRIDES))
def test_bad_override_is_one_clear_line(override):
    with pytest.raises(ConfigError) as info:
        preflight(TINY + [override], multirun=False)
    message = str(info.value)
    assert "\n" not in message
    for part in BAD_OVERRIDES[override]:
        assert part in message, message


def test_bad_value_inside_a_sweep_is_caught_before_any_job(tmp_path, cache_dir):
    with pytest.raises(ConfigError, match="model.num_heads"):
        preflight(TINY + ["model.num_heads=2,3"], multirun=True)


def test_missing_official_file_is_named(tmp_path):
    (tmp_path / "basic_train.tsv").write_text("Source\tTarget\n")
    with pytest.raises(ConfigError, match="lacks basic_val.tsv, basic_test.tsv"):
        preflight(TINY + [f"task.data_dir={tmp_path}"], multirun=False)


@pytest.mark.parametrize("override", ["model=nope", "trainer.max_steps=-1", "model.foo=1"])
def test_cli_exits_2_with_one_line_and_writes_nothing(override, tmp_path, cache_dir):
    result = sparse_run(TINY + [override], cwd=tmp_path, cache_dir=cache_dir)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("sparse-run: error: "), result.stderr
    assert "Traceback" not in result.stderr
    assert not result.stdout.strip(), result.stdout  # the terminal shows that line alone
    if override == "trainer.max_steps=-1":
        assert lines == ["sparse-run: error: trainer.max_steps: must be > 0, got -1"]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "overrides, normaliser, encoder_pattern, head_size",
    [
        (["model=entmax", "model.pattern=causal"], "alpha_entmax", "causal", 16),
        (["model=sparsemax", "model.num_heads=4", "model.head_size=16"], "sparsemax", "dense", 16),
        (["experiment=mt_cpu", "model=entmax15", "model.pattern=causal"], "entmax15", "causal", 64),
    ],
)
def test_attention_axes_compose_over_any_model_preset(overrides, normaliser, encoder_pattern, head_size, cache_dir):
    """Every attention layer the model builds takes the overridden axes (translation: the encoder's
    self-attention takes model.pattern, the decoder stays causal and context attention dense)."""
    import torch

    from sparse_runner.attention import attention_layers
    from sparse_runner.models import build_classifier, build_seq2seq

    cfg = validate(compose_config(overrides, cache_dir=cache_dir, tiny=not overrides[0].startswith("experiment")))
    torch.manual_seed(0)
    if cfg.task.family == "translation":
        model = build_seq2seq(cfg.model, vocab_size=50, max_positions=64, pad_id=0)
    else:
        model = build_classifier(cfg.model, vocab_size=16, num_classes=10, max_length=40, pad_id=0)
    expected = {"encoder_self": encoder_pattern, "decoder_self": "causal", "context": "dense"}
    layers = attention_layers(model)
    assert layers
    for layer in layers:
        assert layer.normaliser.name == normaliser and layer.head_size == head_size
        assert layer.pattern.name == expected[layer.key[0]], layer.key
