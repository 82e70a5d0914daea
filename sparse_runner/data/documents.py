"""Text as documents of lines, from the package, local files or Hugging Face `datasets`: the corpus
loading that the language-modelling and masked-LM tasks share.

  embedded  the State of the Union addresses shipped in the package (`sparse_runner.data.corpora.load_sotu_en`),
            offline: a speech is a document and, as the source has no paragraph breaks, a sentence a line;
  files     `task.data_dir/{train,valid,test}.txt`, one sentence (or document) per line, an empty line
            between documents (without empty lines a file is one document);
  hf        a Hugging Face dataset with a text column (LM1B: `billion-word-benchmark/lm1b`, one sentence
            per row, no document boundaries).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sparse_runner.checks import ConfigError, fail, one_line
from sparse_runner.data.corpora import load_sotu_en
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.hub import hub_splits, load_hub_splits
from sparse_runner.data.lines import utf8_lines

SPLITS = ("train", "val", "test")
# File-name stems tried for each split under task.data_dir (`{stem}.txt`).
SPLIT_STEMS = {"train": ("train",), "val": ("valid", "val", "dev"), "test": ("test",)}
TEXT_FILES = "a folder with {train,valid,test}.txt (one sentence or document per line, an empty line between documents)"

Document = list[str]  # its lines


def sotu_documents(path: Any = None) -> dict[str, list[Document]]:
    """The embedded State of the Union speeches, each a list of sentences, per split (speeches in
    chronological order: the order of ``corpora.sotu_en_metadata()`` within a split); the text of the
    masked-LM task and of the SQuAD and MNLI substitutes."""
    return {split: [split_sentences(text) for text in texts] for split, texts in load_sotu_en(path).items()}


def load_documents(t: Any) -> dict[str, list[Document]]:
    """Each split's documents (lists of non-empty, stripped lines) from a typed DocumentSourceConfig node
    (tasks/text_source.py: task.source, data_dir, hf_*, val_size, max_train_lines)."""
    if t.source == "embedded":
        docs = sotu_documents()
    elif t.source == "files":
        docs = {split: _read_documents(Path(t.data_dir).expanduser(), split) for split in SPLITS}
    else:
        docs = _load_hub(t)
    docs = {split: [[line.strip() for line in doc if line.strip()] for doc in split_docs] for split, split_docs in docs.items()}
    docs = {split: [doc for doc in split_docs if doc] for split, split_docs in docs.items()}
    if t.max_train_lines is not None:
        docs["train"] = _first_lines(docs["train"], t.max_train_lines)
    return docs


def _load_hub(t: Any) -> dict[str, list[Document]]:
    where = f"task {t.name}"
    splits = hub_splits(t.hf_splits, where)
    if t.val_size is not None:  # the dataset has no validation split (LM1B): carve it from train
        splits.pop("val")
    loaded = load_hub_splits(
        t.hf_path, t.hf_name, splits=splits, revision=t.hf_revision, data_dir=t.hf_data_dir, data_files=t.hf_data_files,
        where=where, local_files="task.source=files task.data_dir=DIR ({train,valid,test}.txt, one sentence per line)",
    )
    lines = {}
    for split, dataset in loaded.items():
        if t.hf_text_field not in dataset.column_names:
            fail("task.hf_text_field", f"{t.hf_path} has no column {t.hf_text_field!r}", ", ".join(dataset.column_names))
        lines[split] = dataset.with_format("arrow")[t.hf_text_field].to_pylist()
    if t.val_size is not None:
        lines["train"], lines["val"] = lines["train"][: -t.val_size], lines["train"][-t.val_size :]
    # Hub LM corpora (LM1B) are shuffled sentences: no document boundaries, one stream per split.
    return {split: [split_lines] for split, split_lines in lines.items()}


def _read_documents(directory: Path, split: str) -> list[Document]:
    """Documents of `{stem}.txt`: lines, an empty line between documents. A file that is not UTF-8 text,
    holds NUL bytes (a binary file) or no text at all raises `DataFormatError` naming it (and the line)."""
    for stem in SPLIT_STEMS[split]:
        path = directory / f"{stem}.txt"
        if path.is_file():
            break
    else:
        raise ConfigError(f"task.data_dir: {directory} has no {' / '.join(s + '.txt' for s in SPLIT_STEMS[split])} for the {split} split; valid: {TEXT_FILES}")
    docs: list[Document] = [[]]
    try:
        with path.open(encoding="utf-8-sig") as handle:  # a BOM is not text
            for line in handle:
                line = line.rstrip("\n").rstrip("\r")
                if "\x00" in line:
                    raise _binary(path)
                if line.strip():
                    docs[-1].append(line)
                elif docs[-1]:
                    docs.append([])
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    except OSError as error:
        raise DataFormatError(f"task.data_dir: cannot read {path} ({one_line(error)})") from None
    docs = [doc for doc in docs if doc]
    if not docs:
        raise DataFormatError(f"task.data_dir: {path} holds no text (no non-empty line); valid: {TEXT_FILES}")
    return docs


# The reading above decodes as a text stream (universal newlines); on a problem, the file is read again by
# lines split on "\n" alone, as editors number them, to name the line.
def _not_utf8(path: Path) -> DataFormatError:
    def error(number: int, err: UnicodeDecodeError) -> DataFormatError:
        return DataFormatError(f"{path}:{number}: not valid UTF-8 ({err.reason} at byte {err.start}); text files must be UTF-8")

    try:
        for _ in utf8_lines(path, error):
            pass
    except DataFormatError as found:
        return found
    return DataFormatError(f"{path}: not valid UTF-8; text files must be UTF-8")


def _binary(path: Path) -> DataFormatError:
    with open(path, "rb") as handle:
        number = next((n for n, raw in enumerate(handle, start=1) if b"\x00" in raw), None)
    where = f"{path}:{number}" if number else str(path)
    return DataFormatError(f"{where}: holds NUL bytes: a binary file, not text; valid: {TEXT_FILES}")


# A sentence ends at . ! or ? (maybe followed by a closing quote or bracket) before whitespace and a
# capital letter, digit or opening quote. Crude, but an LM only needs lines of sentence size: EOS
# placement and sentencepiece training, which skips lines over ~4 kB.
_SENTENCE_END = re.compile(
    r"(?:(?<=[.!?])(?<!\bMr\.)(?<!\bMrs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\bNo\.)(?<!\bU\.S\.)|(?<=[.!?][\"')\]]))\s+(?=[A-Z0-9\"'(\[])"
)


def split_sentences(text: str) -> list[str]:
    return [sentence for line in text.split("\n") for sentence in _SENTENCE_END.split(line) if sentence.strip()]


def _first_lines(docs: list[Document], limit: int) -> list[Document]:
    out: list[Document] = []
    for doc in docs:
        if limit <= 0:
            break
        out.append(doc[:limit])
        limit -= len(out[-1])
    return out
