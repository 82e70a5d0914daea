"""Long-document classification data: ``Documents`` (texts and integer labels) and their readers.

Datasets (``DATASETS``: label names in id order, the hub's label order where the hub has one):

  imdb           IMDB reviews (Maas et al. 2011), whole reviews, 0 = negative, 1 = positive.
                 Hub: ``stanfordnlp/imdb`` (``text``, ``label``). Files: the aclImdb release,
                 ``{train,test}/{neg,pos}/*.txt`` (the ``unsup`` reviews have no label and are not read).
  hyperpartisan  SemEval-2019 Task 4, by-article set (Kiesel et al. 2019; 645 articles), 0 = false,
                 1 = true. Hub: ``SemEvalWorkshop/hyperpartisan_news_detection`` config ``byarticle``
                 (``text``, ``title``, ``hyperpartisan``). Files: the official pair
                 ``articles-training-byarticle-20181122.xml`` + ``ground-truth-training-byarticle-20181122.xml``.
  arxiv          arXiv papers in 11 subject classes (He et al. 2019). Hub: ``ccdv/arxiv-classification``
                 (``text``, ``label``). Files: its JSON-lines splits (``{train,val,test}_data.txt`` or
                 ``{train,validation,test}.jsonl``, one ``{"text", "label"}`` per line) or the official
                 release, one folder of ``.txt`` papers per class (folder name = class name).
  sotu_era       the offline SUBSTITUTE: whole State of the Union addresses, labelled with the era of
                 their year (``sotu_era_documents``).

Every problem with a file is one line (``DataFormatError``) naming the file and what is wrong. XML is read
with the standard library's expat parser, which never fetches external entities; a file that declares a
DTD (the official one does not) is refused, so no entity expansion can blow up memory.

Pure Python + numpy: the data layer needs no torch.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from sparse_runner.checks import ConfigError, one_line
from sparse_runner.data.corpora import load_sotu_en, sotu_en_metadata
from sparse_runner.data.errors import DataFormatError

# Class names in label-id order. arXiv: the order of ccdv/arxiv-classification's ClassLabel.
DATASETS: dict[str, tuple[str, ...]] = {
    "imdb": ("neg", "pos"),
    "hyperpartisan": ("false", "true"),
    "arxiv": ("math.AC", "cs.CV", "cs.AI", "cs.SY", "math.GR", "cs.CE", "cs.PL", "cs.IT", "cs.DS", "cs.NE", "math.ST"),
    "sotu_era": ("1790-1860", "1861-1913", "1914-1960", "1961-"),
}
# sotu_era: the first year of each era after the first (Civil War, First World War, the 1960s): four classes
# of 47-71 speeches, so that no era is a majority.
SOTU_ERA_STARTS = (1861, 1914, 1961)
SOTU_ERA_DESCRIPTION = (
    "whole State of the Union addresses (real text, embedded) labelled with the era of their year "
    "(1790-1860 / 1861-1913 / 1914-1960 / 1961-2021); a speech's era, not a long-document benchmark's label"
)

HYPERPARTISAN_FILES = ("articles-training-byarticle-20181122.xml", "ground-truth-training-byarticle-20181122.xml")
IMDB_FILES = "the aclImdb release folder: {train,test}/{neg,pos}/*.txt"
ARXIV_FILES = "{train,val,test}_data.txt (JSON lines with text and label) or one folder of .txt papers per class (cs.AI, math.ST, ...)"
ARXIV_JSONL = {"train": ("train_data.txt", "train.jsonl"), "val": ("val_data.txt", "validation.jsonl", "val.jsonl"),
               "test": ("test_data.txt", "test.jsonl")}


@dataclass
class Documents:
    """`texts` (n strings) and `labels` (n,) int64 of one split."""

    texts: list[str]
    labels: np.ndarray

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64).reshape(-1)
        if len(self.texts) != len(self.labels):
            raise ValueError(f"Documents: {len(self.texts)} texts but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, index: Sequence[int] | np.ndarray) -> Documents:
        index = np.asarray(index, dtype=np.int64)
        return Documents([self.texts[i] for i in index], self.labels[index])

    def label_counts(self, num_classes: int) -> np.ndarray:
        return np.bincount(self.labels, minlength=num_classes)


def concat(parts: Iterable[Documents]) -> Documents:
    parts = list(parts)
    return Documents([t for p in parts for t in p.texts], np.concatenate([p.labels for p in parts]) if parts else np.zeros(0))


# ---------------------------------------------------------------------------------------------- splits
def stratified_split(docs: Documents, fractions: Sequence[float], seed: int) -> list[Documents]:
    """`docs` cut into len(fractions) + 1 parts, seeded: each class is shuffled and `fractions[k]` of it
    (rounded) goes to part k, the rest to the last part; each part keeps the original order of its documents."""
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(len(fractions) + 1)]
    for label in np.unique(docs.labels):
        members = rng.permutation(np.flatnonzero(docs.labels == label))
        start = 0
        for k, fraction in enumerate(fractions):
            count = int(round(fraction * len(members)))
            parts[k] += members[start : start + count].tolist()
            start += count
        parts[-1] += members[start:].tolist()
    return [docs.select(np.sort(np.asarray(p, dtype=np.int64))) for p in parts]


def hold_out(train: Documents, fraction: float, seed: int) -> tuple[Documents, Documents]:
    """(train less a stratified `fraction`, that fraction): the validation split of a source without one."""
    val, rest = stratified_split(train, [fraction], seed)
    if not len(val) or not len(rest):
        raise ConfigError(f"task.val_fraction: {fraction} of {len(train)} training documents leaves an empty split")
    return rest, val


# ---------------------------------------------------------------------------------------------- hub rows
def from_hub_rows(dataset: Any, *, text_field: str, label_field: str, dataset_name: str, where: str,
                  title_field: str | None = None) -> Documents:
    """Documents of a Hugging Face dataset split: `text_field` (with `title_field` in front when given and
    present), `label_field` as a class id, or a bool (Hyperpartisan's `hyperpartisan`) as 0/1."""
    names = DATASETS[dataset_name]
    columns = dataset.column_names
    for needed in (text_field, label_field):
        if needed not in columns:
            raise DataFormatError(f"{where}: no column {needed!r}; it has {', '.join(columns)} (set task.hf_text_field / task.hf_label_field)")
    table = dataset.with_format("arrow")
    texts = [str(t or "") for t in table[text_field].to_pylist()]
    if title_field and title_field in columns:
        texts = [f"{title or ''}\n{text}".strip() for title, text in zip(table[title_field].to_pylist(), texts)]
    labels = []
    for row, value in enumerate(table[label_field].to_pylist()):
        label = _label(value, names)
        if label is None:
            raise DataFormatError(f"{where}: row {row}: label {value!r} is not one of 0..{len(names) - 1} ({', '.join(names)})")
        labels.append(label)
    return Documents(texts, np.asarray(labels, dtype=np.int64))


def _label(value: Any, names: Sequence[str]) -> int | None:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, str):
        text = value.strip()
        if text in names:
            return names.index(text)
        value = int(text) if text.isdigit() else None
    if isinstance(value, int) and 0 <= value < len(names):
        return value
    return None


