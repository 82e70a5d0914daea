"""Which attention backend `model.attention_impl=auto` picks, per device, and why: on CUDA the Triton kernel for
every threshold-form normaliser at every length (padding, causality and attention dropout included); a
pattern mask, a head size above the kernel's, float64 or a machine without triton keep the torch paths; on
CPU the crossover rule decides, as it states. memory_efficient forced on CUDA is refused where
the kernel serves. Runs log the backend of each layer type and write it, with the reason, to metrics.json.

No GPU here: the selection is a pure function of (device type, normaliser, keys, dropout, masks, triton
available), tested with a `torch.device("cuda")` that only its `.type` is read from."""

from __future__ import annotations

import itertools
import json
import logging
import re
from types import SimpleNamespace

import pytest
import torch

import sparse_runner.attention.memory_efficient as me
from sparse_runner.attention import AttentionSpec, MultiHeadAttention
from sparse_runner.attention.spec import check_attention_impl_device
from sparse_runner.checks import ConfigError
from sparse_runner.run import run
from tests.test_combinations import plain  # noqa: F401  (fixture: registers the "window" pattern)

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


# The kernel module is imported inside the fixtures, not here: tests/test_triton_attention.py must be the
# first to import triton in a session (it sets TRITON_INTERPRET=1 before).
@pytest.fixture
def triton_on(monkeypatch):
    monkeypatch.setattr(me.gpu_backend("triton"), "available", lambda: True)


@pytest.fixture
def triton_off(monkeypatch):
    monkeypatch.setattr(me.gpu_backend("triton"), "available", lambda: False)
    monkeypatch.setattr(me, "_told_triton_missing", False)


def choose(device=CUDA, n_keys=128, *, impl="auto", memory_efficient_from="auto", dropout_p=0.0, has_mask=False, **facts):
    return me.explain_impl(impl, memory_efficient_from, n_keys, device, dropout_p=dropout_p, has_mask=has_mask, **facts)


@pytest.mark.parametrize("n_keys", [128, 4096, 65536])
def test_cuda_sends_every_threshold_form_normaliser_to_the_kernel_at_every_length(triton_on, n_keys):
    assert choose(n_keys=n_keys, n_scores=32 * 8 * n_keys * n_keys) == ("triton", "triton: CUDA, threshold-form normaliser, no mask")
    for memory_efficient_from in (64, 10**6):  # a number sets the CPU crossover; on CUDA the kernel serves both sides
        assert choose(n_keys=n_keys, memory_efficient_from=memory_efficient_from)[0] == "triton"


def test_cuda_kernel_takes_padding_causality_and_attention_dropout(triton_on):
    assert choose(dropout_p=0.1) == ("triton", "triton: CUDA, threshold-form normaliser, no mask, attention dropout")
    assert choose(key_padding=True) == ("triton", "triton: CUDA, threshold-form normaliser, padding mask")
    assert choose(causal=True, dropout_p=0.1) == ("triton", "triton: CUDA, threshold-form normaliser, causal mask, attention dropout")
    assert choose(key_padding=True, causal=True, element_size=2, head_dim=128)[1] == "triton: CUDA, threshold-form normaliser, padding and causal mask"


def test_cuda_analysis_takes_its_weights_from_the_explicit_path_where_it_fits(triton_on, monkeypatch):
    """The weights are the analysis' own: the explicit path has them at once; beyond the crossover the kernel
    computes the output (and the weights come block by block, as on CPU)."""
    monkeypatch.setattr(me, "device_memory_bytes", lambda device: 80 * 2**30)
    assert choose(need_weights=True, n_scores=8 * 128 * 128) == ("explicit", "explicit: CUDA, weights for the analysis, 128 keys")
    assert choose(need_weights=True, n_keys=8192)[0] == "triton"
    assert choose(need_weights=True, n_scores=2**40)[0] == "triton"  # explicit scores would not fit


def test_cuda_keeps_the_torch_paths_where_the_kernel_cannot_serve(triton_on):
    """A pattern mask, a head size above the kernel's, float64: explicit up to the crossover, memory-efficient beyond, as on CPU."""
    assert choose(has_mask=True) == ("explicit", "explicit: CUDA, a pattern mask, 128 keys <= 4096")
    assert choose(has_mask=True, n_keys=8192, dropout_p=0.1) == ("memory_efficient", "memory_efficient: CUDA, a pattern mask, 8192 keys > 4096")
    assert choose(head_dim=256) == ("explicit", "explicit: CUDA, head size 256 > 128, 128 keys <= 4096")
    assert choose(element_size=8, n_keys=8192)[0] == "memory_efficient"
    assert choose(threshold_form=False, n_keys=65536) == ("explicit", "explicit: a normaliser without a threshold form")


