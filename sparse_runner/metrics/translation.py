"""Translation quality: the paper's tokenized BLEU, plus sacreBLEU and chrF for comparable reporting.

Correia et al. (2019, Table 1) report *tokenized* BLEU: hypotheses and references are Moses-tokenized
and scored with ``multi-bleu.perl`` (corpus BLEU over whitespace tokens, case-sensitive, 4-grams,
no smoothing, brevity penalty against the reference length). That number depends on the tokenizer,
so we also report detokenized sacreBLEU and chrF with their signature strings, which are comparable
across papers.

``translation_scores`` takes *detokenized* text on both sides (what ``SubwordTokenizer.decode``
returns and what the raw references are).
"""

from __future__ import annotations

import functools
import logging
from typing import Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

from sparse_runner.example_scores import BLEU_COLUMNS, BLEU_ORDER

logger = logging.getLogger(__name__)

MAX_NGRAM_ORDER = BLEU_ORDER   # multi-bleu.perl's 4-grams
# Target languages for which Moses tokenization does not split words (no spaces in the script); their
# tokenized BLEU uses sacreBLEU's tokenizer for the language instead (see _tokenized_bleu_recipe).
_UNSEGMENTED = {"zh": "zh", "ja": "ja-mecab"}


def translation_scores(hypotheses: Sequence[str], references: Sequence[str], *, target_lang: str) -> dict:
    """Corpus-level scores of ``hypotheses`` against one reference each, all in [0, 100].

    Returns:
        ``{"bleu": float, "sacrebleu": float, "chrf": float, "sacrebleu_signature": str,
        "chrf_signature": str, "bleu_tokenization": str}`` where

        * ``bleu`` is the paper's tokenized BLEU: both sides Moses-tokenized (``sacremoses``, the
          ``target_lang`` rules, no XML escaping), then multi-bleu.perl-style corpus BLEU
          (sacreBLEU with ``tokenize="none"``, no smoothing, case-sensitive). For ja/zh targets the
          tokenizer is sacreBLEU's ja-mecab (``char`` if MeCab is not installed) / zh instead.
          ``bleu_tokenization`` says which recipe was used.
        * ``sacrebleu`` is standard detokenized sacreBLEU (``13a``; sacreBLEU's defaults ``zh`` and
          ``ja-mecab``/``ko-mecab`` for those targets, falling back to ``char`` with a warning when
          MeCab is not installed -- the signature then says ``tok:char``).
        * ``chrf`` is sacreBLEU chrF (character 6-grams, beta 2).

    Empty input gives 0.0 for every score. Lists of different lengths raise ``ValueError``.
    """
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("translation_scores takes lists of sentences, not a single string")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"translation_scores: {len(hypotheses)} hypotheses but {len(references)} references; "
            "expected one reference per hypothesis"
        )
    lang = _base_lang(target_lang)
    hypotheses = [_as_segment(h) for h in hypotheses]
    references = [_as_segment(r) for r in references]

    sacre = _sacrebleu_metric(lang)
    chrf = CHRF()
    tokenized = BLEU(tokenize="none", smooth_method="none", force=True, max_ngram_order=MAX_NGRAM_ORDER)
    recipe = _tokenized_bleu_recipe(lang)

    if not hypotheses:
        # sacreBLEU cannot score an empty corpus (and only knows its signature after scoring), so the
        # signatures come from scoring one dummy pair with identically configured metrics.
        return {
            "bleu": 0.0, "sacrebleu": 0.0, "chrf": 0.0,
            "sacrebleu_signature": _signature_after_dummy(_sacrebleu_metric(lang)),
            "chrf_signature": _signature_after_dummy(CHRF()),
            "bleu_tokenization": recipe,
        }

    sacre_score = sacre.corpus_score(hypotheses, [references]).score
    chrf_score = chrf.corpus_score(hypotheses, [references]).score
    tok_hyps = [_tokenize(h, lang) for h in hypotheses]
    tok_refs = list(_tokenize_references(tuple(references), lang))
    bleu_score = tokenized.corpus_score(tok_hyps, [tok_refs]).score
    return {
        "bleu": float(bleu_score),
        "sacrebleu": float(sacre_score),
        "chrf": float(chrf_score),
        "sacrebleu_signature": str(sacre.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_tokenization": recipe,
    }


def bleu_statistics(hypotheses: Sequence[str], references: Sequence[str], *, target_lang: str) -> np.ndarray:
    """(n, 10) per-sentence statistics of the paper's tokenized BLEU (``translation_scores``'s ``bleu``), in the
    order of ``example_scores.BLEU_COLUMNS``: hypothesis and reference lengths, matched and total n-grams for n = 1..4.
    Corpus BLEU is a function of their column sums (``example_scores.bleu_from_statistics``), which lets an interval
    resample sentences without decoding again."""
    if len(hypotheses) != len(references):
        raise ValueError(f"bleu_statistics: {len(hypotheses)} hypotheses but {len(references)} references")
    lang = _base_lang(target_lang)
    tok_hyps = [_tokenize(_as_segment(h), lang) for h in hypotheses]
    tok_refs = _tokenize_references(tuple(_as_segment(r) for r in references), lang)
    # effective_order only changes a sentence's own score, not its counts; it silences sacreBLEU's advice.
    sentence = BLEU(tokenize="none", smooth_method="none", force=True, max_ngram_order=MAX_NGRAM_ORDER, effective_order=True)
    rows = []
    for hyp, ref in zip(tok_hyps, tok_refs):
        score = sentence.sentence_score(hyp, [ref])
        rows.append([score.sys_len, score.ref_len, *score.counts, *score.totals])
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(BLEU_COLUMNS))


