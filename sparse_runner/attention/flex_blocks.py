"""Softmax block patterns through PyTorch's FlexAttention: the pattern's block layout as a `BlockMask`.

`model.attention_impl=flex` (CUDA only, opt-in): a block pattern (local, BigBird, HST's token step) with
softmax and without the analysis' weights computes its attention with one `flex_attention` call over the
whole sequence instead of `block_sparse.attend_tiles`' gathered key tiles, many small kernels per layer
(on an H200 the tiles' HST and BigBird layers took as long at 16k tokens as at 64k: launch-bound). Whether
flex is faster is for a GPU measurement to say (scripts/bench_block_sparse.py --device cuda); until then
`auto` keeps the tiles.

The pattern is given to FlexAttention as a `mask_mod` that reads small lookup tables (`BlockLayout`),
never an n x n tensor:

    allowed[h, block[q], block[kv]]      the key-block table of the pattern (`key_blocks`), one row per query
                                         block, per head when BigBird draws its random blocks per head
    & keys_ok[b, kv]                     key padding
    HST: a representative slot is seen only by its own block's tokens

`create_block_mask` turns it into the `BlockMask` (which 128 x 128 tiles hold any pair; the kernel skips
the others), compiled on CUDA so that the n x n mask is never materialised. The kernel computes whole
128-tiles: with blocks of 64 that is ~2.5x BigBird's pairs and ~6x HST's (its tiles of 65 straddle them;
counted from the layouts at 4k-64k tokens), e.g. 2.5% and 0.6% of the n x n scores at 64k. Layouts and block masks are
cached on the pattern per (sequence length, heads, device): a training step at a seen length rebuilds
nothing. With key padding the cached block mask is reused with every tile masked (`mask_mod` then reads
the batch's padding), so padding never rebuilds it either.

Not taken (the tiles' SDPA computes the call, as without flex): attention dropout (FlexAttention has
none), a normaliser other than softmax, the analysis' weights. FlexAttention has no backward on CPU
(torch 2.13), so a run on CPU refuses `flex` (`spec.check_attention_impl_device`); the forward runs there
eagerly (materialising the scores, exact), which the tests use.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from sparse_runner.attention.block_sparse import record_scores

# FlexAttention's own tile (torch's _DEFAULT_SPARSE_BLOCK_SIZE): the unit the kernel skips or computes.
FLEX_BLOCK = 128
IMPL = "flex"


# ----------------------------------------------------------------------------- when it is taken
def refusal(normaliser: Any, dropout_p: float, need_weights: bool) -> str | None:
    """Why a block pattern's call with model.attention_impl=flex stays on the tiles (None: flex takes it)."""
    if need_weights:
        return "the analysis needs the weights"
    if not normaliser.fused_sdpa:
        return f"{normaliser.name} is not softmax"
    if dropout_p > 0.0:
        return f"attention dropout {dropout_p:g}, which FlexAttention does not have"
    return None


def takes(impl: str, normaliser: Any, dropout_p: float, need_weights: bool) -> bool:
    return impl == IMPL and refusal(normaliser, dropout_p, need_weights) is None


