"""ERNIE-Sparse's Hierarchical Sparse Transformer pattern (HST, Liu et al. 2022).

The paper publishes no code; it says that HST "sequentially unif[ies] local and global information":
local tokens first attend inside their block, then representative tokens aggregate global information
and propagate it back, with hierarchical and sparse heads sharing their weights. Every detail below is
our reading (docs/papers.md), each one an option.

The encoder puts one representative token in front of every block (`layout.SequenceLayout`), so a
layer's sequence is [globals][r_1 t_1 .. t_b][r_2 ...]: tiles of block_size + 1 positions.

`stages: 2` (the default), three steps inside ONE layer, all with the layer's one set of Q/K/V/O weights:
  a. local, representatives: r_j attends to its own tile (itself and its block's tokens);
     r_j' = x_j + O(a_j) (a residual, as a layer would add);
  b. global: the representatives r' and the global tokens (a CLS vector) attend to every
     representative r' and every global token (Q/K/V of r' projected again with the same weights);
     r_j'' = x_j + O(a_j + b_j);
  c. local, tokens: every token attends to the tokens of its local topology and to its own block's
     UPDATED representative r_j'' (keys and values projected from r_j''); what the representatives
     gathered globally reaches every token in the same layer.
  The layer returns O(c) for tokens, O(a + b) for representatives (so that after the layer's residual a
  representative is r''), O(b) for global tokens. Between the steps there is no LayerNorm and no
  feed-forward: a step's output joins its input by a residual only.
`stages: 1`: one attention per query over the union of its keys (a token: its local keys and its own
  representative; a representative: its tile, every representative, the globals); what a
  representative gathers reaches its tokens in the next layer only. Kept for the ablation.

`local`, the topology of the tokens' local step: `block` (own block only), `window` (± `neighbours`
blocks), `bigbird` (BigBird's window of ± `neighbours` blocks, its `global_blocks` (first, last) whose
tokens see every token and are seen by every token, and `random_blocks` random blocks per block, drawn
for every head apart as `pattern=bigbird` does (`random_per_head`). One difference from `pattern=bigbird`:
when a shift (SAR, the shifted test) adds a block, HST draws its random blocks again for the new block
count, since its layout pads every block to whole tiles and the layer cannot tell how many blocks the
unshifted sequence had. A token never reads another block's representative.

The global tokens (a classifier's CLS vector) read the representatives and each other, never a token: a
classifier sees its input only through the block summaries, so moving the block boundaries (SAR, the
shifted test) changes its prediction even with one layer, where local's and BigBird's global tokens read
every token and a one-layer classifier's prediction does not depend on the boundaries
(tests/test_topology_shift.py).

Cost per layer: n * (local keys + 1) + (n / block) * (block + 1) + (n / block + globals)^2, never n^2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import torch

from sparse_runner.attention import flex_blocks
from sparse_runner.attention.block_patterns import (
    BlockPattern,
    _block_size,
    _for_heads,
    _non_negative,
    _random_blocks_forced,
    _tile_keys,
    _window_table,
    bigbird_global_blocks,
    bigbird_table,
)
from sparse_runner.attention.block_sparse import KeySource, RowGroup, attend_tiles, from_tiles, gather_tiles, mask_tiles, padding_or_none, to_tiles
from sparse_runner.attention.patterns import register_pattern


@dataclass(frozen=True)
class HSTOptions:
    block_size: int = _block_size()
    stages: int = field(default=2, metadata={"valid": lambda s: s in (1, 2), "help": "2 (local, global, then tokens read the updated representatives) or 1 (one attention over the union)"})
    local: Literal["block", "window", "bigbird"] = "block"
    neighbours: int = _non_negative(1, "an int >= 0 (blocks on each side for local=window and local=bigbird)")
    global_blocks: int = field(default=2, metadata={"valid": lambda g: g in (0, 1, 2), "help": "0, 1 (first block) or 2 (first and last); local=bigbird"})
    random_blocks: int = _non_negative(3, "an int >= 0 (random key blocks per block; local=bigbird)")
    seed: int = _non_negative(0, "an int >= 0 (seeds the random blocks, with the layer index)")
    random_per_head: bool = field(default=True, metadata={"help": "true (every head draws its own random blocks, as BigBird) or false (one draw that every head shares); local=bigbird"})
    representatives: Literal["learned", "pooled", "both"] = "both"


class LayerProjections(Protocol):
    """What two-stage HST needs of its attention layer (`MultiHeadAttention` passes one as `layer`): the
    q, k, v projections' linear parts (weights, no bias), since the projections of a representative's
    x + u are those of x, rows of q, k, v already, plus those of u; and the output projection."""

    def q_linear(self, u: torch.Tensor) -> torch.Tensor:
        """(B, R, d_model) -> (B, H, R, D): u through the q projection's weights alone."""

    def kv_linear(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R, d_model) -> two (B, H, R, D): u through the k and the v projection's weights alone."""

    def out(self, heads: torch.Tensor) -> torch.Tensor:
        """(B, H, R, D) -> (B, R, d_model), the layer's output projection."""


