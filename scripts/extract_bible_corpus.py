#!/usr/bin/env python
"""Build the offline Spanish→English Bible corpus (sparse_runner/data/bible_es_en.tsv.xz).

    python scripts/extract_bible_corpus.py --debs /tmp/debs     # .debs already downloaded
    python scripts/extract_bible_corpus.py                      # fetches them with `apt-get download`

Sources (public domain, Debian main): ``sword-text-sparv`` 2.60-1 (Reina-Valera 1909, SWORD module
``spaRV1909eb``) and ``sword-text-web`` 426.0-1 (World English Bible, module ``engWEB2015eb``).

Steps, and why:

1. Read both SWORD zText modules (see `read_ztext`).  A zText index has one slot per position of the
   module's versification: for each testament a couple of leading slots (empty, module header), then
   per book one introduction slot, and per chapter one heading slot ("verse 0") followed by one slot
   per verse.  Verse slots carry no osisID, so keys are derived from the chapter heading: the slot
   that opens ``<chapter osisID="Gen.1" sID=…>`` is verse 0 and the k-th slot after it is verse k,
   until a slot that opens a book (``<div type="book|front" sID=…>``, the next book's introduction).
   The two modules use different versifications (KJV and NRSVA); both are checked to give the same
   keys wherever both have the chapter (`check_keys`).
2. Clean each verse (`clean_osis`): drop footnotes, editorial headings and speaker labels, then all
   markup; unescape entities; one space between words; no tabs or newlines (the TSV needs no quoting).
3. Pair the verses whose key exists in both modules (WEB also has the deuterocanon, which is dropped)
   and where both sides are non-empty.  Undo RV1909's capitalised chapter openings ("EN el
   principio" -> "En el principio", `undo_drop_caps`).
4. Drop chapters whose verse numbering differs between the two traditions (`misaligned_chapters`):
   in a few chapters (e.g. Numbers 13, 1 Samuel 24, Job 40) one tradition numbers the verses one or
   more off, so every pair from the shift onwards is a wrong translation.  Two detectors, either
   suffices: a length-based alignment (Gale & Church style dynamic programming on character counts)
   that flags a chapter when allowing merged or skipped verses explains the lengths much better than
   pairing verse i with verse i; and a shared-word-stem test that flags a chapter when Spanish verse i
   shares more name/cognate stems with English verse i+k (k != 0) than with verse i.
5. Drop single pairs whose length ratio is absurd (`MAX_RATIO`): the rest of merged verses, the
   subscriptions RV1909 appends to epistles, textual variants.
6. Split by whole chapters (so neighbouring verses, which share names and phrasing, never straddle two
   splits): chapters are shuffled with ``random.Random(SEED)`` and taken in that order into val until it
   holds >= 1000 pairs, then into test likewise; every other chapter is train.
7. Write one UTF-8 TSV, header ``split book chapter verse es en``, rows in canonical (RV1909 index)
   order, compressed with xz at a fixed preset, atomically.  The xz container has no timestamps, so
   two runs give byte-identical files.
"""

from __future__ import annotations

import argparse
import html
import lzma
import math
import random
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import unicodedata
import zlib
from collections import Counter
from pathlib import Path
from typing import Iterator, NamedTuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "sparse_runner" / "data" / "bible_es_en.tsv.xz"

# lang: (Debian package, version the shipped corpus was built from, SWORD module)
PACKAGES = {
    "es": ("sword-text-sparv", "2.60-1", "spaRV1909eb"),
    "en": ("sword-text-web", "426.0-1", "engWEB2015eb"),
}
TESTAMENTS = ("ot", "nt")
SEED = 0
VAL_PAIRS = 1000
TEST_PAIRS = 1000
XZ_PRESET = 9
HEADER = ("split", "book", "chapter", "verse", "es", "en")

Key = tuple[str, int, int]  # (OSIS book id, chapter, verse)


# --------------------------------------------------------------------------------------------------
# SWORD zText reading
# --------------------------------------------------------------------------------------------------

BLOCK_RECORD = struct.Struct("<III")  # .bzs: offset in .bzz, compressed size, uncompressed size
ENTRY_RECORD = struct.Struct("<IIH")  # .bzv: block number, offset in the uncompressed block, size