def _base_lang(code: str) -> str:
    """``"en"``, ``"EN"``, ``"en-US"``, ``"en_GB"`` -> ``"en"``."""
    if not isinstance(code, str) or not code.strip():
        raise ValueError(f"translation_scores: target_lang must be a language code such as 'en' or 'de', got {code!r}")
    return code.strip().lower().replace("_", "-").split("-")[0]


def _as_segment(text: str) -> str:
    # A newline inside a sentence would be read as two segments by line-based BLEU scripts; sacreBLEU
    # scores it as one segment anyway, but the Moses tokenizer works line by line.
    return " ".join(str(text).split("\n")).strip()


def _sacrebleu_metric(lang: str) -> BLEU:
    try:
        return BLEU(trg_lang=lang)
    except (RuntimeError, ImportError) as err:  # ja-mecab / ko-mecab need extra packages
        _warn_once(f"sacreBLEU's default tokenizer for target '{lang}' is unavailable ({' '.join(str(err).split())[:120]}); using tokenize=char")
        return BLEU(tokenize="char", trg_lang=lang)


def _signature_after_dummy(metric) -> str:
    metric.corpus_score(["x"], [["x"]])
    return str(metric.get_signature())


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    logger.warning(message)


@functools.lru_cache(maxsize=None)
def _sacrebleu_tokenizer_available(name: str) -> bool:
    try:
        BLEU(tokenize=name)
        return True
    except (RuntimeError, ImportError):
        return False


def _tokenized_bleu_recipe(lang: str) -> str:
    """Words describing how ``bleu`` is computed for target ``lang`` (stored with the results)."""
    tail = f"case-sensitive, multi-bleu.perl-style corpus BLEU ({MAX_NGRAM_ORDER}-grams, no smoothing) via sacrebleu tokenize=none"
    if lang in _UNSEGMENTED:
        name = _UNSEGMENTED[lang]
        if not _sacrebleu_tokenizer_available(name):
            name = "char"
        return f"sacreBLEU {name} tokenizer (Moses does not segment {lang}), {tail}"
    import sacremoses

    return f"Moses tokenizer (sacremoses {sacremoses.__version__}, lang={lang}, escape=False, aggressive_dash_splits=False), {tail}"


@functools.lru_cache(maxsize=16)
def _moses(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


@functools.lru_cache(maxsize=16)
def _sacrebleu_tokenizer(lang: str):
    name = _UNSEGMENTED[lang]
    if not _sacrebleu_tokenizer_available(name):
        name = "char"
    from sacrebleu.metrics.bleu import _get_tokenizer

    return _get_tokenizer(name)()


def _tokenize(text: str, lang: str) -> str:
    if lang in _UNSEGMENTED:
        return _sacrebleu_tokenizer(lang)(text)
    # escape=False: multi-bleu.perl only splits on whitespace, so XML-escaping ("&apos;") would change
    # nothing but the token spelling, identically on both sides.
    return _moses(lang).tokenize(text, escape=False, return_str=True)


@functools.lru_cache(maxsize=8)
def _tokenize_references(references: tuple[str, ...], lang: str) -> tuple[str, ...]:
    # The same validation references are scored at every evaluation: tokenize them once.
    return tuple(_tokenize(r, lang) for r in references)
