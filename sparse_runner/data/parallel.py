"""Where the parallel text of a translation task comes from: embedded corpus, local files or the HF hub.

``load_parallel`` returns ``{"train": (src, tgt), "val": (src, tgt), "test": (src, tgt)}``, each side
a ``list[str]`` of raw (detokenized) sentences, aligned by index. Three sources:

``embedded``
    The Bible es-en corpus that ships with the package (``sparse_runner.data.corpora.load_bible_es_en``);
    works offline, for smoke tests and small CPU runs.

``files``
    Parallel text in ``data_dir``, in one of three formats (``file_format="auto"`` picks the one
    whose training file exists):

    * ``aligned``: ``{split}.{lang}`` plain text, one sentence per line, line *i* of the source file
      translating line *i* of the target file (the fairseq / OpenNMT / Moses convention). Split names:
      ``train``; ``valid``, ``val`` or ``dev``; ``test``. The KFTT release names
      (``kyoto-train``, ``kyoto-dev``, ``kyoto-test`` in ``kftt-data-1.0/data/orig``) work too.
    * ``tsv``: ``{split}.tsv``, ``source<TAB>target`` per line. A first line naming the two languages
      (``de<TAB>en``, in either order: the columns follow it) or ``source<TAB>target`` is a header.
    * ``jsonl``: ``{split}.jsonl``, one JSON object per line, ``{"de": ..., "en": ...}`` or the HF
      layout ``{"translation": {"de": ..., "en": ...}}``.

    Files are UTF-8 (a BOM is ignored). Aligned files are split on ``\\n`` only -- not on the other
    characters ``str.splitlines`` treats as line breaks (``\\r``, ``\\x85``, ``\\u2028``...), which
    would shift the alignment -- and a trailing ``\\r`` is removed.

``hf``
    A Hugging Face dataset whose rows hold a ``translation`` dict keyed by language code (or one
    column per language), loaded with ``datasets.load_dataset``. conf/task/<pair>.yaml holds the ids of
    the paper's pairs. When the hub cannot be reached, a copy in the local HF cache is used; without
    one, ``DataUnavailable`` says how to get the data.

Cleaning (same for every source): each sentence is stripped of surrounding whitespace. In ``train``,
pairs where either side is empty are dropped (they teach nothing, and an empty target would train
the model to stop at once). ``val`` and ``test`` are kept whole and in order, because scores must be
computed on the complete reference set to be comparable; an empty side there is only logged. A
split left with no pairs is an error.

Every problem is a ``ConfigError`` subclass with a one-line message, which the CLI prints before
exiting with status 2.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from sparse_runner.checks import ConfigError
from sparse_runner.data.corpora import load_bible_es_en
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.hub import hub_label, hub_splits, load_hub_splits
from sparse_runner.data.lines import utf8_lines

logger = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "val", "test")
SOURCES: tuple[str, ...] = ("embedded", "files", "hf")
FILE_FORMATS: tuple[str, ...] = ("auto", "aligned", "tsv", "jsonl")

#: File-name stems accepted for each split, in the order they are looked for.
SPLIT_STEMS: dict[str, tuple[str, ...]] = {
    "train": ("train", "kyoto-train"),
    "val": ("valid", "val", "dev", "kyoto-dev"),
    "test": ("test", "kyoto-test"),
}

#: Hub copies of the paper's language pairs, as ``load_parallel(source="hf", **entry)`` arguments.
#: ``datasets`` >= 4 runs no loading scripts; wmt14/wmt16 are plain parquet, while
#: IWSLT/iwslt2017 is a script repository whose data the hub also serves as parquet on the
#: ``refs/convert/parquet`` branch (one folder per config). These ids were found in the hub's
#: listings but could not be loaded from this (offline) machine. KFTT has no complete hub copy
#: loadable without a script: use the official release with ``source=files``
#: (``data_dir=.../kftt-data-1.0/data/orig``, files ``kyoto-{train,dev,test}.{ja,en}``).

Parallel = dict[str, tuple[list[str], list[str]]]


def load_parallel(
    source: str,
    *,
    src_lang: str,
    tgt_lang: str,
    data_dir: str | os.PathLike | None = None,
    file_format: str = "auto",
    hf_path: str | None = None,
    hf_name: str | None = None,
    hf_splits: Mapping[str, str] | None = None,
    hf_revision: str | None = None,
    hf_data_dir: str | None = None,
    hf_data_files: Any = None,
    task_name: str = "?",
) -> Parallel:
    """Source and target sentences of the train / val / test splits.

    Args:
        source: ``"embedded"``, ``"files"`` or ``"hf"`` (see the module docstring).
        src_lang, tgt_lang: language codes as they appear in file names / row keys (``"de"``, ``"en"``).
        data_dir: directory of the files (``source="files"``).
        file_format: ``"auto"``, ``"aligned"``, ``"tsv"`` or ``"jsonl"`` (``source="files"``).
        hf_path, hf_name: ``datasets.load_dataset`` path and config name (``source="hf"``);
            ``hf_path`` may also be a packaged builder such as ``"json"`` or ``"parquet"`` with
            ``hf_data_files``.
        hf_splits: our split name -> the dataset's split name, merged over ``hub.DEFAULT_HF_SPLITS``.
        hf_revision, hf_data_dir, hf_data_files: passed to ``load_dataset`` as ``revision``,
            ``data_dir`` and ``data_files``.
        task_name: used in error messages.

    Returns:
        ``{"train": (src, tgt), "val": (src, tgt), "test": (src, tgt)}`` with ``len(src) == len(tgt)``.
    """
    where = f"task {task_name}"
    for name, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if not isinstance(lang, str) or not lang or any(c in lang for c in "/\\ \t"):
            raise ConfigError(f"{where}: {name} must be a language code such as 'de' or 'en', got {lang!r}")
    if src_lang == tgt_lang:
        raise ConfigError(f"{where}: src_lang and tgt_lang are both {src_lang!r}; they must differ")

    if source == "embedded":
        raw = _load_embedded(src_lang, tgt_lang, where)
        origin = {split: f"embedded Bible corpus ({split})" for split in SPLITS}
    elif source == "files":
        if data_dir is None or str(data_dir).strip() == "":
            raise ConfigError(f"{where}: source=files needs task.data_dir (a directory with train/valid/test.{{{src_lang},{tgt_lang}}})")
        if file_format not in FILE_FORMATS:
            raise ConfigError(f"{where}: file_format={file_format!r} is not one of {', '.join(FILE_FORMATS)}")
        raw, origin = _load_files(Path(os.path.expanduser(str(data_dir))), src_lang, tgt_lang, file_format, where)
    elif source == "hf":
        if not hf_path:
            raise ConfigError(f"{where}: source=hf needs task.hf_path (a Hugging Face dataset id such as wmt/wmt16)")
        raw = _load_hub(
            hf_path, hf_name, src_lang=src_lang, tgt_lang=tgt_lang, hf_splits=hf_splits, revision=hf_revision,
            data_dir=hf_data_dir, data_files=hf_data_files, where=where,
        )
        origin = {split: f"{hub_label(hf_path, hf_name)} ({split})" for split in SPLITS}
    else:
        raise ConfigError(f"{where}: source={source!r} is not one of {', '.join(SOURCES)}")

    out = {split: _clean(split, *raw[split], origin=origin[split], where=where) for split in SPLITS}
    logger.info(
        "%s: %s->%s parallel data from %s: %s pairs (train/val/test)",
        where, src_lang, tgt_lang, source, "/".join(str(len(out[s][0])) for s in SPLITS),
    )
    return out


# --------------------------------------------------------------------------------------------- cleaning
def _clean(split: str, src: Sequence[str], tgt: Sequence[str], *, origin: str, where: str) -> tuple[list[str], list[str]]:
    if len(src) != len(tgt):
        raise DataFormatError(f"{where}: {origin} has {len(src)} source but {len(tgt)} target sentences; they must be aligned")
    src = [("" if s is None else str(s)).strip() for s in src]
    tgt = [("" if t is None else str(t)).strip() for t in tgt]
    if split == "train":
        keep = [i for i in range(len(src)) if src[i] and tgt[i]]
        if len(keep) < len(src):
            logger.info("%s: %s: dropped %d of %d pairs with an empty side", where, origin, len(src) - len(keep), len(src))
            src = [src[i] for i in keep]
            tgt = [tgt[i] for i in keep]
    else:
        empty = sum(1 for s, t in zip(src, tgt) if not s or not t)
        if empty:
            logger.warning("%s: %s: %d of %d pairs have an empty side (kept: evaluation uses the whole set)", where, origin, empty, len(src))
    if not src:
        raise DataFormatError(f"{where}: {origin} has no sentence pairs" + (" with both sides non-empty" if split == "train" else ""))
    return src, tgt


# --------------------------------------------------------------------------------------------- embedded
def _load_embedded(src_lang: str, tgt_lang: str, where: str) -> dict[str, tuple[list[str], list[str]]]:
    pair = (src_lang, tgt_lang)
    if pair not in (("es", "en"), ("en", "es")):
        raise ConfigError(
            f"{where}: source=embedded has only the Bible Spanish-English corpus (src_lang=es tgt_lang=en, or reversed), "
            f"not {src_lang}->{tgt_lang}; use source=files or source=hf for other pairs"
        )
    data = load_bible_es_en()
    out = {}
    for split in SPLITS:
        if split not in data:
            raise DataFormatError(f"{where}: the embedded Bible corpus has no {split!r} split (has: {', '.join(map(str, data))})")
        es, en = data[split]
        out[split] = (list(es), list(en)) if pair == ("es", "en") else (list(en), list(es))
    return out


# --------------------------------------------------------------------------------------------- files
def _candidates(fmt: str, split: str, src_lang: str, tgt_lang: str) -> list[tuple[str, ...]]:
    """File names that would hold ``split`` in format ``fmt``: one tuple per stem."""
    stems = SPLIT_STEMS[split]
    if fmt == "aligned":
        return [(f"{stem}.{src_lang}", f"{stem}.{tgt_lang}") for stem in stems]
    return [(f"{stem}.{fmt}",) for stem in stems if not stem.startswith("kyoto-")]


def _describe_expected(fmt: str, split: str, src_lang: str, tgt_lang: str) -> str:
    return " or ".join("+".join(names) for names in _candidates(fmt, split, src_lang, tgt_lang))


def _load_files(directory: Path, src_lang: str, tgt_lang: str, file_format: str, where: str):
    if not directory.is_dir():
        raise ConfigError(f"{where}: task.data_dir={str(directory)!r} is not a directory")
    fmt = file_format if file_format != "auto" else _detect_format(directory, src_lang, tgt_lang, where)
    raw, origin = {}, {}
    for split in SPLITS:
        found = [names for names in _candidates(fmt, split, src_lang, tgt_lang) if any((directory / n).is_file() for n in names)]
        if not found:
            raise DataFormatError(
                f"{where}: no {split} split in {directory} for file_format={fmt}: expected {_describe_expected(fmt, split, src_lang, tgt_lang)}"
            )
        if len(found) > 1:
            raise DataFormatError(
                f"{where}: {directory} has more than one {split} split ({'; '.join('+'.join(n) for n in found)}); keep one of them"
            )
        names = found[0]
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            present = [n for n in names if n not in missing]
            raise DataFormatError(f"{where}: {directory / present[0]} has no partner file {directory / missing[0]} (aligned files come in pairs)")
        paths = [directory / n for n in names]
        if fmt == "aligned":
            raw[split] = _read_aligned(paths[0], paths[1], where)
        elif fmt == "tsv":
            raw[split] = _read_tsv(paths[0], src_lang, tgt_lang, where)
        else:
            raw[split] = _read_jsonl(paths[0], src_lang, tgt_lang, where)
        origin[split] = "+".join(str(p) for p in paths)
    return raw, origin


def _detect_format(directory: Path, src_lang: str, tgt_lang: str, where: str) -> str:
    present = [
        fmt for fmt in FILE_FORMATS[1:]
        if any((directory / n).is_file() for names in _candidates(fmt, "train", src_lang, tgt_lang) for n in names)
    ]
    if len(present) == 1:
        return present[0]
    if not present:
        listing = sorted(p.name for p in directory.iterdir())[:8]
        raise DataFormatError(
            f"{where}: no training data in {directory}: expected {_describe_expected('aligned', 'train', src_lang, tgt_lang)} (aligned), "
            f"train.tsv or train.jsonl; found {', '.join(listing) if listing else 'nothing'}"
        )
    raise DataFormatError(f"{where}: {directory} has training data in several formats ({', '.join(present)}); set task.file_format to one of them")


def _lines(path: Path, where: str) -> Iterator[tuple[int, str]]:
    """(line number, text without the line break) for each ``\\n``-terminated line of a UTF-8 file."""

    def error(number: int, err: UnicodeDecodeError) -> DataFormatError:
        return DataFormatError(f"{where}: {path}:{number}: not valid UTF-8 ({err.reason} at byte {err.start}); files must be UTF-8")

    return utf8_lines(path, error, keep_ends=False)


def _read_aligned(src_path: Path, tgt_path: Path, where: str) -> tuple[list[str], list[str]]:
    src = [text for _, text in _lines(src_path, where)]
    tgt = [text for _, text in _lines(tgt_path, where)]
    if len(src) != len(tgt):
        shorter, longer = (src_path, tgt_path) if len(src) < len(tgt) else (tgt_path, src_path)
        raise DataFormatError(
            f"{where}: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: {shorter} ends before line "
            f"{min(len(src), len(tgt)) + 1} of {longer}; the two files must be line-aligned (one sentence per line)"
        )
    return src, tgt


_TSV_HEADERS = (["source", "target"], ["src", "tgt"])


def _read_tsv(path: Path, src_lang: str, tgt_lang: str, where: str) -> tuple[list[str], list[str]]:
    first: list[str] = []
    second: list[str] = []
    swap = False
    seen_content = False
    for number, text in _lines(path, where):
        if not text.strip():
            continue  # a blank line cannot hold a pair (e.g. a trailing empty line)
        fields = text.split("\t")
        if len(fields) != 2:
            raise DataFormatError(
                f"{where}: {path}:{number}: expected 2 tab-separated columns ({src_lang}<TAB>{tgt_lang}), found {len(fields)}"
            )
        if not seen_content:
            seen_content = True
            header = [f.strip().lower() for f in fields]
            if header == [src_lang.lower(), tgt_lang.lower()] or header in _TSV_HEADERS:
                continue
            if header == [tgt_lang.lower(), src_lang.lower()]:
                swap = True  # the header puts the target language in the first column
                continue
        first.append(fields[0])
        second.append(fields[1])
    return (second, first) if swap else (first, second)


def _read_jsonl(path: Path, src_lang: str, tgt_lang: str, where: str) -> tuple[list[str], list[str]]:
    src, tgt = [], []
    expected = f'a JSON object {{"{src_lang}": ..., "{tgt_lang}": ...}} or {{"translation": {{"{src_lang}": ..., "{tgt_lang}": ...}}}}'
    for number, text in _lines(path, where):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataFormatError(f"{where}: {path}:{number}: not valid JSON ({err.msg} at column {err.colno}); expected {expected}") from None
        pair = row.get("translation") if isinstance(row, dict) and isinstance(row.get("translation"), dict) else row
        if not isinstance(pair, dict) or src_lang not in pair or tgt_lang not in pair:
            keys = sorted(pair) if isinstance(pair, dict) else type(pair).__name__
            raise DataFormatError(f"{where}: {path}:{number}: expected {expected}; found {keys}")
        for lang in (src_lang, tgt_lang):
            if not isinstance(pair[lang], str):
                raise DataFormatError(f"{where}: {path}:{number}: the {lang!r} value is {type(pair[lang]).__name__}, expected a string")
        src.append(pair[src_lang])
        tgt.append(pair[tgt_lang])
    return src, tgt


# --------------------------------------------------------------------------------------------- hub
def _load_hub(
    path: str, name: str | None, *, src_lang: str, tgt_lang: str, hf_splits, revision, data_dir, data_files, where: str
) -> dict[str, tuple[list[str], list[str]]]:
    local_files = f"task.source=files task.data_dir=DIR (train/valid/test.{{{src_lang},{tgt_lang}}})"
    splits = hub_splits(hf_splits, where)
    loaded = load_hub_splits(
        path, name, splits=splits, revision=revision, data_dir=data_dir, data_files=data_files, where=where, local_files=local_files
    )
    label = hub_label(path, name)
    return {split: _hub_columns(ds, src_lang, tgt_lang, f"{where}: {label} split {splits[split]!r}") for split, ds in loaded.items()}


def _hub_columns(dataset, src_lang: str, tgt_lang: str, where: str) -> tuple[list[str], list[str]]:
    """The two sides of a hub split, read column-wise from Arrow (fast for millions of rows)."""
    columns = list(dataset.column_names)
    table = dataset.with_format("arrow")
    if "translation" in columns:
        column = table["translation"]
        fields = [column.type.field(i).name for i in range(column.type.num_fields)] if hasattr(column.type, "num_fields") else []
        if src_lang not in fields or tgt_lang not in fields:
            raise DataFormatError(f"{where}: the translation column has languages {fields or column.type}, expected {src_lang!r} and {tgt_lang!r}")
        return tuple(
            [text for chunk in column.chunks for text in chunk.field(lang).to_pylist()] for lang in (src_lang, tgt_lang)
        )
    if src_lang in columns and tgt_lang in columns:
        return tuple(table[lang].to_pylist() for lang in (src_lang, tgt_lang))
    raise DataFormatError(
        f"{where}: expected a 'translation' column (dict keyed by language) or columns {src_lang!r} and {tgt_lang!r}; found {', '.join(columns)}"
    )