def read_ztext(module_dir: Path, testament: str) -> list[str]:
    """All index slots of one testament of a zText module, as raw OSIS strings ('' for empty slots).

    `testament` is "ot" or "nt"; a module without that testament yields [].  Only ZIP (zlib)
    compression is supported, which is what both modules declare (CompressType=ZIP).
    """
    paths = [module_dir / f"{testament}.{ext}" for ext in ("bzs", "bzv", "bzz")]
    if not all(p.exists() for p in paths):
        return []
    bzs, bzv, bzz = (p.read_bytes() for p in paths)
    blocks = [BLOCK_RECORD.unpack_from(bzs, i) for i in range(0, len(bzs), BLOCK_RECORD.size)]
    unpacked: dict[int, bytes] = {}  # each block (a book) is decompressed once
    entries = []
    for pos in range(0, len(bzv) - ENTRY_RECORD.size + 1, ENTRY_RECORD.size):
        block, offset, size = ENTRY_RECORD.unpack_from(bzv, pos)
        if size == 0:
            entries.append("")
            continue
        if block not in unpacked:
            start, compressed, expected = blocks[block]
            data = zlib.decompress(bzz[start : start + compressed])
            if len(data) != expected:
                raise ValueError(f"{module_dir}/{testament}: block {block} is {len(data)} bytes, index says {expected}")
            unpacked[block] = data
        entries.append(unpacked[block][offset : offset + size].decode("utf-8"))
    return entries


CHAPTER_START = re.compile(r'<chapter\b[^>]*\bosisID="([^"]+)"[^>]*/?>')
# A book (or front matter) introduction opens with a milestone-style div carrying sID; the book's
# closing div (eID) sits at the end of its last verse and must not end that verse's chapter.
BOOK_START = re.compile(r'<div\b(?=[^>]*\bsID=)(?=[^>]*\btype="(?:book|front)")[^>]*>')


def iter_verse_slots(entries: list[str]) -> Iterator[tuple[str, int, int, str]]:
    """Yield (book, chapter, verse, raw OSIS) for every verse slot of one testament.

    The chapter heading slot (the one opening ``<chapter osisID="Book.N">``) is verse 0; the slots
    after it are verses 1, 2, ...  A slot opening a book introduction ends the chapter, as does the
    next chapter heading.  Slots before the first chapter (module header, first introduction) are
    skipped.  A slot that opens several chapters at once (WEB's Greek Daniel, which its
    versification has no room for) makes the numbering of those chapters meaningless: the chapter
    is skipped until the next clean chapter heading.
    """
    current: tuple[str, int] | None = None
    heading = 0
    for slot, raw in enumerate(entries):
        chapters = CHAPTER_START.findall(raw)
        if chapters:
            book, _, number = chapters[-1].rpartition(".")
            current = (book, int(number)) if len(chapters) == 1 else None
            heading = slot
        elif BOOK_START.search(raw):
            current = None
        elif current is not None:
            yield current[0], current[1], slot - heading, raw


def read_module(module_dir: Path) -> dict[Key, str]:
    """{(book, chapter, verse): raw OSIS} of a module, both testaments, in index order."""
    verses: dict[Key, str] = {}
    for testament in TESTAMENTS:
        for book, chapter, verse, raw in iter_verse_slots(read_ztext(module_dir, testament)):
            verses[(book, chapter, verse)] = raw
    return verses


# --------------------------------------------------------------------------------------------------
# Cleaning
# --------------------------------------------------------------------------------------------------

NOTE = re.compile(r"<note\b.*?</note>", re.S)
# Not part of the verse text: speaker labels (Song of Songs in WEB) and editorial headings. Canonical
# titles (Psalm superscriptions) are kept: both modules put them at the start of verse 1.
EDITORIAL = re.compile(r"<speaker\b.*?</speaker>|<title\b(?![^>]*\bcanonical=\"true\")[^>]*>.*?</title>", re.S)
EMPTY_TAG = re.compile(r"<[^<>]*/>")  # milestones: line, paragraph and division boundaries
TAG = re.compile(r"<[^<>]*>")  # start and end tags of inline elements: <w lemma=…>, <transChange>, …
SPACE_BEFORE_PUNCT = re.compile(r"\s+(?=[,.;:!?])")


def clean_osis(raw: str) -> str:
    """Plain text of one OSIS verse.

    Notes, headings and speaker labels become a space (a note sits between two words).  Milestone
    elements (``<l sID/>``, ``<lb/>``, ``<div sID/>``) become a space too, since they separate lines
    of poetry that have no space between them; inline tags (``<w>``, ``<transChange>``) are removed
    without a space, so ``<w>word</w>,`` stays ``word,``.  Whitespace (tabs and newlines included)
    is collapsed to single spaces.
    """
    text = NOTE.sub(" ", raw)
    text = EDITORIAL.sub(" ", text)
    text = EMPTY_TAG.sub(" ", text)
    text = TAG.sub("", text)
    text = html.unescape(text)
    text = " ".join(text.split())
    return SPACE_BEFORE_PUNCT.sub("", text)  # a removed note or milestone may sit before punctuation


