"""ERNIE-Sparse's Hierarchical Sparse Transformer pattern (HST, Liu et al. 2022).

The paper gives no code and no details, so the design is docs/papers.md's, every choice an option:
the encoder puts one representative token in front of every block (`layout.SequenceLayout`), so a
layer's sequence is [globals][r_1 block_1][r_2 block_2]...
  - local stage: a block's tokens attend to their block and its representative (`neighbours` > 0:
    also the tokens of that many blocks on each side);
  - global stage: representatives attend to their own block, to every representative and to the
    global tokens; global tokens attend to the representatives and to each other.
Assumption: both stages are one attention (one normalisation over the union of a query's keys) with
the layer's single set of Q/K/V/O weights, which is how the paper's hierarchical and sparse heads share
their weights; what a representative gathers reaches its block's tokens in the next layer.
Cost per layer: n * (block + 1) + (n / block) * (block + n / block + globals), never n^2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from sparse_runner.attention.block_patterns import BlockPattern, _block_size, _non_negative, _tile_keys, _window_table
from sparse_runner.attention.block_sparse import KeySource, RowGroup, attend_tiles, from_tiles, gather_tiles, mask_tiles, to_tiles
from sparse_runner.attention.patterns import register_pattern


@dataclass(frozen=True)
class HSTOptions:
    block_size: int = _block_size()
    neighbours: int = _non_negative(0, "an int >= 0 (neighbouring blocks each token also sees)")
    representatives: Literal["learned", "pooled"] = "learned"




# ----------------------------------------------------------------------------- HST
@register_pattern("hst", options=HSTOptions)
class HSTPattern(BlockPattern):
    """ERNIE-Sparse's Hierarchical Sparse Transformer pattern (see the module docstring).

    Positions g + j * (block_size + 1) are the representatives (the encoder's layout puts them there);
    `representatives` says whether they start as a learned embedding or as their block's mean.
    """

    @property
    def representatives(self) -> str:
        return self.options.representatives

    def _tile_size(self) -> int:
        return self.options.block_size + 1

    def key_blocks(self, blocks: int) -> tuple[np.ndarray, np.ndarray]:
        return _window_table(blocks, self.options.neighbours)  # the local stage's tiles

    def _mask(self, n: int) -> np.ndarray:
        g, tile, side = self.global_tokens, self._tile_size(), self.options.neighbours
        t = np.arange(n - g)
        block, is_rep = t // tile, (t % tile) == 0
        near = np.abs(block[:, None] - block[None, :]) <= side
        same = block[:, None] == block[None, :]
        body = np.where(
            is_rep[:, None],
            same | is_rep[None, :],                                            # rep: own block, all reps
            (near & ~is_rep[None, :]) | (same & is_rep[None, :]),              # token: blocks, own rep
        )
        mask = np.zeros((n, n), dtype=bool)
        mask[g:, g:] = body
        mask[:g, :g] = True                   # globals see each other
        mask[:g, g:] = is_rep[None, :]        # ... and the representatives
        mask[g:, :g] = is_rep[:, None]        # representatives see the globals
        return mask

    def attend(self, q, k, v, *, normaliser, key_padding_mask=None, dropout_p=0.0, need_weights=False):
        self._check(q, k)
        b, h, n, d = q.shape
        g, tile, side = self.global_tokens, self._tile_size(), self.options.neighbours
        if n <= g:
            return super().attend(q, k, v, normaliser=normaliser, key_padding_mask=key_padding_mask, dropout_p=dropout_p, need_weights=need_weights)
        blocks = self._tiles(n)
        keys_ok = key_padding_mask if key_padding_mask is not None else torch.ones(1, n, dtype=torch.bool, device=q.device)
        tiles_ok = mask_tiles(keys_ok, g, blocks, tile)  # (B or 1, blocks, tile); slot 0 = representative
        qt, kt, vt = (to_tiles(x, g, blocks, tile) for x in (q, k, v))
        run = dict(normaliser=normaliser, dropout_p=dropout_p, need_weights=need_weights)

        reps = KeySource(kt[:, :, None, :, 0], vt[:, :, None, :, 0], tiles_ok[:, None, None, None, :, 0])  # shared
        globals_ = [KeySource(k[:, :, None, :g], v[:, :, None, :g], keys_ok[:, None, None, None, :g])] if g else []

        # Local stage: the block's tokens over their block (+ neighbours' tokens) and its representative.
        index, ok, _ = self._table(blocks, q.device)
        pad_free = key_padding_mask is None and (n - g) % tile == 0  # no mask needed (SDPA runs unmasked)
        if side == 0:
            local = KeySource(kt, vt, None if pad_free else tiles_ok[:, None, :, None, :])
        else:
            own = index == torch.arange(blocks, device=q.device)[:, None]
            valid = tiles_ok[:, index] & ok[None, :, :, None] & (own[:, :, None] | (torch.arange(tile, device=q.device) > 0))[None]
            local = KeySource(gather_tiles(kt, index), gather_tiles(vt, index), valid.flatten(2)[:, None, :, None, :])
        # Every slot of a tile is a query here, the representative's too (its row is replaced below):
        # whole tiles in and out, no slices, so the backward needs no zero-filled gradient buffers.
        out_tok, w_tok, valid_tok = attend_tiles(qt, [local], **run)
        # Global stage: representatives over their block's tokens, all representatives and the globals.
        is_rep = torch.arange(tile, device=q.device) == 0
        own_tokens = KeySource(kt, vt, tiles_ok[:, None, :, None, :] & ~is_rep)  # the tile, less its representative
        out_rep, w_rep, valid_rep = attend_tiles(qt[:, :, :, :1], [own_tokens, reps, *globals_], **run)
        out = from_tiles(torch.where(is_rep[:, None], out_rep, out_tok), n - g)
        groups = []
        if g:
            out_g, w_g, valid_g = attend_tiles(q[:, :, None, :g], [reps, *globals_], **run)
            out = torch.cat([out_g[:, :, 0], out], dim=2)
            if need_weights:
                rep_keys = g + torch.arange(blocks, device=q.device) * tile
                keys = torch.cat([rep_keys, torch.arange(g, device=q.device)])[None]
                groups.append(RowGroup(torch.arange(g, device=q.device), keys, w_g[:, :, 0], valid_g[:, :, 0]))
        if not need_weights:
            return out, None, None
        starts = g + torch.arange(blocks, device=q.device) * tile
        rep_rows, tok_rows = starts, (starts[:, None] + torch.arange(1, tile, device=q.device)).flatten()
        keep_rep, keep_tok = rep_rows < n, tok_rows < n
        rep_keys = torch.cat([
            starts[:, None] + torch.arange(tile, device=q.device),      # own tile (its representative masked)
            starts.expand(blocks, blocks),                              # every representative
            torch.arange(g, device=q.device).expand(blocks, g),         # the global tokens
        ], dim=1)
        groups.append(RowGroup(rep_rows[keep_rep], rep_keys[keep_rep], w_rep.flatten(2, 3)[:, :, keep_rep], valid_rep.flatten(2, 3)[:, :, keep_rep]))
        tok_keys = _tile_keys(g, index, tile)
        tok_block = torch.arange(blocks, device=q.device).repeat_interleave(tile - 1)[keep_tok]
        valid_tok = valid_tok[:, :, :, 1:].expand(-1, -1, -1, tile - 1, -1).flatten(2, 3)
        w_tok = w_tok[:, :, :, 1:].flatten(2, 3)
        groups.append(RowGroup(tok_rows[keep_tok], tok_keys[tok_block], w_tok[:, :, keep_tok], valid_tok[:, :, keep_tok]))
        return out, groups, None
