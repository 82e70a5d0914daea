"""Block-sparse patterns: local and BigBird (ITC); their shared tile bookkeeping (`BlockPattern`).

Each cuts the sequence after its `global_tokens` (a classifier's CLS vector) into blocks of
`block_size` and computes attention tile by tile (`block_sparse.attend_tiles`): cost O(n * block)
instead of O(n^2), for every normaliser. Each also gives its dense boolean mask, and the tests hold
every fast path to masked dense attention under that mask.

Global tokens (positions 0 .. global_tokens - 1) see every key and are seen by every query.
ERNIE-Sparse's hierarchical pattern (HST) builds on these in `hst.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from sparse_runner.attention.block_sparse import (
    KeySource,
    RowGroup,
    attend_tiles,
    from_tiles,
    gather_tiles,
    mask_tiles,
    to_tiles,
)
from sparse_runner.attention.layout import SequenceLayout
from sparse_runner.attention.patterns import Pattern, register_pattern


def _block_size(help_text: str = "a positive int (tokens per block)"):
    return field(default=64, metadata={"valid": lambda b: b > 0, "help": help_text})


def _non_negative(default: int, help_text: str):
    return field(default=default, metadata={"valid": lambda x: x >= 0, "help": help_text})


@dataclass(frozen=True)
class LocalOptions:
    block_size: int = _block_size()
    neighbours: int = _non_negative(0, "an int >= 0 (blocks seen on each side of a query's own block)")


@dataclass(frozen=True)
class BigBirdOptions:
    block_size: int = _block_size()
    window: int = field(default=3, metadata={"valid": lambda w: w > 0 and w % 2 == 1, "help": "an odd int > 0 (blocks of the sliding window)"})
    global_blocks: int = field(default=2, metadata={"valid": lambda g: g in (0, 1, 2), "help": "0, 1 (first block) or 2 (first and last)"})
    random_blocks: int = _non_negative(3, "an int >= 0 (random key blocks per query block)")
    seed: int = _non_negative(0, "an int >= 0 (seeds the random blocks, with the layer index)")


class BlockPattern(Pattern):
    """Shared by the block patterns: self-attention only, a sequence layout, the tile bookkeeping."""

    representatives: str | None = None  # HST: how the encoder makes each block's representative token
    self_attention_only = True
    # Tokens the encoder's layout has moved every block boundary right by (SAR's second pass, the shifted
    # test); set by `layout.shifted_blocks`.
    block_shift = 0
    # Tiles of explicit scores (model.attention_impl=explicit is what they do; the other impls do not apply).
    ignores_attention_impl = "block patterns compute their own blocks"

    def __init__(self, options=None, *, global_tokens: int = 0, layer: int = 0) -> None:
        super().__init__(options, global_tokens=global_tokens, layer=layer)
        self._tables: dict = {}

    def key_blocks(self, blocks: int) -> tuple[np.ndarray, np.ndarray]:
        """(index (blocks, K) int, ok (blocks, K) bool): the key blocks of every query block; a slot
        that is not ok (off the edge, or a repeat) is masked."""
        raise NotImplementedError

    def _table(self, blocks: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """`key_blocks(blocks)` on `device`, and whether every block sees only itself; made once per
        (blocks, device), so the forward pass neither copies the table nor waits on the device."""
        key = (blocks, device)
        if key not in self._tables:
            index, ok = self.key_blocks(blocks)
            own_only = index.shape[1] == 1 and bool(ok.all()) and bool((index[:, 0] == np.arange(blocks)).all())
            self._tables[key] = (torch.as_tensor(index, device=device), torch.as_tensor(ok, device=device), own_only)
        return self._tables[key]

    def sequence_layout(self, d_model: int) -> SequenceLayout:
        return SequenceLayout(self.options.block_size, self.global_tokens, d_model, self.representatives)

    def _check(self, q: torch.Tensor, k: torch.Tensor) -> None:
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"pattern {self.name!r} is for self-attention; got {q.shape[-2]} queries and {k.shape[-2]} keys")

    def _tile_size(self) -> int:
        return self.options.block_size

    def _tiles(self, n: int) -> int:
        return max(1, math.ceil((n - self.global_tokens) / self._tile_size()))

    def dense_mask(self, n_queries: int, n_keys: int, device: torch.device | str = "cpu") -> torch.Tensor:
        if n_queries != n_keys:
            raise ValueError(f"pattern {self.name!r} is for self-attention; got {n_queries} queries and {n_keys} keys")
        return torch.as_tensor(self._mask(n_queries), device=device)

    def _mask(self, n: int) -> np.ndarray:
        raise NotImplementedError


# ----------------------------------------------------------------------------- local and BigBird
class KeyBlockPattern(BlockPattern):
    """A pattern given by a table: query block i attends to the key blocks `table[i]` (and to the
    global tokens); some query blocks (BigBird's global blocks) attend to everything."""

    def dense_blocks(self, blocks: int) -> list[int]:
        """Query blocks that attend to every key."""
        return []

    def _mask(self, n: int) -> np.ndarray:
        g, bs = self.global_tokens, self.options.block_size
        blocks = self._tiles(n)
        index, ok = self.key_blocks(blocks)
        block_mask = np.zeros((blocks, blocks), dtype=bool)
        rows = np.repeat(np.arange(blocks), index.shape[1])
        block_mask[rows[ok.ravel()], index.ravel()[ok.ravel()]] = True
        block_mask[self.dense_blocks(blocks)] = True
        of = np.arange(n - g) // bs
        mask = np.ones((n, n), dtype=bool)  # global rows and columns see / are seen by all
        mask[g:, g:] = block_mask[of[:, None], of[None, :]]
        return mask

    def attend(self, q, k, v, *, normaliser, key_padding_mask=None, dropout_p=0.0, need_weights=False):
        self._check(q, k)
        b, h, n, d = q.shape
        g, bs = self.global_tokens, self.options.block_size
        if n <= g:  # nothing but global tokens: plain dense attention
            return super().attend(q, k, v, normaliser=normaliser, key_padding_mask=key_padding_mask, dropout_p=dropout_p, need_weights=need_weights)
        blocks = self._tiles(n)
        keys_ok = key_padding_mask if key_padding_mask is not None else torch.ones(1, n, dtype=torch.bool, device=q.device)
        tiles_ok = mask_tiles(keys_ok, g, blocks, bs)  # (B or 1, blocks, bs)
        qt, kt, vt = (to_tiles(x, g, blocks, bs) for x in (q, k, v))

        index, ok, own_only = self._table(blocks, q.device)
        # Nothing padded (no padding mask, whole blocks): the keys need no mask, and SDPA runs unmasked.
        pad_free = key_padding_mask is None and (n - g) % bs == 0
        if own_only:
            sources = [KeySource(kt, vt, None if pad_free else tiles_ok[:, None, :, None, :])]  # own block only: no gather
        else:
            valid = (tiles_ok[:, index] & ok[None, :, :, None]).flatten(2)  # (B or 1, blocks, K * bs)
            sources = [KeySource(gather_tiles(kt, index), gather_tiles(vt, index), valid[:, None, :, None, :])]
        if g:
            sources.append(KeySource(k[:, :, None, :g], v[:, :, None, :g], keys_ok[:, None, None, None, :g]))
        out_t, w_t, valid_t = attend_tiles(qt, sources, normaliser=normaliser, dropout_p=dropout_p, need_weights=need_weights)
        out = from_tiles(out_t, n - g)

        # Rows that see every key: the global tokens, then the global blocks' queries.
        dense_rows = torch.cat([
            torch.arange(g, device=q.device),
            *(torch.arange(g + i * bs, min(g + (i + 1) * bs, n), device=q.device) for i in self.dense_blocks(blocks)),
        ])
        if g:
            out = torch.cat([out.new_zeros(b, h, g, d), out], dim=2)
        groups = []
        if len(dense_rows):
            everything = KeySource(k[:, :, None], v[:, :, None], keys_ok[:, None, None, None, :])
            out_d, w_d, valid_d = attend_tiles(q[:, :, None, dense_rows], [everything], normaliser=normaliser, dropout_p=dropout_p, need_weights=need_weights)
            out = out.index_copy(2, dense_rows, out_d[:, :, 0])
            if need_weights:
                groups.append(RowGroup(dense_rows, torch.arange(n, device=q.device)[None], w_d[:, :, 0], valid_d[:, :, 0]))
        if not need_weights:
            return out, None, None
        body_rows = torch.arange(g, n, device=q.device)
        tiled_rows = body_rows[~torch.isin(body_rows, dense_rows)]
        pick = tiled_rows - g
        keys = _tile_keys(g, index, bs)  # (blocks, K * bs)
        if g:
            keys = torch.cat([keys, torch.arange(g, device=q.device).expand(blocks, g)], dim=1)
        valid_rows = valid_t.expand(-1, -1, -1, bs, -1).flatten(2, 3)[:, :, pick]
        groups.append(RowGroup(tiled_rows, keys[pick // bs], w_t.flatten(2, 3)[:, :, pick], valid_rows))
        return out, groups, None


@register_pattern("local", options=LocalOptions)
class LocalPattern(KeyBlockPattern):
    """Blocks of `block_size`; a query sees its own block and `neighbours` blocks on each side, plus
    the global tokens (LRA's "Local Attention" baseline)."""

    def key_blocks(self, blocks: int) -> tuple[np.ndarray, np.ndarray]:
        return _window_table(blocks, self.options.neighbours)

    def _mask(self, n: int) -> np.ndarray:  # from the definition, not from the table
        g, bs = self.global_tokens, self.options.block_size
        of = np.arange(n - g) // bs
        mask = np.ones((n, n), dtype=bool)
        mask[g:, g:] = np.abs(of[:, None] - of[None, :]) <= self.options.neighbours
        return mask


@register_pattern("bigbird", options=BigBirdOptions)
class BigBirdPattern(KeyBlockPattern):
    """BigBird's ITC pattern (Zaheer et al. 2020), the LRA baseline: a sliding window of `window`
    blocks, global blocks (first, and last) that see and are seen by everything, and `random_blocks`
    random key blocks per query block.

    Assumption: the random blocks are drawn once per layer from (seed, layer, number of blocks), not
    redrawn every step; the eval-time pattern is then the trained one, and the dense mask is fixed.
    """

    def dense_blocks(self, blocks: int) -> list[int]:
        return sorted({0, blocks - 1}) if self.options.global_blocks == 2 else [0][: self.options.global_blocks]

    def key_blocks(self, blocks: int) -> tuple[np.ndarray, np.ndarray]:
        o = self.options
        return _bigbird_table(blocks, o.window // 2, tuple(self.dense_blocks(blocks)), o.random_blocks, o.seed, self.layer)


def _tile_keys(start: int, index: torch.Tensor, tile: int) -> torch.Tensor:
    """(blocks, K) tile index table -> (blocks, K * tile): the sequence position of every gathered key."""
    within = torch.arange(tile, device=index.device)
    return (start + index[:, :, None] * tile + within).flatten(1)


def _window_table(blocks: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.arange(-side, side + 1)
    index = np.arange(blocks)[:, None] + offsets[None, :]
    ok = (index >= 0) & (index < blocks)
    return np.clip(index, 0, blocks - 1), ok


@lru_cache(maxsize=64)
def _bigbird_table(blocks: int, side: int, global_blocks: tuple[int, ...], random_blocks: int, seed: int, layer: int):
    window, window_ok = _window_table(blocks, side)
    rng = np.random.default_rng([seed, layer, blocks])
    n_random = min(random_blocks, blocks)
    index = np.zeros((blocks, window.shape[1] + len(global_blocks) + n_random), dtype=np.int64)
    ok = np.zeros_like(index, dtype=bool)
    for i in range(blocks):
        seen = set(window[i][window_ok[i]].tolist())
        row = list(window[i][window_ok[i]]) + [j for j in global_blocks if j not in seen]
        candidates = np.array(sorted(set(range(blocks)) - seen - set(global_blocks)), dtype=np.int64)
        row += sorted(rng.choice(candidates, size=min(n_random, len(candidates)), replace=False).tolist())
        index[i, : len(row)], ok[i, : len(row)] = row, True
    return index, ok