# ---------------------------------------------------------------------------------------------- IMDB
def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataFormatError(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start}); text files must be UTF-8") from None
    except OSError as err:
        raise DataFormatError(f"cannot read {path} ({one_line(err)})") from None


def read_aclimdb(directory: str | os.PathLike) -> dict[str, Documents]:
    """{"train", "test"} of the aclImdb release (``{train,test}/{neg,pos}/*.txt``, files in name order)."""
    root = Path(directory).expanduser()
    if (root / "aclImdb").is_dir():  # the archive unpacks to aclImdb/
        root = root / "aclImdb"
    out = {}
    for split in ("train", "test"):
        texts, labels = [], []
        for label, name in enumerate(DATASETS["imdb"]):
            folder = root / split / name
            if not folder.is_dir():
                raise DataFormatError(f"task.data_dir: {root} has no {split}/{name}/ folder; valid: {IMDB_FILES}")
            files = sorted(folder.glob("*.txt"))
            if not files:
                raise DataFormatError(f"task.data_dir: {folder} holds no .txt review; valid: {IMDB_FILES}")
            for path in files:
                # The release marks line breaks inside a review as HTML.
                texts.append(_read_text(path).replace("<br />", "\n"))
                labels.append(label)
        out[split] = Documents(texts, np.asarray(labels))
    return out