# --------------------------------------------------------------------------------------------------
# Pairing and filtering
# --------------------------------------------------------------------------------------------------


class Pair(NamedTuple):
    book: str
    chapter: int
    verse: int
    es: str
    en: str


def check_keys(es: dict[Key, str], en: dict[Key, str]) -> list[str]:
    """Chapters both modules have but with different verse slots (versification differences)."""
    def slots(verses: dict[Key, str]) -> dict[tuple[str, int], set[int]]:
        out: dict[tuple[str, int], set[int]] = {}
        for book, chapter, verse in verses:
            out.setdefault((book, chapter), set()).add(verse)
        return out

    es_slots, en_slots = slots(es), slots(en)
    return [
        f"{book} {chapter}: es {len(es_slots[c])} verse slots, en {len(en_slots[c])}"
        for c in es_slots
        if c in en_slots and es_slots[c] != en_slots[c]
        for book, chapter in [c]
    ]


def pair_verses(es: dict[Key, str], en: dict[Key, str]) -> tuple[list[Pair], int]:
    """Pairs for the keys present in both modules with text on both sides, in Spanish index order.

    Returns (pairs, number of common keys dropped because one side is empty).
    """
    pairs, empty = [], 0
    for key, raw in es.items():
        if key not in en:
            continue
        es_text, en_text = clean_osis(raw), clean_osis(en[key])
        if es_text and en_text:
            pairs.append(Pair(*key, es_text, en_text))
        else:
            empty += 1
    return pairs, empty


LETTERS = re.compile(r"[^\W\d_]+")


def undo_drop_caps(pairs: list[Pair]) -> list[Pair]:
    """Give the capitalised opening of each RV1909 chapter its ordinary case.

    RV1909 prints the opening of a chapter in capitals, like a drop cap ("EN el principio",
    "Y ACONTECIÓ que", "DE VEINTICINCO años", "Aleluya. ALABAD á"); left alone, a model would learn
    that convention.  In verse 1, each all-capitals word among the first three is rewritten to the
    casing it has most often elsewhere in the Spanish text (verse-initial words excluded), so names
    stay capitalised ("Jacob") and other words are lower-cased ("aconteció"); a word never seen
    elsewhere gets only its first letter capitalised; a sentence-initial word then starts with a
    capital.  Capitals elsewhere (inscriptions such as "REY DE LOS JUDIOS") are left alone.
    """
    seen: Counter[str] = Counter()
    for p in pairs:
        for word in p.es.split()[1:]:
            seen.update(LETTERS.findall(word))

    def recase(caps: str, initial: bool) -> str:
        lower, title = caps.lower(), caps.capitalize()
        cased = title if seen[title] >= seen[lower] else lower
        return cased[0].upper() + cased[1:] if initial else cased

    out = []
    for p in pairs:
        if p.verse == 1:
            words = p.es.split(" ")
            for i, word in enumerate(words[:3]):
                letters = LETTERS.search(word)
                if letters and len(letters.group(0)) > 1 and letters.group(0).isupper():
                    initial = i == 0 or words[i - 1].endswith((".", "!", "?"))  # "Aleluya. ALABAD"
                    words[i] = word[: letters.start()] + recase(letters.group(0), initial) + word[letters.end() :]
            p = p._replace(es=" ".join(words))
        out.append(p)
    return out


def by_chapter(pairs: list[Pair]) -> dict[tuple[str, int], list[Pair]]:
    chapters: dict[tuple[str, int], list[Pair]] = {}
    for p in pairs:
        chapters.setdefault((p.book, p.chapter), []).append(p)
    return chapters


