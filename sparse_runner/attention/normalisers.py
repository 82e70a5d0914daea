"""Normalisers: modules mapping attention scores to weights along the last dimension.

Contract for every normaliser: `forward(scores (B, H, Nq, Nk)) -> weights` of the same shape; entries
that are -inf (masked) get weight exactly 0; a row that is entirely -inf gives zeros, never NaN.
They are modules because alpha-entmax learns one alpha per head (Correia et al. 2019).

`softmax` is special: dense softmax attention never materialises its weights but goes through
`torch.nn.functional.scaled_dot_product_attention` (see patterns.Pattern.attend); `Softmax.forward` is the
explicit path used when the weights are needed (analysis).

A normaliser registers itself where it is defined, under the name `model.normaliser` selects, together with
the dataclass of its options (`model.normaliser_options`, checked as a pattern's are: spec.check_options):

    @register_normaliser("alpha_entmax", options=AlphaEntmaxOptions)
    class AlphaEntmax(Normaliser): ...

The registered object is called as `(num_heads, options)`, options an instance of its `Options` (a
`Normaliser` subclass's constructor takes those; a plain factory may be registered too). Another package adds
normalisers through the entry-point group `sparse_runner.normalisers` (see `sparse_runner.registry`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

import torch
from torch import nn

from sparse_runner.registry import Registry

# name -> normaliser class (or factory), filled by @register_normaliser.
NORMALISERS: Registry[Callable[..., "Normaliser"]] = Registry(
    "normaliser", package="sparse_runner.attention", entry_points="sparse_runner.normalisers"
)


@dataclass(frozen=True)
class NoOptions:
    """The options of a normaliser that has none."""


def register_normaliser(name: str, options: type = NoOptions) -> Callable[[Any], Any]:
    """Decorator: make a normaliser class (or factory) available as `model.normaliser=<name>`.

    `options` is a dataclass whose fields (with defaults) are the keys `model.normaliser_options` accepts; a
    field's metadata may hold `valid` (a predicate on the value) and `help` (the valid values, in words)."""
    return NORMALISERS.register(name, Options=options)


def _entmax():
    # Imported on first use: the module may build its C++ kernel, which softmax-only runs never need.
    from sparse_runner.attention import entmax

    return entmax


class Normaliser(nn.Module):
    """Base class; `fused_sdpa` says attention may skip materialising weights and call SDPA.

    The constructor takes `(num_heads, options)`; the normalisers without options ignore them."""

    fused_sdpa = False
    Options: type = NoOptions

    def __init__(self, num_heads: int | None = None, options: Any = None) -> None:
        super().__init__()

    def alphas(self) -> torch.Tensor | None:
        """(H,) alpha of each head, or None when alpha is not a notion of this normaliser."""
        return None

    def kernel_alpha(self) -> float | torch.Tensor:
        """The normaliser as the fused kernels take alpha: a float when one alpha serves every head (softmax 1,
        1.5-entmax, sparsemax 2, a fixed alpha_entmax: `constant_alpha` of its options), which lets them
        specialise, and is read without a tensor (no device sync, nothing for a compiled model to trace);
        otherwise its (H,) alphas."""
        constant = self.constant_alpha(getattr(self, "options", None))
        if constant is not None:
            return constant
        alphas = self.alphas()
        if alphas is None:
            raise ValueError(f"normaliser {self.name!r} is not an alpha-entmax; use model.attention_impl=explicit")
        return alphas

    @classmethod
    def has_threshold_form(cls) -> bool:
        """Whether it is an alpha-entmax (it gives `alphas`): the memory-efficient path and the GPU
        kernels compute it from one threshold per row; any other normaliser needs the explicit path."""
        return cls.alphas is not Normaliser.alphas

    @classmethod
    def constant_alpha(cls, options: Any = None) -> float | None:
        """The alpha of every head under `options` (an instance of `Options`), or None when it is learned or not
        a notion here."""
        return None

    name = "explicit"

    def backend_name(self, device: torch.device) -> str:
        """Which implementation computes this normaliser on `device` (recorded in metrics.json)."""
        return f"{self.name}-{_entmax().active_backend(device)}"


class ConstantAlpha(Normaliser):
    """An alpha-entmax whose alpha is a constant of the class (`ALPHA`). (`name` is set by @register_normaliser.)"""

    ALPHA: ClassVar[float]

    def alphas(self) -> torch.Tensor:
        return torch.full((1,), self.ALPHA)

    @classmethod
    def constant_alpha(cls, options: Any = None) -> float:
        return cls.ALPHA


