"""model.attention_impl=flex: softmax block patterns through FlexAttention (attention/flex_blocks.py).

On CPU FlexAttention runs eagerly (it materialises the scores: exact, and forward only), which is enough to
hold the engine to what it replaces: its mask is the pattern's `dense_mask` (HST: the token step's
`stage_masks`), pair by pair; its output is that of the tiles (`block_sparse.attend_tiles`) and of masked
dense SDPA, for local, BigBird (random blocks per head or shared, 0-2 global blocks, global tokens) and HST,
with key padding, lengths that are no multiple of the block size or of FlexAttention's 128, and block sizes
16, 32, 64; its BlockMask computes the tiles that hold a pair and no others. Then when it is taken (softmax,
no dropout, no weights, opt-in), what the backend record says, and what the config refuses. The compiled
CUDA kernel, forward and backward, is the `gpu` test at the end."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_mask

from sparse_runner.attention import AttentionSpec, MultiHeadAttention, attention_backends, build_pattern, flex_blocks
from sparse_runner.attention.block_sparse import count_scores
from sparse_runner.attention.normalisers import Softmax
from sparse_runner.attention.spec import check_attention_impl_device
from sparse_runner.checks import ConfigError
from sparse_runner.cli import preflight
from tests.conftest import TINY

# Eager FlexAttention says, once per call site, that it is not the fused kernel: here that is the point.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

CPU = torch.device("cpu")
H = 3

# (pattern, options, global tokens, n): n a multiple of neither the block size nor 128, except where noted.
KEY_BLOCK_CASES = [
    ("local", {"block_size": 16}, 0, 300),
    ("local", {"block_size": 32, "neighbours": 1}, 1, 300),
    ("bigbird", {"block_size": 16}, 0, 300),                                                   # random blocks per head
    ("bigbird", {"block_size": 16, "random_per_head": False}, 1, 300),                         # one draw for all heads
    ("bigbird", {"block_size": 32, "global_blocks": 1, "random_blocks": 2, "seed": 3}, 2, 300),
    ("bigbird", {"block_size": 64, "global_blocks": 0}, 1, 700),
    ("bigbird", {"block_size": 64, "random_blocks": 1}, 0, 700),  # 128-tiles that every pair of fills ("full")
]
KEY_BLOCK_IDS = [f"{p}-{'-'.join(f'{k}{v}' for k, v in o.items())}-g{g}-n{n}" for p, o, g, n in KEY_BLOCK_CASES]

HST_CASES = [
    ({"block_size": 16}, 0),
    ({"block_size": 32, "local": "bigbird", "neighbours": 1}, 0),                  # random blocks per head
    ({"block_size": 16, "local": "bigbird", "global_blocks": 1, "random_per_head": False}, 1),
    ({"block_size": 64, "local": "bigbird", "global_blocks": 2, "random_blocks": 1}, 1),
    ({"block_size": 16, "stages": 1, "local": "window"}, 1),
]
HST_IDS = [f"{'-'.join(f'{k}{v}' for k, v in o.items())}-g{g}" for o, g in HST_CASES]


def inputs(n: int, batch: int = 2, dim: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, H, n, dim, generator=g, dtype=torch.float64) for _ in range(3))
    return 3 * q, k, v


def padding(n: int) -> torch.Tensor:
    """(2, n): the first sequence whole, the second without its last 70 positions (whole padded blocks)."""
    return torch.arange(n)[None, :] < torch.tensor([n, n - 70])[:, None]


def layout_mask(layout: flex_blocks.BlockLayout, heads: int, pad: torch.Tensor | None = None) -> torch.Tensor:
    """(B, heads, L, L) bool: the layout's mask_mod evaluated at every pair."""
    keys_ok = layout.keys_ok(pad, 1 if pad is None else pad.shape[0])
    return create_mask(layout.mask_mod(keys_ok, heads), keys_ok.shape[0], heads, layout.length, layout.length, device="cpu")


