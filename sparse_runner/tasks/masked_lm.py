"""Masked-language-model pre-training (Devlin et al. 2019; Bhojanapalli et al. 2020 pre-train BERT this way).

Text: documents of lines (`data/documents.py`: the embedded State of the Union addresses, local
`{train,valid,test}.txt` files, or a Hugging Face dataset with a text column). Each document's tokens
are packed into examples of `task.max_length` ids, `[CLS] ... [SEP]`, which never cross a document
boundary (a document's last example is shorter). No next-sentence prediction (RoBERTa dropped it).

Masking, BERT's: `mask_prob` (15 %) of the real tokens are chosen, at least one per example; of those,
80 % become [MASK], 10 % a random piece, 10 % stay (`mask_replace` = [0.8, 0.1]). Training draws fresh
masks for every batch (from torch's generator, which checkpoints carry, so resume is exact);
validation and test masks are drawn once from `eval_mask_seed`, so every evaluation scores the same
positions. The output layer runs on the chosen positions only.

Metrics: masked-token loss (cross-entropy, nats), `accuracy` of the top prediction at the chosen
positions, `ppl` = exp(loss), and `majority_accuracy`: always predicting the training split's most
frequent piece, the floor a model has to beat. The tokenizer is copied to `outputs/tokenizer.model`,
so fine-tuning from the run (`model.init_from`) reads the same ids.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from sparse_runner.checks import ConfigError, fail, in_unit_interval, positive
from sparse_runner.data.documents import SPLITS, load_documents
from sparse_runner.io import atomic_open
from sparse_runner.models.bert import build_masked_lm
from sparse_runner.tasks.base import StepOutput
from sparse_runner.tasks.batching import pad_sequences
from sparse_runner.tasks.bert_text import CLS_ID, FIRST_PIECE_ID, PAD_ID, SEP_ID, BertTextTask
from sparse_runner.tasks.registry import register_task
from sparse_runner.tasks.text_source import DocumentSourceConfig, check_document_source

EVAL_SPLITS = ("val", "test")


@dataclass
class MaskedLMTaskConfig(DocumentSourceConfig):
    tokenizer: Optional[str]  # a sentencepiece .model to use instead of training one
    max_length: int  # ids per example, [CLS] and [SEP] included (the paper pre-trains at 128)
    max_positions: Optional[int]  # learned position table (BERT: 512, for longer fine-tuning inputs); None = max_length
    mask_prob: float
    mask_replace: list[float]  # of the chosen: -> [MASK], -> random piece
    eval_mask_seed: int


def mask_tokens(
    tokens: torch.Tensor, lengths: torch.Tensor, *, mask_prob: float, replace: tuple[float, float], mask_id: int, vocab_size: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking of a padded batch: (inputs, chosen), both (B, N).

    tokens: (B, N) long, [CLS] first and [SEP] last of each row's `lengths` (B,); padding after.
    chosen: bool, the positions to predict: each real piece with probability `mask_prob`, at least one
    per row (a row with none gets its lowest-drawn piece). inputs: `tokens` with a chosen position set
    to `mask_id` with probability replace[0], to a random piece (ids FIRST_PIECE_ID .. vocab_size-1)
    with probability replace[1], and left as it was otherwise.
    """
    b, n = tokens.shape
    real = torch.arange(n)[None, :] < lengths[:, None]
    candidate = real & (tokens != CLS_ID) & (tokens != SEP_ID)
    draw = torch.rand(b, n, generator=generator).masked_fill(~candidate, 2.0)
    chosen = draw < mask_prob
    lowest = draw.argmin(dim=1)
    none = ~chosen.any(dim=1) & candidate.any(dim=1)
    chosen[none, lowest[none]] = True
    action = torch.rand(b, n, generator=generator)
    inputs = tokens.clone()
    inputs[chosen & (action < replace[0])] = mask_id
    randomised = chosen & (action >= replace[0]) & (action < replace[0] + replace[1])
    inputs[randomised] = torch.randint(FIRST_PIECE_ID, vocab_size, (int(randomised.sum()),), generator=generator)
    return inputs, chosen


