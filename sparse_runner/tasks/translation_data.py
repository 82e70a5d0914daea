"""Where the parallel text of a translation task comes from: embedded corpus, local files or the HF hub.

``load_parallel`` returns ``{"train": (src, tgt), "val": (src, tgt), "test": (src, tgt)}``, each side
a ``list[str]`` of raw (detokenized) sentences, aligned by index. Three sources:

``embedded``
    The Bible es-en corpus that ships with the package (``sparse_runner.data.load_bible_es_en``);
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

import contextlib
import importlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence
from urllib.parse import urlparse

from sparse_runner.checks import ConfigError

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

#: Our split -> the hub dataset's split, unless ``hf_splits`` says otherwise.
DEFAULT_HF_SPLITS: dict[str, str] = {"train": "train", "val": "validation", "test": "test"}

#: Hub copies of the paper's language pairs, as ``load_parallel(source="hf", **entry)`` arguments.
#: ``datasets`` >= 4 no longer runs loading scripts; wmt14/wmt16 are plain parquet, while
#: IWSLT/iwslt2017 is a script repository whose data the hub also serves as parquet on the
#: ``refs/convert/parquet`` branch (one folder per config). These ids were found in the hub's
#: listings but could not be loaded from this (offline) machine. KFTT has no complete hub copy
#: loadable without a script: use the official release with ``source=files``
#: (``data_dir=.../kftt-data-1.0/data/orig``, files ``kyoto-{train,dev,test}.{ja,en}``).

#: Seconds to wait for a TCP connection to the hub before treating it as unreachable. Without this
#: check an unreachable hub costs ~25 s of retries (minutes if packets are silently dropped).
HUB_PROBE_TIMEOUT_S = 5.0

Parallel = dict[str, tuple[list[str], list[str]]]


class DataUnavailable(ConfigError):
    """The data could not be obtained (hub unreachable and not cached); the message says what to do."""


class DataFormatError(ConfigError):
    """A data file (or hub dataset) does not have the expected layout; the message names file and line."""


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
        hf_splits: our split name -> the dataset's split name, merged over ``DEFAULT_HF_SPLITS``.
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
        origin = {split: f"{_hub_label(hf_path, hf_name)} ({split})" for split in SPLITS}
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
    try:
        module = importlib.import_module("sparse_runner.data")
        loader = module.load_bible_es_en
    except (ImportError, AttributeError) as err:
        raise DataUnavailable(f"{where}: the embedded Bible corpus is not available in this installation ({err})") from None
    data = loader()
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
    with open(path, "rb") as handle:  # binary: split on b"\n" only, never on \r, \x85, \u2028 ...
        for number, raw in enumerate(handle, start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataFormatError(f"{where}: {path}:{number}: not valid UTF-8 ({err.reason} at byte {err.start}); files must be UTF-8") from None


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
def _hub_label(path: str, name: str | None) -> str:
    return f"{path} ({name})" if name else path


def _plain(value: Any) -> Any:
    """Hydra's DictConfig / ListConfig -> dict / list (``datasets`` expects plain containers)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _is_local(path: str) -> bool:
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return path in _PACKAGED_DATASETS_MODULES or Path(os.path.expanduser(path)).exists()


def _proxy_configured() -> bool:
    return any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"))


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub endpoint (``HF_ENDPOINT``) opens within ``timeout`` seconds.

    Runs in a daemon thread because name resolution has no timeout of its own.
    """
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, name="hf-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


@contextlib.contextmanager
def _hub_offline(enabled: bool):
    """Make ``datasets`` / ``huggingface_hub`` behave as with ``HF_HUB_OFFLINE=1`` inside the block.

    Both libraries read these module flags at call time; in offline mode ``load_dataset`` goes straight
    to the local cache instead of retrying the network.
    """
    if not enabled:
        yield
        return
    import datasets.config
    from huggingface_hub import constants

    saved = (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = True
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _squeezed(text: str, limit: int = 300) -> str:
    # The whole message on one line, not just its first line: the hub's errors often say what went
    # wrong only after a generic first line.
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _load_hub(
    path: str, name: str | None, *, src_lang: str, tgt_lang: str, hf_splits, revision, data_dir, data_files, where: str
) -> dict[str, tuple[list[str], list[str]]]:
    import datasets
    import datasets.config

    splits = dict(DEFAULT_HF_SPLITS)
    given = _plain(hf_splits) or {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"{where}: hf_splits must map our splits ({', '.join(SPLITS)}) to dataset splits, got {given!r}")
    unknown = sorted(set(given) - set(SPLITS))
    if unknown:
        raise ConfigError(f"{where}: hf_splits has unknown key(s) {', '.join(map(str, unknown))}; valid keys: {', '.join(SPLITS)}")
    splits.update({k: str(v) for k, v in given.items()})

    label = _hub_label(path, name)
    local = _is_local(path)
    offline = bool(datasets.config.HF_HUB_OFFLINE)
    if not local and not offline and not _proxy_configured():
        # A proxy may reach the hub where a direct connection cannot, so only probe without one.
        offline = not hub_reachable()
        if offline:
            logger.info("%s: the Hugging Face hub is unreachable; looking for %s in the local cache only", where, label)
    unavailable = (
        f"{where}: cannot download {label} from the Hugging Face hub (offline?) and it is not in the local cache "
        f"({datasets.config.HF_DATASETS_CACHE}); download it once with network access (it is then cached), "
        f"or use local files: task.source=files task.data_dir=DIR (train/valid/test.{{{src_lang},{tgt_lang}}})"
    )
    start = time.perf_counter()
    try:
        with _hub_offline(offline and not local):
            loaded = datasets.load_dataset(
                path, name, revision=revision, data_dir=data_dir, data_files=_plain(data_files),
            )
    except (ConnectionError, TimeoutError) as err:
        logger.debug("%s: load_dataset failed after %.1fs: %s", where, time.perf_counter() - start, err)
        raise DataUnavailable(unavailable) from None
    except RuntimeError as err:
        if "scripts are no longer supported" in str(err):
            raise ConfigError(
                f"{where}: {label} is a script-based dataset, which datasets {datasets.__version__} cannot run; "
                f"try its parquet export (task.hf_revision=refs/convert/parquet task.hf_data_dir=<config name>) or use local files"
            ) from None
        raise ConfigError(f"{where}: cannot load {label}: {_squeezed(err)}") from None
    except (FileNotFoundError, ValueError) as err:
        if offline and "Couldn't find cache" in str(err):
            raise DataUnavailable(unavailable) from None  # cached, but another config than the one asked for
        raise ConfigError(f"{where}: cannot load {label}: {_squeezed(err)}") from None
    except Exception as err:
        if type(err).__name__ in ("DatasetNotFoundError", "DataFilesNotFoundError", "EmptyDatasetError"):
            raise ConfigError(f"{where}: cannot load {label}: {_squeezed(err)}; check task.hf_path / task.hf_name") from None
        raise

    out = {}
    for split in SPLITS:
        hub_split = splits[split]
        if hub_split not in loaded:
            raise ConfigError(
                f"{where}: {label} has no split {hub_split!r} for {split}; it has {', '.join(loaded)} (set task.hf_splits.{split})"
            )
        out[split] = _hub_columns(loaded[hub_split], src_lang, tgt_lang, f"{where}: {label} split {hub_split!r}")
    return out


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
