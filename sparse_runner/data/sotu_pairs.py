"""The offline substitute for MultiNLI: ``sotu_pairs`` (there is no NLI data in the package, and none
reachable offline). The text is real -- sentences of the State of the Union addresses shipped with the
package (``sparse_runner.data.corpora.load_sotu_en``, as ``documents.sotu_documents``) -- but the pairs
and their labels are GENERATED.  The three labels are discourse relations, NOT entailment:

  0 "entailment"     the hypothesis is the next sentence of the premise's speech (continuation);
  1 "neutral"        the hypothesis is a sentence of the same speech at least ``neutral_min_distance``
                     (10) sentences away from the premise (same document, not adjacent);
  2 "contradiction"  the hypothesis is a sentence of another speech of the same split (different document).

The MNLI class names are kept only so that the MNLI code path (model, metrics, reports) runs unchanged
offline; an accuracy on this substitute says nothing about inference.  How the pairs are drawn
(balance, what a model cannot exploit, splits, matched / mismatched): ``sotu_pairs``.

Pure Python + numpy: the data layer needs no torch.
"""

from __future__ import annotations

import logging
import zlib
from typing import Mapping, Sequence

import numpy as np

from sparse_runner.checks import ConfigError
from sparse_runner.data.mnli_pairs import PairSplit

logger = logging.getLogger(__name__)

SUBSTITUTE_GENRE = "sotu"
SUBSTITUTE_DESCRIPTION = (
    "State of the Union sentence pairs (real text, generated pairs and labels): "
    "'entailment' = the next sentence of the speech, 'neutral' = a sentence of the same speech >= 10 sentences away, "
    "'contradiction' = a sentence of another speech; discourse relations, not entailment; no mismatched genre"
)
MIN_WORDS = 4  # shorter sentences ("(Applause.)", "Thank you.") are not used
MAX_WORDS = 60  # longer ones are cut to their first 60 words (99th percentile of SOTU sentences: ~95 words)


def usable_sentence(sentence: str, min_words: int = MIN_WORDS, max_words: int = MAX_WORDS) -> str | None:
    """`sentence` with its whitespace collapsed and cut at `max_words` words; None if under `min_words`."""
    words = sentence.split()
    return " ".join(words[:max_words]) if len(words) >= min_words else None


def _seed_for(seed: int, split: str, *more: int) -> np.random.Generator:
    # A generator per (seed, split, document): one split's pairs do not depend on the other splits, nor
    # one document's premises on the other documents'.
    return np.random.default_rng([int(seed), zlib.crc32(split.encode("utf-8")), *more])


def sotu_pairs(
    documents_by_split: Mapping[str, Sequence[Sequence[str]]],
    *,
    seed: int = 0,
    pairs_per_document: int | None = None,
    neutral_min_distance: int = 10,
    min_words: int = MIN_WORDS,
    max_words: int = MAX_WORDS,
) -> dict[str, PairSplit]:
    """The offline substitute for MNLI: 3-way pairs of real sentences with generated labels, per split.

    `documents_by_split`: ``{split: [document, ...]}``, a document being its sentences in order
    (``sotu_documents()``).  Returns ``{split: PairSplit}`` with the same keys: pairs of a split come only
    from that split's documents.

    Sentences: whitespace collapsed, those under `min_words` words dropped, the rest cut at `max_words`
    words.  "Next" means next among the sentences kept, so only fragments of under `min_words` words
    ("(Applause.)") can lie between a premise and its continuation.

    Pairs: every kept sentence that has a next sentence (and a neutral candidate) is a premise -- or
    `pairs_per_document // 3` of them per document, drawn at random, when `pairs_per_document` is set --
    and each premise gives THREE pairs, one per label, as MNLI's premises do:

      0 "entailment"     its next sentence;
      1 "neutral"        a sentence of the same document at least `neutral_min_distance` positions away;
      2 "contradiction"  the continuation ("entailment" hypothesis) of a premise of another document of
                         the same split, drawn at random.

    So the classes are exactly balanced in every split, the premise alone says nothing about the label,
    and the three hypotheses come from (nearly) the same distribution of sentences: contradiction
    hypotheses are drawn from the entailment hypotheses rather than from all sentences, which would
    over-represent long speeches (the written messages of the 19th century) and make the era of the
    hypothesis a cue.  Neutral and contradiction hypotheses never repeat the premise's text or its next
    sentence's, and no speech holds both texts of a contradiction pair (a few sentences recur verbatim in
    several speeches).

    Splits: SOTU's own split by whole speeches is kept (train speeches -> train pairs, val -> val, test ->
    test).  A few sentences recur verbatim in other speeches (boilerplate, or a president repeating
    himself: 28 texts on the shipped corpus); a sentence whose text occurs in another split's documents is
    never used as a premise or hypothesis (its position still counts for "next"), so no sentence text is
    shared between the pairs of two splits.

    Matched / mismatched: every pair is ``matched``, and there is no mismatched split.  MNLI's mismatched
    set holds genres absent from training; SOTU has one genre, and its speech split spreads every era over
    train (train holds 10 to 47 speeches of every half-century from 1790 to 2021, written and spoken
    messages alike, and a speech of every president of val and test), so neither genre nor era nor
    president can set some validation speeches apart from training.  Calling some of them "mismatched" would report a domain shift that is not there.

    Deterministic: the pairs of a split depend only on `seed`, the split's name, its documents, the options
    and (through the texts left out) the sentences of the other splits; the order of the pairs is shuffled
    (seeded), so that any prefix holds all three labels in about equal numbers.
    """
    if pairs_per_document is not None and pairs_per_document < 3:
        raise ConfigError(f"pairs_per_document: must be >= 3 (each premise gives one pair per label) or None for all, got {pairs_per_document}")
    if neutral_min_distance < 2:
        raise ConfigError(f"neutral_min_distance: must be >= 2 (1 is the next sentence), got {neutral_min_distance}")
    if not 1 <= min_words <= max_words:
        raise ConfigError(f"min_words / max_words: need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    kept = {
        split: [[usable_sentence(s, min_words, max_words) for s in doc] for doc in docs]
        for split, docs in documents_by_split.items()
    }
    kept = {split: [[s for s in doc if s is not None] for doc in docs] for split, docs in kept.items()}
    splits_of: dict[str, set[str]] = {}
    for split, docs in kept.items():
        for doc in docs:
            for sentence in doc:
                splits_of.setdefault(sentence, set()).add(split)
    shared = {s for s, where in splits_of.items() if len(where) > 1}
    if shared:
        logger.info("sotu_pairs: %d sentence texts occur in more than one split; they are not used", len(shared))
    return {split: _split_pairs(split, docs, shared, seed, pairs_per_document, neutral_min_distance) for split, docs in kept.items()}


