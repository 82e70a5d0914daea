"""Machine translation (Correia et al. 2019, Table 1): data -> joint BPE -> seq2seq -> decoding -> BLEU.

Where the sentence pairs come from is `translation_data`'s business (embedded Bible, local files, the
Hugging Face hub); this module tokenises them, batches them by tokens, trains with teacher forcing,
decodes (greedy or beam) and scores the detokenised output against the raw references.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sparse_runner.config import ConfigError
from sparse_runner.decoding import beam_search, greedy_search
from sparse_runner.io import atomic_write_text
from sparse_runner.metrics.translation import translation_scores
from sparse_runner.models import build_seq2seq
from sparse_runner.tasks.base import Task
from sparse_runner.tasks.batching import pad_sequences, plan_eval
from sparse_runner.tasks.translation_data import load_parallel
from sparse_runner.tokenization import BOS_ID, EOS_ID, PAD_ID, train_or_load

SPLITS = ("train", "val", "test")


class TranslationTask(Task):
    family = "translation"

    def __init__(self, task_cfg: Any, *, cache_dir: str, batch_size: int, batch_tokens: int | None = None) -> None:
        self.cfg = task_cfg
        self.name = task_cfg.name
        self.max_length = task_cfg.max_length
        self.eval_batch_size = batch_size
        self.eval_batch_tokens = batch_tokens
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
                cache_dir=Path(cache_dir).expanduser(),
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

    def train_lengths(self) -> np.ndarray:
        return self._lengths["train"]

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
            "num_tokens": int(tgt_lengths.sum()),
        }

    # ------------------------------------------------------------------------------ training
    def training_step(self, model, batch, label_smoothing: float = 0.0):
        logits = model(batch["src"], batch["src_lengths"], batch["tgt_in"])
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), batch["tgt_out"].flatten(), ignore_index=PAD_ID, label_smoothing=label_smoothing
        )
        return loss, {"tokens": batch["num_tokens"], "examples": len(batch["tgt_lengths"])}

    # ------------------------------------------------------------------------------ evaluation
    def _eval_plan(self, split: str, max_batches: int | None) -> list[np.ndarray]:
        return plan_eval(self._lengths[split], self.eval_batch_size, max_tokens=self.eval_batch_tokens)[:max_batches]

    @torch.no_grad()
    def teacher_forced_loss(self, model, split, device, *, max_batches=None, autocast=None) -> dict[str, float]:
        """Token-level NLL (no smoothing) and perplexity on `split`. Also the pass the analysis observes."""
        was_training = model.training
        model.eval()
        nll, tokens = 0.0, 0
        for indices in self._eval_plan(split, max_batches):
            batch = self.make_batch(split, indices, device)
            target_mask = batch["tgt_out"] != PAD_ID
            with autocast or contextlib.nullcontext():
                memory, memory_mask = model.encode(batch["src"], batch["src_lengths"])
                logits = model.decode(batch["tgt_in"], memory, memory_mask, target_mask=target_mask)
            nll += float(F.cross_entropy(logits.flatten(0, 1).float(), batch["tgt_out"].flatten(), ignore_index=PAD_ID, reduction="sum"))
            tokens += batch["num_tokens"]
        model.train(was_training)
        loss = nll / max(tokens, 1)
        return {f"{split}/loss": loss, f"{split}/ppl": math.exp(min(loss, 50.0))}

    @torch.no_grad()
    def translate(self, model, split: str, device, *, beam_size: int, max_batches=None, autocast=None, use_cache: bool = True) -> tuple[list[int], list[str]]:
        """Decode `split`: (example indices, detokenised hypotheses), in the split's length-sorted order."""
        d = self.cfg.decoding
        was_training = model.training
        model.eval()
        order: list[int] = []
        hypotheses: list[str] = []
        for indices in self._eval_plan(split, max_batches):
            batch = self.make_batch(split, indices, device)
            search = dict(bos_id=BOS_ID, eos_id=EOS_ID, max_len_a=d.max_len_a, max_len_b=d.max_len_b, use_cache=use_cache)
            with autocast or contextlib.nullcontext():
                if beam_size == 1:
                    ids = greedy_search(model, batch["src"], batch["src_lengths"], **search)
                else:
                    ids = beam_search(model, batch["src"], batch["src_lengths"], beam_size=beam_size, length_penalty=d.length_penalty, **search)
            hypotheses.extend(self.tokenizer.decode(ids))
            order.extend(int(i) for i in indices)
        model.train(was_training)
        return order, hypotheses

    @torch.no_grad()
    def evaluate(self, model, split, device, *, max_batches=None, autocast=None, output_dir: Path | None = None):
        """Loss/perplexity, then decode and score: '<split>/bleu' (tokenized, the paper's), sacrebleu, chrf.

        Validation decodes with `val_beam_size` (greedy by default: fast enough to run at every
        evaluation); test with `decoding.beam_size`. With output_dir, hypotheses are written there as
        `<split>.hyp` (one line per example, in the split's original order).
        """
        metrics = self.teacher_forced_loss(model, split, device, max_batches=max_batches, autocast=autocast)
        beam = self.cfg.val_beam_size if split == "val" else self.cfg.decoding.beam_size
        order, hypotheses = self.translate(model, split, device, beam_size=beam, max_batches=max_batches, autocast=autocast)
        by_index = dict(zip(order, hypotheses))
        indices = sorted(by_index)
        hyps = [by_index[i] for i in indices]
        refs = [self.references[split][i] for i in indices]
        scores = translation_scores(hyps, refs, target_lang=self.cfg.tgt_lang)
        self.signatures = {
            "sacrebleu_signature": scores["sacrebleu_signature"],
            "chrf_signature": scores["chrf_signature"],
            "bleu_tokenization": scores["bleu_tokenization"],
        }
        if output_dir is not None:
            atomic_write_text(Path(output_dir) / f"{split}.hyp", "".join(h.replace("\n", " ") + "\n" for h in hyps))
        metrics.update({f"{split}/bleu": scores["bleu"], f"{split}/sacrebleu": scores["sacrebleu"], f"{split}/chrf": scores["chrf"]})
        return metrics

    def analysis_pass(self, model, split, device, *, autocast=None) -> None:
        # Teacher forcing on the references, as the paper's analysis: every attention type sees real
        # (query, key) pairs of whole sentences, not one-token decoding steps.
        self.teacher_forced_loss(model, split, device, autocast=autocast)
