"""Normalisers: modules mapping attention scores to weights along the last dimension.

Contract for every normaliser: `forward(scores (B, H, Nq, Nk)) -> weights` of the same shape; entries
that are -inf (masked) get weight exactly 0; a row that is entirely -inf gives zeros, never NaN.
They are modules because alpha-entmax learns one alpha per head (Correia et al. 2019).

`softmax` is special: dense softmax attention never materialises its weights but goes through
`torch.nn.functional.scaled_dot_product_attention` (see patterns.Pattern.attend); `Softmax.forward` is the
explicit path used when the weights are needed (analysis).
"""

from __future__ import annotations

import torch
from torch import nn



def _entmax():
    # Imported on first use: the module may build its C++ kernel, which softmax-only runs never need.
    from sparse_runner.attention import entmax

    return entmax


class Normaliser(nn.Module):
    """Base class; `fused_sdpa` says attention may skip materialising weights and call SDPA."""

    fused_sdpa = False

    def alphas(self) -> torch.Tensor | None:
        """(H,) alpha of each head, or None when alpha is not a notion of this normaliser."""
        return None

    name = "explicit"

    def backend_name(self, device: torch.device) -> str:
        """Which implementation computes this normaliser on `device` (recorded in metrics.json)."""
        return f"{self.name}-{_entmax().active_backend(device)}"


class Softmax(Normaliser):
    name = "softmax"
    fused_sdpa = True

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.nan_to_num(torch.softmax(scores.float(), dim=-1), nan=0.0).to(scores.dtype)

    def alphas(self) -> torch.Tensor:
        return torch.ones(1)

    def backend_name(self, device: torch.device) -> str:
        return "sdpa"


class Sparsemax(Normaliser):
    """alpha = 2 (Martins & Astudillo 2016)."""

    name = "sparsemax"

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return _entmax().sparsemax(scores, dim=-1)

    def alphas(self) -> torch.Tensor:
        return torch.full((1,), 2.0)


class Entmax15(Normaliser):
    """alpha = 1.5 (Peters et al. 2019)."""

    name = "entmax15"

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return _entmax().entmax15(scores, dim=-1)

    def alphas(self) -> torch.Tensor:
        return torch.full((1,), 1.5)


class AlphaEntmax(Normaliser):
    """alpha-entmax with one alpha per head: fixed (`alpha` a float) or learned.

    Learned alpha follows Correia et al. (2019): alpha = 1 + sigmoid(a), one scalar `a` per head,
    trained by the same optimiser as everything else; `a` starts at N(0, 1) ("random") or at the
    value that gives `alpha_init`.
    """

    name = "alpha_entmax"

    def __init__(self, num_heads: int, alpha: float | None = None, alpha_init: float | str = "random") -> None:
        super().__init__()
        self.num_heads = num_heads
        if alpha is not None:
            self.register_buffer("fixed_alpha", torch.full((num_heads,), float(alpha)))
            self.alpha_logit = None
        else:
            self.fixed_alpha = None
            if alpha_init == "random":
                init = torch.randn(num_heads)
            else:
                init = torch.full((num_heads,), float(torch.logit(torch.tensor(float(alpha_init) - 1.0))))
            self.alpha_logit = nn.Parameter(init)

    def alphas(self) -> torch.Tensor:
        if self.alpha_logit is None:
            return self.fixed_alpha
        return 1.0 + torch.sigmoid(self.alpha_logit)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        alpha = self.alphas().to(scores.device).view(1, -1, 1, 1)  # one per head, broadcast over B, Nq
        return _entmax().alpha_entmax(scores, alpha, dim=-1)


# name -> factory(num_heads, alpha, alpha_init); a new normaliser registers here.
NORMALISERS = {
    "softmax": lambda num_heads, **_: Softmax(),
    "sparsemax": lambda num_heads, **_: Sparsemax(),
    "entmax15": lambda num_heads, **_: Entmax15(),
    "alpha_entmax": lambda num_heads, alpha=None, alpha_init="random": AlphaEntmax(num_heads, alpha, alpha_init),
}


def build_normaliser(name: str, num_heads: int, *, alpha: float | None = None, alpha_init: float | str = "random") -> Normaliser:
    if name not in NORMALISERS:
        raise ValueError(f"unknown normaliser {name!r}; valid: {', '.join(sorted(NORMALISERS))}")
    return NORMALISERS[name](num_heads, alpha=alpha, alpha_init=alpha_init)
