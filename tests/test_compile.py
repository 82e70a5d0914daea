"""torch.compile traces the block-sparse layers and the models built on them as one graph (trainer.compile).

On a GPU the block patterns' many small kernels and the host's waits bound a layer's time (launches, not
arithmetic); compiled as one graph, Inductor fuses the gathers and masks and CUDA graphs can replay it. A graph
break anywhere (numpy in the forward, a tensor read on the host) splits that graph and brings a sync back, so
these tests compile with fullgraph=True, which raises on the first break. Backend "aot_eager": Dynamo and
AOTAutograd trace forward and backward exactly as for Inductor, then run the traced ops eagerly, so the check
costs seconds, and the results must equal the eager layer's.

The first call of a shape is eager here: it builds the pattern's block tables (numpy, once per shape), which a
compiled model meets as one graph break on its first step only (`BlockPattern._make_gather_table`). Windows (local,
HST's local: block and window) compute theirs inside the graph, from the block count (`window_table`).

The fused kernels (C++ on CPU, Triton on CUDA) are registered operators with their gradients (torch.library), so
Dynamo keeps them in the graph as opaque calls: the alpha-entmax, 1.5-entmax and sparsemax models trace as one graph
too, on the fused kernel and on the explicit path (the row-wise C++ entmax). The Triton kernel's operator is checked
under Triton's interpreter in test_triton_attention.py. Only the memory-efficient path (a Python loop over key
chunks, a fallback that `auto` does not pick where a kernel runs) still breaks the graph.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparse_runner.attention import AttentionSpec, MultiHeadAttention, build_normaliser
from sparse_runner.attention.layout import SequenceLayout

D_MODEL, HEADS, BLOCK = 32, 2, 8

CASES = {
    "local": ("local", {"block_size": BLOCK}),
    "local, a window of one block on each side": ("local", {"block_size": BLOCK, "neighbours": 1}),
    "bigbird, random blocks per head": ("bigbird", {"block_size": BLOCK, "random_blocks": 1}),
    "hst, two stages": ("hst", {"block_size": BLOCK}),
    "hst, two stages, window tokens": ("hst", {"block_size": BLOCK, "local": "window", "neighbours": 1}),
    "hst, two stages, bigbird tokens": ("hst", {"block_size": BLOCK, "local": "bigbird", "random_blocks": 1}),
}


def _compiled_matches_eager(fn, inputs: list[torch.Tensor], params: list[torch.nn.Parameter], *, backend: str = "aot_eager",
                            fullgraph: bool = True, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """fn(*inputs) compiled (fullgraph=True: with no graph break) gives eager's output and gradients."""
    leaves = [x for x in [*inputs, *params] if x.requires_grad]
    results = []
    for step in (fn, torch.compile(fn, backend=backend, fullgraph=fullgraph)):
        for x in leaves:
            x.grad = None
        out = step(*inputs)
        out.square().sum().backward()
        results.append([out.detach(), *(x.grad.clone() for x in leaves)])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def _listops_loss(tiny_config, model: str, device: str, *overrides: str):
    """(loss, tokens, params): the ListOps classifier's training loss as a function of a padded batch's tokens,
    as the trainer's step computes it, with dropout off (it would draw differently in two runs); its block tables
    already built (one eager call)."""
    from sparse_runner.tasks import build_task

    cfg = tiny_config("experiment=lra_listops_cpu", f"model={model}", *overrides)
    task = build_task(cfg)
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = task.build_model(cfg.model).to(device).train()
    for module in net.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    batch = task.make_batch("train", np.arange(4), torch.device(device))
    assert batch["lengths"] is not None  # ListOps pads: the masked path is the one traced

    def loss(tokens):
        return task.forward_loss(net, {**batch, "tokens": tokens}).loss

    with torch.no_grad():
        loss(batch["tokens"])
    return loss, batch["tokens"], [p for p in net.parameters() if p.requires_grad]


@pytest.mark.parametrize("case", list(CASES))
def test_a_block_sparse_layer_compiles_to_one_graph(case):
    pattern, options = CASES[case]
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = MultiHeadAttention(D_MODEL, AttentionSpec(num_heads=HEADS, head_size=16, pattern=pattern, pattern_options=options)).train()
    x = torch.randn(2, 45, D_MODEL, requires_grad=True)  # 45: the last block part padding
    lengths = torch.tensor([45, 30])
    mask = torch.arange(45)[None] < lengths[:, None]
    if pattern == "hst":
        x, mask, _ = SequenceLayout(BLOCK, 0, D_MODEL, "both").enter(x, mask)
        x = x.detach().requires_grad_()

    def layer_out(x):
        return layer(x, key_padding_mask=mask)

    with torch.no_grad():
        layer_out(x)  # builds the block tables
    torch.manual_seed(1)  # the layer's dropout is 0: nothing random left, the seed only pins that
    _compiled_matches_eager(layer_out, [x], list(layer.parameters()))


