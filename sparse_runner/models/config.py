"""The `model` node of a run: its schema and its checks (one line per problem, see `checks`).

A model preset (conf/model/*.yaml) fills these keys; the three attention axes are `normaliser`,
`pattern` (+ `pattern_options`) and the head geometry (`num_heads`, `head_size`), and they compose by
override on top of any preset (`model=entmax model.pattern=causal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from sparse_runner.checks import choice, fail, in_unit_interval, positive

POOLINGS = ("cls", "mean")
POSITIONS = ("sinusoidal", "learned")


@dataclass
class ModelConfig:
    name: str = "softmax"
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    head_size: Optional[int] = None
    ffn_dim: int = 256
    dropout: float = 0.1
    attention_dropout: float = 0.0
    normaliser: str = "softmax"
    alpha: Optional[float] = None
    alpha_init: Any = "random"
    pattern: str = "dense"
    pattern_options: dict[str, Any] = field(default_factory=dict)  # fields of the pattern's Options (attention/patterns.py)
    pooling: str = "cls"
    positions: str = "sinusoidal"
    norm_first: bool = True
    decoder_layers: Optional[int] = None  # encoder-decoder models; None = num_layers
    share_embeddings: bool = True  # encoder-decoder models: one matrix for source, target and output


MODEL_KEYS = tuple(f.name for f in fields(ModelConfig))


def check_model_config(m: Any) -> None:
    """Raise ConfigError on the first invalid value of a typed `model` node."""
    from sparse_runner.attention import check_attention_config

    for key in ("d_model", "num_layers", "num_heads", "ffn_dim"):
        positive(f"model.{key}", m[key])
    positive("model.head_size", m.head_size, allow_none=True)
    if m.head_size is None and m.d_model % m.num_heads != 0:
        fail(
            "model.num_heads",
            f"{m.num_heads} does not divide model.d_model={m.d_model} (head_size is null, so it is d_model / num_heads)",
            "a divisor of d_model, or set model.head_size",
        )
    for key in ("dropout", "attention_dropout"):
        in_unit_interval(f"model.{key}", m[key])
    check_attention_config(m)
    choice("model.pooling", m.pooling, POOLINGS)
    choice("model.positions", m.positions, POSITIONS)
    positive("model.decoder_layers", m.decoder_layers, allow_none=True)


def check_model_keys(m: Any, honoured: frozenset[str] | set[str], who: str) -> None:
    """A model key that `who` (a task family's model) does not use must stay at its default: setting it
    would otherwise be silently ignored."""
    defaults = ModelConfig()
    for key in MODEL_KEYS:
        if key in honoured or key == "name":
            continue
        value = m[key]
        plain = dict(value) if hasattr(value, "items") else value
        if plain != getattr(defaults, key):
            fail(
                f"model.{key}",
                f"{who} does not use this key (it is {plain!r}; leave it at {getattr(defaults, key)!r})",
                ", ".join(sorted(honoured - {"name"})),
            )