# ----------------------------------------------------------------------------- the layout
@dataclass
class BlockLayout:
    """A block pattern over a sequence of `length` positions, as lookup tables for a `mask_mod`.

    block: (L,) int64, the block of every position; blocks 0 .. R - 1 are the pattern's, block R holds the
        global tokens (they see every key and every query sees them). L = length rounded up to FLEX_BLOCK:
        the kernel may read the tables past the end, where keys are masked anyway.
    allowed: (H', R + 1, R + 1) bool, query block i sees key block j; H' = 1 when every head sees the same
        keys, else one table per head (BigBird's random blocks).
    representative: (L,) bool, HST's representative slots: seen only by their own block's queries.
    """

    length: int
    block: torch.Tensor
    allowed: torch.Tensor
    representative: torch.Tensor
    flex_block: int = FLEX_BLOCK
    _masks: dict = field(default_factory=dict, repr=False)

    def keys_ok(self, key_padding: torch.Tensor | None, batch: int) -> torch.Tensor:
        """(batch, L) bool: the real keys (all of the first `length` without padding), False past the end."""
        rows = torch.ones(1, self.length, dtype=torch.bool, device=self.block.device) if key_padding is None else key_padding
        return torch.nn.functional.pad(rows, (0, self.block.shape[0] - self.length), value=False).expand(batch, -1)

    def mask_mod(self, keys_ok: torch.Tensor, heads: int) -> Callable:
        return _layout_mask(self.block, self.allowed.expand(heads, -1, -1), self.representative, keys_ok)

    def block_mask(self, padded: bool) -> tuple[BlockMask, int]:
        """(the pattern's BlockMask, the flex_block x flex_block tiles it computes per head), made once per
        layout; batch and heads broadcast where they can. padded: every tile that holds a pair is masked
        (none is "full"), so that a mask_mod reading the key padding applies everywhere (`attend`)."""
        if padded not in self._masks:
            heads = self.allowed.shape[0]
            # Compiled, mask_mod is evaluated tile by tile; eager, create_block_mask builds the (1, H', L, L) mask.
            make = _compiled(create_block_mask) if self.block.device.type == "cuda" else create_block_mask
            mask = make(self.mask_mod(self.keys_ok(None, 1), heads), 1, heads, self.length, self.length,
                        device=self.block.device, BLOCK_SIZE=self.flex_block, separate_full_blocks=not padded)
            self._masks[padded] = mask, visited_blocks(mask) // heads  # one sync, here only
        return self._masks[padded]


def _layout_mask(block: torch.Tensor, allowed: torch.Tensor, representative: torch.Tensor, keys_ok: torch.Tensor) -> Callable:
    """The mask_mod of a `BlockLayout`: one code object for every pattern and length (compiled once per shape)."""

    def mask_mod(b, h, q, kv):
        same_block = block[q] == block[kv]
        token = allowed[h, block[q], block[kv]] & ~representative[kv]
        return keys_ok[b, kv] & (token | (representative[kv] & same_block))

    return mask_mod


def layout_from_table(index: torch.Tensor, ok: torch.Tensor, dense_rows: list[int], block: torch.Tensor, representative: torch.Tensor,
                      length: int, flex_block: int = FLEX_BLOCK) -> BlockLayout:
    """A `BlockLayout` from a pattern's key-block table (`BlockPattern._gather_table`).

    index, ok: (R, K) or (H, R, K), the key blocks of every query block and which slots count; dense_rows:
    query blocks that see every key (BigBird's global blocks); block, representative: (length,) per position.
    """
    index, ok = (index, ok) if index.dim() == 3 else (index[None], ok[None])
    heads, blocks = index.shape[:2]
    # Counted, not scattered as bool: a slot that does not count holds some index, and must not clear it.
    counts = torch.zeros(heads, blocks + 1, blocks + 1, dtype=torch.int32, device=index.device)
    counts[:, :blocks].scatter_add_(2, index, ok.to(torch.int32))
    allowed = counts > 0
    allowed[:, dense_rows] = True
    allowed[:, blocks] = True     # global tokens see every key ...
    allowed[:, :, blocks] = True  # ... and are seen by every query
    padded = math.ceil(length / flex_block) * flex_block
    return BlockLayout(length, torch.nn.functional.pad(block, (0, padded - length)), allowed,
                       torch.nn.functional.pad(representative, (0, padded - length), value=False), flex_block)