# ---------------------------------------------------------------------------------------------- Hyperpartisan
def _parse_xml(path: Path) -> ElementTree.Element:
    if not path.is_file():
        raise DataFormatError(f"task.data_dir: {path.parent} has no {path.name}; valid: the official pair {' + '.join(HYPERPARTISAN_FILES)}")
    data = path.read_bytes()
    if b"<!DOCTYPE" in data[:4096] or b"<!ENTITY" in data:
        raise DataFormatError(f"{path}: declares a DTD or entities, which the official files never do; refusing to expand them")
    try:
        return ElementTree.fromstring(data)
    except ElementTree.ParseError as err:
        raise DataFormatError(f"{path}: not well-formed XML ({err})") from None


def read_hyperpartisan(directory: str | os.PathLike) -> Documents:
    """Every labelled article of the official by-article pair, in the articles file's order: text = title,
    then the article's text (its paragraphs and links, markup dropped)."""
    root = Path(directory).expanduser()
    articles_path, truth_path = (root / name for name in HYPERPARTISAN_FILES)
    truth = {}
    for element in _parse_xml(truth_path).iter("article"):
        value = (element.get("hyperpartisan") or "").strip().lower()
        if element.get("id") is None or value not in DATASETS["hyperpartisan"]:
            raise DataFormatError(f"{truth_path}: article {element.get('id')!r} has hyperpartisan={element.get('hyperpartisan')!r}; valid: true, false")
        truth[element.get("id")] = DATASETS["hyperpartisan"].index(value)
    texts, labels = [], []
    for element in _parse_xml(articles_path).iter("article"):
        key = element.get("id")
        if key not in truth:
            raise DataFormatError(f"{truth_path}: no label for article {key!r} of {articles_path.name}")
        body = " ".join(" ".join(element.itertext()).split())
        texts.append(f"{element.get('title', '').strip()}\n{body}".strip())
        labels.append(truth[key])
    if not texts:
        raise DataFormatError(f"{articles_path}: holds no <article>; valid: the official by-article release")
    return Documents(texts, np.asarray(labels))


# ---------------------------------------------------------------------------------------------- arXiv
def read_arxiv(directory: str | os.PathLike) -> dict[str, Documents]:
    """The hub's JSON-lines splits ({"train", "val", "test"}) when the folder has them, else the official
    release's class folders as one {"all": ...} (the release has no split)."""
    root = Path(directory).expanduser()
    found = {split: next((root / n for n in names if (root / n).is_file()), None) for split, names in ARXIV_JSONL.items()}
    if all(found.values()):
        return {split: _read_arxiv_jsonl(path) for split, path in found.items()}
    if any(found.values()):
        missing = [split for split, path in found.items() if path is None]
        raise DataFormatError(f"task.data_dir: {root} has JSON-lines splits but none for {', '.join(missing)}; valid: {ARXIV_FILES}")
    names = DATASETS["arxiv"]
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not folders:
        raise DataFormatError(f"task.data_dir: {root} has neither JSON-lines splits nor class folders; valid: {ARXIV_FILES}")
    texts, labels = [], []
    for folder in folders:
        if folder.name not in names:
            raise DataFormatError(f"task.data_dir: {folder.name}/ is not an arXiv class of the dataset; valid: {', '.join(names)}")
        for path in sorted(folder.glob("*.txt")):
            texts.append(_read_text(path))
            labels.append(names.index(folder.name))
    if not texts:
        raise DataFormatError(f"task.data_dir: the class folders of {root} hold no .txt paper; valid: {ARXIV_FILES}")
    return {"all": Documents(texts, np.asarray(labels))}


def _read_arxiv_jsonl(path: Path) -> Documents:
    names = DATASETS["arxiv"]
    texts, labels = [], []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as err:
                raise DataFormatError(f"{path}:{number}: not JSON ({err})") from None
            label = _label(row.get("label"), names) if isinstance(row, dict) else None
            if label is None or not isinstance(row.get("text"), str):
                raise DataFormatError(f"{path}:{number}: expected {{\"text\": str, \"label\": 0..{len(names) - 1}}}")
            texts.append(row["text"])
            labels.append(label)
    if not texts:
        raise DataFormatError(f"{path}: holds no example; valid: {ARXIV_FILES}")
    return Documents(texts, np.asarray(labels))