@register_normaliser("softmax")
class Softmax(ConstantAlpha):
    """alpha = 1; goes through SDPA when the weights are not needed."""

    fused_sdpa = True
    ALPHA = 1.0

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        # Half precision is computed in float32 and cast back; float32 and float64 in their own dtype (a
        # float64 input is not rounded to float32 on the way).
        work = scores if scores.dtype == torch.float64 else scores.float()
        return torch.nan_to_num(torch.softmax(work, dim=-1), nan=0.0).to(scores.dtype)

    def backend_name(self, device: torch.device) -> str:
        return "sdpa"


@register_normaliser("sparsemax")
class Sparsemax(ConstantAlpha):
    """alpha = 2 (Martins & Astudillo 2016)."""

    ALPHA = 2.0

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return _entmax().sparsemax(scores, dim=-1)


@register_normaliser("entmax15")
class Entmax15(ConstantAlpha):
    """alpha = 1.5 (Peters et al. 2019)."""

    ALPHA = 1.5

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return _entmax().entmax15(scores, dim=-1)


def _alpha_init_valid(value: Any) -> bool:
    if value == "random":
        return True
    try:
        return 1.0 < float(value) < 2.0
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class AlphaEntmaxOptions:
    # a float in [1, 2] fixes alpha for every head; null learns one per head
    alpha: Any = field(default=None, metadata={"valid": lambda a: a is None or (not isinstance(a, bool) and isinstance(a, (int, float)) and 1.0 <= a <= 2.0),
                                               "help": "a float in [1, 2] (fixed alpha), or null to learn one per head"})
    # learned alpha = 1 + sigmoid(a): a ~ N(0, 1) (random, as Correia et al.) or the a that gives this float in (1, 2)
    alpha_init: Any = field(default="random", metadata={"valid": _alpha_init_valid, "help": "random (a ~ N(0,1), as Correia et al.) or a float in (1, 2)"})


@register_normaliser("alpha_entmax", options=AlphaEntmaxOptions)
class AlphaEntmax(Normaliser):
    """alpha-entmax with one alpha per head: fixed (`alpha` a float) or learned.

    Learned alpha follows Correia et al. (2019): alpha = 1 + sigmoid(a), one scalar `a` per head,
    trained by the same optimiser as everything else; `a` starts at N(0, 1) ("random") or at the
    value that gives `alpha_init`.
    """

    def __init__(self, num_heads: int, options: AlphaEntmaxOptions | None = None) -> None:
        super().__init__()
        options = options if options is not None else AlphaEntmaxOptions()
        self.num_heads, self.options = num_heads, options
        if options.alpha is not None:
            self.register_buffer("fixed_alpha", torch.full((num_heads,), float(options.alpha)))
            self.alpha_logit = None
        else:
            self.fixed_alpha = None
            if options.alpha_init == "random":
                init = torch.randn(num_heads)
            else:
                init = torch.full((num_heads,), float(torch.logit(torch.tensor(float(options.alpha_init) - 1.0))))
            self.alpha_logit = nn.Parameter(init)

    def alphas(self) -> torch.Tensor:
        if self.alpha_logit is None:
            return self.fixed_alpha
        return 1.0 + torch.sigmoid(self.alpha_logit)

    @classmethod
    def constant_alpha(cls, options: AlphaEntmaxOptions | None = None) -> float | None:
        return None if options is None or options.alpha is None else float(options.alpha)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        alpha = self.alphas().to(scores.device).view(1, -1, 1, 1)  # one per head, broadcast over B, Nq
        return _entmax().alpha_entmax(scores, alpha, dim=-1)


def normaliser_options(name: str, options: Mapping[str, Any] | None = None) -> Any:
    """The `Options` instance of the normaliser registered as `name` from a dict of its option fields (missing =
    default); ValueError naming the valid normalisers for an unknown name."""
    return getattr(NORMALISERS[name], "Options", NoOptions)(**(options or {}))


def build_normaliser(name: str, num_heads: int, options: Mapping[str, Any] | None = None) -> Normaliser:
    """The normaliser registered as `name` for a layer of `num_heads` heads, with `options` (a dict of its
    option fields; missing = default); ValueError naming the valid ones for an unknown name."""
    return NORMALISERS[name](num_heads, normaliser_options(name, options))