def key_block_layout(pattern: Any, n: int, heads: int, device: torch.device, flex_block: int = FLEX_BLOCK) -> BlockLayout:
    """Local and BigBird (`block_patterns.KeyBlockPattern`) over n positions: the global tokens, then blocks of
    block_size; what its `dense_mask(n, n, heads=heads)` says, as a layout."""
    g, size = pattern.global_tokens, pattern.options.block_size
    blocks, drawn = pattern._tiles(n), pattern._unshifted_tiles(n)
    index, ok, _ = pattern._gather_table(blocks, drawn, heads, device, union=False)
    position = torch.arange(n, device=device)
    block = torch.where(position < g, blocks, (position - g) // size)
    representative = torch.zeros(n, dtype=torch.bool, device=device)
    return layout_from_table(index, ok, pattern.dense_blocks(blocks, drawn), block, representative, n, flex_block)


def hst_token_layout(pattern: Any, blocks: int, heads: int, device: torch.device, flex_block: int = FLEX_BLOCK) -> BlockLayout:
    """HST's token step (`hst.HSTPattern._token_step`) over its tiles laid end to end, blocks x (block_size + 1)
    positions, slot 0 of each the representative: a token sees the tokens of its key blocks and its own
    block's representative (`stage_masks(n)["tokens"]`)."""
    tile = pattern._tile_size()
    index, ok, _ = pattern._gather_table(blocks, blocks, heads, device, union=False)
    position = torch.arange(blocks * tile, device=device)
    return layout_from_table(index, ok, pattern.dense_blocks(blocks), position // tile, position % tile == 0, blocks * tile, flex_block)


def cached_layout(pattern: Any, key: tuple, build: Callable[[], BlockLayout]) -> BlockLayout:
    """The layout `build` makes, kept on the pattern (beside its gather tables) under `key`."""
    key = ("flex", *key)
    if key not in pattern._tables:
        pattern._tables[key] = build()
    return pattern._tables[key]


# ----------------------------------------------------------------------------- attention
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: BlockLayout, key_padding: torch.Tensor | None) -> torch.Tensor:
    """Softmax attention of q over (k, v) under `layout`: q, k, v (B, H, L, D), L = layout.length; key_padding
    (B or 1, L) bool, True = real key, or None. Returns (B, H, L, D); a query without any key gets zeros."""
    b, h = q.shape[:2]
    cached, tiles = layout.block_mask(padded=key_padding is not None)
    # The cached tiles with a mask_mod for this call: the kernel calls it with the batch's and heads' own
    # indices (the cached mask broadcasts over both), and with padding it reads this batch's real keys.
    block_mask = BlockMask(cached.seq_lengths, cached.kv_num_blocks, cached.kv_indices, cached.full_kv_num_blocks,
                           cached.full_kv_indices, cached.q_num_blocks, cached.q_indices, cached.full_q_num_blocks,
                           cached.full_q_indices, cached.BLOCK_SIZE, layout.mask_mod(layout.keys_ok(key_padding, b), h))
    record_scores(b * h * tiles * layout.flex_block ** 2)  # per head: the mean over heads when they differ
    return _flex(q.device)(q, k, v, block_mask=block_mask)


def visited_blocks(block_mask: BlockMask) -> int:
    """The tiles the kernel computes (partial and full), summed over the mask's batch and heads (one sync)."""
    full = block_mask.full_kv_num_blocks
    return int(block_mask.kv_num_blocks.sum()) + (int(full.sum()) if full is not None else 0)


def _flex(device: torch.device) -> Callable:
    """flex_attention compiled on CUDA (its fused kernel), eager elsewhere (the scores materialised: the CPU
    tests' exact reference). Inside a compiled model the outer compilation takes it."""
    if device.type != "cuda" or torch.compiler.is_compiling():
        return flex_attention
    return _compiled(flex_attention)


# Static shapes: one compilation per sequence length and padding (with dynamic shapes, torch 2.13's CPU
# flex template failed to build at the second length; static is FlexAttention's common use). Dynamo's
# default of 8 compilations per function would send a ninth length to eager flex_attention, whose n x n
# scores do not fit at long lengths: our calls allow RECOMPILES.
RECOMPILES = 64


@functools.cache
def _compiled(fn: Callable) -> Callable:
    compiled = torch.compile(fn, dynamic=False)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with torch._dynamo.config.patch(recompile_limit=RECOMPILES):
            return compiled(*args, **kwargs)

    return call
