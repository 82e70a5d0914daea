"""Block-sparse attention: every tile of queries attends to its own gathered keys; n x n never exists.

A block pattern (local, BigBird, HST) cuts the sequence into tiles and says, for every tile of queries,
where its keys come from: its own tile, neighbouring or randomly chosen tiles gathered by index, and
keys shared by every tile (global tokens, HST's representatives). `attend_tiles` computes attention of
the query tiles over the concatenation of those key sources: the scores of each source (a source shared
by every tile is one plain matmul, never copied per tile), one normalisation across all of them, one
weighted sum per source. Any normaliser works unchanged because it only ever sees rows of scores;
softmax without weights goes through SDPA on the tiles, and the other threshold-form normalisers through a
fused kernel: the C++ one on CPU (kernels/entmax_attention_cpu.py), the Triton one on CUDA
(kernels/entmax_attention_triton.py, where every head and query of a tile sees the same keys).

Why by hand: FlexAttention has no backward on CPU (torch 2.13), and Hugging Face's BigBird kernel only
does softmax and BigBird's own topology (docs/benchmarks.md).

For the analysis, the weights come back as `RowGroup`s: rows of queries, each row holding only its
candidate keys (`valid` says which are real), so their size is that of the sparse pattern too.

Heads may differ (BigBird draws its random blocks per head): a gather table may have a head axis, each
head's query tiles then gathering their own key tiles, and a key source's `valid` may have one too.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from sparse_runner.attention.normalisers import Normaliser


@dataclass
class KeySource:
    """Keys and values that a set of query tiles attends to.

    k, v: (B, H, R, S, D), one block of S keys per query tile, or (B, H, 1, S, D), shared by every tile.
    valid: bool, broadcastable to (B, H, R, T, S) (T = queries per tile), its head axis 1 when every head
    sees the same keys; None = every key is valid.
    """

    k: torch.Tensor
    v: torch.Tensor
    valid: torch.Tensor | None = None


@dataclass
class RowGroup:
    """Attention weights of some query rows over their candidate keys (for the analysis).

    rows: positions of these queries in the layer's sequence (a LongTensor of length Q).
    keys: (Q or 1, S) LongTensor, the position of the key in each slot (anything where not valid); the
        same for every head, so that slot s of a query is one key in every head (head diversity compares
        the heads slot by slot).
    weights: (B, H, Q, S); valid: (B or 1, 1 or H, Q, S) bool, True where the key is one the query may see
        (per head when the heads see different keys: BigBird's per-head random blocks).
    """

    rows: torch.Tensor
    keys: torch.Tensor
    weights: torch.Tensor
    valid: torch.Tensor

    def to_dense(self, n_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights (B, H, Q, n_keys), slots (B, 1 or H, Q, n_keys) int): the slots scattered to their keys,
        and how many valid slots hold each key (0 or 1 in a correct pattern; for tests), per head when
        `valid` is."""
        b, h, q, s = self.weights.shape
        keys = self.keys.expand(q, s).clamp(0, n_keys - 1)
        valid = self.valid.expand(b, self.valid.shape[1], q, s)
        weights = self.weights.new_zeros(b, h, q, n_keys).scatter_add(3, keys.expand(b, h, q, s), self.weights * valid)
        dense_valid = torch.zeros(b, valid.shape[1], q, n_keys, dtype=torch.int64, device=valid.device)
        dense_valid = dense_valid.scatter_add(3, keys.expand(*valid.shape), valid.long())
        return weights, dense_valid


# Materialised (logical) scores, counted while `count_scores()` is active: the tests check that a block
# pattern's cost grows linearly with the length by counting, not timing.
_score_counter: list[int] | None = None


@contextlib.contextmanager
def count_scores() -> Iterator[list[int]]:
    """Inside the block, every attention call adds the number of (query, key) scores it computes
    (batch x heads x queries x candidate keys) to the one-element list this yields."""
    global _score_counter
    outer, _score_counter = _score_counter, [0]
    try:
        yield _score_counter
    finally:
        _score_counter = outer


def record_scores(n: int) -> None:
    if _score_counter is not None:
        _score_counter[0] += int(n)


def attend_tiles(
    q: torch.Tensor,
    sources: list[KeySource],
    *,
    normaliser: Normaliser,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Attention of R tiles of T queries, each over the concatenation of `sources`.

    q: (B, H, R, T, D). Returns (out (B, H, R, T, D), weights (B, H, R, T, S) or None, valid
    (B or 1, 1 or H, R, T, S) bool), S = the sources' key counts summed. A query without any valid key gets
    a zero output (and zero weights), whatever the normaliser.
    impl: the layer's model.attention_impl; with "auto" a threshold-form normaliser goes through a fused kernel
    (`tile_kernel`: C++ on CPU, Triton on CUDA) unless the weights are asked for.
    """
    b, h, r, t, d = q.shape
    sizes = [s.k.shape[-2] for s in sources]
    masks = [s.valid for s in sources if s.valid is not None]
    # (batch, heads, queries per tile) of the widest mask: a mask the same for every query of a tile (T 1)
    # stays so, and broadcasts over the tile's queries below.
    lead = tuple(max([m.shape[i] for m in masks]) if masks else 1 for i in (0, 1, 3))  # (no `default=`: torch.compile)
    valid = torch.cat([_valid(s, lead, r) for s in sources], dim=-1)  # (B or 1, 1 or H, R, T or 1, S)
    record_scores(b * h * r * t * sum(sizes))

    one_per_tile = len(sources) == 1 and sources[0].k.shape[2] == r
    # One query per tile goes to SDPA only over keys of its own: shared keys would be copied into every tile.
    if normaliser.fused_sdpa and not need_weights and (t > 1 or one_per_tile):
        if one_per_tile:
            k, v = sources[0].k, sources[0].v
        else:  # one key tensor per tile: shared sources (the few global tokens) are copied into each
            k = torch.cat([s.k.expand(b, h, r, -1, d) for s in sources], dim=-2)
            v = torch.cat([s.v.expand(b, h, r, -1, d) for s in sources], dim=-2)
        fold, unfold = _sdpa_layout(q, k, v)
        q4, k4, v4 = fold(q), fold(k), fold(v)
        if all(s.valid is None for s in sources):
            return unfold(F.scaled_dot_product_attention(q4, k4, v4, dropout_p=dropout_p)), None, _per_query(valid, t)
        has_key = valid.any(-1, keepdim=True)
        # A row without keys is given all its slots (finite garbage) and zeroed below: fused kernels
        # differ in what they return for a fully masked row (NaN on some).
        mask = fold((valid | ~has_key).expand(b, h, -1, -1, -1))
        out = unfold(F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, dropout_p=dropout_p))
        return out * has_key, None, _per_query(valid, t)

    kernel = tile_kernel(q.device, normaliser) if not need_weights and impl == "auto" else None
    if kernel == "cpp":
        return _attend_tiles_fused(q, sources, valid, normaliser, dropout_p), None, _per_query(valid, t)
    if kernel == "triton" and triton_takes(valid, q):
        return _attend_tiles_triton(q, sources, valid, normaliser, dropout_p), None, _per_query(valid, t)

    # q scaled and made contiguous once: every source's matmul then reads it as one (B*H*R) batch
    # without copying it, and the scores are not divided in a pass of their own.
    q = q.contiguous() / math.sqrt(d)
    scores = torch.cat([_scores(q, s) for s in sources], dim=-1)
    scores = scores.masked_fill(~valid, float("-inf"))
    # Normalisers take (B, H, rows, keys): one alpha per head broadcasts as (1, H, 1, 1).
    weights = normaliser(scores.reshape(b, h, r * t, -1)).view(b, h, r, t, -1)  # all--inf rows -> zeros
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    out = sum(_weighted(part, s) for part, s in zip(dropped.split(sizes, dim=-1), sources))
    return out, (weights if need_weights else None), _per_query(valid, t)


def tile_kernel(device: torch.device, normaliser: Normaliser) -> str | None:
    """The fused kernel that computes a block pattern's tiles for a threshold-form normaliser: "cpp" on CPU (the
    C++ extension built), "triton" on CUDA (triton installed; tiles whose mask the kernel cannot take, see
    `triton_takes`, stay explicit), None elsewhere. On CPU, on tiles of 64 queries over 192 keys, the C++ kernel
    took 0.64x the explicit tiles' time at heads of 64 and 0.31x at heads of 16 (forward + backward,
    alpha-entmax, medians of 5 calls timed by hand); a whole HST layer at 4,096 tokens took 0.95x
    (docs/benchmarks.md). On CUDA the Triton path is unmeasured (no GPU lent yet): the dense layer's Triton
    kernel was 12-50x the explicit path there, which is why it is the default."""
    if not normaliser.has_threshold_form():
        return None
    if device.type == "cpu":
        from sparse_runner.attention.kernels import entmax_attention_cpu

        return "cpp" if entmax_attention_cpu.available() else None
    if device.type == "cuda":
        from sparse_runner.attention.kernels import entmax_attention_triton

        return "triton" if entmax_attention_triton.available() else None
    return None


def triton_takes(valid: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether the Triton kernel can take tiles with this mask: it masks keys per batch entry and head, so every
    query of a tile must see the same keys (its heads may differ: BigBird's random blocks drawn per head), and it
    takes heads up to its MAX_HEAD_DIM in half or single precision."""
    from sparse_runner.attention.kernels import entmax_attention_triton

    return (valid.shape[3] == 1 and q.shape[-1] <= entmax_attention_triton.MAX_HEAD_DIM
            and q.dtype in (torch.float16, torch.bfloat16, torch.float32))