@register_task("mlm", config=MaskedLMTaskConfig)
class MaskedLMTask(BertTextTask):
    val_metrics = ("loss", "accuracy")
    primary_metric = "accuracy"

    @classmethod
    def check_config(cls, t) -> None:
        check_document_source(t, hub_example="wikitext (hf_name=wikitext-103-raw-v1)")
        if t.max_length < 3:
            fail("task.max_length", f"must hold [CLS], one piece and [SEP], got {t.max_length}", "an int >= 3 (the paper: 128)")
        positive("task.max_positions", t.max_positions, allow_none=True)
        if t.max_positions is not None and t.max_positions < t.max_length:
            fail("task.max_positions", f"must be >= task.max_length={t.max_length}, got {t.max_positions}")
        in_unit_interval("task.mask_prob", t.mask_prob)
        if t.mask_prob == 0:
            fail("task.mask_prob", "is 0: nothing would be predicted", "a fraction in (0, 1), e.g. 0.15")
        if len(t.mask_replace) != 2 or min(t.mask_replace) < 0 or sum(t.mask_replace) > 1:
            fail("task.mask_replace", f"is [share -> [MASK], share -> random piece], two fractions summing to <= 1, got {list(t.mask_replace)}")

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        docs = load_documents(self.cfg)
        self.load_tokenizer(lambda: [line for doc in docs["train"] for line in doc])
        self.examples = {split: self._pack(docs[split]) for split in SPLITS}
        for split in SPLITS:
            if not self.examples[split]:
                raise ConfigError(f"task {self.name}: the {split} split has no text")
        self._lengths = {split: np.array([len(x) for x in self.examples[split]], dtype=np.int64) for split in SPLITS}
        counts = np.bincount(np.concatenate([x[1:-1] for x in self.examples["train"]]), minlength=self.tokenizer.vocab_size)
        self.majority_id = int(counts.argmax())
        self.replace = tuple(float(x) for x in self.cfg.mask_replace)
        self.eval_masks = {split: self._fixed_masks(split) for split in EVAL_SPLITS}

    def _pack(self, docs: list[list[str]]) -> list[np.ndarray]:
        """[CLS] + up to max_length - 2 pieces + [SEP], consecutive within each document."""
        ids = self.tokenizer.encode([line for doc in docs for line in doc])
        size = self.cfg.max_length - 2
        out, start = [], 0
        for doc in docs:
            stream = np.concatenate(ids[start : start + len(doc)]).astype(np.int64)  # documents are never empty (load_documents)
            start += len(doc)
            for i in range(0, len(stream), size):
                out.append(np.concatenate([[CLS_ID], stream[i : i + size], [SEP_ID]]))
        return out

    def _fixed_masks(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, chosen) of a whole evaluation split, drawn once from task.eval_mask_seed (per split)."""
        tokens, lengths = pad_sequences(self.examples[split], pad_id=PAD_ID, multiple=1)
        generator = torch.Generator().manual_seed(self.cfg.eval_mask_seed * 2 + EVAL_SPLITS.index(split))
        return self._mask(tokens, lengths, generator)

    def _mask(self, tokens, lengths, generator=None):
        return mask_tokens(tokens, lengths, mask_prob=self.cfg.mask_prob, replace=self.replace, mask_id=self.mask_id,
                           vocab_size=self.tokenizer.vocab_size, generator=generator)

    # ------------------------------------------------------------------------------ data
    def sizes(self) -> dict[str, int]:
        return {split: len(x) for split, x in self.examples.items()}

    def lengths(self, split: str) -> np.ndarray:
        return self._lengths[split]

    def describe(self) -> dict[str, Any]:
        t = self.cfg
        data = {"embedded": "State of the Union addresses 1790-2021 (real English, embedded)", "files": f"text files in {t.data_dir}",
                "hf": f"{t.hf_path} through datasets"}[t.source]
        return {
            "data": {"name": t.name, "source": {"embedded": "release", "files": "release", "hf": "hub"}[t.source], "substitute_for": None, "description": data},
            "tokenizer": self.tokenizer_info(),
            "tokens": {split: int(self._lengths[split].sum()) for split in SPLITS},
            "masking": {"mask_prob": t.mask_prob, "mask_replace": list(t.mask_replace)},
        }

    def build_model(self, model_cfg: Any) -> torch.nn.Module:
        return build_masked_lm(model_cfg, vocab_size=self.vocab_size, max_length=self.cfg.max_positions or self.cfg.max_length, pad_id=PAD_ID)

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        if split in self.eval_masks:  # the split's fixed masks, cut to the batch's longest example
            inputs, chosen = self.eval_masks[split]
            lengths = torch.from_numpy(self._lengths[split][indices])
            width = int(lengths.max())
            index = torch.from_numpy(np.asarray(indices, dtype=np.int64))
            inputs, chosen = inputs[index, :width], chosen[index, :width]
            targets = pad_sequences([self.examples[split][int(i)] for i in indices], pad_id=PAD_ID, multiple=1)[0]
        else:
            targets, lengths = pad_sequences([self.examples[split][int(i)] for i in indices], pad_id=PAD_ID)
            inputs, chosen = self._mask(targets, lengths)
        return {
            "inputs": inputs.to(device, non_blocking=True),
            "lengths": None if bool((lengths == inputs.shape[1]).all()) else lengths.to(device, non_blocking=True),
            "chosen": chosen.to(device, non_blocking=True),
            "targets": targets[chosen].to(device, non_blocking=True),  # (P,) the original ids at the chosen positions
            "num_tokens": int(lengths.sum()),
        }

    # ------------------------------------------------------------------------------ steps
    def forward_loss(self, model, batch) -> StepOutput:
        logits = model(batch["inputs"], batch["lengths"], batch["chosen"])  # (P, vocab)
        loss = F.cross_entropy(logits.float(), batch["targets"], label_smoothing=self.label_smoothing)
        return StepOutput(loss=loss, logits=logits, tokens=batch["num_tokens"], loss_count=len(batch["targets"]))

    def eval_step(self, model, batch, split):
        logits = model(batch["inputs"], batch["lengths"], batch["chosen"])
        targets = batch["targets"]
        return {
            "nll": float(F.cross_entropy(logits.float(), targets, reduction="sum")),
            "correct": int((logits.argmax(-1) == targets).sum()),
            "majority": int((targets == self.majority_id).sum()),
            "predicted": len(targets),
        }

    def finalise(self, split: str, sums, output_dir: Path | None = None) -> dict[str, float]:
        count = max(sums.get("predicted", 0), 1)
        loss = sums.get("nll", 0.0) / count
        return {
            f"{split}/loss": loss,
            f"{split}/accuracy": sums.get("correct", 0) / count,
            f"{split}/ppl": math.exp(min(loss, 50.0)),
            f"{split}/majority_accuracy": sums.get("majority", 0) / count,
        }

    def write_outputs(self, model, output_dir: Path) -> None:
        """`tokenizer.model`: the ids this encoder learned, for fine-tuning runs (`model.init_from`)."""
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.tokenizer.path, "rb") as source, atomic_open(output_dir / "tokenizer.model", "wb", encoding=None) as target:
            shutil.copyfileobj(source, target)