def test_cuda_without_triton_says_so_once_and_keeps_the_torch_paths(triton_off, caplog):
    with caplog.at_level(logging.WARNING, logger=me.__name__):
        assert choose() == ("explicit", "explicit: CUDA, triton not installed, 128 keys <= 4096")
        assert choose(n_keys=5000) == ("memory_efficient", "memory_efficient: CUDA, triton not installed, 5000 keys > 4096")
    warnings = [r for r in caplog.records if "triton is not installed" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()


def test_forced_impls_are_kept_and_named(triton_on):
    assert choose(impl="explicit", n_keys=65536) == ("explicit", "explicit: model.attention_impl=explicit")
    assert choose(impl="memory_efficient", has_mask=True) == ("memory_efficient", "memory_efficient: model.attention_impl=memory_efficient")
    assert choose(impl="triton", dropout_p=0.1) == ("triton", "triton: model.attention_impl=triton")


@pytest.fixture
def cpp_on(monkeypatch):
    monkeypatch.setattr(me.cpu_kernel(), "available", lambda: True)


@pytest.fixture
def cpp_off(monkeypatch):
    monkeypatch.setattr(me.cpu_kernel(), "available", lambda: False)


def _cpu_rule(memory_efficient_from, n_keys, n_scores, threshold_form, fits, kernel_takes) -> str:
    """The CPU choice as the crossover rule states it (memory_efficient.py's comments on EXPLICIT_UP_TO and
    CPP_EXPLICIT_UP_TO): the fused kernel, where it takes the call, beyond its own crossover."""
    up_to = me.CPP_EXPLICIT_UP_TO if kernel_takes else me.EXPLICIT_UP_TO
    if memory_efficient_from == "auto":
        explicit = n_keys <= up_to and (n_scores is None or fits)
    else:
        explicit = n_keys < memory_efficient_from
    return "explicit" if explicit or not threshold_form else ("cpp" if kernel_takes else "memory_efficient")


@pytest.mark.parametrize("built", [True, False])
def test_cpu_choices_follow_the_crossover_rule_whatever_the_dropout_and_masks(monkeypatch, built):
    monkeypatch.setattr(me, "device_memory_bytes", lambda device: 2**33)
    monkeypatch.setattr(me.cpu_kernel(), "available", lambda: built)
    grid = itertools.product(
        ("auto", 100, 4097), (1, 64, 256, 257, 4096, 4097, 65536), (None, 10, 2**40), (True, False), (0.0, 0.1), (False, True), (None, 256), (4, 8)
    )
    for me_from, n_keys, n_scores, threshold_form, dropout_p, has_mask, head_dim, element_size in grid:
        fits = n_scores is None or me.explicit_fits(n_scores, element_size, CPU)
        kernel_takes = built and not has_mask
        impl, reason = choose(CPU, n_keys, memory_efficient_from=me_from, dropout_p=dropout_p, has_mask=has_mask, threshold_form=threshold_form,
                              n_scores=n_scores, element_size=element_size, head_dim=head_dim, key_padding=has_mask, causal=True)
        assert impl == _cpu_rule(me_from, n_keys, n_scores, threshold_form, fits, kernel_takes)
        assert reason.startswith(f"{impl}: ") and "\n" not in reason
        assert me.choose_impl("auto", me_from, n_keys, CPU, dropout_p=dropout_p, has_mask=has_mask, threshold_form=threshold_form,
                              n_scores=n_scores, element_size=element_size) == impl


def test_cpu_kernel_reasons_name_the_rule_that_applied(cpp_on, monkeypatch):
    monkeypatch.setattr(me, "device_memory_bytes", lambda device: 2**33)
    assert choose(CPU, 256) == ("explicit", "explicit: CPU, 256 keys <= 256")
    assert choose(CPU, 512, key_padding=True) == ("cpp", "cpp: CPU, threshold-form normaliser, padding mask, 512 keys > 256")
    assert choose(CPU, 128, n_scores=2**40) == ("cpp", "cpp: CPU, threshold-form normaliser, no mask, 128 keys, the explicit scores exceed 1/8 of its memory")
    assert choose(CPU, 512, dropout_p=0.1, causal=True) == ("cpp", "cpp: CPU, threshold-form normaliser, causal mask, attention dropout, 512 keys > 256")
    assert choose(CPU, 5000, has_mask=True) == ("memory_efficient", "memory_efficient: CPU, a pattern mask, 5000 keys > 4096")
    assert choose(CPU, 512, need_weights=True) == ("explicit", "explicit: CPU, weights for the analysis, 512 keys")
    assert choose(CPU, 5000, need_weights=True)[0] == "cpp"
    assert choose(CPU, 128, impl="cpp") == ("cpp", "cpp: model.attention_impl=cpp")


def test_forced_cpp_is_refused_off_the_cpu_without_the_extension_and_for_what_it_cannot_take(cpp_on, monkeypatch):
    assert choose(CPU, impl="cpp", dropout_p=0.1) == ("cpp", "cpp: model.attention_impl=cpp")
    for kwargs, problem in (
        (dict(device=CUDA), "model.attention_impl=cpp needs a CPU device; use memory_efficient (any device) or auto"),
        (dict(device=CPU, has_mask=True), "model.attention_impl=cpp cannot take a pattern mask; use memory_efficient or auto"),
    ):
        with pytest.raises(RuntimeError) as error:
            choose(impl="cpp", **kwargs)
        assert str(error.value) == problem
    monkeypatch.setattr(me.cpu_kernel(), "available", lambda: False)
    with pytest.raises(RuntimeError, match=r"^model.attention_impl=cpp needs the C\+\+ extension, which could not be built here; use memory_efficient \(any device\) or auto$"):
        choose(CPU, impl="cpp")


def test_cpu_reasons_name_the_rule_that_applied(cpp_off, monkeypatch):
    monkeypatch.setattr(me, "device_memory_bytes", lambda device: 2**33)
    assert choose(CPU, 512) == ("explicit", "explicit: CPU, the C++ extension unavailable, 512 keys <= 4096")
    assert choose(CPU, 4097) == ("memory_efficient", "memory_efficient: CPU, the C++ extension unavailable, 4097 keys > 4096")
    assert choose(CPU, 4096, n_scores=2**40) == ("memory_efficient", "memory_efficient: CPU, the C++ extension unavailable, 4096 keys, the explicit scores exceed 1/8 of its memory")
    assert choose(CPU, 99, memory_efficient_from=100) == ("explicit", "explicit: CPU, the C++ extension unavailable, 99 keys < model.memory_efficient_from=100")
    assert choose(CPU, 100, memory_efficient_from=100) == ("memory_efficient", "memory_efficient: CPU, the C++ extension unavailable, 100 keys >= model.memory_efficient_from=100")


# ------------------------------------------------------------------------------------------------
# memory_efficient forced on CUDA: refused where the kernel serves the layers, in one line
# ------------------------------------------------------------------------------------------------


def model_node(**keys):
    values = dict(attention_impl="memory_efficient", pattern="dense", head_size=None, qkv_dim=None, d_model=64, num_heads=4)
    return SimpleNamespace(**{**values, **keys})


def test_forced_memory_efficient_on_cuda_is_refused_in_one_line_where_the_kernel_serves(triton_on):
    with pytest.raises(ConfigError) as err:
        check_attention_impl_device(model_node(), CUDA)
    message = str(err.value)
    assert message.startswith("model.attention_impl: memory_efficient on CUDA") and "\n" not in message
    assert message.endswith("valid with CUDA: auto, triton, explicit")
    check_attention_impl_device(model_node(), CPU)  # the CPU keeps it
    for impl in ("auto", "explicit", "triton"):
        check_attention_impl_device(model_node(attention_impl=impl), CUDA)


def test_forced_memory_efficient_on_cuda_is_kept_where_the_kernel_cannot_serve(triton_on, plain):
    check_attention_impl_device(model_node(pattern="window"), CUDA)  # a pattern mask
    check_attention_impl_device(model_node(head_size=256), CUDA)
    check_attention_impl_device(model_node(num_heads=1, d_model=192), CUDA)  # d_model / num_heads = 192


def test_forced_memory_efficient_on_cuda_is_kept_without_triton(triton_off):
    check_attention_impl_device(model_node(), CUDA)


@pytest.mark.parametrize("impl", ["triton", "adasplash"])
def test_gpu_kernels_are_still_refused_on_cpu(impl):
    with pytest.raises(ConfigError, match=f"model.attention_impl: {impl} needs a CUDA device, and this run is on cpu; valid here"):
        check_attention_impl_device(model_node(attention_impl=impl), CPU)


# ------------------------------------------------------------------------------------------------
# What the layers record is what ran
# ------------------------------------------------------------------------------------------------


def test_layers_record_the_backend_that_runs_and_log_it_once_per_layer_type(cpp_off, monkeypatch, caplog):
    from sparse_runner.attention import attention_backends

    calls = []
    real = me.memory_efficient_attention
    monkeypatch.setattr(me, "memory_efficient_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    model = torch.nn.ModuleDict({
        "long": MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="entmax15", memory_efficient_from=10), key=("encoder_self", 0)),
        "long2": MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="entmax15", memory_efficient_from=10), key=("encoder_self", 1)),
        "soft": MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="softmax"), key=("decoder_self", 0)),
        "block": MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="softmax", pattern="local", pattern_options={"block_size": 4}),
                                    key=("local_self", 0)),
    })
    backends = attention_backends(model)
    x = torch.randn(2, 16, 16)
    with caplog.at_level(logging.INFO, logger="sparse_runner.attention.multihead"):
        for _ in range(2):
            for layer in model.values():
                layer(x)
    assert calls == [1, 1, 1, 1]  # the two entmax layers ran the memory-efficient path, twice each
    assert backends.fields() == {
        "attention_backend": "memory_efficient,sdpa",
        "attention_backend_reason": {
            "decoder_self": "sdpa: softmax",
            "encoder_self": "memory_efficient: CPU, the C++ extension unavailable, 16 keys >= model.memory_efficient_from=10",
            "local_self": "sdpa: pattern local (block patterns compute their own blocks)",
        },
    }
    lines = [r.getMessage() for r in caplog.records]
    assert lines.count("attention encoder_self: memory_efficient (memory_efficient: CPU, the C++ extension unavailable, 16 keys >= model.memory_efficient_from=10)") == 1
    assert len(lines) == 3, lines


