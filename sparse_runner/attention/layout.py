"""How an encoder lays out its sequence for a block pattern: where the blocks start, and HST's
representative tokens.

`SequenceLayout.enter` runs once before the encoder's layers and `leave` once after them:
  - `shift` (set by SAR's second pass, `training.regularisers.sar`) moves every block boundary right by
    that many tokens, by putting `shift` masked positions in front of the first token. Positions are
    added before `enter`, so a token keeps its position embedding whatever the topology.
  - HST (`representatives` "learned", "pooled" or "both"): one representative token in front of every
    block: [globals][r_1 t_1 .. t_b][r_2 ...]. "learned": one learned vector plus the mean position
    encoding of the block's real tokens (so representatives differ by place, not by content);
    "pooled": the mean of its block's real tokens (embedded, positions included); "both": the learned
    vector plus that mean, which carries the input into layer 1 and marks the slot as a representative.
    A block without real tokens gets a masked representative. The representatives then evolve
    through the layers like any token.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn


class SequenceLayout(nn.Module):
    def __init__(self, block_size: int, global_tokens: int, d_model: int, representatives: str | None = None) -> None:
        super().__init__()
        self.block_size, self.global_tokens, self.representatives = block_size, global_tokens, representatives
        self.shift = 0
        if representatives in ("learned", "both"):
            self.representative = nn.Parameter(torch.randn(d_model) * 0.02)

    def enter(
        self, x: torch.Tensor, valid: torch.Tensor | None, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """x (B, N, d), valid (B, N) bool or None -> (x', valid', N) for the layers; pass N to `leave`.
        positions: (N, d), the position encodings already added to x ("learned" representatives add
        their block's mean; None = no positions)."""
        b, n, d = x.shape
        g, bs, s = self.global_tokens, self.block_size, self.shift
        body = n - g
        if s == 0 and self.representatives is None:
            return x, valid, n
        blocks = max(1, math.ceil((body + s) / bs))
        right = blocks * bs - body - s if self.representatives else 0
        ok = valid if valid is not None else torch.ones(b, n, dtype=torch.bool, device=x.device)
        tokens = F.pad(x[:, g:], (0, 0, s, right))
        tokens_ok = F.pad(ok[:, g:], (s, right), value=False)
        if self.representatives:
            tiles, tiles_ok = tokens.view(b, blocks, bs, d), tokens_ok.view(b, blocks, bs)
            rep_ok = tiles_ok.any(-1, keepdim=True)
            w = tiles_ok[..., None].to(x.dtype)
            if self.representatives == "learned":
                rep = self.representative.to(x.dtype).expand(b, blocks, 1, d)
                if positions is not None:
                    placed = F.pad(positions[g:].to(x.dtype), (0, 0, s, right)).view(1, blocks, bs, d)
                    rep = rep + (placed * w).sum(2, keepdim=True) / w.sum(2, keepdim=True).clamp_min(1.0)
            else:
                rep = (tiles * w).sum(2, keepdim=True) / w.sum(2, keepdim=True).clamp_min(1.0)
                if self.representatives == "both":
                    rep = rep + self.representative.to(x.dtype)
            tokens = torch.cat([rep, tiles], dim=2).view(b, blocks * (bs + 1), d)
            tokens_ok = torch.cat([rep_ok, tiles_ok], dim=2).view(b, blocks * (bs + 1))
        x = torch.cat([x[:, :g], tokens], dim=1)
        if valid is None and s == 0 and right == 0:
            return x, None, n  # nothing padded: no mask (the patterns then skip masking)
        return x, torch.cat([ok[:, :g], tokens_ok], dim=1), n

    def leave(self, h: torch.Tensor, n: int) -> torch.Tensor:
        """The layers' output (B, N', d) -> (B, N, d): the original positions, representatives dropped."""
        g, s = self.global_tokens, self.shift
        if s == 0 and self.representatives is None:
            return h
        tokens = h[:, g:]
        if self.representatives:
            b, _, d = h.shape
            tokens = tokens.reshape(b, -1, self.block_size + 1, d)[:, :, 1:].reshape(b, -1, d)
        return torch.cat([h[:, :g], tokens[:, s : s + n - g]], dim=1)


def layouts(model: nn.Module) -> list[SequenceLayout]:
    """The sequence layouts of a model (one per encoder with a block pattern)."""
    return [m for m in model.modules() if isinstance(m, SequenceLayout)]


@contextlib.contextmanager
def shifted_blocks(model: nn.Module, shift: int) -> Iterator[None]:
    """Inside the block, every block boundary of `model`'s block-sparse encoders is `shift` tokens
    further right (SAR's perturbed topology; the robustness test)."""
    # The patterns are told too: what a pattern draws per block (BigBird's random blocks) stays tied
    # to the unshifted blocks, so that the second topology moves the boundaries and nothing else.
    found = layouts(model)
    patterns = [m.pattern for m in model.modules() if hasattr(getattr(m, "pattern", None), "block_shift")]
    before = [layout.shift for layout in found], [pattern.block_shift for pattern in patterns]
    for item in found:
        item.shift = shift
    for pattern in patterns:
        pattern.block_shift = shift
    try:
        yield
    finally:
        for layout, old in zip(found, before[0]):
            layout.shift = old
        for pattern, old in zip(patterns, before[1]):
            pattern.block_shift = old
