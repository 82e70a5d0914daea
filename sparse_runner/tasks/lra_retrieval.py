"""LRA Retrieval: do two documents match? (Tay et al. 2021; PAPERS.md D.3)

Each document is byte-level (id = byte + 1, 0 pads; up to `task.max_length` bytes, 4000 in LRA) and
goes through the SAME encoder on its own -- no attention between the two -- and the pair is scored by
MLP([x1, x2, x1 * x2, x1 - x2]) (`models.DualEncoderClassifier`). Binary label.

Sources (`task.source`):
  files       LRA's release: `data_dir/new_aan_pairs.{train,eval,test}.tsv`, tab-separated without a
              header: label, id1, id2, text1, text2 (ACL Anthology Network citation pairs; read with
              `datasets`' csv builder, as the LRA ports do).
  sotu_pairs  the offline substitute, built from the State of the Union addresses shipped in the
              package: a positive pair is two disjoint windows of one speech, a negative pair windows
              of two different speeches (half of them the speech closest in year: same era, often the
              same president, so style alone does not decide). Pairs never cross the speech split, so
              test speeches are unseen. Real text, but document matching, not citation: labelled as a
              substitute for AAN.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from sparse_runner.checks import ConfigError, fail, in_unit_interval, positive
from sparse_runner.models import build_classifier
from sparse_runner.tasks.batching import pad_sequences
from sparse_runner.tasks.classification import ClassificationData, SequenceClassificationTask
from sparse_runner.tasks.hub import SPLITS
from sparse_runner.tasks.lra_text import PAD_ID, VOCAB_SIZE, encode_bytes
from sparse_runner.tasks.registry import register_task
from sparse_runner.tasks.sequence_splits import PackedSplit, split_cache
from sparse_runner.tasks.text_source import check_source
from sparse_runner.tasks.base import TaskConfig

SOURCES = ("files", "sotu_pairs")
RELEASE_FILES = "a folder with LRA's new_aan_pairs.{train,eval,test}.tsv"
AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
AAN_COLUMNS = ["label", "id1", "id2", "text1", "text2"]
_FORMAT_VERSION = 1


@dataclass(eq=False)
class PairSplit:
    """Document pairs of one split: `first[i]` and `second[i]` with label `labels[i]`."""

    first: PackedSplit
    second: PackedSplit

    def __post_init__(self) -> None:
        if len(self.first) != len(self.second) or not np.array_equal(self.first.labels, self.second.labels):
            raise ValueError("PairSplit: the two sides must have the same examples and labels")

    @property
    def labels(self) -> np.ndarray:
        return self.first.labels

    def __len__(self) -> int:
        return len(self.first)

    def lengths(self) -> np.ndarray:
        """The longer document of each pair (what batching by length needs)."""
        return np.maximum(self.first.lengths(), self.second.lengths())


def speech_windows(texts: list[str], years: list[int], *, count: int, window: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """`count` pairs of byte windows (ids) over the speeches `texts`, half positive (label 1).

    Only speeches of at least 2 * window bytes are used, so every window has the same length and
    length says nothing about the label. A positive pair is two disjoint windows of one speech; a
    negative pair one window of each of two speeches, the second the closest in year for half of the
    negatives and uniformly random for the rest.
    """
    docs = [t.encode("utf-8") for t in texts]
    usable = [i for i, d in enumerate(docs) if len(d) >= 2 * window]
    if len(usable) < 2:
        raise ConfigError(f"sotu_pairs: fewer than two speeches of at least {2 * window} bytes (task.max_length={window} is too long)")
    rng = np.random.default_rng(seed)
    year = np.asarray(years)[usable]
    first, second, labels = [], [], rng.permutation(np.arange(count) % 2)

    def cut(doc: bytes, start: int) -> np.ndarray:
        return np.frombuffer(doc[start : start + window], dtype=np.uint8).astype(np.uint16) + 1

    for label in labels:
        a = int(rng.integers(len(usable)))
        doc_a = docs[usable[a]]
        if label:
            # Two disjoint windows: the second starts at least `window` bytes after the first ends, or before it.
            s1, s2 = sorted(rng.integers(0, len(doc_a) - 2 * window + 1, size=2))
            starts = [s1, s2 + window]
            if rng.random() < 0.5:
                starts.reverse()
            first.append(cut(doc_a, starts[0]))
            second.append(cut(doc_a, starts[1]))
            continue
        if rng.random() < 0.5:
            gap = np.abs(year - year[a]).astype(float)
            gap[a] = np.inf
            b = int(rng.choice(np.flatnonzero(gap == gap.min())))
        else:
            b = int(rng.choice(np.delete(np.arange(len(usable)), a)))
        doc_b = docs[usable[b]]
        first.append(cut(doc_a, int(rng.integers(0, len(doc_a) - window + 1))))
        second.append(cut(doc_b, int(rng.integers(0, len(doc_b) - window + 1))))
    return first, second, labels


@dataclass
class LraRetrievalTaskConfig(TaskConfig):
    name: str = "lra_retrieval"
    family: str = "lra_retrieval"
    source: str = "files"
    data_dir: Optional[str] = None
    max_length: int = 4000  # bytes per document
    num_train: int = 20000  # sotu_pairs: pairs per split
    num_val: int = 2000
    num_test: int = 2000
    seed: int = 0


@register_task("lra_retrieval", config=LraRetrievalTaskConfig)
class LraRetrievalTask(SequenceClassificationTask):
    @classmethod
    def check_config(cls, t) -> None:
        check_source(t, files=RELEASE_FILES, hub_example="(none: LRA's AAN pairs are release files)", sources=SOURCES)
        positive("task.max_length", t.max_length)
        if t.source == "files":
            missing = [f for f in AAN_FILES.values() if not (Path(os.path.expanduser(t.data_dir)) / f).is_file()]
            if missing:
                fail("task.data_dir", f"{t.data_dir} lacks {', '.join(missing)}", RELEASE_FILES)
        for key in ("num_train", "num_val", "num_test"):
            positive(f"task.{key}", t[key])

    def load_data(self) -> ClassificationData:
        t = self.cfg
        root = Path(os.path.expanduser(self.cache_dir)) / "lra_retrieval"
        if t.source == "files":
            sides = self._aan(root)
            info = {"name": "aan", "source": "release", "substitute_for": None, "description": f"LRA's new_aan_pairs files in {t.data_dir}"}
        else:
            sides = self._sotu_pairs(root)
            info = {"name": "sotu_pairs", "source": "substitute", "substitute_for": "AAN",
                    "description": "same-speech matching over the State of the Union addresses (disjoint windows of one speech vs two speeches, "
                                   "half of the negatives from the closest year); real text standing in for AAN citation pairs"}
        splits = {s: PairSplit(sides[f"{s}_first"], sides[f"{s}_second"]) for s in SPLITS}
        return ClassificationData(splits, vocab_size=VOCAB_SIZE, num_classes=2, pad_id=PAD_ID, info=info)

    def _aan(self, root: Path) -> dict[str, PackedSplit]:
        t = self.cfg
        data_dir = Path(os.path.expanduser(t.data_dir))
        files = {s: data_dir / name for s, name in AAN_FILES.items()}
        identity = {"version": _FORMAT_VERSION, "files": [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files.values()],
                    "max_length": t.max_length}

        def build() -> dict[str, PackedSplit]:
            import csv

            import datasets

            loaded = datasets.load_dataset(
                "csv", data_files={s: str(p) for s, p in files.items()}, delimiter="\t", column_names=AAN_COLUMNS,
                quoting=csv.QUOTE_NONE, keep_in_memory=True,
            )
            out = {}
            for split in SPLITS:
                ds = loaded[split]
                # The release writes labels as floats ("1.0") in some copies and ints in others.
                labels = np.asarray([int(float(x)) for x in ds["label"]], dtype=np.int64)
                if len(labels) and not set(np.unique(labels)) <= {0, 1}:
                    raise ConfigError(f"task {t.name}: {files[split]}: labels must be 0 or 1, got {sorted(set(labels.tolist()))[:5]}")
                for side, column in (("first", "text1"), ("second", "text2")):
                    out[f"{split}_{side}"] = PackedSplit.from_sequences([encode_bytes(x or "", t.max_length) for x in ds[column]], labels)
            return out

        return split_cache(root / "aan", PackedSplit, identity, build)

    def _sotu_pairs(self, root: Path) -> dict[str, PackedSplit]:
        from sparse_runner.data import load_sotu_en, sotu_en_metadata

        t = self.cfg
        identity = {"version": _FORMAT_VERSION, "source": "sotu_pairs", "window": t.max_length, "seed": t.seed,
                    "counts": [t.num_train, t.num_val, t.num_test]}

        def build() -> dict[str, PackedSplit]:
            texts, meta = load_sotu_en(), sotu_en_metadata()
            out = {}
            for offset, split in enumerate(SPLITS):
                years = [m.year for m in meta if m.split == split]
                first, second, labels = speech_windows(texts[split], years, count=t[f"num_{split}"], window=t.max_length, seed=t.seed * 3 + offset)
                out[f"{split}_first"] = PackedSplit.from_sequences(first, labels)
                out[f"{split}_second"] = PackedSplit.from_sequences(second, labels)
            return out

        return split_cache(root / "sotu_pairs", PackedSplit, identity, build)

    # ------------------------------------------------------------------------------ pairs
    def build_model(self, model_cfg: Any) -> torch.nn.Module:
        return build_classifier(model_cfg, vocab_size=VOCAB_SIZE, num_classes=2, max_length=self.max_length, pad_id=PAD_ID, pairs=True)

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        data: PairSplit = self.splits[split]
        batch: dict[str, Any] = {"labels": torch.from_numpy(data.labels[indices]).to(device, non_blocking=True), "num_tokens": 0}
        for side, docs in (("1", data.first), ("2", data.second)):
            tokens, lengths = pad_sequences([docs.sequence(int(i))[: self.max_length] for i in indices], pad_id=PAD_ID, max_width=self.max_length)
            batch[f"tokens{side}"] = tokens.to(device, non_blocking=True)
            batch[f"lengths{side}"] = None if bool((lengths == tokens.shape[1]).all()) else lengths.to(device, non_blocking=True)
            batch["num_tokens"] += int(lengths.sum())
        return batch

    def logits(self, model, batch) -> torch.Tensor:
        return model(batch["tokens1"], batch["lengths1"], batch["tokens2"], batch["lengths2"])
