"""What the BERT-style task families (masked LM, SQuAD, MNLI) share: ids, the tokenizer, the pre-trained run.

Ids: the subword tokenizer's (tokenization.py) with its BOS as [CLS] and its EOS as [SEP]; [MASK] is one
id past the tokenizer's vocabulary, so the model's vocabulary is the tokenizer's plus one and every
task of the family builds the same embedding table from one tokenizer.

Tokenizer, first that applies: the pre-trained run's (`model.init_from`: the encoder's ids must mean
what they meant in pre-training), `task.tokenizer` (a sentencepiece .model file), or one trained on the
task's own training text and cached (`train_or_load`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from sparse_runner.checks import ConfigError, fail, one_line
from sparse_runner.models import BERT_KEYS
from sparse_runner.pretrained import PretrainedRun, resolve
from sparse_runner.tasks.base import StepOutput, Task
from sparse_runner.tasks.batching import pad_sequences
from sparse_runner.tasks.text_source import TextTaskConfig, check_source
from sparse_runner.tokenization import BOS_ID, EOS_ID, PAD_ID, SubwordTokenizer, train_or_load

log = logging.getLogger(__name__)

CLS_ID, SEP_ID = BOS_ID, EOS_ID
FIRST_PIECE_ID = 4  # ids below are pad, unk, [CLS], [SEP]: never a random replacement in masking

__all__ = ["CLS_ID", "FIRST_PIECE_ID", "PAD_ID", "SEP_ID", "BertClassificationTask", "BertTextTask", "FineTuningDataConfig", "check_fine_tuning_data"]


@dataclass
class FineTuningDataConfig(TextTaskConfig):
    """The keys SQuAD and MNLI share: where the data come from (a family adds its own offline
    substitute as a `source` and its `hf_splits`) and the tokenizer used without a pre-trained run."""

    source: str
    tokenizer: Optional[str]  # a sentencepiece .model to use instead of training one


def check_fine_tuning_data(t: Any, *, sources: Sequence[str], files: str, hub_example: str, splits: Sequence[str]) -> None:
    """`check_source` for a FineTuningDataConfig node, plus the keys `task.hf_splits` must map (`splits`)."""
    check_source(t, files=files, hub_example=hub_example, sources=tuple(sources))
    if sorted(t.hf_splits) != sorted(splits):
        fail("task.hf_splits", f"must map exactly {', '.join(splits)} to dataset splits, got {dict(t.hf_splits)}")


class BertTextTask(Task):
    """Base of the BERT-style families: resolves `model.init_from` and provides the tokenizer.

    After `load_tokenizer`: `tokenizer`, `mask_id` (= tokenizer vocabulary) and `vocab_size` (the
    model's: tokenizer vocabulary + 1).
    """

    model_keys = BERT_KEYS

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        # Resolved first: a bad init_from is refused before any data is read or a tokenizer trained.
        self.pretrained: PretrainedRun | None = resolve(cfg.model.init_from) if cfg.model.init_from else None
        self._tokenizer_source = ""

    def load_tokenizer(self, training_texts: Callable[[], Sequence[str]]) -> SubwordTokenizer:
        """The tokenizer (see the module docstring); `training_texts` is called only if one is trained."""
        t = self.cfg
        if self.pretrained is not None:
            path, self._tokenizer_source = self.pretrained.tokenizer, f"pre-trained run {self.pretrained.run_dir}"
            if t.tokenizer:
                log.warning("task.tokenizer=%s is not used: the tokenizer comes with model.init_from", t.tokenizer)
        elif t.tokenizer:
            path, self._tokenizer_source = Path(t.tokenizer).expanduser(), "task.tokenizer"
        else:
            path = None
        if path is not None:
            try:
                tokenizer = SubwordTokenizer(path)
            except Exception as exc:
                raise ConfigError(f"task.tokenizer: cannot load {path}: {one_line(exc)}; valid: a sentencepiece .model trained by sparse-run") from None
        else:
            self._tokenizer_source = "trained on the task's training text"
            try:
                tokenizer = train_or_load(
                    list(training_texts()), vocab_size=t.vocab_size, character_coverage=t.character_coverage, cache_dir=Path(self.cache_dir).expanduser()
                )
            except ValueError as exc:  # e.g. a vocabulary larger than the data can fill
                raise ConfigError(f"task.vocab_size: {exc}") from None
        self.tokenizer = tokenizer
        self.mask_id = tokenizer.vocab_size
        self.vocab_size = tokenizer.vocab_size + 1
        return tokenizer

    def tokenizer_info(self) -> dict[str, Any]:
        return {"type": "sentencepiece-bpe", "vocab_size": self.tokenizer.vocab_size, "model": str(self.tokenizer.path), "source": self._tokenizer_source}

    def pack(self, *parts: Sequence[int]) -> list[int]:
        """[CLS] a [SEP] (b [SEP] ...): the input layout of every BERT-style task."""
        out = [CLS_ID]
        for part in parts:
            out.extend(int(i) for i in part)
            out.append(SEP_ID)
        return out


class BertClassificationTask(BertTextTask):
    """A BERT-style family that classifies one packed id sequence per example (MNLI's sentence pair, a
    long document): `self.examples[split]` holds the ids, `split_labels(split)` the labels."""

    def split_labels(self, split: str) -> np.ndarray:
        """(examples,) int64: the label of every example of `split`."""
        raise NotImplementedError

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        """tokens (B, N) long; lengths (B,) long, or None when nothing is padded (attention then needs no
        mask); labels (B,) long; num_tokens: the real ids."""
        tokens, lengths = pad_sequences([self.examples[split][int(i)] for i in indices], pad_id=PAD_ID, max_width=self.cfg.max_length)
        return {
            "tokens": tokens.to(device, non_blocking=True),
            "lengths": None if bool((lengths == tokens.shape[1]).all()) else lengths.to(device, non_blocking=True),
            "labels": torch.from_numpy(self.split_labels(split)[indices]).to(device, non_blocking=True),
            "num_tokens": int(lengths.sum()),
            "indices": indices,
        }

    def forward_loss(self, model, batch) -> StepOutput:
        logits = model(batch["tokens"], batch["lengths"])
        loss = F.cross_entropy(logits.float(), batch["labels"], label_smoothing=self.label_smoothing)
        return StepOutput(loss=loss, logits=logits, tokens=batch["num_tokens"])