@register_pattern("hst", options=HSTOptions)
class HSTPattern(BlockPattern):
    """ERNIE-Sparse's Hierarchical Sparse Transformer pattern (see the module docstring).

    Positions g + j * (block_size + 1) are the representatives (the encoder's layout puts them there);
    `representatives` says how the layout makes them (learned + the block's position, the block's mean,
    or both added).
    """

    flex_engine = "the token step (the representatives' steps: SDPA)"

    @property
    def representatives(self) -> str:
        return self.options.representatives

    @property
    def reads_layer(self) -> bool:
        return self.options.stages == 2

    def _tile_size(self) -> int:
        return self.options.block_size + 1

    # ------------------------------------------------------------------ topology
    def dense_blocks(self, blocks: int) -> list[int]:
        """Blocks whose tokens attend to every token (BigBird's global blocks)."""
        return bigbird_global_blocks(blocks, self.options.global_blocks) if self.options.local == "bigbird" else []

    def window_side(self) -> int | None:
        o = self.options
        return {"block": 0, "window": o.neighbours}.get(o.local)

    def heads_differ(self, drawn: int) -> bool:
        o = self.options
        return o.local == "bigbird" and o.random_per_head and not _random_blocks_forced(drawn, o.neighbours, o.global_blocks, o.random_blocks)

    def key_blocks(self, blocks: int, heads: int | None = None, drawn: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The token step's key blocks of every block (see `BlockPattern.key_blocks`; `drawn` is always
        `blocks` here, see the module docstring)."""
        o = self.options
        if o.local != "bigbird":
            return _for_heads(*_window_table(blocks, o.neighbours if o.local == "window" else 0), heads)
        if heads is None and self.heads_differ(blocks):
            raise ValueError(f"pattern {self.name!r} with local=bigbird draws its random blocks per head (random_per_head): give heads= for one mask per head")
        index, ok = bigbird_table(blocks, o.neighbours, o.global_blocks, o.random_blocks, o.seed, self.layer, heads=heads or 1, per_head=o.random_per_head)
        return (index[0], ok[0]) if heads is None else (index, ok)

    def stage_masks(self, n: int, heads: int | None = None) -> dict[str, np.ndarray]:
        """(n, n) bool masks of the steps, rows = queries: "representatives" (step a: a representative
        over its tile), "global" (step b: representatives and globals over representatives and globals),
        "tokens" (step c: a token over its local tokens and its own representative; with `heads`, one mask
        per head, (heads, n, n), as local=bigbird's random blocks differ from head to head). `stages: 1`
        attends once over their union (`dense_mask`)."""
        g, tile = self.global_tokens, self._tile_size()
        t = np.arange(n - g)
        block, is_rep = t // tile, (t % tile) == 0
        blocks = self._tiles(n)
        index, ok = self.key_blocks(blocks, heads=heads)
        lead = index.shape[:-2]
        block_mask = np.zeros((*lead, blocks, blocks), dtype=bool)
        *head, rows, _ = np.nonzero(ok)
        block_mask[(*head, rows, index[ok])] = True
        block_mask[..., self.dense_blocks(blocks), :] = True
        block_mask[..., :, self.dense_blocks(blocks)] = True
        same = block[:, None] == block[None, :]
        masks = {name: np.zeros((n, n), dtype=bool) for name in ("representatives", "global")}
        masks["representatives"][g:, g:] = is_rep[:, None] & same
        glob = np.concatenate([np.ones(g, dtype=bool), is_rep])
        masks["global"][:] = glob[:, None] & glob[None, :]
        masks["tokens"] = np.zeros((*lead, n, n), dtype=bool)
        masks["tokens"][..., g:, g:] = ~is_rep[:, None] & ((block_mask[..., block[:, None], block[None, :]] & ~is_rep[None, :]) | (same & is_rep[None, :]))
        return masks

    def _mask(self, n: int) -> np.ndarray:
        masks = self.stage_masks(n)
        return masks["representatives"] | masks["global"] | masks["tokens"]

    def _head_masks(self, n: int, heads: int) -> np.ndarray:
        masks = self.stage_masks(n, heads)
        return masks["representatives"] | masks["global"] | masks["tokens"]

    # ------------------------------------------------------------------ attention
    def attend(self, q, k, v, *, normaliser, key_padding_mask=None, dropout_p=0.0, need_weights=False, layer: LayerProjections | None = None):
        """`Pattern.attend`, plus `layer` (two stages): the layer's projections, with which steps b and c
        project the representatives again."""
        self._check(q, k)
        n, g = q.shape[-2], self.global_tokens
        if n <= g:
            return super().attend(q, k, v, normaliser=normaliser, key_padding_mask=key_padding_mask, dropout_p=dropout_p, need_weights=need_weights)
        if self.options.stages == 2 and layer is None:
            raise ValueError("two-stage HST projects its representatives again between the steps: call it through MultiHeadAttention (or pass layer=)")
        blocks, tile = self._tiles(n), self._tile_size()
        key_padding_mask = padding_or_none(key_padding_mask)
        keys_ok = key_padding_mask if key_padding_mask is not None else torch.ones(1, n, dtype=torch.bool, device=q.device)
        tiles_ok = mask_tiles(keys_ok, g, blocks, tile)  # (B or 1, blocks, tile); slot 0 = representative
        (qg, qt), (kg, kt), (vg, vt) = (_split_positions(x, [g, n - g]) if g else (x[:, :, :0], x) for x in (q, k, v))
        qt, kt, vt = (to_tiles(x, 0, blocks, tile) for x in (qt, kt, vt))
        tiled = _Tiles(qt, kt, vt, qg, kg, vg, tiles_ok, keys_ok, pad_free=key_padding_mask is None and (n - g) % tile == 0)
        run = dict(normaliser=normaliser, dropout_p=dropout_p, need_weights=need_weights, impl=self.impl)
        if self.options.stages == 1:
            return self._one_stage(q, k, v, tiled, run)
        return self._two_stages(q, k, v, tiled, run, layer)

    def _one_stage(self, q, k, v, tiled: _Tiles, run: dict):
        b, h, n, d = q.shape
        g, tile, blocks = self.global_tokens, self._tile_size(), tiled.q.shape[2]
        reps = tiled.representatives()
        globals_ = [KeySource(tiled.kg[:, :, None], tiled.vg[:, :, None], tiled.keys_ok[:, None, None, None, :g])] if g else []
        out_tok, tok_groups = self._token_step(tiled, tiled.k, tiled.v, run)
        # Representatives over their tile (less themselves: they are among `reps`), all representatives and the globals.
        is_rep = torch.arange(tile, device=q.device) == 0
        own_tokens = KeySource(tiled.k, tiled.v, tiled.ok[:, None, :, None, :] & ~is_rep)
        out_rep, w_rep, valid_rep = attend_tiles(tiled.q[:, :, :, :1], [own_tokens, reps, *globals_], **run)
        out = from_tiles(out_tok.slice_scatter(out_rep, dim=3, end=1), n - g)
        groups = []
        if g:
            out_g, w_g, valid_g = attend_tiles(tiled.qg[:, :, None], [reps, *globals_], **run)
            out = torch.cat([out_g[:, :, 0], out], dim=2)
            if run["need_weights"]:
                keys = torch.cat([self._rep_positions(blocks, q.device), torch.arange(g, device=q.device)])[None]
                groups.append(RowGroup(torch.arange(g, device=q.device), keys, w_g[:, :, 0], valid_g[:, :, 0]))
        if not run["need_weights"]:
            return out, None, None
        starts = self._rep_positions(blocks, q.device)
        keep = starts < n
        rep_keys = torch.cat([
            starts[:, None] + torch.arange(tile, device=q.device),      # own tile (its representative masked)
            starts.expand(blocks, blocks),                              # every representative
            torch.arange(g, device=q.device).expand(blocks, g),         # the global tokens
        ], dim=1)
        groups.append(RowGroup(starts[keep], rep_keys[keep], w_rep.flatten(2, 3)[:, :, keep], valid_rep.flatten(2, 3)[:, :, keep]))
        return out, groups + tok_groups, None

    def _two_stages(self, q, k, v, tiled: _Tiles, run: dict, layer: LayerProjections):
        b, h, n, d = q.shape
        g, tile, blocks = self.global_tokens, self._tile_size(), tiled.q.shape[2]
        starts = self._rep_positions(blocks, q.device)
        # The representatives' q, k, v: slot 0 of the tiles (k and v split off, as step c splits off the tokens).
        # Steps b and c project r' = r + u and r'' = r + u'' as these plus the weights times u, u''.
        q_rep = tiled.q[:, :, :, 0]
        (k_rep, k_tok), (v_rep, v_tok) = (_split_positions(t, [1, tile - 1]) for t in (tiled.k, tiled.v))
        # Step a: every representative over its own tile.
        own_tile = KeySource(tiled.k, tiled.v, None if tiled.pad_free else tiled.ok[:, None, :, None, :])
        out_a = attend_tiles(q_rep[:, :, :, None], [own_tile], **{**run, "need_weights": False})[0][:, :, :, 0]  # (B, H, R, D)
        # Step b: representatives (re-projected from r') and globals over both.
        u1 = layer.out(out_a)
        q1 = q_rep + layer.q_linear(u1)
        k1, v1 = (rep[:, :, :, 0] + update for rep, update in zip((k_rep, v_rep), layer.kv_linear(u1)))
        q_b, k_b, v_b = ((torch.cat([t, t1], dim=2) if g else t1) for t, t1 in ((tiled.qg, q1), (tiled.kg, k1), (tiled.vg, v1)))
        ok_b = None if tiled.pad_free else torch.cat([tiled.keys_ok[:, :g], tiled.ok[:, :, 0]], dim=1)[:, None, None, None, :]
        out_b, w_b, valid_b = attend_tiles(q_b[:, :, None], [KeySource(k_b[:, :, None], v_b[:, :, None], ok_b)], **run)
        out_b = out_b[:, :, 0]
        out_rep = out_a + out_b[:, :, g:]
        # Step c: tokens over their local tokens and their block's updated representative r''.
        k2, v2 = (rep + update[:, :, :, None] for rep, update in zip((k_rep, v_rep), layer.kv_linear(layer.out(out_rep))))
        kt, vt = _with_representatives(k2, k_tok), _with_representatives(v2, v_tok)
        out_tok, tok_groups = self._token_step(tiled, kt, vt, run)
        out = from_tiles(out_tok.slice_scatter(out_rep[:, :, :, None], dim=3, end=1), n - g)
        if g:
            out = torch.cat([out_b[:, :, :g], out], dim=2)
        if not run["need_weights"]:
            return out, None, None
        # Reported per query: its last step (tokens: c; representatives and globals: b).
        keep = torch.cat([torch.ones(g, dtype=torch.bool, device=q.device), starts < n])
        rows = torch.cat([torch.arange(g, device=q.device), starts])
        w_b, valid_b = w_b[:, :, 0], valid_b[:, :, 0]
        global_group = RowGroup(rows[keep], rows[None], w_b[:, :, keep], valid_b[:, :, keep])
        return out, [global_group, *tok_groups], None

    def _token_step(self, tiled: _Tiles, kt: torch.Tensor, vt: torch.Tensor, run: dict) -> tuple[torch.Tensor, list[RowGroup]]:
        """Every tile's queries over the tokens of its key blocks and its own tile's representative slot
        of (kt, vt); the representatives' own rows come out too (the caller replaces them). Returns
        (out (B, H, R, tile, D), the token rows' weights as RowGroups when asked)."""
        g, tile = self.global_tokens, self._tile_size()
        qt, ok = tiled.q, tiled.ok
        heads, blocks, device = qt.shape[1], qt.shape[2], qt.device
        if flex_blocks.takes(self.impl, run["normaliser"], run["dropout_p"], run["need_weights"]):  # model.attention_impl=flex
            layout = flex_blocks.cached_layout(self, ("hst_tokens", blocks, heads, device), lambda: flex_blocks.hst_token_layout(self, blocks, heads, device))
            out = flex_blocks.attend(*(x.flatten(2, 3) for x in (qt, kt, vt)), layout, None if tiled.pad_free else ok.flatten(1))
            return out.view(qt.shape), []
        # With the weights, heads that differ gather the union of their key blocks (`_gather_table`).
        index, index_ok, own_only = self._attend_table(blocks, blocks, heads, device, run["need_weights"])
        if own_only:  # no gather: the tile itself
            local = KeySource(kt, vt, None if tiled.pad_free else ok[:, None, :, None, :])
        else:
            per_head, head_ok = (index if index.dim() == 3 else index[None]), (index_ok if index_ok.dim() == 3 else index_ok[None])
            own = per_head == torch.arange(blocks, device=device)[:, None]  # (H or 1, R, K)
            slot_ok = own[..., None] | (torch.arange(tile, device=device) > 0)  # other blocks' representatives: never
            valid = ok[:, per_head] & head_ok[None, ..., None] & slot_ok[None]  # (B or 1, H or 1, R, K, tile)
            local = KeySource(gather_tiles(kt, index), gather_tiles(vt, index), valid.flatten(3)[:, :, :, None, :])
        # Every slot of a tile is a query, the representative's too (its row is replaced by the caller):
        # whole tiles in and out, no slices, so the backward needs no zero-filled gradient buffers.
        out, w, valid_w = attend_tiles(qt, [local], **run)
        dense = self.dense_blocks(blocks)
        dense_out = dense_w = None
        if dense:  # BigBird's global blocks: their tokens see every token and their own representative
            rows = torch.as_tensor(dense, device=device)
            is_rep = torch.arange(tile, device=device) == 0
            every = ok[:, None] & (~is_rep | (torch.arange(blocks, device=device)[None, :, None] == rows[:, None, None]))  # (B, D, R, tile)
            source = KeySource(kt.flatten(2, 3)[:, :, None], vt.flatten(2, 3)[:, :, None], every.flatten(2)[:, None, :, None, :])
            dense_out, dense_w, dense_valid = attend_tiles(qt[:, :, rows], [source], **run)
            out = out.index_copy(2, rows, dense_out)
        if not run["need_weights"]:
            return out, []
        n_body = tiled.keys_ok.shape[1] - g
        starts = self._rep_positions(blocks, device)
        tok_rows = (starts[:, None] + torch.arange(1, tile, device=device)).flatten()
        tok_block = torch.arange(blocks, device=device).repeat_interleave(tile - 1)
        keep = (tok_rows < g + n_body) & ~torch.isin(tok_block, torch.as_tensor(dense, dtype=torch.long, device=device))
        keys = _tile_keys(g, index, tile)
        valid_rows = valid_w[:, :, :, 1:].expand(-1, -1, -1, tile - 1, -1).flatten(2, 3)
        groups = [RowGroup(tok_rows[keep], keys[tok_block[keep]], w[:, :, :, 1:].flatten(2, 3)[:, :, keep], valid_rows[:, :, keep])]
        if dense:
            d_rows = (starts[rows][:, None] + torch.arange(1, tile, device=device)).flatten()
            d_keep = d_rows < g + n_body
            all_keys = (g + torch.arange(blocks * tile, device=device))[None]
            d_valid = dense_valid[:, :, :, 1:].expand(-1, -1, -1, tile - 1, -1).flatten(2, 3)
            groups.append(RowGroup(d_rows[d_keep], all_keys, dense_w[:, :, :, 1:].flatten(2, 3)[:, :, d_keep], d_valid[:, :, d_keep]))
        return out, groups

    def _rep_positions(self, blocks: int, device: torch.device) -> torch.Tensor:
        return self.global_tokens + torch.arange(blocks, device=device) * self._tile_size()


@dataclass
class _Tiles:
    """A layer's q, k, v cut into tiles of block_size + 1 (slot 0: the representative), with their masks."""

    q: torch.Tensor  # (B, H, R, tile, D), views of the layer's q, k, v
    k: torch.Tensor
    v: torch.Tensor
    qg: torch.Tensor  # (B, H, globals, D): the global tokens' q, k, v
    kg: torch.Tensor
    vg: torch.Tensor
    ok: torch.Tensor  # (B or 1, R, tile) bool: real positions
    keys_ok: torch.Tensor  # (B or 1, N) bool
    pad_free: bool  # nothing padded: no mask needed (SDPA runs unmasked)

    def representatives(self) -> KeySource:
        """Every tile's representative as keys shared by all tiles."""
        return KeySource(self.k[:, :, None, :, 0], self.v[:, :, None, :, 0], self.ok[:, None, None, None, :, 0])


def _split_positions(x: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    """x (B, H, ..., positions, D) split along its positions. Split rather than sliced: a split's backward is
    one cat, a slice's a zero-filled buffer the size of x and a copy; and split with the heads moved next to
    D, so that this cat lays the gradient out as the projections lay out q, k, v, every position's heads
    side by side (`block_sparse.attend_tiles` reads such tiles in place)."""
    return tuple(part.movedim(-2, 1) for part in x.movedim(1, -2).split(sizes, dim=-3))


def _with_representatives(reps: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Tiles (B, H, R, tile, D) of reps (B, H, R, 1, D) in slot 0 and tokens (B, H, R, tile - 1, D), laid
    out as the projections lay out (see `_split_positions`)."""
    return torch.cat([reps.movedim(1, -2), tokens.movedim(1, -2)], dim=2).movedim(-2, 1)