def _attend_tiles_triton(q: torch.Tensor, sources: list[KeySource], valid: torch.Tensor, normaliser: Normaliser, dropout_p: float) -> torch.Tensor:
    """`attend_tiles` through the Triton kernel: each tile a batch entry of the kernel over its keys (shared
    sources copied into every tile, as for SDPA), the tile's valid keys as that entry's key padding mask (one
    per head where the heads gather different keys), so that each head's alpha applies (`triton_takes` says
    when the mask allows it)."""
    from sparse_runner.attention.kernels import entmax_attention_triton

    b, h, r, t, _ = q.shape
    k, v, fold = _tiles_as_batch(q, sources)
    heads = valid.shape[1]  # 1: every head sees the tile's keys; H: each its own
    keys = valid.expand(b, heads, r, 1, -1).transpose(1, 2).reshape(b * r, heads, -1)  # (B * R, 1 or H, S)
    out = entmax_attention_triton.entmax_attention(fold(q), fold(k), fold(v), normaliser.kernel_alpha(),
                                                   key_padding_mask=keys, dropout_p=dropout_p)
    return out.view(b, r, h, t, -1).transpose(1, 2)


def _attend_tiles_fused(q: torch.Tensor, sources: list[KeySource], valid: torch.Tensor, normaliser: Normaliser, dropout_p: float) -> torch.Tensor:
    """`attend_tiles` through the fused C++ kernel: each tile's keys (shared sources copied into every tile,
    as for SDPA) and its valid mask, with the tiles as batch entries of the kernel, heads kept last so that
    each head's alpha applies."""
    from sparse_runner.attention.kernels import entmax_attention_cpu

    b, h, r, t, _ = q.shape
    k, v, fold = _tiles_as_batch(q, sources)
    mask = fold(valid.expand(b, h, r, t, -1))
    # alphas(): one per head, or one for all (a learned alpha is a parameter and gets its gradient)
    out = entmax_attention_cpu.entmax_attention(fold(q), fold(k), fold(v), normaliser.alphas(), mask=mask, dropout_p=dropout_p)
    return out.view(b, r, h, t, -1).transpose(1, 2)