# Two independent detectors of chapters whose verse numbering differs between the two traditions.
# Thresholds were set on this data, where both show a wide gap (the values are in the README):
#
# 1. Lengths (`alignment_gain`).  Model: log(chars_es + K) - log(chars_en + K) is MU +- SIGMA for a
#    true pair (MU, SIGMA estimated robustly from all pairs; K damps very short verses).
SMOOTH_CHARS = 20
MERGE_COST = 3.0  # a 2:1 or 1:2 bead (two verses of one side translate one of the other)
SKIP_COST = 4.0  # a 1:0 or 0:1 bead (a verse with no counterpart: the tail of a shifted chapter)
MAX_PAIR_COST = 2 * SKIP_COST  # so one odd pair (a textual variant) never pays for a detour
MIN_LENGTH_GAIN = 25.0  # flagged chapters score 31.8 and more; all others 17.8 or less (Judges 14,
# whose last three verses are split differently: left to the ratio filter)
# 2. Shared word stems (`stem_offset_gain`): names and cognates (Jacob/Jacob, Mahanaim, Leviatán/
#    Leviathan, ...) line up at the right offset.  This catches shifts of several verses in poetry,
#    where neighbouring verses have similar lengths and the length test is blind (Job 40 is 5 off).
STEM_LETTERS = 4
MAX_OFFSET = 6
MIN_STEM_GAIN = 0.015  # flagged chapters score 0.0197 and more; then Num 30 (0.011, flagged by
# length) and all others 0.0052 or less


def length_model(pairs: list[Pair]) -> tuple[float, float]:
    """Median and robust spread (1.4826 * MAD) of the per-verse log length ratio es/en."""
    logs = [log_ratio(p) for p in pairs]
    mu = statistics.median(logs)
    sigma = 1.4826 * statistics.median(abs(x - mu) for x in logs)
    sigma = max(sigma, 1e-3)  # identical lengths everywhere (only in toy data) would divide by zero
    return mu, sigma


def log_ratio(pair: Pair) -> float:
    return math.log(len(pair.es) + SMOOTH_CHARS) - math.log(len(pair.en) + SMOOTH_CHARS)


