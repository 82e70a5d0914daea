"""Tests of the joint sentencepiece tokenizer and its content-addressed cache (sparse_runner.tokenization)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import sentencepiece as spm

from sparse_runner import tokenization as tk

WORDS_DE = "der die das Haus Katze Hund läuft schnell über Straße heute morgen gut schön".split()
WORDS_EN = "the a house cat dog runs quickly over street today tomorrow good nice".split()


def make_corpus(n: int = 600, seed: int = 0) -> list[str]:
    """Source and target 'sentences' (joint corpus), a few hundred distinct word sequences."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = WORDS_DE if rng.random() < 0.5 else WORDS_EN
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + rng.choice([".", "!", "?", ""]))
    return out


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return make_corpus()


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    cache = tmp_path_factory.mktemp("tok")
    return tk.train_or_load(corpus, vocab_size=120, cache_dir=cache), cache


def pieces_and_scores(tokenizer: tk.SubwordTokenizer) -> list[tuple[str, float]]:
    return [(tokenizer.processor.id_to_piece(i), tokenizer.processor.get_score(i)) for i in range(tokenizer.vocab_size)]


def test_special_ids_are_as_declared(trained):
    tokenizer, _ = trained
    assert (tk.PAD_ID, tk.UNK_ID, tk.BOS_ID, tk.EOS_ID) == (0, 1, 2, 3)
    assert [tokenizer.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    sp = tokenizer.processor
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
    assert tokenizer.vocab_size == 120


def test_encode_decode_round_trip(trained, corpus):
    tokenizer, _ = trained
    texts = corpus[:50] + ["die Katze runs over the Straße today !", "", "   "]
    ids = tokenizer.encode(texts)
    assert len(ids) == len(texts)
    for arr in ids:
        assert isinstance(arr, np.ndarray) and arr.ndim == 1 and arr.dtype == np.int32
        # encode adds no specials: no padding, BOS or EOS inside
        assert not np.isin(arr, [tk.PAD_ID, tk.BOS_ID, tk.EOS_ID]).any()
    assert ids[-1].size == 0 and ids[-2].size == 0
    # sentencepiece normalises whitespace (strip + collapse); the corpus has none to collapse
    assert tokenizer.decode(ids) == [" ".join(t.split()) for t in texts]
    assert tk.UNK_ID not in np.concatenate(ids[:-2])  # every training character has a piece


def test_decode_stops_at_eos_and_ignores_pad_and_bos(trained):
    tokenizer, _ = trained
    ids = tokenizer.encode(["the cat runs", "der Hund"])
    with_specials = [
        [tk.BOS_ID, *ids[0].tolist(), tk.EOS_ID, *ids[1].tolist(), tk.PAD_ID],  # after EOS: ignored
        np.array([tk.BOS_ID, *ids[1].tolist(), tk.PAD_ID, tk.PAD_ID]),  # no EOS: up to the end
    ]
    assert tokenizer.decode(with_specials) == ["the cat runs", "der Hund"]
    assert tokenizer.decode([[tk.EOS_ID, *ids[0].tolist()]]) == [""]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([[tokenizer.vocab_size]])


def test_same_texts_and_settings_reuse_the_file_without_training(trained, corpus, monkeypatch):
    tokenizer, cache = trained
    path = tokenizer.path
    assert path.parent == cache / "tokenizers" and path.suffix == ".model"
    mtime = path.stat().st_mtime_ns

    def no_training(**kwargs):
        raise AssertionError("the cached model should have been loaded, not retrained")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", no_training)
    again = tk.train_or_load(list(corpus), vocab_size=120, cache_dir=cache)
    assert again.path == path and path.stat().st_mtime_ns == mtime
    assert pieces_and_scores(again) == pieces_and_scores(tokenizer)
    # finished entries only: model, vocab, settings; no temporary directories left behind
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(path.with_suffix(s).name for s in (".json", ".model", ".vocab"))


def test_different_texts_or_settings_give_different_keys(corpus):
    settings = {"vocab_size": 120}
    key = tk.cache_key(corpus, settings)
    assert tk.cache_key(list(corpus), dict(settings)) == key
    assert tk.cache_key(corpus[:-1], settings) != key
    assert tk.cache_key(corpus[:-1] + [corpus[-1] + "x"], settings) != key
    assert tk.cache_key(corpus, {"vocab_size": 121}) != key
    # list boundaries are part of the key
    assert tk.cache_key(["a b", "c"], settings) != tk.cache_key(["a", "b c"], settings)
    assert tk.cache_key(["a\nb"], settings) != tk.cache_key(["a", "b"], settings)


def test_new_texts_train_a_second_model(trained, corpus):
    tokenizer, cache = trained
    other = tk.train_or_load(corpus[:400], vocab_size=120, cache_dir=cache)
    assert other.path != tokenizer.path and other.path.is_file() and tokenizer.path.is_file()
    bigger = tk.train_or_load(corpus, vocab_size=130, cache_dir=cache)
    assert bigger.path not in (tokenizer.path, other.path) and bigger.vocab_size == 130


def test_training_is_deterministic_and_independent_of_threads(corpus, tmp_path):
    # max_sentences below the corpus size exercises the seeded sub-sampling too
    a = tk.train_or_load(corpus, vocab_size=100, cache_dir=tmp_path / "a", max_sentences=300, num_threads=1)
    b = tk.train_or_load(corpus, vocab_size=100, cache_dir=tmp_path / "b", max_sentences=300, num_threads=2)
    assert a.path.name == b.path.name
    assert pieces_and_scores(a) == pieces_and_scores(b)
    c = tk.train_or_load(corpus, vocab_size=100, cache_dir=tmp_path / "c", max_sentences=300, seed=1)
    assert c.path.name != a.path.name


def test_vocab_too_large_is_a_one_line_error_with_a_size_that_works(corpus, tmp_path):
    with pytest.raises(ValueError) as info:
        tk.train_or_load(corpus, vocab_size=5000, cache_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message and "vocab_size=5000" in message
    suggested = int(message.split("vocab_size <= ")[1].split()[0])
    assert tk.train_or_load(corpus, vocab_size=suggested, cache_dir=tmp_path).vocab_size == suggested
    with pytest.raises(ValueError, match=r"vocab_size >= \d+") as info:
        tk.train_or_load(corpus, vocab_size=10, cache_dir=tmp_path)
    assert "\n" not in str(info.value)


def test_failed_training_leaves_nothing_behind(corpus, tmp_path, monkeypatch):
    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tk, "_train", killed)
    with pytest.raises(KeyboardInterrupt):
        tk.train_or_load(corpus, vocab_size=120, cache_dir=tmp_path)
    assert list((tmp_path / "tokenizers").iterdir()) == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(vocab_size=120, model_type="wordpiece"), "model_type"),
        (dict(vocab_size=3), "vocab_size"),
        (dict(vocab_size=120, character_coverage=0.0), "character_coverage"),
    ],
)
def test_invalid_settings(corpus, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tk.train_or_load(corpus, cache_dir=tmp_path, **kwargs)


def test_no_text_to_train_on(tmp_path):
    with pytest.raises(ValueError, match="no non-empty"):
        tk.train_or_load(["", "  "], vocab_size=50, cache_dir=tmp_path)
    with pytest.raises(TypeError):
        tk.train_or_load("one string", vocab_size=50, cache_dir=tmp_path)
    assert not os.path.exists(tmp_path / "tokenizers") or not any((tmp_path / "tokenizers").iterdir())