def _tiles_as_batch(q: torch.Tensor, sources: list[KeySource]):
    """(k, v, fold) for the fused kernels, which take the tiles as batch entries: every tile's keys and values,
    (B, H, R, S, D), shared sources copied into every tile (as for SDPA), and fold, (B, H, R, ...) -> (B * R, H, ...),
    heads kept as heads so that each head's alpha applies."""
    b, h, r, _, d = q.shape
    k = torch.cat([s.k.expand(b, h, r, -1, d) for s in sources], dim=-2)
    v = torch.cat([s.v.expand(b, h, r, -1, s.v.shape[-1]) for s in sources], dim=-2)

    def fold(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(b * r, h, *x.shape[3:])

    return k, v, fold


def _sdpa_layout(*tiles: torch.Tensor):
    """(fold, unfold): how SDPA takes (B, H, R, T, D) tiles, 4-D (PyTorch's fused CPU kernel sends 5-D inputs
    to its math path), and how its output comes back to (B, H, R, T, D).

    Tiles whose memory holds every position's heads side by side, as the layer's projections write q, k and
    v, go in as (B * R, H, T, D) over memory (B * R, T, H, D): the kernel lays its output and gradients out
    (batch, T, heads, D), which is that same layout, so that neither q's tiles nor their gradients nor the
    output (when the layer merges its heads) are copied. Tiles that are not dense in that layout (one slot of
    every tile, HST's representatives) are copied into it: the fused kernel reads strided ones ~1.5x
    slower in place. Other tiles (gathered ones) go in as (B * H * R, 1, T, D), contiguous: with one head per
    batch entry the gradients are contiguous too (as (B, H * R, T, D) every gathered key tile's gradient
    was copied once more), and the fused backward copies every (batch, head) slice of a strided input on
    its own. Masks, (B, H, R, T, S), fold the same way.
    """
    b, h, r = tiles[0].shape[:3]
    if all(x.stride(1) < x.stride(2) and (b == 1 or x.stride(0) == r * x.stride(2)) for x in tiles):
        return (lambda x: x.movedim(1, -2).reshape(b * r, x.shape[3], h, x.shape[4]).contiguous().transpose(1, 2),
                lambda y: y.view(b, r, h, *y.shape[2:]).transpose(1, 2))
    return (lambda x: x.reshape(b * h * r, 1, *x.shape[3:]).contiguous(),
            lambda y: y.view(b, h, r, *y.shape[2:]))


def _valid(s: KeySource, lead: tuple[int, int, int], r: int) -> torch.Tensor:
    """The source's valid mask as (B', H', R, T', S): lead = (B', H', T'), the sizes of the widest mask."""
    b, h, t = lead
    n = s.k.shape[-2]
    if s.valid is None:
        return torch.ones(1, 1, 1, 1, 1, dtype=torch.bool, device=s.k.device).expand(b, h, r, t, n)
    return s.valid.expand(b, h, r, t, n)


def _per_query(valid: torch.Tensor, t: int) -> torch.Tensor:
    """valid with its tile axis at T queries (a view)."""
    return valid.expand(-1, -1, -1, t, -1)


def _scores(q: torch.Tensor, s: KeySource) -> torch.Tensor:
    b, h, r, t, d = q.shape
    if s.k.shape[2] == 1 and r > 1:
        # Shared keys: one (R*T, D) x (D, S) matmul; a broadcast batched matmul would copy the keys R times.
        return (q.reshape(b, h, r * t, d) @ s.k[:, :, 0].transpose(-2, -1)).view(b, h, r, t, -1)
    return q @ s.k.transpose(-2, -1)


def _weighted(w: torch.Tensor, s: KeySource) -> torch.Tensor:
    b, h, r, t, n = w.shape
    if s.v.shape[2] == 1 and r > 1:
        return (w.reshape(b, h, r * t, n) @ s.v[:, :, 0]).view(b, h, r, t, -1)
    return w @ s.v


# ----------------------------------------------------------------------------- tiling helpers
def padding_or_none(key_padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The key padding mask, or None where it pads nothing: the tiles then need no mask, SDPA runs unmasked,
    and no output row is zeroed after it. Looked at on the CPU only: on an accelerator reading the mask would
    make the host wait for the device once per layer, and a compiled model could not trace it. (The tasks and
    the layout already pass None when nothing is padded, decided on the host, so a mask that reaches a layer
    nearly always pads something.)"""
    if key_padding_mask is None or key_padding_mask.device.type != "cpu" or torch.compiler.is_compiling():
        return key_padding_mask
    return None if bool(key_padding_mask.all()) else key_padding_mask


def to_tiles(x: torch.Tensor, start: int, tiles: int, size: int) -> torch.Tensor:
    """(B, H, N, D) -> (B, H, tiles, size, D): positions start.. cut into tiles, zero-padded at the end."""
    # No slice unless needed: a slice's backward is a zero-filled buffer of x's size and a copy.
    body = x[:, :, start:] if start else x
    missing = tiles * size - body.shape[2]
    if missing:
        body = F.pad(body, (0, 0, 0, missing))
    return body.reshape(x.shape[0], x.shape[1], tiles, size, x.shape[-1])


def mask_tiles(valid: torch.Tensor, start: int, tiles: int, size: int) -> torch.Tensor:
    """(B, N) bool -> (B, tiles, size) bool, padding past the end is False."""
    body = valid[:, start:]
    missing = tiles * size - body.shape[1]
    if missing:
        body = F.pad(body, (0, missing), value=False)
    return body.reshape(valid.shape[0], tiles, size)


def gather_tiles(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(B, H, R, T, D) tiles, index (R, K) -> (B, H, R, K * T, D): for every tile, the K tiles it lists.
    index (H, R, K): one table per head, head i's tiles gathered from head i's tiles."""
    b, h, r, t, d = x.shape
    # index_select rather than x[:, :, index]: its backward (index_add) is ~3x faster on CPU than the
    # accumulating index_put of advanced indexing.
    if index.dim() == 2:
        return x.index_select(2, index.reshape(-1)).view(b, h, index.shape[0], index.shape[1] * t, d)
    rows = (index + torch.arange(h, device=index.device)[:, None, None] * r).reshape(-1)  # into (H * R) tiles
    return x.reshape(b, h * r, t, d).index_select(1, rows).view(b, h, index.shape[1], index.shape[2] * t, d)


def gather_valid(tiles_ok: torch.Tensor, index: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """The valid mask of gathered key tiles, for `KeySource.valid`: (B or 1, 1 or H, R, 1, K * T) bool.

    tiles_ok: (B or 1, R, T), the real positions of every tile (`mask_tiles`); index: (R, K) or (H, R, K),
    as for `gather_tiles`; ok: the slots that count, index's shape, or (H, R, K) with a 2-D index (every
    head gathers the same tiles, and each sees only some of them)."""
    valid = tiles_ok[:, index]                            # (B, R, K, T) or (B, H, R, K, T)
    if index.dim() == 2:
        valid = valid[:, None]
    valid = valid & (ok if ok.dim() == 3 else ok[None])[None, :, :, :, None]
    return valid.flatten(3)[:, :, :, None, :]


def from_tiles(tiles: torch.Tensor, length: int) -> torch.Tensor:
    """(B, H, R, T, D) -> (B, H, length, D): the tiles back in sequence order, end padding cut."""
    b, h, r, t, d = tiles.shape
    out = tiles.reshape(b, h, r * t, d)
    return out[:, :, :length] if length < r * t else out  # a slice only if needed (see `to_tiles`)