def alignment_gain(es_lengths: list[int], en_lengths: list[int], mu: float, sigma: float) -> float:
    """How much better a chapter's lengths are explained when verses may merge or be skipped.

    Cost of pairing a span of Spanish with a span of English text: the squared standardised log
    length ratio (capped at MAX_PAIR_COST), plus MERGE_COST or SKIP_COST for a non-1:1 bead.  A
    dynamic programme (in the spirit of Gale & Church's sentence aligner) finds the cheapest
    alignment of the chapter; the gain is (cost of pairing verse i with verse i for all i) minus
    (cheapest cost), >= 0.  A chapter numbered one off from some verse on gains a lot, since every
    shifted pair is a mismatch on the diagonal; a well aligned one gains little: an isolated odd
    pair costs at most as much on the diagonal as skipping it on both sides.
    """

    def cost(es_chars: int, en_chars: int) -> float:
        z = (math.log(es_chars + SMOOTH_CHARS) - math.log(en_chars + SMOOTH_CHARS) - mu) / sigma
        return min(z * z, MAX_PAIR_COST)

    n, m = len(es_lengths), len(en_lengths)
    best = [[math.inf] * (m + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for i in range(n + 1):
        for j in range(m + 1):
            here = best[i][j]
            if here == math.inf:
                continue
            moves = []
            if i < n and j < m:
                moves.append((i + 1, j + 1, cost(es_lengths[i], en_lengths[j])))
            if i + 1 < n and j < m:
                moves.append((i + 2, j + 1, MERGE_COST + cost(es_lengths[i] + es_lengths[i + 1], en_lengths[j])))
            if i < n and j + 1 < m:
                moves.append((i + 1, j + 2, MERGE_COST + cost(es_lengths[i], en_lengths[j] + en_lengths[j + 1])))
            if i < n:
                moves.append((i + 1, j, SKIP_COST))
            if j < m:
                moves.append((i, j + 1, SKIP_COST))
            for a, b, c in moves:
                if here + c < best[a][b]:
                    best[a][b] = here + c
    diagonal = sum(cost(a, b) for a, b in zip(es_lengths, en_lengths))
    return max(0.0, diagonal - best[n][m])


def word_stems(text: str) -> set[str]:
    """First STEM_LETTERS letters of each word of at least that many letters, lower-cased, accents
    removed: a crude cognate key shared by many names and loanwords across Spanish and English."""
    folded = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if not unicodedata.combining(c))
    return {w[:STEM_LETTERS] for w in re.findall(rf"[a-z]{{{STEM_LETTERS},}}", folded)}


def stem_offset_gain(es_texts: list[str], en_texts: list[str]) -> tuple[float, int]:
    """(gain, offset): how much more the stems of Spanish verse i overlap English verse i+offset
    than English verse i, on average (Dice coefficient), for the best offset 0 < |offset| <= MAX_OFFSET
    that still pairs at least half of the chapter (and 3 verses)."""
    es_stems, en_stems = [word_stems(t) for t in es_texts], [word_stems(t) for t in en_texts]
    n = min(len(es_stems), len(en_stems))

    def mean_overlap(offset: int) -> float | None:
        scores = [
            2 * len(es_stems[i] & en_stems[i + offset]) / (len(es_stems[i]) + len(en_stems[i + offset]) or 1)
            for i in range(n)
            if 0 <= i + offset < n
        ]
        return statistics.fmean(scores) if len(scores) >= max(3, n / 2) else None

    diagonal = mean_overlap(0)
    if diagonal is None:
        return 0.0, 0
    shifted = [(score, offset) for offset in range(-MAX_OFFSET, MAX_OFFSET + 1) if offset and (score := mean_overlap(offset)) is not None]
    if not shifted:
        return 0.0, 0
    score, offset = max(shifted)
    return max(0.0, score - diagonal), offset


def misaligned_chapters(pairs: list[Pair]) -> dict[tuple[str, int], str]:
    """{(book, chapter): why} for the chapters either detector flags."""
    mu, sigma = length_model(pairs)
    flagged = {}
    for chapter, items in by_chapter(pairs).items():
        length_gain = alignment_gain([len(p.es) for p in items], [len(p.en) for p in items], mu, sigma)
        stem_gain, offset = stem_offset_gain([p.es for p in items], [p.en for p in items])
        reasons = []
        if length_gain >= MIN_LENGTH_GAIN:
            reasons.append(f"length gain {length_gain:.1f}")
        if stem_gain >= MIN_STEM_GAIN:
            reasons.append(f"stem gain {stem_gain:.3f} at offset {offset:+d}")
        if reasons:
            flagged[chapter] = ", ".join(reasons)
    return flagged


# A single pair whose character lengths differ by more than this factor (beyond the global es/en
# ratio) is not a translation of one verse by the other: on inspection these are the leftovers of
# merged or split verses, the KJV-style subscriptions RV1909 appends to epistles ("La primera
# epístola á Timoteo fué escrita de Laodicea…"), textual variants (1 John 5:7) and the glossary WEB
# stores in its last verse slot.
MAX_RATIO = 2.0


def ratio_ok(pair: Pair, mu: float) -> bool:
    return abs(log_ratio(pair) - mu) <= math.log(MAX_RATIO)


# --------------------------------------------------------------------------------------------------
# Splits and output
# --------------------------------------------------------------------------------------------------


def assign_splits(pairs: list[Pair], seed: int = SEED, val: int = VAL_PAIRS, test: int = TEST_PAIRS) -> dict[tuple[str, int], str]:
    """{(book, chapter): split}: whole chapters, shuffled with `seed`, fill val then test to >= the
    requested number of pairs; all others are train."""
    sizes = Counter((p.book, p.chapter) for p in pairs)
    chapters = list(sizes)  # canonical order, so the shuffle depends only on the seed and the data
    random.Random(seed).shuffle(chapters)
    split_of, filled = {}, {"val": 0, "test": 0}
    for chapter in chapters:
        target = next((s for s, want in (("val", val), ("test", test)) if filled[s] < want), "train")
        split_of[chapter] = target
        if target != "train":
            filled[target] += sizes[chapter]
    return split_of


def to_tsv(pairs: list[Pair], split_of: dict[tuple[str, int], str]) -> str:
    """The TSV text: header, then one row per pair.  Fields never contain tabs or newlines
    (`clean_osis` collapses all whitespace), so no quoting is needed and quotes stay literal."""
    lines = ["\t".join(HEADER)]
    for p in pairs:
        row = (split_of[(p.book, p.chapter)], p.book, str(p.chapter), str(p.verse), p.es, p.en)
        if any(("\t" in f or "\n" in f or "\r" in f) for f in row):
            raise ValueError(f"field with a tab or newline in {p.book} {p.chapter}:{p.verse}")
        lines.append("\t".join(row))
    return "\n".join(lines) + "\n"


def write_xz(path: Path, text: str) -> None:
    """xz-compress `text` (UTF-8) with a fixed preset and write it atomically (temp file + os.replace)."""
    from sparse_runner.io import atomic_open

    data = lzma.compress(text.encode("utf-8"), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)
    with atomic_open(path, "wb") as handle:
        handle.write(data)


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def find_debs(debs: Path | None, workdir: Path) -> dict[str, Path]:
    """{lang: .deb}: taken from `debs` if given, else fetched with `apt-get download` into `workdir`."""
    if debs is None:
        debs = workdir / "debs"
        debs.mkdir()
        # Pinned versions: another version would give another corpus.
        wanted = [f"{package}={version}" for package, version, _ in PACKAGES.values()]
        print(f"downloading {' '.join(wanted)} with apt-get download", file=sys.stderr)
        subprocess.run(["apt-get", "download", *wanted], cwd=debs, check=True)
    found = {}
    for lang, (package, version, _) in PACKAGES.items():
        matches = sorted(debs.glob(f"{package}_*.deb"))
        if len(matches) != 1:
            raise SystemExit(f"expected one {package}_*.deb in {debs}, found {[m.name for m in matches]}")
        if not matches[0].name.startswith(f"{package}_{version}_"):
            print(f"warning: {matches[0].name} is not version {version}: the corpus will differ from the shipped one", file=sys.stderr)
        found[lang] = matches[0]
    return found


def module_dir(root: Path, module: str) -> Path:
    return root / "usr" / "share" / "sword" / "modules" / "texts" / "ztext" / module


def build(debs: dict[str, Path], workdir: Path) -> tuple[list[Pair], dict]:
    """Unpack the .debs and return (final pairs, statistics for the summary)."""
    verses = {}
    for lang, deb in debs.items():
        root = workdir / lang
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        verses[lang] = read_module(module_dir(root, PACKAGES[lang][2]))
    stats: dict = {"verses": {lang: len(v) for lang, v in verses.items()}}
    stats["key_mismatches"] = check_keys(verses["es"], verses["en"])

    pairs, stats["empty"] = pair_verses(verses["es"], verses["en"])
    pairs = undo_drop_caps(pairs)
    stats["paired"] = len(pairs)

    flagged = misaligned_chapters(pairs)
    sizes = Counter((p.book, p.chapter) for p in pairs)
    stats["dropped_chapters"] = [(book, chapter, sizes[(book, chapter)], why) for (book, chapter), why in flagged.items()]
    pairs = [p for p in pairs if (p.book, p.chapter) not in flagged]

    mu, _ = length_model(pairs)
    kept = [p for p in pairs if ratio_ok(p, mu)]
    stats["dropped_ratio"] = [p for p in pairs if not ratio_ok(p, mu)]
    return kept, stats


def summary(pairs: list[Pair], split_of: dict, stats: dict, out: Path, seconds: float) -> str:
    lines = [
        f"verse slots read (with or without text): es {stats['verses']['es']}, en {stats['verses']['en']}",
        "versification differences in shared chapters: " + ("; ".join(stats["key_mismatches"]) or "none"),
        f"common keys with an empty side dropped: {stats['empty']}",
        f"pairs before filtering: {stats['paired']}",
        f"misaligned chapters dropped: {len(stats['dropped_chapters'])} "
        f"({sum(n for *_, n, _ in stats['dropped_chapters'])} pairs)",
    ]
    lines += [f"  {b} {c}: {n} pairs ({why})" for b, c, n, why in stats["dropped_chapters"]]
    lines.append(f"pairs dropped for length ratio: {len(stats['dropped_ratio'])}")
    lines += [f"  {p.book} {p.chapter}:{p.verse}: {len(p.es)} / {len(p.en)} chars" for p in stats["dropped_ratio"]]
    lines.append(f"pairs kept: {len(pairs)}")
    for split in ("train", "val", "test"):
        rows = [p for p in pairs if split_of[(p.book, p.chapter)] == split]
        chapters = {(p.book, p.chapter) for p in rows}
        es_words = sum(len(p.es.split()) for p in rows)
        en_words = sum(len(p.en.split()) for p in rows)
        lines.append(f"  {split:5s}: {len(rows):6d} pairs, {len(chapters):4d} chapters, {es_words:7d} es words, {en_words:7d} en words")
    lines.append(f"wrote {out} ({out.stat().st_size} bytes) in {seconds:.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--debs", type=Path, help="folder with the two .debs (default: apt-get download them)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output .tsv.xz (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=SEED, help="chapter shuffle seed for the splits (default: %(default)s)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bible-corpus-") as tmp:
        workdir = Path(tmp)
        pairs, stats = build(find_debs(args.debs, workdir), workdir)
    split_of = assign_splits(pairs, seed=args.seed)
    write_xz(args.out, to_tsv(pairs, split_of))
    print(summary(pairs, split_of, stats, args.out, time.perf_counter() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
