"""Long-document classification (the classification half of ERNIE-Sparse's downstream results, Liu et al. 2022).

The paper names no tasks in any public source we found; the suite here is OUR CHOICE, the long-document
classification sets of its time: IMDB (whole reviews), Hyperpartisan News Detection (by-article) and arXiv
classification (He et al. 2019, 11 classes). Offline substitute: `sotu_era` (whole State of the Union
addresses labelled with their era), marked as a substitute in metrics.json and the report.

Input `[CLS] document [SEP]`, subword ids (the BERT-style tokenizer of `bert_text.py`, so a masked-LM
pre-training run can be fine-tuned from), cut to `task.max_length` (4096 at paper size); the [CLS] position,
global under every block-sparse pattern, through a tanh pooler gives the logits (`SentencePairClassifier`
with one segment).

Splits (`task.dataset`; readers in `data/long_documents.py`):
  imdb           the source's train / test; validation = `task.val_fraction` of train held out (seeded);
  hyperpartisan  the 645 labelled by-article articles (no official test labels are public), split
                 stratified and seeded: `task.test_fraction` test, `task.val_fraction` validation, the rest
                 train (80/10/10 by default, the proportions of Longformer's split; not its very articles);
  arxiv          the hub's train / validation / test; the official release (class folders, no split) is
                 split as Hyperpartisan;
  sotu_era       the 233 embedded speeches split by speech, stratified and seeded (60/15/25 by default).

Metrics: `accuracy` (primary), `macro_f1` (mean F1 over classes) and `majority_accuracy`. Floors in
metrics.json `task_info.baselines`: the majority class of train and a bag-of-words nearest-centroid rule
fitted on train reading the first `max_length * CHARS_PER_PIECE` characters (about what the model reads).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from sparse_runner.checks import ConfigError, choice, fail, in_unit_interval, positive
from sparse_runner.data.documents import split_sentences
from sparse_runner.data.hub import load_hub_splits
from sparse_runner.data.long_documents import (
    ARXIV_FILES,
    DATASETS,
    HYPERPARTISAN_FILES,
    IMDB_FILES,
    SOTU_ERA_DESCRIPTION,
    Documents,
    from_hub_rows,
    hold_out,
    macro_f1_from_counts,
    majority_accuracy,
    nearest_centroid_accuracy,
    read_aclimdb,
    read_arxiv,
    read_hyperpartisan,
    sotu_era_documents,
    stratified_split,
)
from sparse_runner.models.bert import build_pair_classifier
from sparse_runner.tasks.bert_text import PAD_ID, BertClassificationTask, FineTuningDataConfig
from sparse_runner.tasks.registry import register_task
from sparse_runner.tasks.text_source import check_source

log = logging.getLogger(__name__)

SOURCES = ("hf", "files", "sotu_era")
HUB_DATASETS = ("imdb", "hyperpartisan", "arxiv")
FILES = {"imdb": IMDB_FILES, "hyperpartisan": "the official pair " + " + ".join(HYPERPARTISAN_FILES), "arxiv": ARXIV_FILES}
# Texts are cut to max_length * CHARS_PER_PIECE characters before tokenising: a subword piece is rarely
# longer, and an arXiv paper (tens of thousands of words) would otherwise be tokenised whole for nothing.
CHARS_PER_PIECE = 12
OFFICIAL = {
    "imdb": "IMDB reviews (Maas et al. 2011), whole reviews",
    "hyperpartisan": "SemEval-2019 Task 4 Hyperpartisan News Detection, by-article (seeded split)",
    "arxiv": "arXiv classification (He et al. 2019), 11 classes",
}


@dataclass
class LongDocumentTaskConfig(FineTuningDataConfig):
    dataset: str  # imdb | hyperpartisan | arxiv | sotu_era (source sotu_era only)
    hf_path: Optional[str]
    hf_splits: dict[str, str]  # val / test may be absent
    hf_text_field: str
    hf_label_field: str
    hf_title_field: Optional[str]  # put in front of the text when the rows have it (Hyperpartisan's title)
    max_length: int  # ids per document, [CLS] and [SEP] included
    val_fraction: float  # of train held out for checkpoint selection when the source has no validation split
    test_fraction: float  # of all documents held out as test when the source has no test split
    split_seed: int  # which documents are held out
    max_train_examples: Optional[int]  # only the first N training documents (quick experiments)


@register_task("long_document", config=LongDocumentTaskConfig)
class LongDocumentTask(BertClassificationTask):
    val_metrics = ("accuracy", "macro_f1", "loss")
    primary_metric = "accuracy"

    @classmethod
    def check_config(cls, t) -> None:
        choice("task.dataset", t.dataset, (*HUB_DATASETS, "sotu_era"))
        check_source(t, files=FILES.get(t.dataset, ""), hub_example="stanfordnlp/imdb", sources=SOURCES)
        if (t.source == "sotu_era") != (t.dataset == "sotu_era"):
            fail("task.dataset", f"{t.dataset} with task.source={t.source}: the substitute is dataset sotu_era with source sotu_era",
                 "task=sotu_era, or a dataset of " + ", ".join(HUB_DATASETS) + " with source hf or files")
        unknown = sorted(set(t.hf_splits) - {"train", "val", "test"})
        if "train" not in t.hf_splits or unknown:
            fail("task.hf_splits", f"must map train (and optionally val, test) to dataset splits, got {dict(t.hf_splits)}")
        if t.max_length < 3:
            fail("task.max_length", f"must hold [CLS], one piece and [SEP], got {t.max_length}", "an int >= 3 (paper size: 4096)")
        for key in ("val_fraction", "test_fraction"):
            in_unit_interval(f"task.{key}", t[key])
            positive(f"task.{key}", t[key])
        if t.val_fraction + t.test_fraction >= 1:
            fail("task.test_fraction", f"{t.test_fraction} + task.val_fraction {t.val_fraction} leaves no training documents")
        positive("task.max_train_examples", t.max_train_examples, allow_none=True)

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.label_names = DATASETS[self.cfg.dataset]
        self.num_classes = len(self.label_names)
        docs, self.data_info = self._load()
        if self.cfg.max_train_examples is not None:
            docs["train"] = docs["train"].select(np.arange(min(self.cfg.max_train_examples, len(docs["train"]))))
        for split, part in docs.items():
            if not len(part):
                raise ConfigError(f"task {self.name}: the {split} split has no documents")
        self.docs = docs
        self.max_chars = self.cfg.max_length * CHARS_PER_PIECE
        self.load_tokenizer(lambda: [s for text in docs["train"].texts for s in split_sentences(text[: self.max_chars])])
        self.examples = {split: self._encode(part) for split, part in docs.items()}
        self._lengths = {split: np.array([len(x) for x in ex], dtype=np.int64) for split, ex in self.examples.items()}
        self.majority_label = int(docs["train"].label_counts(self.num_classes).argmax())

    # ------------------------------------------------------------------------------ data
    def _load(self) -> tuple[dict[str, Documents], dict[str, Any]]:
        """{train, val, test} documents and what they are (metrics.json task_info.data)."""
        t = self.cfg
        if t.source == "sotu_era":
            parts = {"all": sotu_era_documents()}
            info = {"name": "sotu_era", "source": "substitute", "substitute_for": "long-document classification (IMDB, Hyperpartisan, arXiv)",
                    "description": SOTU_ERA_DESCRIPTION}
        elif t.source == "files":
            parts = self._read_files(Path(t.data_dir).expanduser())
            info = {"name": t.dataset, "source": "release", "substitute_for": None, "description": f"{OFFICIAL[t.dataset]}, files in {t.data_dir}"}
        else:
            loaded = load_hub_splits(
                t.hf_path, t.hf_name, splits=dict(t.hf_splits), revision=t.hf_revision, data_dir=t.hf_data_dir, data_files=t.hf_data_files,
                where=f"task {t.name}", local_files=f"task.source=files task.data_dir=<{FILES[t.dataset]}>",
            )
            parts = {split: from_hub_rows(ds, text_field=t.hf_text_field, label_field=t.hf_label_field, title_field=t.hf_title_field,
                                          dataset_name=t.dataset, where=f"{t.hf_path} {t.hf_splits[split]}") for split, ds in loaded.items()}
            info = {"name": t.dataset, "source": "hub", "substitute_for": None, "description": f"{OFFICIAL[t.dataset]}, {t.hf_path} through datasets"}
        return self._split(parts), info

    def _read_files(self, directory: Path) -> dict[str, Documents]:
        if self.cfg.dataset == "imdb":
            return read_aclimdb(directory)
        if self.cfg.dataset == "hyperpartisan":
            return {"train": read_hyperpartisan(directory)}
        found = read_arxiv(directory)
        return {"train": found["all"]} if "all" in found else found

    def _split(self, parts: dict[str, Documents]) -> dict[str, Documents]:
        """Carve the splits a source lacks: test (stratified, seeded) from everything, then val from train."""
        t = self.cfg
        if "all" in parts:
            parts = {"train": parts.pop("all")}
        share = t.val_fraction  # of train
        if "test" not in parts:
            test, train = stratified_split(parts["train"], [t.test_fraction], t.split_seed)
            parts = {**parts, "train": train, "test": test}
            # val_fraction then counts all documents, like test_fraction: 80/10/10 by default.
            share = t.val_fraction / (1 - t.test_fraction)
        if "val" not in parts:
            train, val = hold_out(parts["train"], share, t.split_seed + 1)
            parts = {**parts, "train": train, "val": val}
        return {split: parts[split] for split in ("train", "val", "test")}

    def _encode(self, part: Documents) -> list[np.ndarray]:
        """[CLS] the document's first max_length - 2 pieces [SEP]."""
        ids = self.tokenizer.encode([text[: self.max_chars] for text in part.texts])
        return [np.asarray(self.pack(x[: self.cfg.max_length - 2]), dtype=np.int64) for x in ids]

    def sizes(self) -> dict[str, int]:
        return {split: len(part) for split, part in self.docs.items()}

    def lengths(self, split: str) -> np.ndarray:
        return self._lengths[split]

    def describe(self) -> dict[str, Any]:
        train, test = self.docs["train"], self.docs["test"]
        truncated = {split: float(np.mean(self._lengths[split] >= self.cfg.max_length)) for split in self.docs}
        return {
            "data": self.data_info,
            "labels": list(self.label_names),
            "examples": self.sizes(),
            "label_counts": {split: part.label_counts(self.num_classes).tolist() for split, part in self.docs.items()},
            "mean_pieces": {split: float(np.mean(lengths)) for split, lengths in self._lengths.items()},
            "share_cut_at_max_length": truncated,
            "tokenizer": self.tokenizer_info(),
            "baselines": {
                "majority": majority_accuracy(train, test, self.num_classes),
                "bag_of_words_nearest_centroid": nearest_centroid_accuracy(train, test, self.num_classes, max_chars=self.max_chars),
            },
        }

    # ------------------------------------------------------------------------------ model and steps
    def build_model(self, model_cfg: Any) -> torch.nn.Module:
        return build_pair_classifier(model_cfg, vocab_size=self.vocab_size, num_classes=self.num_classes, max_length=self.cfg.max_length, pad_id=PAD_ID)

    def split_labels(self, split: str) -> np.ndarray:
        return self.docs[split].labels

    def eval_step(self, model, batch, split):
        logits = model(batch["tokens"], batch["lengths"])
        labels = batch["labels"]
        predicted = logits.argmax(-1)
        n = self.num_classes
        # confusion[true, predicted], read back in one transfer; summed over batches (and ranks) for macro-F1.
        confusion = torch.bincount(labels * n + predicted, minlength=n * n).view(n, n).tolist()
        out = {
            "loss": float(F.cross_entropy(logits.float(), labels, reduction="sum")),
            "correct": sum(confusion[c][c] for c in range(n)),
            "majority": sum(confusion[self.majority_label]),
            "count": len(labels),
        }
        for c in range(n):
            out[f"tp{c}"] = confusion[c][c]
            out[f"fp{c}"] = sum(confusion[t][c] for t in range(n)) - confusion[c][c]
            out[f"fn{c}"] = sum(confusion[c]) - confusion[c][c]
        return out

    def finalise(self, split: str, sums, output_dir: Path | None = None) -> dict[str, float]:
        count = max(sums.get("count", 0), 1)
        per_class = [[sums.get(f"{kind}{c}", 0) for c in range(self.num_classes)] for kind in ("tp", "fp", "fn")]
        return {
            f"{split}/loss": sums.get("loss", 0.0) / count,
            f"{split}/accuracy": sums.get("correct", 0) / count,
            f"{split}/macro_f1": macro_f1_from_counts(*per_class),
            f"{split}/majority_accuracy": sums.get("majority", 0) / count,
        }
