"""Encoder-decoder model and decoding: the key/value cache changes nothing, beam 1 is greedy,
sparse attention reaches all three attention types, and a trained model's searches find the answer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sparse_runner.analysis.collect import analyse
from sparse_runner.attention import AttentionSpec, head_alphas
from sparse_runner.decoding import beam_search, greedy_search, max_lengths
from sparse_runner.models.seq2seq import TransformerSeq2Seq

BOS, EOS, PAD = 2, 3, 0
NORMALISERS = ["softmax", "sparsemax", "entmax15", "alpha_entmax"]


def make_model(normaliser="softmax", vocab=40, seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(attention=AttentionSpec(num_heads=4, normaliser=normaliser), d_model=32, num_layers=2, ffn_dim=64, dropout=0.0,
                norm_first=True, max_positions=64)
    args.update(kw)
    return TransformerSeq2Seq(vocab, **args).eval()


def random_batch(vocab=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (5, 9), generator=g)
    lengths = torch.tensor([9, 7, 4, 9, 2])
    src[torch.arange(9)[None, :] >= lengths[:, None]] = PAD
    return src, lengths


@pytest.mark.parametrize("normaliser", NORMALISERS)
def test_cached_decoding_matches_full_recompute(normaliser):
    model = make_model(normaliser)
    src, lengths = random_batch()
    memory, memory_mask = model.encode(src, lengths)
    tgt = torch.randint(4, 40, (5, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model.decode(tgt, memory, memory_mask)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, i : i + 1], memory, memory_mask, cache=cache) for i in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache[0]["self"]["k"].shape[2] == 7  # one cached key per fed token


@pytest.mark.parametrize("normaliser", NORMALISERS)
def test_searches_with_and_without_cache_agree(normaliser):
    model = make_model(normaliser)
    src, lengths = random_batch()
    common = dict(bos_id=BOS, eos_id=EOS, max_len_a=1.0, max_len_b=4)
    greedy = greedy_search(model, src, lengths, **common)
    assert greedy == greedy_search(model, src, lengths, use_cache=False, **common)
    assert greedy == beam_search(model, src, lengths, beam_size=1, **common)
    beam = beam_search(model, src, lengths, beam_size=4, **common)
    assert beam == beam_search(model, src, lengths, beam_size=4, use_cache=False, **common)
    limits = max_lengths(lengths, 1.0, 4, 63)
    for out, limit in zip(beam + greedy, list(limits) * 2):
        assert len(out) <= int(limit) - 1  # room for the EOS
        assert EOS not in out and BOS not in out


def sequence_logprob(model, src, lengths, out):
    memory, memory_mask = model.encode(src, lengths)
    tgt_in = torch.tensor([[BOS] + out])
    tgt_out = torch.tensor(out + [EOS])
    logp = torch.log_softmax(model.decode(tgt_in, memory, memory_mask)[0].float(), -1)
    return float(logp.gather(1, tgt_out[:, None]).sum())


def test_beam_scores_are_the_model_scores():
    """With length_penalty=0 the beam's best hypothesis is at least as probable as greedy's and as
    every hypothesis it finished, re-scored independently by a full forward pass."""
    model = make_model("alpha_entmax")
    src, lengths = random_batch()
    common = dict(bos_id=BOS, eos_id=EOS, max_len_a=1.0, max_len_b=4)
    greedy = greedy_search(model, src, lengths, **common)
    beam = beam_search(model, src, lengths, beam_size=5, length_penalty=0.0, **common)
    with torch.no_grad():
        for i in range(len(src)):
            row, n = src[i : i + 1], lengths[i : i + 1]
            assert sequence_logprob(model, row, n, beam[i]) >= sequence_logprob(model, row, n, greedy[i]) - 1e-4


def test_alpha_per_head_in_every_layer_and_attention_type():
    model = make_model("alpha_entmax", decoder_layers=3)
    alphas = head_alphas(model)
    assert sorted(alphas) == sorted(
        [f"encoder_self/{i}" for i in range(2)] + [f"decoder_self/{i}" for i in range(3)] + [f"context/{i}" for i in range(3)]
    )
    logits = {name: p for name, p in model.named_parameters() if name.endswith("alpha_logit")}
    assert len(logits) == 8 and all(p.shape == (4,) for p in logits.values())
    assert len({p.data_ptr() for p in logits.values()}) == 8  # each layer and type has its own


def test_shared_and_separate_embeddings():
    shared = make_model(share_embeddings=True)
    separate = make_model(share_embeddings=False)
    assert shared.embed is shared.encoder.embed
    assert separate.embed is not separate.encoder.embed
    n = lambda m: sum(p.numel() for p in m.parameters())
    assert n(separate) - n(shared) == 40 * 32


def test_analysis_sees_all_types_and_exact_possible_pairs():
    """Density counts only real pairs: src_len^2, src_len*tgt_len and tgt_len(tgt_len+1)/2 (docs/papers.md)."""
    model = make_model("softmax")
    src, lengths = random_batch()
    tgt_lengths = torch.tensor([3, 6, 1, 4, 5])
    tgt = torch.randint(4, 40, (5, 6), generator=torch.Generator().manual_seed(3))
    target_mask = torch.arange(6)[None, :] < tgt_lengths[:, None]
    tgt[~target_mask] = PAD

    def evaluate():
        memory, memory_mask = model.encode(src, lengths)
        model.decode(tgt, memory, memory_mask, target_mask=target_mask)

    stats = analyse(model, evaluate)["attention"]
    assert list(stats) == ["encoder_self", "context", "decoder_self"]
    s, t = lengths.tolist(), tgt_lengths.tolist()
    expected = {
        "encoder_self": sum(x * x for x in s),
        "context": sum(x * y for x, y in zip(s, t)),
        "decoder_self": sum(y * (y + 1) // 2 for y in t),
    }
    for kind, pairs in expected.items():
        layer = stats[kind]["layers"][0]
        assert layer["possible_pairs"] == pairs * 4  # 4 heads
        assert layer["mean_density"] == pytest.approx(1.0)  # softmax: every possible pair > 0


def test_trained_model_copies_with_every_search():
    """A tiny model trained to copy its input: greedy and beam output are the input."""
    torch.manual_seed(0)
    vocab = 12
    model = make_model("entmax15", vocab=vocab, d_model=48, ffn_dim=96)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(400):
        src = torch.randint(4, vocab, (32, 6), generator=g)
        tgt_in = torch.cat([torch.full((32, 1), BOS), src], 1)
        tgt_out = torch.cat([src, torch.full((32, 1), EOS)], 1)
        loss = F.cross_entropy(model(src, None, tgt_in).flatten(0, 1), tgt_out.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src = torch.randint(4, vocab, (8, 6), generator=g)
    expected = src.tolist()
    common = dict(bos_id=BOS, eos_id=EOS, max_len_a=1.0, max_len_b=3)
    assert greedy_search(model, src, None, **common) == expected
    assert beam_search(model, src, None, beam_size=3, **common) == expected
