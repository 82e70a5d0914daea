"""Tests of the embedded Spanish→English Bible corpus and of the script that builds it.

The shipped file is checked as data (splits, sizes, alignment, checksum in the README); the
extractor's pieces are checked on small inputs written here (a synthetic SWORD zText module made with
zlib, hand-made verse pairs), so none of this needs the Debian packages.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import lzma
import re
import statistics
import struct
import sys
import zlib
from pathlib import Path

import pytest

from sparse_runner.data.corpora import BIBLE_ES_EN_PATH, load_bible_es_en

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def extractor():
    """scripts/extract_bible_corpus.py imported as a module (scripts/ is not a package)."""
    path = REPO / "scripts" / "extract_bible_corpus.py"
    spec = importlib.util.spec_from_file_location("extract_bible_corpus", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclass-like NamedTuples look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def shipped() -> dict:
    return load_bible_es_en()


@pytest.fixture(scope="module")
def shipped_rows() -> list[list[str]]:
    """The shipped TSV's rows (header excluded), read independently of the loader."""
    with lzma.open(BIBLE_ES_EN_PATH, "rt", encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert rows[0] == ["split", "book", "chapter", "verse", "es", "en"]
    return rows[1:]


# ------------------------------------------------------------------------------------ shipped file
def test_shipped_file_is_small_and_matches_readme():
    size = BIBLE_ES_EN_PATH.stat().st_size
    assert 1_000_000 < size < 5_000_000
    readme = (BIBLE_ES_EN_PATH.parent / "README.md").read_text(encoding="utf-8")
    digest = hashlib.sha256(BIBLE_ES_EN_PATH.read_bytes()).hexdigest()
    assert digest in readme, "README.md states another sha256: rerun the extractor and update the README"


def test_splits_sizes_and_pairs(shipped):
    assert set(shipped) == {"train", "val", "test"}
    for split, (es, en) in shipped.items():
        assert len(es) == len(en) > 0, split
        assert all(e.strip() and n.strip() for e, n in zip(es, en)), f"{split} has an empty side"
        assert all("\t" not in t and "\n" not in t and "<" not in t for t in es + en), split
    assert 27_000 <= len(shipped["train"][0]) <= 30_000
    for split in ("val", "test"):
        assert 1_000 <= len(shipped[split][0]) <= 1_200, split
    assert sum(len(es) for es, _ in shipped.values()) == 30_808


def test_splits_are_whole_chapters_and_rows_unique(shipped_rows):
    split_of: dict[tuple[str, str], set[str]] = {}
    for split, book, chapter, _verse, *_ in shipped_rows:
        split_of.setdefault((book, chapter), set()).add(split)
    straddling = {c: s for c, s in split_of.items() if len(s) > 1}
    assert not straddling
    keys = [(book, chapter, verse) for _split, book, chapter, verse, *_ in shipped_rows]
    assert len(set(keys)) == len(keys)
    # canonical order: Genesis first, Revelation last, verses ascending within a chapter
    assert keys[0] == ("Gen", "1", "1") and keys[-1][0] == "Rev"


def test_test_split_is_aligned(shipped):
    es, en = shipped["test"]
    es_words = [len(t.split()) for t in es]
    en_words = [len(t.split()) for t in en]
    assert 0.7 <= statistics.median(a / b for a, b in zip(es_words, en_words)) <= 1.3
    assert statistics.correlation(es_words, en_words) > 0.8


def test_known_verse(shipped_rows):
    row = next(r for r in shipped_rows if r[1:4] == ["Gen", "1", "1"])
    assert row[4] == "En el principio crió Dios los cielos y la tierra."  # drop cap "EN" undone
    assert row[5] == "In the beginning, God created the heavens and the earth."


# ------------------------------------------------------------------------------------ zText reader
def write_ztext(directory: Path, testament: str, blocks: list[list[str]]) -> None:
    """A zText testament: each inner list is one zlib block, each string one index slot ('' = empty)."""
    bzs, bzv, bzz = bytearray(), bytearray(), bytearray()
    for number, entries in enumerate(blocks):
        raw = b""
        for entry in entries:
            data = entry.encode("utf-8")
            bzv += struct.pack("<IIH", number if data else 0, len(raw) if data else 0, len(data))
            raw += data
        compressed = zlib.compress(raw)
        bzs += struct.pack("<III", len(bzz), len(compressed), len(raw))
        bzz += compressed
    for ext, content in (("bzs", bzs), ("bzv", bzv), ("bzz", bzz)):
        (directory / f"{testament}.{ext}").write_bytes(bytes(content))


def w(strong: str, text: str) -> str:
    return f'<w lemma="strong:{strong}">{text}</w>'


SYNTHETIC_OT = [
    [  # block 0: Genesis, laid out as osis2mod does
        "",
        '<milestone type="x-importer" subType="x-osis2mod" n="$Rev$"/>',
        '<div osisID="Gen" sID="b1" type="book"/> <title type="main">Génesis</title>',
        '<chapter n="1" osisID="Gen.1" sID="Gen.1"/>',
        w("H7225", "EN el principio") + " " + w("H1254", "crió") + ' Dios<note placement="foot">nota</note>los cielos. ',
        "",  # a verse the module has no text for
        '<l level="1" sID="l1"/>Tarde<l eID="l1"/><l level="2" sID="l2"/>y mañana; &amp; día.<l eID="l2"/>',
        '<title type="x-section">Encabezado</title>Y dijo:\t"Sea la luz". <chapter eID="Gen.1"/>',
        '<chapter n="2" osisID="Gen.2" sID="Gen.2"/>',
        w("H3615", "Y fueron acabados") + ". ",
        'Fin de Génesis. <chapter eID="Gen.2"/> <div eID="b1" osisID="Gen" type="book"/>',
    ],
    [  # block 1: Exodus, introduction slot first (the book-closing div above must not end Gen 2)
        '<div osisID="Exod" sID="b2" type="book"/> Introducción al Éxodo.',
        '<chapter n="1" osisID="Exod.1" sID="Exod.1"/>',
        "Estos son los nombres.",
        # a slot opening several chapters (WEB's Greek Daniel): their numbering is unusable
        '<chapter osisID="Exod.2" sID="Exod.2"/>texto<chapter osisID="Exod.3" sID="Exod.3"/>',
        "huérfano",
    ],
]


def test_ztext_reader_on_synthetic_module(extractor, tmp_path):
    write_ztext(tmp_path, "ot", SYNTHETIC_OT)
    entries = extractor.read_ztext(tmp_path, "ot")
    assert entries == [e for block in SYNTHETIC_OT for e in block]
    assert extractor.read_ztext(tmp_path, "nt") == []  # no New Testament files

    verses = extractor.read_module(tmp_path)
    assert list(verses) == [("Gen", 1, 1), ("Gen", 1, 2), ("Gen", 1, 3), ("Gen", 1, 4), ("Gen", 2, 1), ("Gen", 2, 2), ("Exod", 1, 1)]
    text = {key: extractor.clean_osis(raw) for key, raw in verses.items()}
    assert text[("Gen", 1, 1)] == "EN el principio crió Dios los cielos."  # note -> space, <w> -> nothing
    assert text[("Gen", 1, 2)] == ""
    assert text[("Gen", 1, 3)] == "Tarde y mañana; & día."  # poetry lines separated, entity unescaped
    assert text[("Gen", 1, 4)] == 'Y dijo: "Sea la luz".'  # heading dropped, tab collapsed
    assert text[("Gen", 2, 2)] == "Fin de Génesis."
    assert text[("Exod", 1, 1)] == "Estos son los nombres."


def test_ztext_reader_checks_block_size(extractor, tmp_path):
    write_ztext(tmp_path, "nt", [["", "x", "<chapter osisID=\"Matt.1\" sID=\"Matt.1\"/>", "verse"]])
    bzs = bytearray((tmp_path / "nt.bzs").read_bytes())
    bzs[8:12] = struct.pack("<I", 999)  # wrong uncompressed size
    (tmp_path / "nt.bzs").write_bytes(bytes(bzs))
    with pytest.raises(ValueError, match="block 0"):
        extractor.read_ztext(tmp_path, "nt")


# ------------------------------------------------------------------------------------ pairing, filters
def test_pairing_keeps_common_non_empty_keys(extractor):
    es = {("Gen", 1, 1): "Uno.", ("Gen", 1, 2): "", ("Gen", 1, 3): "Tres."}
    en = {("Gen", 1, 1): "One.", ("Gen", 1, 2): "Two.", ("Tob", 1, 1): "Tobit."}
    pairs, empty = extractor.pair_verses(es, en)
    assert [(p.verse, p.es, p.en) for p in pairs] == [(1, "Uno.", "One.")]
    assert empty == 1
    assert extractor.check_keys(es, en) == ["Gen 1: es 3 verse slots, en 2"]
    assert extractor.check_keys(es, {**en, ("Gen", 1, 3): "Three."}) == []


def test_undo_drop_caps(extractor):
    Pair = extractor.Pair
    pairs = [
        Pair("Gen", 1, 1, "EN el principio.", "x"),
        Pair("Gen", 2, 1, "Y ACONTECIÓ que JACOB vino.", "x"),
        Pair("Gen", 2, 2, "Y aconteció que Jacob vino.", "x"),
        Pair("Gen", 3, 1, "Aleluya. ALABAD á Jacob; REY DE REYES.", "x"),
        Pair("Gen", 3, 2, "alabad, pues, al Rey", "x"),
    ]
    out = [p.es for p in extractor.undo_drop_caps(pairs)]
    assert out == [
        "En el principio.",
        "Y aconteció que JACOB vino.",  # only the first three words are the drop cap
        "Y aconteció que Jacob vino.",
        "Aleluya. Alabad á Jacob; REY DE REYES.",
        "alabad, pues, al Rey",
    ]


def chapter(extractor, book: str, number: int, es: list[str], en: list[str]):
    return [extractor.Pair(book, number, i + 1, a, b) for i, (a, b) in enumerate(zip(es, en))]


def test_misaligned_chapter_detection(extractor):
    import random

    rng = random.Random(0)
    vocabulary = ["palabra", "texto", "casa", "camino", "agua", "tierra", "cielo", "pueblo"]

    def name() -> str:  # a made-up proper name: shared by both sides of a true pair
        return "".join(rng.choice("bcdfghjklmnprstvz") + rng.choice("aeiou") for _ in range(3)).capitalize()

    def verse(words: int, proper: str) -> str:
        return f"{proper} " + " ".join(rng.choice(vocabulary) for _ in range(words))

    names = [name() for _ in range(20)]
    sizes = [rng.randint(4, 40) for _ in names]
    es = [verse(n, p) for n, p in zip(sizes, names)]
    en = [verse(max(1, n + rng.randint(-2, 2)), p) for n, p in zip(sizes, names)]
    pairs = []
    for number in range(1, 30):  # clean chapters, also the background for the length model
        pairs += chapter(extractor, "Gen", number, es, en)
    shifted = chapter(extractor, "Exod", 1, es[1:], en[:-1])  # Spanish numbered one verse ahead
    flagged = extractor.misaligned_chapters(pairs + shifted)
    assert list(flagged) == [("Exod", 1)]
    assert "length gain" in flagged[("Exod", 1)] and "stem gain" in flagged[("Exod", 1)]

    assert extractor.stem_offset_gain(es, en)[0] == 0.0
    gain, offset = extractor.stem_offset_gain(es[:-5], en[5:])  # five off, as Job 40
    assert offset == -5 and gain > 0.05


def test_ratio_filter(extractor):
    Pair = extractor.Pair
    assert extractor.ratio_ok(Pair("Gen", 1, 1, "x" * 100, "y" * 110), mu=0.0)
    assert not extractor.ratio_ok(Pair("Gen", 1, 1, "x" * 300, "y" * 100), mu=0.0)


def test_splits_by_chapter(extractor):
    pairs = [extractor.Pair("Gen", c, v, "a", "b") for c in range(1, 101) for v in range(1, 11)]
    split_of = extractor.assign_splits(pairs, seed=0, val=100, test=100)
    assert split_of == extractor.assign_splits(pairs, seed=0, val=100, test=100)
    counts = {s: sum(10 for v in split_of.values() if v == s) for s in ("train", "val", "test")}
    assert counts == {"train": 800, "val": 100, "test": 100}
    assert split_of != extractor.assign_splits(pairs, seed=1, val=100, test=100)


def test_tsv_round_trip_with_quotes(extractor, tmp_path):
    Pair = extractor.Pair
    texts = [
        ('"Sea la luz", dijo.', 'He said, "Let there be light."'),
        ("'comillas' y \"dobles\" y \"sin cerrar", '"'),
        (extractor.clean_osis("tab\there\r\nand newline"), "¿Qué? ¡Ay! — “curly” ‘quotes’"),
    ]
    pairs = [Pair("Gen", 1, i + 1, es, en) for i, (es, en) in enumerate(texts)]
    path = tmp_path / "corpus.tsv.xz"
    extractor.write_xz(path, extractor.to_tsv(pairs, {("Gen", 1): "test"}))
    loaded = load_bible_es_en(path)
    assert loaded["test"] == ([es for es, _ in texts], [en for _, en in texts])
    assert loaded["train"] == ([], []) and loaded["val"] == ([], [])
    assert texts[2][0] == "tab here and newline"
    with pytest.raises(ValueError, match="tab or newline"):
        extractor.to_tsv([Pair("Gen", 1, 1, "a\tb", "c")], {("Gen", 1): "test"})


def test_loader_rejects_a_foreign_file(tmp_path):
    path = tmp_path / "other.tsv.xz"
    path.write_bytes(lzma.compress(b"de\ten\nHallo\tHello\n"))
    with pytest.raises(ValueError, match="header"):
        load_bible_es_en(path)


def test_readme_counts_match_file(shipped):
    readme = (BIBLE_ES_EN_PATH.parent / "README.md").read_text(encoding="utf-8")
    for split, (es, _) in shipped.items():
        assert re.search(rf"\|\s*{split}\s*\|\s*{len(es):,}\s*\|", readme), f"README row for {split}"