def _draw(rng: np.random.Generator, count: int, accept, tries: int = 64) -> int | None:
    """A uniform draw among range(count) that `accept` takes: rejection sampling, then (when the accepted
    ones are rare) a draw among all of them; None if there are none."""
    for _ in range(tries):
        k = int(rng.integers(count))
        if accept(k):
            return k
    accepted = [k for k in range(count) if accept(k)]
    return accepted[int(rng.integers(len(accepted)))] if accepted else None


def _split_pairs(split: str, docs: list[list[str]], shared: set[str], seed: int, pairs_per_document: int | None, gap: int) -> PairSplit:
    premise_doc, premise_pos, neutral_pos = [], [], []
    for d, doc in enumerate(docs):
        n = len(doc)
        usable = [s not in shared for s in doc]
        # premises: a usable sentence followed by another usable one, with some position >= gap away
        candidates = [i for i in range(n - 1) if usable[i] and usable[i + 1] and doc[i] != doc[i + 1] and (i >= gap or i + gap < n)]
        rng = _seed_for(seed, split, d)
        if pairs_per_document is not None and len(candidates) > pairs_per_document // 3:
            chosen = np.sort(rng.choice(len(candidates), size=pairs_per_document // 3, replace=False))
            candidates = [candidates[c] for c in chosen]
        for i in candidates:
            # neutral: positions 0 .. i-gap, then i+gap .. n-1, numbered 0 .. count-1
            before = max(0, i - gap + 1)
            count = before + max(0, n - i - gap)
            positions = lambda k, i=i, before=before: k if k < before else i + gap + (k - before)  # noqa: E731
            ok = lambda k, i=i, positions=positions: usable[positions(k)] and doc[positions(k)] not in (doc[i], doc[i + 1])  # noqa: E731
            k = _draw(rng, count, ok)
            if k is not None:
                premise_doc.append(d)
                premise_pos.append(i)
                neutral_pos.append(positions(k))
    if not premise_doc:
        raise ConfigError(f"sotu_pairs: split {split!r} gives no pairs ({len(docs)} documents; each needs more than {gap} usable sentences)")
    if len(set(premise_doc)) < 2:
        raise ConfigError(f"sotu_pairs: split {split!r} needs premises from at least two documents for the 'contradiction' pairs, got {len(set(premise_doc))}")
    # contradiction: the continuation of a random premise of another document
    rng = _seed_for(seed, split, len(docs) + 1)
    docs_of: dict[str, set[int]] = {}  # text -> the documents holding it (a few texts recur)
    for d, doc in enumerate(docs):
        for sentence in doc:
            docs_of.setdefault(sentence, set()).add(d)
    nexts = [docs[d][i + 1] for d, i in zip(premise_doc, premise_pos)]
    premises, hypotheses, labels = [], [], []
    for k, (d, i) in enumerate(zip(premise_doc, premise_pos)):
        premise = docs[d][i]
        # no document may hold both texts, or the pair would also be a "same document" one
        c = _draw(rng, len(nexts), lambda c: docs_of[nexts[c]].isdisjoint(docs_of[premise]))
        if c is None:
            raise ConfigError(f"sotu_pairs: split {split!r}: no sentence of another document for the 'contradiction' pair of document {d}")
        for label, hypothesis in enumerate((nexts[k], docs[d][neutral_pos[k]], nexts[c])):
            premises.append(premise)
            hypotheses.append(hypothesis)
            labels.append(label)
    order = _seed_for(seed, split, len(docs) + 2).permutation(len(labels))
    return PairSplit(
        premises=[premises[o] for o in order],
        hypotheses=[hypotheses[o] for o in order],
        labels=np.asarray(labels, np.int64)[order],
        matched=np.ones(len(labels), bool),
        genres=[SUBSTITUTE_GENRE] * len(labels),
    )
