"""The `model` node of a run: its schema and its checks (one line per problem, see `checks`).

A model preset (conf/model/*.yaml) fills these keys; the three attention axes are `normaliser`,
`pattern` (+ `pattern_options`) and the head geometry (`num_heads`, `head_size`), and they compose by
override on top of any preset (`model=entmax model.pattern=causal`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

from omegaconf import OmegaConf

from sparse_runner.checks import choice, fail, in_unit_interval, positive

POOLINGS = ("cls", "mean")
POSITIONS = ("sinusoidal", "learned")


@dataclass
class ModelConfig:
    """The keys of the `model` node and their types; their defaults are in conf/ (`default_model`)."""

    name: str
    d_model: int
    num_layers: int
    num_heads: int
    head_size: Optional[int]
    qkv_dim: Optional[int]
    ffn_dim: int
    dropout: float
    attention_dropout: float
    attention_impl: str
    memory_efficient_from: Any  # an int (keys) or "auto" (attention/memory_efficient.py); Any: OmegaConf has no int | str
    normaliser: str
    normaliser_options: dict[str, Any]  # fields of the normaliser's Options (attention/normalisers.py)
    pattern: str
    pattern_options: dict[str, Any]  # fields of the pattern's Options (attention/patterns.py)
    regulariser: str
    regulariser_options: dict[str, Any]  # fields of the regulariser's Options (training/regularisers/)
    pooling: str
    positions: str
    norm_first: bool
    decoder_layers: Optional[int]
    share_embeddings: bool
    init_from: Optional[str]


def default_model(**overrides: Any) -> ModelConfig:
    """The `model` node of the default config (`identity.default_config`) with `overrides`, as a ModelConfig."""
    from sparse_runner.identity import default_config

    return ModelConfig(**{**default_config()["model"], **overrides})


MODEL_KEYS = tuple(f.name for f in fields(ModelConfig))
# Keys every task family takes: a label, and the regulariser, which the trainer runs (it checks what it needs of
# the model itself: SAR a block pattern).
EVERY_FAMILY = ("name", "regulariser", "regulariser_options")


def check_model_config(m: Any) -> None:
    """Raise ConfigError on the first invalid value of a typed `model` node."""
    from sparse_runner.attention import check_attention_config

    for key in ("d_model", "num_layers", "num_heads", "ffn_dim"):
        positive(f"model.{key}", m[key])
    positive("model.head_size", m.head_size, allow_none=True)
    positive("model.qkv_dim", m.qkv_dim, allow_none=True)
    width, key = (m.d_model, "d_model") if m.qkv_dim is None else (m.qkv_dim, "qkv_dim")
    if m.head_size is None and width % m.num_heads != 0:
        fail(
            "model.num_heads",
            f"{m.num_heads} does not divide model.{key}={width} (head_size is null, so it is {key} / num_heads)",
            f"a divisor of {key}, or set model.head_size",
        )
    for key in ("dropout", "attention_dropout"):
        in_unit_interval(f"model.{key}", m[key])
    check_attention_config(m)
    choice("model.pooling", m.pooling, POOLINGS)
    choice("model.positions", m.positions, POSITIONS)
    positive("model.decoder_layers", m.decoder_layers, allow_none=True)


def check_attention_layers(m: Any, honoured: frozenset[str] | set[str]) -> None:
    """`model.attention_impl` against every attention layer of a task's model, which the model keys it
    reads (`honoured`, models/__init__.py) tell: an encoder's layers use model.pattern; a language model's
    (it does not read model.pattern) are causal; a seq2seq model (it reads model.decoder_layers) adds a
    causal decoder and context attention from target to source positions."""
    from sparse_runner.attention import check_attention_impl

    if "attention_impl" not in honoured:
        return
    decoder = "decoder_layers" in honoured
    patterns = [m.pattern] if "pattern" in honoured else ["causal"]
    check_attention_impl(m, patterns + (["causal", "dense"] if decoder else []), cross_attention=decoder)


def block_pattern_names() -> list[str]:
    """The registered patterns with block boundaries (what SAR and the shifted test move)."""
    from sparse_runner.attention import PATTERNS
    from sparse_runner.attention.block_patterns import BlockPattern

    return sorted(name for name, cls in PATTERNS.items() if issubclass(cls, BlockPattern))


def check_model_keys(m: Any, honoured: frozenset[str] | set[str], who: str) -> None:
    """A model key that `who` (a task family's model) does not use must stay at its default: setting it
    would otherwise be silently ignored."""
    from sparse_runner.identity import default_config

    defaults = default_config()["model"]
    for key in MODEL_KEYS:
        if key in honoured or key in EVERY_FAMILY:
            continue
        value, default = m[key], defaults[key]
        plain = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        if plain != default:
            fail(
                f"model.{key}",
                f"{who} does not use this key (it is {plain!r}; leave it at {default!r})",
                ", ".join(sorted(honoured - set(EVERY_FAMILY))),
            )