# ---------------------------------------------------------------------------------------------- substitute
def sotu_era(year: int) -> int:
    """The era id (DATASETS["sotu_era"]) of a year."""
    return int(np.searchsorted(SOTU_ERA_STARTS, year, side="right"))


def sotu_era_documents(path: Any = None) -> Documents:
    """Every embedded State of the Union address, whole (paragraphs joined by newlines), labelled with its era;
    in file (chronological) order. The corpus's own train/val/test split is not used: its 19 held-out speeches
    are too few to score a whole-speech classifier (the task splits by speech itself, stratified and seeded)."""
    texts = load_sotu_en(path)
    position = {split: 0 for split in texts}
    out_texts, labels = [], []
    for speech in sotu_en_metadata(path):
        out_texts.append(texts[speech.split][position[speech.split]])
        position[speech.split] += 1
        labels.append(sotu_era(speech.year))
    return Documents(out_texts, np.asarray(labels))


# ---------------------------------------------------------------------------------------------- floors
_WORD = re.compile(r"[a-z]+")


def _word_vector(text: str, vocabulary: dict[str, int], max_chars: int | None) -> np.ndarray:
    """(len(vocabulary),) log-scaled word frequencies of `text`, L2-normalised."""
    x = np.zeros(len(vocabulary))
    for word in _WORD.findall((text if max_chars is None else text[:max_chars]).lower()):
        column = vocabulary.get(word)
        if column is not None:
            x[column] += 1
    x = np.log1p(1000 * x / max(x.sum(), 1))
    return x / max(float(np.linalg.norm(x)), 1e-12)


def nearest_centroid_accuracy(train: Documents, test: Documents, num_classes: int, *, max_chars: int | None = None,
                              vocabulary_size: int = 20000) -> float:
    """Accuracy on `test` of a bag-of-words nearest-centroid rule fitted on `train`: log-scaled word frequencies
    of the `vocabulary_size` most frequent training words, L2-normalised; each document goes to the class whose
    mean vector has the highest cosine. `max_chars`: read only that much of each text (about what the model
    sees). One document's vector at a time: IMDB's 25k reviews never make a dense matrix."""
    frequency: dict[str, int] = {}
    for text in train.texts:
        for word in _WORD.findall((text if max_chars is None else text[:max_chars]).lower()):
            frequency[word] = frequency.get(word, 0) + 1
    kept = sorted(frequency, key=lambda w: (-frequency[w], w))[:vocabulary_size]
    vocabulary = {word: k for k, word in enumerate(kept)}
    sums = np.zeros((num_classes, len(vocabulary)))
    for text, label in zip(train.texts, train.labels):
        sums[label] += _word_vector(text, vocabulary, max_chars)
    present = np.flatnonzero(train.label_counts(num_classes) > 0)
    centroids = sums[present] / np.maximum(np.linalg.norm(sums[present], axis=1, keepdims=True), 1e-12)
    predicted = np.asarray([present[int(np.argmax(centroids @ _word_vector(t, vocabulary, max_chars)))] for t in test.texts])
    return float((predicted == test.labels).mean()) if len(test) else float("nan")


def majority_accuracy(train: Documents, test: Documents, num_classes: int) -> float:
    """Accuracy on `test` of always answering `train`'s most frequent class."""
    return float((test.labels == int(train.label_counts(num_classes).argmax())).mean())


def macro_f1(predicted: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """The unweighted mean of per-class F1 over the classes that occur in `labels` or `predicted`."""
    confusion = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    return macro_f1_from_counts(np.diag(confusion), confusion.sum(0) - np.diag(confusion), confusion.sum(1) - np.diag(confusion))


def macro_f1_from_counts(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> float:
    """Macro-F1 from per-class true positives, false positives and false negatives, each (num_classes,)."""
    tp, fp, fn = (np.asarray(x, dtype=np.float64) for x in (tp, fp, fn))
    seen = (tp + fp + fn) > 0
    if not seen.any():
        return 0.0
    return float(np.mean(2 * tp[seen] / (2 * tp[seen] + fp[seen] + fn[seen])))