# ------------------------------------------------------------------------------------------------
# The mask: the pattern's own, pair by pair
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, options, g, n", KEY_BLOCK_CASES, ids=KEY_BLOCK_IDS)
def test_mask_mod_is_the_patterns_dense_mask(name, options, g, n):
    pattern = build_pattern(name, options, global_tokens=g, layer=1)
    layout = flex_blocks.key_block_layout(pattern, n, H, CPU)
    assert torch.equal(layout_mask(layout, H)[0], pattern.dense_mask(n, n, heads=H))
    pad = padding(n)
    assert torch.equal(layout_mask(layout, H, pad), pattern.dense_mask(n, n, heads=H)[None] & pad[:, None, None, :])


def test_mask_mod_follows_shifted_block_boundaries():
    """SAR's shifted test moves BigBird's block boundaries (`block_shift`): the layout takes the same table, and
    a pattern that has run unshifted does not reuse its unshifted layout."""
    pattern = build_pattern("bigbird", {"block_size": 16}, global_tokens=1, layer=2)
    pattern.block_shift = 5
    layout = flex_blocks.key_block_layout(pattern, 300, H, CPU)
    assert torch.equal(layout_mask(layout, H)[0], pattern.dense_mask(300, 300, heads=H))

    flex = build_pattern("bigbird", {"block_size": 16}, global_tokens=1, layer=2, impl="flex")
    q, k, v = inputs(300)
    flex.attend(q, k, v, normaliser=Softmax())
    flex.block_shift = pattern.block_shift = 12  # 18 blocks before the shift, not 19: other random blocks
    torch.testing.assert_close(flex.attend(q, k, v, normaliser=Softmax())[0], pattern.attend(q, k, v, normaliser=Softmax())[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("options, g", HST_CASES, ids=HST_IDS)
def test_hst_token_layout_is_the_token_steps_mask(options, g):
    """Over the tiles laid end to end (no global tokens, whole tiles: the tiles are the sequence), the token
    step's mask for the token rows; a representative's row sees nothing here (the other steps compute it)."""
    pattern = build_pattern("hst", options, layer=1)
    blocks = 7
    n = blocks * pattern._tile_size()
    layout = flex_blocks.hst_token_layout(pattern, blocks, H, CPU)
    tokens = torch.as_tensor(pattern.stage_masks(n, heads=H)["tokens"])
    mask = layout_mask(layout, H)[0]
    is_token = torch.arange(n) % pattern._tile_size() != 0
    assert torch.equal(mask[:, is_token], tokens[:, is_token])


# ------------------------------------------------------------------------------------------------
# The output: that of the tiles and of masked dense SDPA
# ------------------------------------------------------------------------------------------------


# Padding (the second sequence) takes the cached tiles with mask_mod on every one; without, the kernel skips
# mask_mod on the tiles that every pair fills (eager FlexAttention costs ~0.3 s per new shape: a few cases each).
OUTPUT_CASES = [(*case, True) for case in KEY_BLOCK_CASES] + [(*KEY_BLOCK_CASES[i], False) for i in (0, 2, 6)]
OUTPUT_IDS = [f"{case_id}-padded" for case_id in KEY_BLOCK_IDS] + [f"{KEY_BLOCK_IDS[i]}-whole" for i in (0, 2, 6)]


@pytest.mark.parametrize("name, options, g, n, padded", OUTPUT_CASES, ids=OUTPUT_IDS)
def test_flex_equals_the_tiles_and_masked_dense_sdpa(name, options, g, n, padded):
    tiles = build_pattern(name, options, global_tokens=g, layer=1)
    flex = build_pattern(name, options, global_tokens=g, layer=1, impl="flex")
    q, k, v = inputs(n)
    pad = padding(n) if padded else None
    out = flex.attend(q, k, v, normaliser=Softmax(), key_padding_mask=pad)[0]
    if name == "bigbird" and g == 0 and n == 700 and not padded:  # the kernel skips mask_mod on full tiles: exercised
        assert flex_blocks.cached_layout(flex, ("key_blocks", n, flex._unshifted_tiles(n), H, CPU), None).block_mask(False)[0].full_kv_num_blocks.sum() > 0

    expected = tiles.attend(q, k, v, normaliser=Softmax(), key_padding_mask=pad)[0]
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    allowed = tiles.dense_mask(n, n, heads=H)[None] & (pad[:, None, None, :] if padded else True)
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    rows = allowed.any(-1, keepdim=True)  # SDPA's rows without a key are NaN; flex's are zeros
    torch.testing.assert_close(torch.where(rows, out, 0), torch.where(rows, dense, 0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("options, g", HST_CASES, ids=HST_IDS)
def test_hst_layer_with_flex_token_step_equals_the_tiles(options, g):
    """The whole HST layer (its token step through flex, the representatives' steps through SDPA) against the
    layer on the tiles, with the same weights; n = 300 positions, a multiple of neither the tile nor 128."""
    torch.manual_seed(0)
    tiles = MultiHeadAttention(24, AttentionSpec(num_heads=H, pattern="hst", pattern_options=options), global_tokens=g).double()
    flex = MultiHeadAttention(24, AttentionSpec(num_heads=H, pattern="hst", pattern_options=options, impl="flex"), global_tokens=g).double()
    flex.load_state_dict(tiles.state_dict())
    x = torch.randn(2, 300, 24, dtype=torch.float64)
    calls = []
    with torch.no_grad(), _counting_flex(calls):
        for pad in ((None, padding(300)) if options == HST_CASES[0][0] else (padding(300),)):
            torch.testing.assert_close(flex(x, key_padding_mask=pad), tiles(x, key_padding_mask=pad), rtol=0, atol=1e-12)
    assert len(calls) == (2 if options == HST_CASES[0][0] else 1)  # the token step went through flex


class _counting_flex:
    """Counts the engine's flex_attention calls (the function `flex_blocks._flex` hands out)."""

    def __init__(self, calls: list) -> None:
        self.calls, self.real = calls, flex_blocks._flex

    def __enter__(self):
        flex_blocks._flex = lambda device: (self.calls.append(device), self.real(device))[1]

    def __exit__(self, *exc):
        flex_blocks._flex = self.real


# ------------------------------------------------------------------------------------------------
# The BlockMask: the tiles that hold a pair, no others; made once
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, options", [("local", {"block_size": 16, "neighbours": 1}), ("bigbird", {"block_size": 16}),
                                           ("bigbird", {"block_size": 32, "global_blocks": 1, "random_per_head": False})])
def test_block_mask_computes_exactly_the_patterns_blocks(name, options):
    """With FlexAttention's tile at the pattern's block size, the tiles it computes per head are the pattern's
    (query block, key block) pairs: its density times blocks^2. At 128 they are the 128-tiles of the dense
    mask that hold any pair."""
    pattern = build_pattern(name, options, layer=1)
    size, blocks = options["block_size"], 24
    n = size * blocks
    mask = pattern.dense_mask(n, n, heads=H)
    pairs = mask.view(H, blocks, size, blocks, size).any(-1).any(-2)  # (H, blocks, blocks)
    _, tiles = flex_blocks.key_block_layout(pattern, n, H, CPU, flex_block=size).block_mask(padded=False)
    assert tiles * H == int(pairs.sum())
    density = mask.double().mean().item()
    assert tiles / blocks**2 == pytest.approx(density)

    flex_tiles = math.ceil(n / 128)
    padded = F.pad(mask, (0, flex_tiles * 128 - n, 0, flex_tiles * 128 - n))
    holding = padded.view(H, flex_tiles, 128, flex_tiles, 128).any(-1).any(-2)
    _, tiles_128 = flex_blocks.key_block_layout(pattern, n, H, CPU).block_mask(padded=False)
    assert tiles_128 * H == int(holding.sum())
    if name == "local":  # BigBird's random 16- and 32-blocks reach every 128-tile at this length
        assert tiles_128 < flex_tiles**2
    # the padded variant computes the same tiles, none of them "full"
    block_mask, tiles_padded = flex_blocks.key_block_layout(pattern, n, H, CPU).block_mask(padded=True)
    assert tiles_padded == tiles_128 and block_mask.full_kv_num_blocks is None


def test_cost_is_linear_in_the_length():
    """The scores the engine computes (its tiles x 128^2) grow linearly: local attention at 4x the length, 4x."""
    pattern = build_pattern("local", {"block_size": 64}, impl="flex")
    counts = []
    for n in (512, 2048):
        q = torch.randn(1, 1, n, 4)
        with count_scores() as counted:
            pattern.attend(q, q, q, normaliser=Softmax())
        counts.append(counted[0])
    assert counts[1] == 4 * counts[0] < 2048**2 / 4


def test_layouts_and_block_masks_are_made_once_per_length(monkeypatch):
    made = []
    real = flex_blocks.create_block_mask
    monkeypatch.setattr(flex_blocks, "create_block_mask", lambda *a, **kw: made.append(a[3]) or real(*a, **kw))
    pattern = build_pattern("bigbird", {"block_size": 16}, impl="flex")
    for n, pad in ((200, None), (200, None), (200, padding(200)), (200, padding(200).flip(1)), (264, None), (200, None)):
        q = torch.randn(2, H, n, 4)
        pattern.attend(q, q, q, normaliser=Softmax(), key_padding_mask=pad)
    assert made == [200, 200, 264]  # 200 without padding, 200 with (any padding), 264


# ------------------------------------------------------------------------------------------------
# When it is taken, what the record says, what the config refuses
# ------------------------------------------------------------------------------------------------


def layer(pattern="bigbird", impl="flex", dropout=0.0, normaliser="softmax"):
    torch.manual_seed(0)
    return MultiHeadAttention(16, AttentionSpec(num_heads=2, normaliser=normaliser, pattern=pattern, pattern_options={"block_size": 16},
                                                impl=impl, dropout=dropout), key=("encoder_self", 0))


def test_taken_only_for_softmax_without_dropout_or_weights():
    assert flex_blocks.takes("flex", Softmax(), 0.0, need_weights=False)
    assert not flex_blocks.takes("auto", Softmax(), 0.0, need_weights=False)  # opt-in: auto keeps the tiles
    assert flex_blocks.refusal(Softmax(), 0.1, False) == "attention dropout 0.1, which FlexAttention does not have"
    assert flex_blocks.refusal(Softmax(), 0.0, True) == "the analysis needs the weights"
    assert flex_blocks.refusal(layer(normaliser="entmax15").normaliser, 0.0, False) == "entmax15 is not softmax"


def test_training_with_attention_dropout_stays_on_the_tiles_and_evaluation_takes_flex():
    attention = layer(dropout=0.1)
    x = torch.randn(2, 70, 16)
    calls = []
    with _counting_flex(calls):
        attention.train()
        attention(x).sum().backward()  # through the tiles: FlexAttention would have no backward here
        assert calls == []
        attention.eval()
        with torch.no_grad():
            attention(x)
    assert calls == [CPU]


def test_the_backend_record_names_flex_and_why_it_was_not_taken():
    x = torch.randn(2, 70, 16)
    for pattern, engine in (("bigbird", "the whole layer"), ("hst", "the token step (the representatives' steps: SDPA)")):
        attention = layer(pattern, dropout=0.1)
        backends = attention_backends(attention)
        attention.train()
        attention(x)
        attention.eval()
        with torch.no_grad():
            attention(x)
        assert backends.fields() == {
            "attention_backend": "flex,sdpa",
            "attention_backend_reason": {"encoder_self": (
                f"sdpa: pattern {pattern} (block patterns compute their own blocks); model.attention_impl=flex not taken: attention dropout 0.1, "
                f"which FlexAttention does not have; flex: pattern {pattern}, model.attention_impl=flex: {engine} through FlexAttention")},
        }
    assert layer(impl="auto").backend_choice(x, x, None, 0.0) == ("sdpa", "sdpa: pattern bigbird (block patterns compute their own blocks)")


REFUSED = {
    "dense": (["model.attention_impl=flex"],
              "model.attention_impl: 'flex' computes block patterns (bigbird, hst, local) only, not the model's 'dense' layers; "
              "valid with dense: auto, explicit, memory_efficient, cpp, triton, adasplash"),
    "entmax": (["pattern=local", "normaliser=entmax15", "model.attention_impl=flex"],
               "model.attention_impl: 'flex' computes softmax only (FlexAttention), and model.normaliser is 'entmax15'; valid with entmax15: auto, explicit"),
    "bad value": (["pattern=local", "model.attention_impl=flexattention"], "model.attention_impl"),
    "other impl, block pattern": (["pattern=hst", "model.attention_impl=triton"],
                                  "model.attention_impl: 'triton' does not apply to pattern 'hst' (block patterns compute their own blocks); valid with hst: auto, explicit, flex"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_config_refuses_what_flex_cannot_compute_in_one_line(case):
    overrides, expected = REFUSED[case]
    with pytest.raises(ConfigError) as info:
        preflight(TINY + overrides, multirun=False)
    message = str(info.value)
    assert message.startswith(expected) and "\n" not in message, message
    if case == "bad value":
        assert "flexattention" in message and "flex" in message.replace("flexattention", ""), message


def test_a_decoder_refuses_flex():
    with pytest.raises(ConfigError, match=r"^model.attention_impl: 'flex' computes block patterns .* only, not the model's 'causal' layers; valid with causal: "):
        preflight(["experiment=mt_cpu", "pattern=hst", "model.attention_impl=flex"], multirun=False)


@pytest.mark.parametrize("overrides", [["pattern=hst"], ["model=bigbird"], ["pattern=local", "model.attention_dropout=0.1"]])
def test_the_config_accepts_flex_for_softmax_block_patterns(overrides):
    preflight(TINY + overrides + ["model.attention_impl=flex"], multirun=False)


def test_flex_needs_cuda_since_flex_attention_has_no_backward_on_cpu():
    from types import SimpleNamespace

    node = SimpleNamespace(attention_impl="flex", pattern="hst", head_size=None, qkv_dim=None, d_model=64, num_heads=4)
    with pytest.raises(ConfigError) as info:
        check_attention_impl_device(node, CPU)
    assert str(info.value) == ("model.attention_impl: flex needs a CUDA device (FlexAttention has no backward on CPU), and this run is on cpu; "
                               "valid here: auto, explicit")
    check_attention_impl_device(node, torch.device("cuda"))  # only the device type is read


# ------------------------------------------------------------------------------------------------
# CUDA: the compiled kernel, forward and backward
# ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pattern, options, g, masks", [
    ("bigbird", {"block_size": 64}, 1, ("whole", "padded", "whole")),                      # random blocks per head
    ("hst", {"block_size": 32, "local": "bigbird", "neighbours": 1}, 1, ("padded", "padded")),
])
def test_gpu_flex_forward_and_backward_equal_the_tiles(pattern, options, g, masks):
    """A layer through compiled flex_attention against the same layer on the tiles, float32, values and the
    gradients of the input and every weight, 1000 positions (no multiple of 128), with and without padding;
    the later steps rebuild no block mask. (Each new length or padding compiles: a few cases only.)"""
    device = torch.device("cuda")
    torch.manual_seed(0)
    spec = dict(num_heads=8, head_size=64, pattern=pattern, pattern_options=options)
    tiles = MultiHeadAttention(512, AttentionSpec(**spec), global_tokens=g).to(device)
    flex = MultiHeadAttention(512, AttentionSpec(**spec, impl="flex"), global_tokens=g).to(device)
    flex.load_state_dict(tiles.state_dict())
    n = 1000
    x = torch.randn(2, n, 512, device=device)
    upstream = torch.randn(2, n, 512, device=device)
    pad = torch.arange(n, device=device)[None, :] < torch.tensor([n, n - 150], device=device)[:, None]
    for mask in masks:
        results = []
        for module in (tiles, flex):
            module.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            out = module(xi, key_padding_mask=pad if mask == "padded" else None)
            (out * upstream).sum().backward()
            results.append([out, xi.grad, *(p.grad for p in module.parameters())])
        for got, expected in zip(results[1], results[0]):
            torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)
    layouts = [v for key, v in flex.pattern._tables.items() if key[0] == "flex"]
    assert len(layouts) == 1 and set(layouts[0]._masks) == {mask == "padded" for mask in masks}