@pytest.mark.parametrize("model", ["ernie_sparse", "bigbird_sar", "softmax"])
def test_a_models_training_loss_compiles_to_one_graph(tiny_config, model):
    """The ListOps classifier's loss, forward and backward, as the trainer's step runs it with trainer.compile:
    ERNIE-Sparse (HST with SAR's representatives), BigBird, dense softmax."""
    loss, tokens, params = _listops_loss(tiny_config, model, "cpu")
    _compiled_matches_eager(loss, [tokens], params)


@pytest.mark.parametrize("model, overrides", [
    ("entmax", ["model.attention_impl=cpp"]),                       # learned alpha per head on the fused C++ kernel
    ("entmax15", ["model.attention_impl=explicit"]),                # n x n scores through the row-wise C++ entmax
    ("ernie_sparse", ["normaliser=alpha_entmax"]),                  # HST's tiles through both
])
def test_an_entmax_models_training_loss_compiles_to_one_graph(tiny_config, model, overrides):
    """The C++ kernels are operators to Dynamo (not pybind calls, each a graph break): no break, eager's values."""
    from sparse_runner.attention.kernels import load_entmax_cpu

    if load_entmax_cpu() is None:
        pytest.skip("the C++ extension cannot be built here")
    loss, tokens, params = _listops_loss(tiny_config, model, "cpu", *overrides)
    _compiled_matches_eager(loss, [tokens], params)


