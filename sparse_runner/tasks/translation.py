"""Machine translation (Correia et al. 2019, Table 1): data -> joint BPE -> seq2seq -> decoding -> BLEU.

Where the sentence pairs come from is `data/parallel.py`'s business (embedded Bible, local files, the
Hugging Face hub); this module tokenises them, batches them by tokens, trains with teacher forcing,
decodes (greedy or beam) and scores the detokenised output against the raw references.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.checks import ConfigError, choice, fail, positive
from sparse_runner.data.parallel import FILE_FORMATS, load_parallel
from sparse_runner.decoding import beam_search, greedy_search
from sparse_runner.io import atomic_write_text
from sparse_runner.example_scores import ExampleScores
from sparse_runner.metrics.translation import bleu_statistics, translation_scores
from sparse_runner.models import SEQ2SEQ_KEYS, build_seq2seq
from sparse_runner.tasks.base import StepOutput, Task
from sparse_runner.tasks.batching import pad_sequences
from sparse_runner.tasks.registry import register_task
from sparse_runner.tasks.text_source import TextTaskConfig, check_text_source
from sparse_runner.tokenization import BOS_ID, EOS_ID, PAD_ID, train_or_load

SPLITS = ("train", "val", "test")


@dataclass
class DecodingConfig:
    beam_size: int
    length_penalty: float
    max_len_a: float
    max_len_b: int


@dataclass
class TranslationTaskConfig(TextTaskConfig):
    src_lang: str
    tgt_lang: str
    file_format: str
    max_train_pairs: Optional[int]
    max_eval_pairs: Optional[int]
    val_beam_size: int
    decoding: DecodingConfig


PARALLEL_FILES = "a folder with {train,valid,test}.{src,tgt} files, {split}.tsv or {split}.jsonl"


@register_task("translation", config=TranslationTaskConfig)
class TranslationTask(Task):
    val_metrics = ("bleu", "sacrebleu", "chrf", "loss", "ppl")
    primary_metric = "bleu"
    model_keys = SEQ2SEQ_KEYS

    @classmethod
    def check_config(cls, t) -> None:
        check_text_source(t, files=PARALLEL_FILES, hub_example="IWSLT/iwslt2017")
        choice("task.file_format", t.file_format, FILE_FORMATS)
        if t.src_lang == t.tgt_lang:  # here, not only at load time: refused before anything is written
            fail("task.tgt_lang", f"src_lang and tgt_lang are both {t.src_lang!r}; a translation pair needs two languages")
        for key in ("vocab_size", "val_beam_size"):
            positive(f"task.{key}", t[key])
        if t.max_length < 4:
            fail("task.max_length", f"must be at least 4 subword tokens, got {t.max_length}")
        positive("task.max_train_pairs", t.max_train_pairs, allow_none=True)
        positive("task.max_eval_pairs", t.max_eval_pairs, allow_none=True)
        d = t.decoding
        positive("task.decoding.beam_size", d.beam_size)
        positive("task.decoding.max_len_a", d.max_len_a, allow_zero=True)
        positive("task.decoding.max_len_b", d.max_len_b, allow_zero=True)
        if d.max_len_a == 0 and d.max_len_b == 0:
            fail("task.decoding.max_len_b", "max_len_a and max_len_b are both 0: no output could be produced")

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        task_cfg = self.cfg
        pairs = load_parallel(
            task_cfg.source,
            src_lang=task_cfg.src_lang,
            tgt_lang=task_cfg.tgt_lang,
            data_dir=str(Path(task_cfg.data_dir).expanduser()) if task_cfg.data_dir else None,
            file_format=task_cfg.file_format,
            hf_path=task_cfg.hf_path,
            hf_name=task_cfg.hf_name,
            hf_revision=task_cfg.hf_revision,
            hf_data_dir=task_cfg.hf_data_dir,
            hf_data_files=task_cfg.hf_data_files,
            hf_splits=dict(task_cfg.hf_splits) if task_cfg.hf_splits else None,
            task_name=task_cfg.name,
        )
        if task_cfg.max_train_pairs is not None:
            pairs["train"] = tuple(side[: task_cfg.max_train_pairs] for side in pairs["train"])
        if task_cfg.max_eval_pairs is not None:
            for split in ("val", "test"):
                pairs[split] = tuple(side[: task_cfg.max_eval_pairs] for side in pairs[split])
        train_src, train_tgt = pairs["train"]
        try:
            self.tokenizer = train_or_load(
                list(train_src) + list(train_tgt),
                vocab_size=task_cfg.vocab_size,
                character_coverage=task_cfg.character_coverage,
                cache_dir=Path(self.cache_dir).expanduser(),
            )
        except ValueError as exc:  # e.g. a vocabulary larger than the data can fill
            raise ConfigError(f"task.vocab_size: {exc}") from None
        self.references = {split: list(pairs[split][1]) for split in SPLITS}
        self.sources: dict[str, list[np.ndarray]] = {}
        self.targets: dict[str, list[np.ndarray]] = {}
        self.dropped_long_pairs = 0
        eos = np.array([EOS_ID], dtype=np.int64)
        for split in SPLITS:
            src_ids = [np.asarray(s, dtype=np.int64) for s in self.tokenizer.encode(list(pairs[split][0]))]
            tgt_ids = [np.asarray(t, dtype=np.int64) for t in self.tokenizer.encode(list(pairs[split][1]))]
            if split == "train":
                # Over-long training pairs are dropped, not cut: a cut target teaches wrong endings.
                # (Both sides get one more token, EOS, which must fit in max_length.)
                keep = [i for i, (s, t) in enumerate(zip(src_ids, tgt_ids)) if 0 < len(s) < self.max_length and 0 < len(t) < self.max_length]
                self.dropped_long_pairs = len(tgt_ids) - len(keep)
                src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
                self.references[split] = [self.references[split][i] for i in keep]
            # Evaluation sources are cut to max_length (the reference stays whole: BLEU is on raw text).
            src_ids = [np.concatenate([s[: self.max_length - 1], eos]) for s in src_ids]
            self.sources[split], self.targets[split] = src_ids, tgt_ids
        self._lengths = {
            split: np.array([max(len(s), len(t) + 1) for s, t in zip(self.sources[split], self.targets[split])], dtype=np.int64)
            for split in SPLITS
        }
        self.signatures: dict[str, str] = {}

    # ------------------------------------------------------------------------------ data
    def sizes(self) -> dict[str, int]:
        return {split: len(self.sources[split]) for split in SPLITS}

    def lengths(self, split: str) -> np.ndarray:
        return self._lengths[split]

    def describe(self) -> dict[str, Any]:
        d = self.cfg.decoding
        return {
            "tokenizer": {"type": "sentencepiece-bpe (joint)", "vocab_size": self.tokenizer.vocab_size, "model": str(self.tokenizer.path)},
            "dropped_long_train_pairs": self.dropped_long_pairs,
            "decoding": {
                "test": {"beam_size": d.beam_size, "length_penalty": d.length_penalty, "max_len_a": d.max_len_a, "max_len_b": d.max_len_b},
                "val": {"beam_size": self.cfg.val_beam_size},
            },
            **self.signatures,
        }

    def build_model(self, model_cfg: Any) -> nn.Module:
        d = self.cfg.decoding
        max_positions = int(max(self.max_length, d.max_len_a * self.max_length + d.max_len_b)) + 2
        return build_seq2seq(model_cfg, vocab_size=self.tokenizer.vocab_size, max_positions=max_positions, pad_id=PAD_ID)

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        src, src_lengths = pad_sequences([self.sources[split][int(i)] for i in indices], pad_id=PAD_ID)
        targets = [self.targets[split][int(i)] for i in indices]
        bos, eos = np.array([BOS_ID]), np.array([EOS_ID])
        tgt_in, tgt_lengths = pad_sequences([np.concatenate([bos, t]) for t in targets], pad_id=PAD_ID)
        tgt_out, _ = pad_sequences([np.concatenate([t, eos]) for t in targets], pad_id=PAD_ID)
        full = bool((src_lengths == src.shape[1]).all())
        return {
            "src": src.to(device, non_blocking=True),
            # None when nothing is padded: the encoder then needs no mask.
            "src_lengths": None if full else src_lengths.to(device, non_blocking=True),
            "tgt_in": tgt_in.to(device, non_blocking=True),
            "tgt_out": tgt_out.to(device, non_blocking=True),
            "tgt_lengths": tgt_lengths,
            "indices": [int(i) for i in indices],
            "num_tokens": int(tgt_lengths.sum()),
        }

    # ------------------------------------------------------------------------------ training
    def _loss(self, logits: torch.Tensor, batch: dict[str, Any], **kwargs) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["tgt_out"].flatten(), ignore_index=PAD_ID, **kwargs)

    def forward_loss(self, model, batch) -> StepOutput:
        logits = model(batch["src"], batch["src_lengths"], batch["tgt_in"])
        loss = self._loss(logits, batch, label_smoothing=self.label_smoothing)
        return StepOutput(loss=loss, logits=logits, tokens=batch["num_tokens"], mask=batch["tgt_out"] != PAD_ID, loss_count=batch["num_tokens"])

    # ------------------------------------------------------------------------------ evaluation
    def _teacher_forced_logits(self, model, batch) -> torch.Tensor:
        # target_mask tells the analysis which target positions are real queries.
        memory, memory_mask = model.encode(batch["src"], batch["src_lengths"])
        return model.decode(batch["tgt_in"], memory, memory_mask, target_mask=batch["tgt_out"] != PAD_ID)

    def translate_batch(self, model, batch, *, beam_size: int, use_cache: bool = True) -> list[str]:
        """Detokenised hypotheses for one batch (greedy when beam_size is 1)."""
        d = self.cfg.decoding
        search = dict(bos_id=BOS_ID, eos_id=EOS_ID, max_len_a=d.max_len_a, max_len_b=d.max_len_b, use_cache=use_cache)
        if beam_size == 1:
            ids = greedy_search(model, batch["src"], batch["src_lengths"], **search)
        else:
            ids = beam_search(model, batch["src"], batch["src_lengths"], beam_size=beam_size, length_penalty=d.length_penalty, **search)
        return self.tokenizer.decode(ids)

    def eval_step(self, model, batch, split):
        """Token-level NLL (no smoothing) with teacher forcing, then decode: validation with
        `val_beam_size` (greedy by default: fast enough for every evaluation), test with `decoding.beam_size`."""
        nll = float(self._loss(self._teacher_forced_logits(model, batch), batch, reduction="sum"))
        beam = self.cfg.val_beam_size if split == "val" else self.cfg.decoding.beam_size
        hypotheses = self.translate_batch(model, batch, beam_size=beam)
        return {"nll": nll, "tokens": batch["num_tokens"], "hypotheses": list(zip(batch["indices"], hypotheses))}

    def analysis_step(self, model, batch) -> None:
        # Teacher forcing on the references, as the paper's analysis: every attention type sees real
        # (query, key) pairs of whole sentences, not one-token decoding steps.
        self._teacher_forced_logits(model, batch)

    def finalise(self, split: str, sums, output_dir: Path | None = None) -> dict[str, float]:
        """'<split>/loss' and ppl, then the scores of the hypotheses against the raw references:
        bleu (tokenized, the paper's), sacrebleu, chrf. With output_dir, hypotheses are written there
        as `<split>.hyp` (one line per example, in the split's original order)."""
        loss = sums.get("nll", 0.0) / max(sums.get("tokens", 0), 1)
        by_index = dict(sums.get("hypotheses", []))
        indices = sorted(by_index)
        hyps = [by_index[i] for i in indices]
        refs = [self.references[split][i] for i in indices]
        scores = translation_scores(hyps, refs, target_lang=self.cfg.tgt_lang)
        self.signatures = {key: scores[key] for key in ("sacrebleu_signature", "chrf_signature", "bleu_tokenization")}
        if output_dir is not None:
            atomic_write_text(Path(output_dir) / f"{split}.hyp", "".join(h.replace("\n", " ") + "\n" for h in hyps))
        return {
            f"{split}/loss": loss,
            f"{split}/ppl": math.exp(min(loss, 50.0)),
            f"{split}/bleu": scores["bleu"],
            f"{split}/sacrebleu": scores["sacrebleu"],
            f"{split}/chrf": scores["chrf"],
        }

    def example_scores(self, split: str, sums) -> ExampleScores | None:
        """Per sentence, the statistics of the paper's tokenized BLEU (metrics.translation.bleu_statistics)."""
        by_index = dict(sums.get("hypotheses", []))
        if not by_index:
            return None
        indices = sorted(by_index)
        stats = bleu_statistics([by_index[i] for i in indices], [self.references[split][i] for i in indices],
                                target_lang=self.cfg.tgt_lang)
        return ExampleScores(f"{split}/bleu", "bleu", stats, np.array(indices))
