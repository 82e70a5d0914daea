"""Joint subword vocabulary for translation: a sentencepiece model trained once per data set and cached.

Correia et al. (2019) segment source and target with one *joint* BPE vocabulary (32K merges). Here the
vocabulary is a sentencepiece model trained on the source and target training sentences together
(`train_or_load`), so one embedding table can be shared by encoder, decoder and output layer.

Ids
---
The four special ids are fixed for every model this module trains, so model code can use the
constants without asking the tokenizer:

========  ====  =========  ===============================================================
constant  id    piece      meaning
========  ====  =========  ===============================================================
PAD_ID    0     ``<pad>``  padding; never produced by ``encode``
UNK_ID    1     ``<unk>``  a character not seen in training (see ``byte_fallback``)
BOS_ID    2     ``<s>``    start of a target sequence; never added by ``encode``
EOS_ID    3     ``</s>``   end of sequence; never added by ``encode``
========  ====  =========  ===============================================================

Cache
-----
The model is ``<cache_dir>/tokenizers/<key>.model`` (plus the human-readable ``<key>.vocab`` and a
``<key>.json`` recording the settings). ``key`` is a sha256 over the training sentences (in order),
every setting that changes the model and the sentencepiece version, so a rerun or a sweep over the
same data loads the file instead of retraining, and any change of data or settings trains a new one.
Training happens in a temporary directory next to the cache; finished files are moved in with
``os.replace`` (the ``.model`` last), so a killed job leaves no file that looks finished and two jobs
training the same key at once both end with a complete, identical model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from sparse_runner.io import atomic_write_json

logger = logging.getLogger(__name__)

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
SPECIAL_PIECES = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}

MODEL_TYPES = ("bpe", "unigram", "char", "word")

# Part of every cache key: a change to how this module trains a model from the same texts and settings
# takes a new number, so a cached model of another number is not reused.
_TRAINING_FORMAT_VERSION = 1

# How many texts are hashed / converted per step (bounds the memory of one step on multi-million
# sentence corpora without a Python call per sentence).
_CHUNK = 20_000


class SubwordTokenizer:
    """A trained sentencepiece model with the fixed special ids above.

    ``encode`` maps text to ids (no BOS/EOS added: the caller decides where they go) and ``decode``
    maps ids back to text (stopping at the first EOS). Decoded text is the *normalised* text:
    sentencepiece collapses runs of whitespace, strips the ends and, with the default
    ``nmt_nfkc`` rule, applies NFKC (e.g. full-width letters become ASCII).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.processor = spm.SentencePieceProcessor(model_file=str(self.path))
        found = {
            PAD_ID: self.processor.pad_id(), UNK_ID: self.processor.unk_id(),
            BOS_ID: self.processor.bos_id(), EOS_ID: self.processor.eos_id(),
        }
        if any(found[i] != i for i in found):
            raise ValueError(
                f"{self.path}: special ids are pad={found[PAD_ID]} unk={found[UNK_ID]} bos={found[BOS_ID]} "
                f"eos={found[EOS_ID]}, expected pad={PAD_ID} unk={UNK_ID} bos={BOS_ID} eos={EOS_ID} (train it with train_or_load)"
            )

    @property
    def vocab_size(self) -> int:
        """Number of ids, special ones included (ids are ``0 .. vocab_size - 1``)."""
        return int(self.processor.get_piece_size())

    def encode(self, texts: Sequence[str], *, num_threads: int | None = None) -> list[np.ndarray]:
        """One ``int32`` array of ids per text, shape ``(num_pieces,)``; no BOS/EOS, no padding.

        An empty (or all-whitespace) text gives an empty array. ``num_threads`` (default: all cores,
        at most 16) only changes the speed.
        """
        if isinstance(texts, str):
            raise TypeError("SubwordTokenizer.encode takes a list of strings, not one string")
        threads = int(num_threads) if num_threads else _default_threads()
        out: list[np.ndarray] = []
        for start in range(0, len(texts), _CHUNK):
            # One C++ call per chunk: much faster than one call per sentence.
            for ids in self.processor.encode(list(texts[start:start + _CHUNK]), out_type=int, num_threads=threads):
                out.append(np.asarray(ids, dtype=np.int32))
        return out

    def encode_with_offsets(
        self, texts: Sequence[str], *, num_threads: int | None = None
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``encode`` plus where each piece lies in the original text: one ``(ids, starts, ends)`` per text.

        ``ids`` is ``int32`` and equal to ``encode([text])[0]``; ``starts`` and ``ends`` are ``int64``
        *character* (code point) offsets into the Python string ``text``, so ``text[starts[i]:ends[i]]``
        is the original text that piece ``i`` was made from (extractive QA maps predicted pieces back to
        the passage with them). Spans are in order and never overlap.

        sentencepiece reports UTF-8 *byte* offsets (``begin``/``end``), converted here to characters.
        Their conventions, and what this method changes:

        * A piece that starts a word begins with the whitespace marker ``▁``, and sentencepiece's span
          for it covers the whitespace *before* the word -- the whole run of it (``"a  word"``:
          ``▁word`` covers ``"  word"``). That whitespace (any ``str.isspace`` character, or a
          control / format character such as U+200B that the normaliser turns into ``▁``) is cut from
          the start of the span of every ``▁`` piece, so ``▁word`` gives ``"word"`` and a piece that is
          only ``▁`` gives an empty span just before the next word. Whitespace at the very start of the
          text is in no span (the ``▁`` sentencepiece adds there has an empty span), nor is trailing
          whitespace.
        * When normalisation changes a character's length, the pieces made from it share its span:
          the first ones get an empty span and the last one the whole character (NFKC's ``"½"`` ->
          ``1 ⁄ 2``: ``1`` and ``⁄`` empty, ``2`` the ``"½"``; ``"ﬁne"``: ``▁f`` empty, ``in`` the
          ``"ﬁn"``). With ``byte_fallback`` the byte pieces of one character do the same, so every
          offset lies on a character boundary.

        Empty spans (``starts[i] == ends[i]``) are therefore normal; a span-overlap test such as
        ``starts < b and ends > a`` treats them as inside ``[a, b)`` only when strictly within it.
        """
        if isinstance(texts, str):
            raise TypeError("SubwordTokenizer.encode_with_offsets takes a list of strings, not one string")
        threads = int(num_threads) if num_threads else _default_threads()
        marker = "▁".encode("utf-8")
        # which ids are pieces starting with the whitespace marker (an <unk> piece is its surface text: asked below)
        starts_word = np.array([self.processor.id_to_piece(i).startswith("▁") for i in range(self.vocab_size)], dtype=bool)
        # characters cut from the start of a marker piece's span: whitespace, or invisible ones (control,
        # format: not printable) that the normaliser turns into the marker; a table for ASCII
        blank_ascii = np.array([chr(c).isspace() or not chr(c).isprintable() for c in range(128)], dtype=bool)
        out: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for first in range(0, len(texts), _CHUNK):
            chunk = list(texts[first:first + _CHUNK])
            mapped = self.processor.encode(chunk, out_type="offset_mapping", return_bytes=True, num_threads=threads)
            for text, result in zip(chunk, mapped):
                ids = np.asarray(result["ids"], dtype=np.int32)
                offsets = np.asarray(result["offsets"], dtype=np.int64).reshape(-1, 2)
                starts, ends = offsets[:, 0].copy(), offsets[:, 1].copy()
                data = text.encode("utf-8")
                n = len(text)
                if len(data) == n:  # ASCII: bytes are characters
                    blank = blank_ascii[np.frombuffer(data, dtype=np.uint8)]
                else:  # byte offsets -> character offsets
                    lead = (np.frombuffer(data, dtype=np.uint8) & 0xC0) != 0x80  # first byte of a character
                    chars_before = np.concatenate([[0], np.cumsum(lead)])  # characters starting before byte k
                    # a start inside a character moves back to it, an end inside one moves past it
                    inside = np.zeros(len(data) + 1, dtype=bool)
                    inside[:-1] = ~lead
                    starts = chars_before[starts] - inside[starts]
                    ends = chars_before[ends]
                    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
                    low = codes < 128
                    blank = np.zeros(n, dtype=bool)
                    blank[low] = blank_ascii[codes[low]]
                    for j in np.flatnonzero(~low).tolist():
                        blank[j] = text[j].isspace() or not text[j].isprintable()
                # next_solid[k]: the first position >= k that is not blank (n if none)
                position = np.append(np.where(blank, n, np.arange(n)), n)
                next_solid = np.minimum.accumulate(position[::-1])[::-1]
                word = starts_word[ids]
                for i in np.flatnonzero(ids == UNK_ID).tolist():
                    word[i] = result["pieces"][i].startswith(marker)
                starts = np.where(word, np.minimum(next_solid[starts], ends), starts)
                out.append((ids, starts, ends))
        return out

    def decode(self, ids: Iterable[Sequence[int]]) -> list[str]:
        """Text for each id sequence (list, numpy array or 1-D tensor of ints).

        Each sequence is cut at its first ``EOS_ID``; ``PAD_ID`` and ``BOS_ID`` anywhere are dropped
        (a decoder output usually starts with BOS and is padded after EOS). ``UNK_ID`` decodes to
        sentencepiece's unknown surface (`` ⁇ ``).
        """
        cleaned: list[list[int]] = []
        size = self.vocab_size
        for seq in ids:
            seq = seq.tolist() if hasattr(seq, "tolist") else list(seq)
            kept: list[int] = []
            for i in seq:
                i = int(i)
                if i == EOS_ID:
                    break
                if i in (PAD_ID, BOS_ID):
                    continue
                if not 0 <= i < size:
                    raise ValueError(f"SubwordTokenizer.decode: id {i} is outside the vocabulary 0..{size - 1} of {self.path.name}")
                kept.append(i)
            cleaned.append(kept)
        return list(self.processor.decode(cleaned)) if cleaned else []

    def id_to_piece(self, i: int) -> str:
        return self.processor.id_to_piece(int(i))

    def __repr__(self) -> str:
        return f"SubwordTokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"


def train_or_load(
    texts: Sequence[str],
    *,
    vocab_size: int,
    cache_dir: str | os.PathLike,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    byte_fallback: bool = False,
    hard_vocab_limit: bool = True,
    normalization_rule_name: str = "nmt_nfkc",
    max_sentences: int = 1_000_000,
    max_sentence_length: int = 4192,
    seed: int = 0,
    num_threads: int | None = None,
) -> SubwordTokenizer:
    """The joint subword model for ``texts``: loaded from the cache if trained before, else trained now.

    Args:
        texts: training sentences, one string each; pass the source *and* target training sides for a
            joint vocabulary. Empty strings are ignored for training (but are part of the cache key).
        vocab_size: total number of ids, the four special ones included.
        cache_dir: the run's cache root; the model goes to ``<cache_dir>/tokenizers/<key>.model``.
        model_type: one of ``MODEL_TYPES``; ``bpe`` as in the paper.
        character_coverage: share of the training characters that get their own piece. 1.0 keeps every
            character (right for Latin-script pairs); ~0.9995 is usual when Japanese/Chinese is
            involved, where the rarest characters then become ``<unk>`` or bytes.
        byte_fallback: spell characters without a piece as UTF-8 byte pieces instead of ``<unk>``.
            Off by default: it takes 256 ids, and with ``character_coverage=1.0`` it only matters for
            characters absent from the whole training set (as with the paper's subword-nmt BPE,
            whose unseen characters are unknown words too). Turn it on for ja/zh with coverage < 1.
        hard_vocab_limit: if True (default), a ``vocab_size`` the data cannot fill is an error rather
            than a silently smaller vocabulary, so the configured size is the size you get.
        normalization_rule_name: sentencepiece's normaliser (``nmt_nfkc`` default, ``identity`` to keep
            text exactly as given apart from whitespace).
        max_sentences: at most this many of the non-empty ``texts`` are used for training, chosen by a
            permutation seeded with ``seed`` (our own sampling, not sentencepiece's, so the choice is
            reproducible). BPE statistics settle long before the 9M sentences of WMT14 en-de, and this
            keeps training to minutes and a few GB on 2 cores. ``0`` means all.
        max_sentence_length: longer sentences (in bytes) are skipped by the trainer.
        seed: seeds the sub-sampling and sentencepiece's random generator.
        num_threads: trainer threads, default: the usable cores, at most 16. Not part of the cache key:
            the pieces and scores do not depend on it (checked in the tests), only the speed.

    Returns:
        The ``SubwordTokenizer``. Raises ``ValueError`` (one line) if the settings are invalid or the
        vocabulary size does not fit the data, naming a size that would.
    """
    if isinstance(texts, str):
        raise TypeError("train_or_load: texts must be a list of sentences, not one string")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"train_or_load: model_type={model_type!r} is not one of {', '.join(MODEL_TYPES)}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < len(SPECIAL_PIECES) + 1:
        raise ValueError(f"train_or_load: vocab_size must be an int > {len(SPECIAL_PIECES)}, got {vocab_size!r}")
    if not 0.0 < float(character_coverage) <= 1.0:
        raise ValueError(f"train_or_load: character_coverage must be in (0, 1], got {character_coverage!r}")
    if max_sentences < 0:
        raise ValueError(f"train_or_load: max_sentences must be >= 0 (0 = all), got {max_sentences!r}")

    settings = {
        "format_version": _TRAINING_FORMAT_VERSION,
        "sentencepiece_version": spm.__version__,
        "vocab_size": int(vocab_size),
        "model_type": model_type,
        "character_coverage": float(character_coverage),
        "byte_fallback": bool(byte_fallback),
        "hard_vocab_limit": bool(hard_vocab_limit),
        "normalization_rule_name": normalization_rule_name,
        "max_sentences": int(max_sentences),
        "max_sentence_length": int(max_sentence_length),
        "seed": int(seed),
        "special_ids": {str(i): piece for i, piece in SPECIAL_PIECES.items()},
    }
    key = cache_key(texts, settings)
    directory = Path(cache_dir) / "tokenizers"
    model_path = directory / f"{key}.model"

    if model_path.is_file():
        try:
            tokenizer = SubwordTokenizer(model_path)
            logger.info("tokenizer: loaded %s (vocab %d)", model_path, tokenizer.vocab_size)
            return tokenizer
        except Exception as err:  # e.g. a file damaged outside this program: rebuild it
            logger.warning("tokenizer: cannot load cached %s (%s); training it again", model_path, err)

    threads = int(num_threads) if num_threads else _default_threads()
    sample = _training_sample(texts, max_sentences=int(max_sentences), seed=int(seed))
    if not sample:
        raise ValueError("train_or_load: no non-empty training sentences to build a vocabulary from")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".tmp", dir=directory))
    start = time.perf_counter()
    try:
        _train(sample, tmp / "spm", settings, threads)
        # .vocab and .json first: the .model appearing is what marks the cache entry as finished.
        os.replace(tmp / "spm.vocab", directory / f"{key}.vocab")
        atomic_write_json(directory / f"{key}.json", {**settings, "num_training_sentences": len(sample), "num_texts": len(texts)})
        os.replace(tmp / "spm.model", model_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = SubwordTokenizer(model_path)
    logger.info(
        "tokenizer: trained %s on %d sentences in %.1fs (vocab %d)",
        model_path, len(sample), time.perf_counter() - start, tokenizer.vocab_size,
    )
    return tokenizer


def _default_threads() -> int:
    try:
        available = len(os.sched_getaffinity(0))  # respects taskset / cgroup CPU pinning
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    return max(1, min(available, 16))


def cache_key(texts: Sequence[str], settings: dict) -> str:
    """sha256 hex digest over ``settings`` (canonical JSON) and ``texts`` in order.

    Each chunk of texts is hashed as its UTF-8 byte lengths followed by the bytes, so no two different
    lists give the same byte stream (``["a b"]`` vs ``["a", "b"]``, texts containing newlines).
    """
    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True).encode("utf-8"))
    h.update(len(texts).to_bytes(8, "little"))
    for start in range(0, len(texts), _CHUNK):
        encoded = [t.encode("utf-8") for t in texts[start:start + _CHUNK]]
        h.update(np.array([len(b) for b in encoded], dtype="<i8").tobytes())
        h.update(b"".join(encoded))
    return h.hexdigest()


def _training_sample(texts: Sequence[str], *, max_sentences: int, seed: int) -> list[str]:
    """The non-empty texts, or a seeded random subset of ``max_sentences`` of them, in corpus order."""
    nonempty = [i for i, t in enumerate(texts) if t and not t.isspace()]
    if max_sentences and len(nonempty) > max_sentences:
        chosen = np.sort(np.random.default_rng(seed).permutation(len(nonempty))[:max_sentences])
        nonempty = [nonempty[i] for i in chosen]
    return [texts[i] for i in nonempty]


_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def _train(sample: list[str], prefix: Path, settings: dict, threads: int) -> None:
    """Run the sentencepiece trainer on ``sample``; writes ``<prefix>.model`` and ``<prefix>.vocab``."""
    spm.set_random_generator_seed(settings["seed"])
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample),
            model_prefix=str(prefix),
            vocab_size=settings["vocab_size"],
            model_type=settings["model_type"],
            character_coverage=settings["character_coverage"],
            byte_fallback=settings["byte_fallback"],
            hard_vocab_limit=settings["hard_vocab_limit"],
            normalization_rule_name=settings["normalization_rule_name"],
            max_sentence_length=settings["max_sentence_length"],
            # the sample is already chosen (reproducibly) above: the trainer must use all of it
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=threads,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece=SPECIAL_PIECES[PAD_ID], unk_piece=SPECIAL_PIECES[UNK_ID],
            bos_piece=SPECIAL_PIECES[BOS_ID], eos_piece=SPECIAL_PIECES[EOS_ID],
            minloglevel=1,  # warnings and errors only; the info log is thousands of lines
        )
    except RuntimeError as err:
        message = str(err)
        where = f"{len(sample)} training sentences, model_type={settings['model_type']}"
        match = _TOO_HIGH.search(message)
        if match:
            raise ValueError(
                f"tokenizer: vocab_size={match.group(1)} is more pieces than sentencepiece can build from the "
                f"{where}; set vocab_size <= {match.group(2)} (or hard_vocab_limit=false to accept a smaller vocabulary)"
            ) from None
        match = _TOO_LOW.search(message)
        if match:
            raise ValueError(
                f"tokenizer: vocab_size={match.group(1)} is smaller than the {match.group(2)} characters and special "
                f"pieces of the {where}; set vocab_size >= {match.group(2)} or lower character_coverage"
            ) from None
        raise ValueError(f"tokenizer: sentencepiece training failed ({where}): {' '.join(message.split())}") from None