def _graphs_traced(lengths: tuple[int, ...], max_length: int, **model: object) -> int:
    """How many graphs Dynamo traces for a one-layer classifier (`default_model` with `model`) compiled after an
    eager first call, as trainer.compile does (`CompiledStep`), then run forward and backward at `lengths`."""
    from sparse_runner.models import build_classifier
    from sparse_runner.models.config import default_model

    torch._dynamo.reset()
    torch.manual_seed(0)
    config = default_model(d_model=32, num_layers=1, num_heads=2, ffn_dim=32, dropout=0.0, **model)
    classifier = build_classifier(config, vocab_size=20, num_classes=3, max_length=max_length, pad_id=0)
    graphs = []

    def count_graphs(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    classifier(torch.randint(1, 20, (2, 24)), None)
    compiled = torch.compile(classifier, backend=count_graphs)
    for n in lengths:
        compiled(torch.randint(1, 20, (2, n)), torch.tensor([n, n - 5])).sum().backward()
    return len(graphs)


@pytest.mark.parametrize("normaliser", ["alpha_entmax", "softmax"])
def test_a_compiled_dense_model_traces_a_new_length_without_recompiling(normaliser):
    """Batches are padded to their longest sequence, so lengths vary. After a second length Dynamo traces the model
    with a symbolic length; nothing on the attention path may specialise it to one (formatting the key count into
    the backend's reason string did: a recompile for every length, until Dynamo's limit of 8 sends it to eager)."""
    # the first length, then every other length in one graph
    assert _graphs_traced((24, 40, 56, 33, 71), 100, normaliser=normaliser) == 2


@pytest.mark.parametrize("normaliser, pattern, options, graphs", [
    ("alpha_entmax", "hst", {"local": "block"}, 2),
    ("softmax", "hst", {"local": "block"}, 2),
    ("softmax", "hst", {"local": "window", "neighbours": 1}, 2),
    ("alpha_entmax", "local", {"neighbours": 1}, 3),
])
def test_a_compiled_windowed_block_model_traces_every_block_count_in_one_graph(normaliser, pattern, options, graphs):
    """Lengths of 3 to 19 blocks trace the graphs of a dense model, not one per block count.
    ERNIE-Sparse's default topology (HST, local: block) gathers no key blocks, so nothing in its layer depends on
    the count; a window (HST's local: window, pattern local) computes its table from the count (`window_table`).
    With the tables looked up per count these lengths traced 37 graphs (HST, block) and 7 (both windows): a
    recompile per count, up to Dynamo's limit. Local's third graph: a last block that is part padding (HST's
    layout pads every block whole)."""
    config = {"pattern": pattern, "pattern_options": {"block_size": 8, **options}}
    assert _graphs_traced((24, 40, 56, 33, 71, 90, 150), 200, normaliser=normaliser, **config) == graphs


def test_a_compiled_run_warns_where_a_pattern_traces_a_graph_per_block_count():
    """BigBird under trainer.compile: a warning naming the pattern, the number of block counts that the longest
    training sequence allows and Dynamo's limit; a window (local) or lengths within the limit: none."""
    from sparse_runner.models import build_classifier
    from sparse_runner.models.config import default_model
    from sparse_runner.training.trainer import warn_graphs_per_block_count

    def model(pattern: str, block: int):
        config = default_model(d_model=32, num_layers=2, num_heads=2, ffn_dim=32, pattern=pattern, pattern_options={"block_size": block})
        return build_classifier(config, vocab_size=20, num_classes=3, max_length=200, pad_id=0)

    warnings = warn_graphs_per_block_count(model("bigbird", 8), 200)
    assert len(warnings) == 1 and "pattern bigbird" in warnings[0] and "up to 25 counts of 8" in warnings[0]
    assert f"compiles {torch._dynamo.config.recompile_limit} graphs" in warnings[0]
    assert warn_graphs_per_block_count(model("local", 8), 200) == []
    assert warn_graphs_per_block_count(model("bigbird", 64), 200) == []  # 4 counts


def test_a_compiled_step_runs_its_first_call_eagerly(monkeypatch):
    """trainer.compile's first call runs the model itself (the host-side work of a first call: the C++ extension's
    build, cached device facts, block tables), later calls the compiled wrapper; attributes are the model's."""
    from sparse_runner.training.trainer import CompiledStep

    calls = []
    model, compiled = torch.nn.Linear(2, 2), lambda x: calls.append("compiled") or x
    model.register_forward_hook(lambda *_: calls.append("eager"))
    step = CompiledStep(model, compiled)
    for _ in range(3):
        step(torch.zeros(1, 2))
    assert calls == ["eager", "compiled", "compiled"] and step.weight is model.weight


def test_a_compiled_step_can_be_copied():
    """CompiledStep forwards attributes to its model; copy (and pickle), which skip __init__, must not recurse."""
    import copy

    from sparse_runner.training.trainer import CompiledStep

    step = copy.copy(CompiledStep(torch.nn.Linear(2, 2), None))
    assert step.weight is step.model.weight


@pytest.mark.slow  # Inductor compiles the model on the CPU: about 40 s
def test_a_compiled_training_run_has_no_graph_break(tiny_config, tmp_path, monkeypatch):
    """`sparse-run model=entmax trainer.compile=true` on CPU, through the trainer: no graph break, from the first
    step (the C++ extension loaded and the machine's memory read on the eager first call, as in a fresh process)
    through a new padded length (a recompile)."""
    from torch._dynamo.utils import counters

    from sparse_runner.attention import kernels, memory_efficient
    from sparse_runner.run import run

    monkeypatch.setattr(kernels, "_status", None)  # as if not loaded yet in this process
    monkeypatch.setattr(kernels, "_module", None)
    monkeypatch.setattr(memory_efficient, "_memory_bytes", {})
    torch._dynamo.reset()
    counters.clear()
    run(tiny_config("experiment=lra_listops_cpu", "model=entmax", "trainer.compile=true", "trainer.max_steps=4",
                    "trainer.eval_every=4"), tmp_path / "run")
    assert counters["stats"]["unique_graphs"] >= 1
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_the_fused_kernels_read_a_constant_alpha_as_a_float():
    """A float alpha lets the kernels specialise (1.5-entmax, sparsemax) and is read without a tensor: no device
    sync per layer, nothing for a compiled model to trace. Learned alphas stay a tensor (they take gradients)."""
    assert build_normaliser("entmax15", 4).kernel_alpha() == 1.5
    assert build_normaliser("sparsemax", 4).kernel_alpha() == 2.0
    assert build_normaliser("alpha_entmax", 4, {"alpha": 1.5}).kernel_alpha() == 1.5
    learned = build_normaliser("alpha_entmax", 4).kernel_alpha()
    assert torch.is_tensor(learned) and learned.shape == (4,) and learned.requires_grad


def test_importing_the_runner_imports_neither_dynamo_nor_triton():
    """torch._dynamo imports triton when it is installed; before Triton's interpreter is chosen
    (TRITON_INTERPRET, read at triton's import) that would fix it for the process, and the kernel tests would
    run in a subprocess instead. So nothing in the runner calls into torch.compiler at import time."""
    import subprocess
    import sys

    code = ("import sys, sparse_runner.run, sparse_runner.attention.block_patterns, sparse_runner.attention.hst; "
            "print(sorted(m for m in ('torch._dynamo', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"


def test_a_padding_mask_off_the_cpu_is_never_read_on_the_host():
    """On an accelerator, reading whether a mask pads anything would make the host wait for the device once per
    layer (and a compiled model could not trace it): the mask is passed on as it is. A meta tensor, which has no
    values to read, stands in for a CUDA one."""
    from sparse_runner.attention.block_sparse import padding_or_none

    mask = torch.ones(2, 5, dtype=torch.bool, device="meta")
    assert padding_or_none(mask) is mask
    assert padding_or_none(torch.ones(2, 5, dtype=torch.bool)) is None  # on the CPU it is read, for free
    assert padding_or_none(None) is None


@pytest.mark.gpu
@pytest.mark.slow  # Inductor compiles each model for a minute or so: not in gpu_check's budget (`-m "gpu and not slow"`)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("model", ["ernie_sparse", "bigbird", "entmax"])
def test_gpu_a_compiled_training_loss_matches_eager(tiny_config, model):
    """On CUDA with Inductor, as trainer.compile=true runs the step, as one graph: the block-sparse models, and the
    alpha-entmax model with the Triton kernel's operator inside the graph."""
    loss, tokens, params = _listops_loss(tiny_config, model, "cuda")
    _compiled_matches_eager(loss, [tokens], params, backend="inductor", rtol=1e-3, atol=1e-5)
