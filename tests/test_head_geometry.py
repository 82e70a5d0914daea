"""Head geometry (Bhojanapalli et al. 2020): model=fixed_head keeps the head size whatever the number of
heads, model=standard_heads keeps d/h, and our parameter counts follow the paper's Table 2."""

from __future__ import annotations

import pytest
import torch

from sparse_runner.attention import attention_layers
from sparse_runner.config import group_options, validate
from sparse_runner.models import build_classifier
from tests.conftest import compose_config

# Table 2 of the paper (docs/papers.md): 24 layers, d = 512, BERT-large's FFN width 4096 and its
# 30,522-word vocabulary; (heads, head size) -> published millions of parameters.
TABLE2 = {(8, 128): 168, (12, 128): 193, (16, 128): 218, (32, 128): 319, (8, 32): 130, (8, 64): 142, (8, 256): 218}


@pytest.mark.parametrize("heads, head_size", list(TABLE2))
def test_parameter_counts_match_the_papers_table2(heads, head_size):
    cfg = validate(compose_config([
        "model=fixed_head", "model.d_model=512", "model.num_layers=24", "model.ffn_dim=4096", f"model.num_heads={heads}",
        f"model.head_size={head_size}", "model.positions=learned", "task.max_length=512", "task.generator.max_length=600",
    ], tiny=False))
    with torch.device("meta"):  # sizes only: no memory, no time
        model = build_classifier(cfg.model, vocab_size=30522, num_classes=3, max_length=512, pad_id=0)
    count = sum(p.numel() for p in model.parameters())
    # The paper's formula, 24 (4 d h d_p + 2 d FFN) + embeddings, is what the published counts follow.
    assert 24 * (4 * 512 * heads * head_size + 2 * 512 * 4096) + 30522 * 512 < count
    assert abs(count / 1e6 - TABLE2[heads, head_size]) <= 1.0, count


@pytest.mark.parametrize("heads", [2, 3, 8, 16])
def test_fixed_head_size_whatever_the_heads(heads, cache_dir):
    cfg = validate(compose_config(["model=fixed_head", f"model.num_heads={heads}", "model.head_size=24"], cache_dir=cache_dir))
    model = build_classifier(cfg.model, vocab_size=16, num_classes=10, max_length=40, pad_id=0)
    for layer in attention_layers(model):  # d_model 32 is not divisible by 3 heads: no matter
        assert layer.num_heads == heads and layer.head_size == 24 and layer.q_proj.out_features == heads * 24


@pytest.mark.parametrize("heads", [1, 2, 4, 8])
def test_standard_heads_split_d_model(heads, cache_dir):
    cfg = validate(compose_config(["model=standard_heads", f"model.num_heads={heads}"], cache_dir=cache_dir))
    model = build_classifier(cfg.model, vocab_size=16, num_classes=10, max_length=40, pad_id=0)
    assert {layer.head_size for layer in attention_layers(model)} == {32 // heads}


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_no_experiment_undoes_the_head_geometry_of_the_model_preset(experiment):
    """Experiments come last in the defaults list: one that set model.head_size would silently turn
    model=fixed_head into standard heads."""
    fixed = compose_config([f"experiment={experiment}", "model=fixed_head"], tiny=False)
    standard = compose_config([f"experiment={experiment}", "model=standard_heads"], tiny=False)
    assert fixed.model.head_size == 32 and standard.model.head_size is None


def test_qkv_dim_sets_the_standard_head_size_and_a_fixed_head_size_wins(cache_dir):
    """model.qkv_dim (LRA's total q/k/v width) gives standard heads qkv_dim / num_heads dimensions each;
    a fixed head size (model=fixed_head) keeps its own."""
    def head_sizes(*overrides):
        cfg = validate(compose_config(list(overrides), cache_dir=cache_dir))
        model = build_classifier(cfg.model, vocab_size=16, num_classes=10, max_length=40, pad_id=0)
        return {(layer.head_size, layer.q_proj.out_features) for layer in attention_layers(model)}

    assert head_sizes("model.num_heads=4", "model.qkv_dim=16") == {(4, 16)}
    assert head_sizes("model=fixed_head", "model.num_heads=4", "model.qkv_dim=16", "model.head_size=8") == {(8, 32)}
    with pytest.raises(Exception, match=r"model\.num_heads: 3 does not divide model\.qkv_dim=16"):
        head_sizes("model.num_heads=3", "model.qkv_dim=16")
