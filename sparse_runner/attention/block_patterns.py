"""Block-sparse patterns: local and BigBird (ITC); their shared tile bookkeeping (`BlockPattern`).

Each cuts the sequence after its `global_tokens` (a classifier's CLS vector) into blocks of
`block_size` and computes attention tile by tile (`block_sparse.attend_tiles`): cost O(n * block)
instead of O(n^2), for every normaliser. Each also gives its dense boolean mask, and the tests hold
every fast path to masked dense attention under that mask.

Global tokens (positions 0 .. global_tokens - 1) see every key and are seen by every query.
ERNIE-Sparse's hierarchical pattern (HST) builds on these in `hst.py`.

BigBird's heads attend to different keys (each draws its own random blocks): its dense mask is one per
head, `dense_mask(n, n, heads=H)` (H, n, n), which every block pattern gives (the others repeat theirs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from sparse_runner.attention import flex_blocks
from sparse_runner.attention.block_sparse import (
    KeySource,
    RowGroup,
    attend_tiles,
    from_tiles,
    gather_tiles,
    gather_valid,
    mask_tiles,
    padding_or_none,
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
    random_per_head: bool = field(default=True, metadata={"help": "true (every head draws its own random blocks, as BigBird) or false (one draw that every head shares)"})


class BlockPattern(Pattern):
    """Shared by the block patterns: self-attention only, a sequence layout, the tile bookkeeping."""

    representatives: str | None = None  # HST: how the encoder makes each block's representative token
    self_attention_only = True
    # Tokens the encoder's layout has moved every block boundary right by (SAR's second pass, the shifted
    # test); set by `layout.shifted_blocks`.
    block_shift = 0
    # Tiles of explicit scores (model.attention_impl=explicit is what they do; flex: softmax through FlexAttention,
    # flex_blocks.py; the other impls do not apply).
    ignores_attention_impl = "block patterns compute their own blocks"
    # What model.attention_impl=flex computes through FlexAttention (flex_blocks.py); "": it does not apply.
    flex_engine = ""

    def __init__(self, options=None, *, global_tokens: int = 0, layer: int = 0) -> None:
        super().__init__(options, global_tokens=global_tokens, layer=layer)
        self._tables: dict = {}

    def key_blocks(self, blocks: int, heads: int | None = None, drawn: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(index, ok): the key blocks of every query block, (blocks, K) for every head, or one table per
        head, (heads, blocks, K), when `heads` is given; a slot that is not ok (off the edge, or a repeat)
        is masked. drawn: the blocks of the sequence before the layout moved every block boundary right
        (`block_shift`; default `blocks`, no shift)."""
        raise NotImplementedError

    def heads_differ(self, drawn: int) -> bool:
        """Whether the heads attend to different key blocks in a sequence of `drawn` unshifted blocks."""
        return False

    def window_side(self) -> int | None:
        """s, where every query block sees the key blocks i - s .. i + s that exist and no other, whatever the
        block count and in every head (from the options; 0: its own block only); None where a table says which
        (BigBird's global and random blocks)."""
        return None

    def _attend_table(self, blocks: int, drawn: int, heads: int, device: torch.device, need_weights: bool) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
        """`_gather_table` for `attend`. Where a window gives the key blocks (`window_side`) and the weights' key
        positions are not asked for: (None, None, True), no table, for the own block only; under torch.compile,
        the window's table computed from the block count (`window_table`).

        Why: looked up per count (`_gather_table`), a table made Dynamo trace a new graph for every block count,
        until its limit of 8 sent the model to eager (measured on a one-layer classifier over 7 lengths: 37 graphs
        with HST, 7 with local's window of one block on each side). Computed from the count, it traces one
        graph for every length, as a dense model does; batches padded to their longest sequence meet a new count
        often. BigBird's random blocks are numpy draws per count and still trace a graph per count."""
        side = None if need_weights else self.window_side()
        if side == 0:
            return None, None, True
        if side is not None and torch.compiler.is_compiling():
            index, ok = window_table(blocks, side, device)
            return index, ok, False
        return self._gather_table(blocks, drawn, heads, device, union=need_weights)

    def _gather_table(self, blocks: int, drawn: int, heads: int, device: torch.device, union: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """(index, ok, own_only) for `attend`, on `device`; made once per (blocks, drawn, heads, device), so
        the forward pass neither copies the table nor waits on the device. index: (blocks, K) when every
        head gathers the same key blocks, else (heads, blocks, K); ok: index's shape. own_only: every block
        sees only itself. union (heads that differ): every head gathers, for each query block, the union of
        the heads' key blocks, index (blocks, K'), and ok (heads, blocks, K') keeps each head's own, so that
        a slot holds the same key in every head (the weights' `RowGroup`s).
        A compiled model (trainer.compile, whose very first step runs eagerly) meets the making (numpy) at the
        first step of a new block count only, as a graph break; after it the table is a cached constant of that
        count's graph. (Not `torch.compiler.disable`: that
        would import torch._dynamo, and with it triton, whenever this module is imported.)"""
        key = ("gather", blocks, drawn, heads, union, device)
        if key not in self._tables:
            self._tables[key] = self._make_gather_table(blocks, drawn, heads, device, union)
        return self._tables[key]

    def _make_gather_table(self, blocks: int, drawn: int, heads: int, device: torch.device, union: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
        if self.heads_differ(drawn):
            index, ok = self.key_blocks(blocks, heads=heads, drawn=drawn)
            if union:
                index, ok = _union_table(index, ok)
            own_only = False
        else:
            index, ok = self.key_blocks(blocks, drawn=drawn)
            own_only = index.shape[1] == 1 and bool(ok.all()) and bool((index[:, 0] == np.arange(blocks)).all())
        return torch.tensor(index, device=device), torch.tensor(ok, device=device), own_only

    def sequence_layout(self, d_model: int) -> SequenceLayout:
        return SequenceLayout(self.options.block_size, self.global_tokens, d_model, self.representatives)

    def _check(self, q: torch.Tensor, k: torch.Tensor) -> None:
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"pattern {self.name!r} is for self-attention; got {q.shape[-2]} queries and {k.shape[-2]} keys")

    def _tile_size(self) -> int:
        return self.options.block_size

    def _tiles(self, n: int) -> int:
        return max(1, math.ceil((n - self.global_tokens) / self._tile_size()))

    def dense_mask(self, n_queries: int, n_keys: int, device: torch.device | str = "cpu", heads: int | None = None) -> torch.Tensor:
        """(n, n) bool, True where a query may attend a key, in every head; with `heads`, one mask per head,
        (heads, n, n). Without `heads`, a pattern whose heads see different keys (BigBird's random blocks
        drawn per head) raises ValueError, unless its heads happen to agree at this length."""
        if n_queries != n_keys:
            raise ValueError(f"pattern {self.name!r} is for self-attention; got {n_queries} queries and {n_keys} keys")
        if heads is None:
            return torch.as_tensor(self._mask(n_queries), device=device)
        return torch.as_tensor(self._head_masks(n_queries, heads), device=device)

    def _mask(self, n: int) -> np.ndarray:
        raise NotImplementedError

    def _head_masks(self, n: int, heads: int) -> np.ndarray:
        """(heads, n, n): the mask of every head (here all the same)."""
        return np.repeat(self._mask(n)[None], heads, axis=0)


# ----------------------------------------------------------------------------- local and BigBird
class KeyBlockPattern(BlockPattern):
    """A pattern given by a table: query block i attends to the key blocks `table[i]` (and to the
    global tokens); some query blocks (BigBird's global blocks) attend to everything. The table may
    differ from head to head (BigBird's random blocks)."""

    flex_engine = "the whole layer"

    def dense_blocks(self, blocks: int, drawn: int | None = None) -> list[int]:
        """Query blocks that attend to every key (drawn: see `key_blocks`)."""
        return []

    def _unshifted_tiles(self, n: int) -> int:
        """The blocks of the layer's n positions before the layout moved every block boundary `block_shift`
        tokens right, by putting that many masked positions in front (and none at the end): `_tiles(n)`, or
        fewer when the shift pushed tokens into a new last block."""
        return min(self._tiles(n), max(1, math.ceil((n - self.global_tokens - self.block_shift) / self._tile_size())))

    def _mask(self, n: int) -> np.ndarray:
        return self._block_masks(n, None)

    def _head_masks(self, n: int, heads: int) -> np.ndarray:
        if not self.heads_differ(self._unshifted_tiles(n)):
            return super()._head_masks(n, heads)
        return self._block_masks(n, heads)

    def _block_masks(self, n: int, heads: int | None) -> np.ndarray:
        """(n, n), or (heads, n, n) with `heads`: the mask that `key_blocks` and `dense_blocks` give."""
        g, bs = self.global_tokens, self.options.block_size
        blocks, drawn = self._tiles(n), self._unshifted_tiles(n)
        index, ok = self.key_blocks(blocks, heads=heads, drawn=drawn)
        lead = index.shape[:-2]
        block_mask = np.zeros((*lead, blocks, blocks), dtype=bool)
        *head, rows, _ = np.nonzero(ok)
        block_mask[(*head, rows, index[ok])] = True
        block_mask[..., self.dense_blocks(blocks, drawn), :] = True
        of = np.arange(n - g) // bs
        mask = np.ones((*lead, n, n), dtype=bool)  # global rows and columns see / are seen by all
        mask[..., g:, g:] = block_mask[..., of[:, None], of[None, :]]
        return mask

    def attend(self, q, k, v, *, normaliser, key_padding_mask=None, dropout_p=0.0, need_weights=False):
        self._check(q, k)
        b, h, n, d = q.shape
        g, bs = self.global_tokens, self.options.block_size
        if n <= g:  # nothing but global tokens: plain dense attention
            return super().attend(q, k, v, normaliser=normaliser, key_padding_mask=key_padding_mask, dropout_p=dropout_p, need_weights=need_weights)
        blocks, drawn = self._tiles(n), self._unshifted_tiles(n)
        key_padding_mask = padding_or_none(key_padding_mask)
        if flex_blocks.takes(self.impl, normaliser, dropout_p, need_weights):  # model.attention_impl=flex: one call, the whole layer
            layout = flex_blocks.cached_layout(self, ("key_blocks", n, drawn, h, q.device), lambda: flex_blocks.key_block_layout(self, n, h, q.device))
            return flex_blocks.attend(q, k, v, layout, key_padding_mask), None, None
        keys_ok = key_padding_mask if key_padding_mask is not None else torch.ones(1, n, dtype=torch.bool, device=q.device)
        tiles_ok = mask_tiles(keys_ok, g, blocks, bs)  # (B or 1, blocks, bs)
        qt, kt, vt = (to_tiles(x, g, blocks, bs) for x in (q, k, v))

        # With the weights, heads that differ gather the union of their key blocks (`_gather_table`).
        index, ok, own_only = self._attend_table(blocks, drawn, h, q.device, need_weights)
        # Nothing padded (no padding mask, whole blocks): the keys need no mask, and SDPA runs unmasked.
        pad_free = key_padding_mask is None and (n - g) % bs == 0
        if own_only:
            sources = [KeySource(kt, vt, None if pad_free else tiles_ok[:, None, :, None, :])]  # own block only: no gather
        else:
            sources = [KeySource(gather_tiles(kt, index), gather_tiles(vt, index), gather_valid(tiles_ok, index, ok))]
        if g:
            sources.append(KeySource(k[:, :, None, :g], v[:, :, None, :g], keys_ok[:, None, None, None, :g]))
        out_t, w_t, valid_t = attend_tiles(qt, sources, normaliser=normaliser, dropout_p=dropout_p, need_weights=need_weights, impl=self.impl)
        out = from_tiles(out_t, n - g)

        # Rows that see every key: the global tokens, then the global blocks' queries.
        dense_rows = torch.cat([
            torch.arange(g, device=q.device),
            *(torch.arange(g + i * bs, min(g + (i + 1) * bs, n), device=q.device) for i in self.dense_blocks(blocks, drawn)),
        ])
        if g:
            out = torch.cat([out.new_zeros(b, h, g, d), out], dim=2)
        groups = []
        if len(dense_rows):
            # Without padding no mask: SDPA then runs its unmasked kernel.
            everything = KeySource(k[:, :, None], v[:, :, None], None if key_padding_mask is None else keys_ok[:, None, None, None, :])
            out_d, w_d, valid_d = attend_tiles(q[:, :, None, dense_rows], [everything], normaliser=normaliser, dropout_p=dropout_p, need_weights=need_weights, impl=self.impl)
            out = out.index_copy(2, dense_rows, out_d[:, :, 0])
            if need_weights:
                groups.append(RowGroup(dense_rows, torch.arange(n, device=q.device)[None], w_d[:, :, 0], valid_d[:, :, 0]))
        if not need_weights:
            return out, None, None
        body_rows = torch.arange(g, n, device=q.device)
        tiled_rows = body_rows[~torch.isin(body_rows, dense_rows)]
        pick = tiled_rows - g
        keys = _tile_keys(g, index, bs)  # (blocks, K * bs): index is one table for every head here
        if g:
            keys = torch.cat([keys, torch.arange(g, device=q.device).expand(blocks, g)], dim=1)
        valid_rows = valid_t.expand(-1, -1, -1, bs, -1).flatten(2, 3)[:, :, pick]
        groups.append(RowGroup(tiled_rows, keys[pick // bs], w_t.flatten(2, 3)[:, :, pick], valid_rows))
        return out, groups, None


@register_pattern("local", options=LocalOptions)
class LocalPattern(KeyBlockPattern):
    """Blocks of `block_size`; a query sees its own block and `neighbours` blocks on each side, plus
    the global tokens (LRA's "Local Attention" baseline)."""

    def key_blocks(self, blocks: int, heads: int | None = None, drawn: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        return _for_heads(*_window_table(blocks, self.options.neighbours), heads)

    def window_side(self) -> int:
        return self.options.neighbours

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
    random key blocks per query block, drawn for every head on its own as in BigBird
    (`random_per_head: false`: one draw that every head shares, for the ablation).

    Assumption: the random blocks are drawn once per layer and head (`bigbird_table`), not redrawn every
    step; the eval-time pattern is then the trained one, and the dense masks are fixed. Under SAR's
    shifted block boundaries (`block_shift`) every block keeps its random blocks (`bigbird_table`).
    """

    def dense_blocks(self, blocks: int, drawn: int | None = None) -> list[int]:
        return bigbird_global_blocks(blocks, self.options.global_blocks, drawn)

    def heads_differ(self, drawn: int) -> bool:
        o = self.options
        return o.random_per_head and not _random_blocks_forced(drawn, o.window // 2, o.global_blocks, o.random_blocks)

    def key_blocks(self, blocks: int, heads: int | None = None, drawn: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        o = self.options
        if heads is None and self.heads_differ(blocks if drawn is None else drawn):
            raise ValueError(f"pattern {self.name!r} draws its random blocks per head (random_per_head): give heads= for one table (mask) per head")
        index, ok = bigbird_table(
            blocks, o.window // 2, o.global_blocks, o.random_blocks, o.seed, self.layer,
            heads=heads or 1, per_head=o.random_per_head, drawn_blocks=drawn,
        )
        return (index[0], ok[0]) if heads is None else (index, ok)


def _tile_keys(start: int, index: torch.Tensor, tile: int) -> torch.Tensor:
    """(blocks, K) tile index table -> (blocks, K * tile): the sequence position of every gathered key."""
    within = torch.arange(tile, device=index.device)
    return (start + index[:, :, None] * tile + within).flatten(1)


def window_table(blocks: int, side: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(index, ok), each (blocks, 2 * side + 1): query block i's key blocks i - side .. i + side, and which of
    them exist (index clipped to 0 .. blocks - 1 where not). torch arithmetic, so that a compiled model traces it
    for a symbolic block count."""
    index = torch.arange(blocks, device=device)[:, None] + torch.arange(-side, side + 1, device=device)
    return index.clamp(0, blocks - 1), (index >= 0) & (index < blocks)


def _window_table(blocks: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """`window_table` as numpy arrays, for the tables and masks made with numpy."""
    index, ok = window_table(blocks, side)
    return index.numpy(), ok.numpy()


def _for_heads(index: np.ndarray, ok: np.ndarray, heads: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A table of every head, (blocks, K), as it is (heads None) or repeated for each head, (heads, blocks, K)."""
    if heads is None:
        return index, ok
    return np.repeat(index[None], heads, axis=0), np.repeat(ok[None], heads, axis=0)


def _union_table(index: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-head tables (heads, blocks, K) -> (index (blocks, K'), ok (heads, blocks, K')): for every query
    block the union of the heads' key blocks (in order of first appearance, head 0's first), and which of
    them each head attends to."""
    blocks = index.shape[1]
    rows = [list(dict.fromkeys(index[:, i][ok[:, i]].tolist())) for i in range(blocks)]
    width = max(len(row) for row in rows)
    union = np.zeros((blocks, width), dtype=np.int64)
    exists = np.zeros((blocks, width), dtype=bool)
    for i, row in enumerate(rows):
        union[i, : len(row)], exists[i, : len(row)] = row, True
    mine = np.where(ok, index, -1)  # (heads, blocks, K)
    head_ok = (union[None, :, :, None] == mine[:, :, None, :]).any(-1) & exists[None]
    return union, head_ok


def bigbird_global_blocks(blocks: int, global_blocks: int, drawn_blocks: int | None = None) -> list[int]:
    """BigBird's global blocks (their queries see every key, every query sees their keys) among `blocks`:
    none (global_blocks=0), the first (1), or the first and the last (2). drawn_blocks: see `bigbird_table`;
    blocks past the last drawn one continue it: with the last block global, they are global too."""
    drawn = blocks if drawn_blocks is None else drawn_blocks
    chosen = ([0] if global_blocks >= 1 else []) + (list(range(drawn - 1, blocks)) if global_blocks == 2 else [])
    return sorted(set(chosen))


def bigbird_table(
    blocks: int,
    side: int,
    global_blocks: int,
    random_blocks: int,
    seed: int,
    layer: int,
    *,
    heads: int = 1,
    per_head: bool = True,
    drawn_blocks: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """BigBird's key blocks of every query block, one table per head: (index, ok), each (heads, blocks, K).

    Row i of head h lists the window (blocks i - side .. i + side that exist), the global blocks
    (`bigbird_global_blocks` with `global_blocks` 0, 1 or 2) and up to `random_blocks` random blocks drawn
    among the other blocks, packed to the left in that order (the random ones sorted); a slot that is not
    ok (past the row's end: the window's edge, a global block inside the window, fewer candidates than
    draws) holds 0. K = 2 * side + 1 + the number of global blocks + min(random_blocks, drawn_blocks), the
    same for every head.

    Every head draws its own random blocks (Zaheer et al. 2020) from numpy's generator seeded with
    (seed, layer, drawn_blocks, h), so head h's blocks do not depend on how many heads there are.
    per_head=False: every head gets one draw, seeded with (seed, layer, drawn_blocks): the table that all
    heads shared before the draws were per head.

    drawn_blocks (default `blocks`): how many blocks the sequence had before its layout moved every block
    boundary right (SAR's second pass, the shifted test: `BlockPattern.block_shift`); the shift may add
    blocks at the end, blocks >= drawn_blocks. The shift moves the boundaries and nothing else:
      - the random blocks are those of the unshifted layout: query block i keeps unshifted block i's random
        key blocks (key block j being the shifted block j), whether or not the number of blocks changed;
      - a block past the last unshifted one holds the tokens the shift pushed past the old end, the tail of
        the last block, and continues it: it takes the last unshifted block's random key blocks, and its
        global status (with global_blocks=2 the last unshifted block stays global, and so do the new ones).
    Only the window follows the shifted layout (blocks i - side .. i + side among `blocks`).
    """
    drawn = blocks if drawn_blocks is None else drawn_blocks
    if not 1 <= drawn <= blocks:
        raise ValueError(f"drawn_blocks must be in 1 .. blocks = {blocks}, got {drawn}")
    window, window_ok = _window_table(blocks, side)
    globals_ = np.array(bigbird_global_blocks(blocks, global_blocks, drawn), dtype=np.int64)
    draws = [_random_rows(drawn, side, global_blocks, random_blocks, seed, layer, h) for h in (range(heads) if per_head else [None])]
    random = np.stack(draws)[:, np.minimum(np.arange(blocks), drawn - 1)]  # (heads or 1, blocks, r)
    lead = (random.shape[0], blocks)
    index = np.concatenate([np.broadcast_to(window, (*lead, window.shape[1])), np.broadcast_to(globals_, (*lead, len(globals_))), random], axis=-1)
    ok = np.concatenate([np.broadcast_to(window_ok, (*lead, window.shape[1])), np.ones((*lead, len(globals_)), dtype=bool), random >= 0], axis=-1)
    # A slot that repeats an earlier slot of its row (a global block inside the window) is masked.
    slots = index.shape[-1]
    earlier = np.tri(slots, slots, -1, dtype=bool)  # [k, j]: slot j comes before slot k
    ok = ok & ~((index[..., :, None] == index[..., None, :]) & ok[..., None, :] & earlier).any(-1)
    order = np.argsort(~ok, axis=-1, kind="stable")  # the slots that count first, in their order
    index, ok = np.take_along_axis(index, order, -1), np.take_along_axis(ok, order, -1)
    index = np.where(ok, index, 0)
    if not per_head:
        index, ok = np.repeat(index, heads, axis=0), np.repeat(ok, heads, axis=0)
    return index, ok


@lru_cache(maxsize=256)
def _random_rows(drawn: int, side: int, global_blocks: int, random_blocks: int, seed: int, layer: int, head: int | None) -> np.ndarray:
    """(drawn, min(random_blocks, drawn)) int64: the random key blocks of every query block of a sequence
    of `drawn` blocks (sorted; -1 past the row's draws when it has fewer candidates), drawn without the
    window and the global blocks. head None: the draw that every head shares (`bigbird_table`)."""
    window, window_ok = _window_table(drawn, side)
    globals_ = bigbird_global_blocks(drawn, global_blocks)
    rng = np.random.default_rng([seed, layer, drawn] if head is None else [seed, layer, drawn, head])
    n_random = min(random_blocks, drawn)
    rows = np.full((drawn, n_random), -1, dtype=np.int64)
    free = np.empty(drawn, dtype=bool)
    for i in range(drawn):
        free[:] = True
        free[window[i][window_ok[i]]] = False
        free[globals_] = False
        candidates = np.flatnonzero(free)
        chosen = np.sort(rng.choice(candidates, size=min(n_random, len(candidates)), replace=False))
        rows[i, : len(chosen)] = chosen
    rows.flags.writeable = False
    return rows


@lru_cache(maxsize=256)
def _random_blocks_forced(drawn: int, side: int, global_blocks: int, random_blocks: int) -> bool:
    """Whether every query block's random blocks are all of its candidates, so that every draw (every
    head) gives the same table."""
    if random_blocks == 0:
        return True
    i = np.arange(drawn)
    taken = np.abs(i[:, None] - i[None, :]) <= side
    taken[:, bigbird_global_blocks(drawn, global_blocks)] = True
    return bool(((~taken).sum(1) <= min(random_blocks, drawn)).all())
