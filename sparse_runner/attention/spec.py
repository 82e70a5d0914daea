"""`AttentionSpec`: everything one attention layer is built from, in one object.

It is made once from the `model` config node (`AttentionSpec.from_config`) and handed to every
attention layer a model builds; a layer type that needs another topology (a decoder's causal
self-attention, context attention) asks for a copy with `spec.with_pattern(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Literal, Mapping, get_args, get_origin, get_type_hints

from sparse_runner.checks import ConfigError, choice, fail

# The `model` keys `AttentionSpec.from_config` reads.
ATTENTION_KEYS = frozenset(
    {"num_heads", "head_size", "qkv_dim", "normaliser", "normaliser_options", "pattern", "pattern_options", "attention_dropout"}
    | {"attention_impl", "memory_efficient_from"}
)


def head_size_of(m: Any) -> int | None:
    """The head size a `model` node asks for: `head_size` when set (a fixed head size); else, when
    `qkv_dim` (the q/k/v projections' total width, LRA's `qkv_dim`) is set, qkv_dim / num_heads; else None
    (d_model / num_heads, decided by the layer)."""
    if m.head_size is not None:
        return m.head_size
    qkv_dim = getattr(m, "qkv_dim", None)
    return qkv_dim // m.num_heads if qkv_dim is not None else None


@dataclass(frozen=True)
class AttentionSpec:
    """normaliser x pattern x head geometry, plus the layer's attention dropout."""

    num_heads: int
    head_size: int | None = None  # None: d_model // num_heads
    normaliser: str = "softmax"
    normaliser_options: dict[str, Any] = field(default_factory=dict)  # fields of the normaliser's Options
    pattern: str = "dense"
    pattern_options: dict[str, Any] = field(default_factory=dict)
    dropout: float = 0.0
    impl: str = "auto"  # how dense-pattern attention is computed (memory_efficient.ATTENTION_IMPLS)
    memory_efficient_from: int | str = "auto"  # impl=auto: keys from which the memory-efficient path is used, or "auto"

    @classmethod
    def from_config(cls, m: Any) -> "AttentionSpec":
        """From a `model` config node (or a `ModelConfig`); reads exactly ATTENTION_KEYS."""
        return cls(
            num_heads=m.num_heads,
            head_size=head_size_of(m),
            normaliser=m.normaliser,
            normaliser_options=dict(m.normaliser_options or {}),
            pattern=m.pattern,
            pattern_options=dict(m.pattern_options or {}),
            dropout=m.attention_dropout,
            impl=m.attention_impl,
            memory_efficient_from=m.memory_efficient_from,
        )

    def with_pattern(self, pattern: str, **options: Any) -> "AttentionSpec":
        """A copy with another pattern (and only the given options)."""
        return replace(self, pattern=pattern, pattern_options=options)


def check_attention_config(m: Any) -> None:
    """Raise ConfigError on the first invalid attention key of a typed `model` node."""
    from sparse_runner.attention.memory_efficient import ATTENTION_IMPLS, MEMORY_EFFICIENT_FROM_AUTO
    from sparse_runner.attention.normalisers import NORMALISERS, NoOptions
    from sparse_runner.attention.patterns import PATTERNS

    choice("model.normaliser", m.normaliser, sorted(NORMALISERS))
    options_schema = getattr(NORMALISERS[m.normaliser], "Options", NoOptions)
    check_options("model.normaliser_options", m.normaliser_options or {}, options_schema, f"normaliser {m.normaliser!r}")
    # A config states every option, so that the report tells a fixed-alpha run from a learned-alpha one.
    missing = sorted(f.name for f in fields(options_schema) if f.name not in (m.normaliser_options or {}))
    if missing:
        raise ConfigError(f"model.normaliser_options: normaliser {m.normaliser!r} needs {', '.join(missing)}; select it with "
                          f"normaliser={m.normaliser} (conf/normaliser/{m.normaliser}.yaml sets every option)")
    choice("model.attention_impl", m.attention_impl, ATTENTION_IMPLS)
    value = m.memory_efficient_from
    if value != MEMORY_EFFICIENT_FROM_AUTO and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        fail("model.memory_efficient_from", f"bad value {value!r}",
             "auto (the explicit path up to 4096 keys where its scores fit in memory) or a positive int (keys per "
             "query from which attention_impl=auto uses the memory-efficient path)")
    choice("model.pattern", m.pattern, sorted(PATTERNS))
    check_options("model.pattern_options", m.pattern_options or {}, PATTERNS[m.pattern].Options, f"pattern {m.pattern!r}")