def test_a_run_writes_the_backend_and_its_reason_to_metrics_json(tiny_config, tmp_path, caplog):
    cfg = tiny_config("model=entmax15", "trainer.max_steps=2", "trainer.eval_every=2", "trainer.log_every=2", "trainer.warmup_steps=1")
    with caplog.at_level(logging.INFO, logger="sparse_runner.attention.multihead"):
        run(cfg, tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert re.fullmatch(r"entmax15-(cpp|torch)", m["attention_backend"]), m["attention_backend"]
    reason = m["attention_backend_reason"]
    assert list(reason) == ["encoder_self"] and re.fullmatch(r"explicit: CPU, (the C\+\+ extension unavailable, \d+ keys <= 4096|\d+ keys <= 256)", reason["encoder_self"]), reason
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attention encoder_self: ")]
    assert logged == [f"attention encoder_self: {m['attention_backend']} ({reason['encoder_self']})"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_alpha_entmax_run_with_attention_dropout_reports_triton(tiny_config, tmp_path):
    cfg = tiny_config("model=entmax", "model.attention_dropout=0.1", "trainer.device=cuda", "trainer.max_steps=4", "trainer.eval_every=2",
                      "trainer.log_every=2", "trainer.warmup_steps=1")
    run(cfg, tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["status"] == "completed" and m["attention_backend"] == "triton", m["attention_backend"]
    assert m["attention_backend_reason"]["encoder_self"].startswith("triton: CUDA, threshold-form normaliser, ")
    assert "attention dropout" in m["attention_backend_reason"]["encoder_self"]


def test_a_block_pattern_names_the_kernel_its_tiles_take(monkeypatch):
    """C++ on CPU, Triton on CUDA (tile_kernel; the tiles themselves: test_triton_attention.py), explicit without one."""
    from sparse_runner.attention import block_sparse, multihead

    layer = MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser="alpha_entmax", pattern="hst", pattern_options={"block_size": 4}))
    q = torch.zeros(1, 2, 16, 8)
    for kernel, expected in (
        ("triton", ("triton", "triton: pattern hst (block patterns compute their own blocks), CUDA, threshold-form normaliser; "
                              "tiles whose heads or queries see different keys: explicit")),
        ("cpp", ("cpp", "cpp: pattern hst (block patterns compute their own blocks), CPU, threshold-form normaliser")),
        (None, (explicit := layer.normaliser.backend_name(q.device), f"{explicit}: pattern hst (block patterns compute their own blocks)")),
    ):
        monkeypatch.setattr(multihead, "tile_kernel", lambda device, normaliser, kernel=kernel: kernel)
        assert layer.backend_choice(q, q, None, 0.0) == expected
    assert block_sparse.tile_kernel(torch.device("cuda"), layer.normaliser) in ("triton", None)   # triton installed or not
    assert block_sparse.tile_kernel(torch.device("meta"), layer.normaliser) is None