def check_attention_impl(m: Any, patterns: Iterable[str], *, cross_attention: bool = False) -> None:
    """Raise ConfigError when `model.attention_impl` cannot work with the rest of a checked `model` node.

    patterns: the pattern of every attention layer of the model (`model.pattern` for an encoder, causal
    and dense for a decoder's layers); cross_attention: whether a layer's queries and keys may differ in
    number (a decoder's context attention, incremental decoding). Refused: an impl that no layer reads
    (block patterns compute their own blocks: auto or explicit, and flex with softmax; flex computes
    nothing else), a memory-efficient impl for a normaliser without a threshold form, and what the fused
    kernels cannot do (`memory_efficient.GPU_IMPLS`,
    `CPU_IMPLS`: a mask besides padding and causality; AdaSplash: attention dropout, a learned alpha or
    alpha 1, other numbers of queries and keys). `auto` always works: it only picks what can. What depends on the
    device is checked once it is known (`check_attention_impl_device`).
    """
    from sparse_runner.attention.memory_efficient import CPU_IMPLS, GPU_IMPLS
    from sparse_runner.attention.normalisers import NORMALISERS, Normaliser, normaliser_options
    from sparse_runner.attention.patterns import PATTERNS

    impl = m.attention_impl
    if impl == "auto":
        return
    classes = [PATTERNS[name] for name in dict.fromkeys(patterns)]
    if impl == "flex":
        _check_flex(m, classes)
        return
    readers = [cls for cls in classes if not cls.ignores_attention_impl]
    if not readers:
        why = classes[0].ignores_attention_impl if classes else "the model has no attention layer"
        if impl != "explicit":
            valid = "auto, explicit, flex" if classes and _flex_applies(m, classes) else "auto, explicit"
            _refuse("model.attention_impl", f"{impl!r} does not apply to pattern {m.pattern!r} ({why})", m.pattern, valid)
        return
    if impl == "explicit":
        return
    normaliser = NORMALISERS[m.normaliser]
    if not (isinstance(normaliser, type) and issubclass(normaliser, Normaliser)):
        return  # a factory: what it builds is known at run time only
    if not normaliser.has_threshold_form():
        alpha_entmax = [name for name, n in NORMALISERS.items() if isinstance(n, type) and issubclass(n, Normaliser) and n.has_threshold_form()]
        fail(
            "model.normaliser",
            f"{m.normaliser!r} has no threshold form for the memory-efficient path (model.attention_impl={impl})",
            f"{', '.join(alpha_entmax)} (or model.attention_impl auto, explicit)",
        )
    if impl not in GPU_IMPLS + CPU_IMPLS:
        return
    masked = [cls.name for cls in readers if cls.masks_pairs()]
    if masked:
        _refuse("model.attention_impl", f"{impl!r} cannot apply the mask of pattern {masked[0]!r} (the fused kernels take padding and causal masks only)", masked[0], "auto, explicit, memory_efficient")
    if impl in CPU_IMPLS:
        return
    if impl != "adasplash":
        return
    if m.attention_dropout > 0 and not normaliser.fused_sdpa:  # softmax trains through SDPA, which drops out
        _refuse("model.attention_impl", f"'adasplash' has no attention dropout, and model.attention_dropout is {m.attention_dropout}", "attention dropout", "auto, explicit, memory_efficient, triton")
    if normaliser.constant_alpha.__func__ is not Normaliser.constant_alpha.__func__:  # the class says its alpha
        alpha = normaliser.constant_alpha(normaliser_options(m.normaliser, m.normaliser_options))
        if alpha is None or not 1.0 < alpha <= 2.0:
            has = "learns one alpha per head (model.normaliser_options.alpha is null)" if alpha is None else f"has alpha {alpha:g}"
            _refuse("model.attention_impl", f"'adasplash' takes one fixed alpha in (1, 2], and {m.normaliser!r} {has}", m.normaliser, "auto, explicit, memory_efficient, triton")
    if cross_attention:
        _refuse("model.attention_impl", "'adasplash' needs as many queries as keys, and a decoder's context attention and incremental decoding have other numbers", "a decoder", "auto, explicit, memory_efficient, triton")


def _flex_applies(m: Any, classes: list) -> bool:
    """Whether model.attention_impl=flex can compute these layers: block patterns with softmax."""
    from sparse_runner.attention.normalisers import NORMALISERS

    return all(getattr(cls, "flex_engine", "") for cls in classes) and getattr(NORMALISERS[m.normaliser], "fused_sdpa", False)


def _check_flex(m: Any, classes: list) -> None:
    """flex (flex_blocks.py) computes block patterns with softmax; the other layers and normalisers are refused."""
    from sparse_runner.attention.memory_efficient import ATTENTION_IMPLS
    from sparse_runner.attention.patterns import PATTERNS

    others = [cls.name for cls in classes if not getattr(cls, "flex_engine", "")]
    if others:
        blocks = ", ".join(sorted(name for name, cls in PATTERNS.items() if getattr(cls, "flex_engine", "")))
        _refuse("model.attention_impl", f"'flex' computes block patterns ({blocks}) only, not the model's {others[0]!r} layers", others[0],
                ", ".join(i for i in ATTENTION_IMPLS if i != "flex"))
    if not _flex_applies(m, classes):
        _refuse("model.attention_impl", f"'flex' computes softmax only (FlexAttention), and model.normaliser is {m.normaliser!r}", m.normaliser, "auto, explicit")


def check_attention_impl_device(m: Any, device: Any) -> None:
    """Raise ConfigError when `model.attention_impl` does not suit `device` (a torch.device), checked where
    the run's device is known (a login node without a GPU may well compose a job for a GPU node).

    The GPU kernels and flex need CUDA, the cpp kernel a CPU. On CUDA, memory_efficient is refused where the Triton kernel computes the
    layers: that path is a Python loop of small kernels, hundreds of times slower there (measured on an
    H200). It is kept where the kernel cannot serve: a pattern mask besides padding and causality (the
    encoder's `model.pattern`; a decoder's own layers are causal and dense), a head size above the kernel's,
    or no triton installed."""
    from sparse_runner.attention.memory_efficient import CPU_IMPLS, GPU_IMPLS, gpu_backend
    from sparse_runner.attention.patterns import PATTERNS

    impl = m.attention_impl
    if impl == "flex" and device.type != "cuda":
        raise ConfigError(f"model.attention_impl: flex needs a CUDA device (FlexAttention has no backward on CPU), and this run is on {device}; valid here: auto, explicit")
    if impl in GPU_IMPLS and device.type != "cuda":
        raise ConfigError(f"model.attention_impl: {impl} needs a CUDA device, and this run is on {device}; valid here: auto, explicit, memory_efficient, cpp")
    if impl in CPU_IMPLS and device.type != "cpu":
        raise ConfigError(f"model.attention_impl: {impl} is the CPU kernel, and this run is on {device}; valid here: auto, explicit, memory_efficient, triton")
    if impl != "memory_efficient" or device.type != "cuda":
        return
    pattern = PATTERNS[m.pattern]
    head_size = head_size_of(m) or m.d_model // m.num_heads
    kernel = gpu_backend("triton")
    if (pattern.masks_pairs() and not pattern.ignores_attention_impl) or head_size > kernel.MAX_HEAD_DIM or not kernel.available():
        return
    _refuse("model.attention_impl", "memory_efficient on CUDA is a loop of small torch kernels, hundreds of times slower than "
            "the Triton kernel that computes these layers", "CUDA", "auto, triton, explicit")


def _refuse(key: str, problem: str, where: str, valid: str) -> None:
    raise ConfigError(f"{key}: {problem}; valid with {where}: {valid}")


def check_options(prefix: str, values: Mapping[str, Any], schema: type, owner: str) -> None:
    """Raise ConfigError unless every key of `values` is a field of the dataclass `schema` and its value
    has the field's type (int, float, bool, str, or a Literal of choices) and passes its `valid` metadata."""
    known = {f.name: f for f in fields(schema)}
    types = get_type_hints(schema)
    for key, value in values.items():
        where = f"{prefix}.{key}"
        if not known:
            fail(where, f"{owner} takes no options")
        if key not in known:
            fail(where, f"unknown option of {owner}", ", ".join(sorted(known)))
        kind, meta = types[key], known[key].metadata
        if get_origin(kind) is Literal:
            choice(where, value, get_args(kind))
        elif not _has_type(value, kind) or not meta.get("valid", lambda _: True)(value):
            fail(where, f"bad value {value!r}", meta.get("help", getattr(kind, "__name__", str(kind))))


# Field type -> the Python types a config value of it may have (YAML writes 2.0 as 2).
_VALUE_TYPES = {int: int, float: (int, float), bool: bool, str: str}


def _has_type(value: Any, kind: Any) -> bool:
    if kind not in _VALUE_TYPES:
        return True  # other types: only the `valid` predicate checks them
    # bool is a subclass of int: `true` is not a block size.
    return isinstance(value, _VALUE_TYPES[kind]) and (kind is bool or not isinstance(value, bool))
