"""Language modelling (Bhojanapalli et al. 2020's LM1B experiment): text -> BPE -> causal LM -> perplexity.

Text comes as documents made of lines, from the package, local files or the hub (`data/documents.py`).
Every line ends with EOS and every document starts with BOS. `task.examples=blocks` packs each
document's tokens into windows of `block_size` predictions that never cross a document boundary (a
document's last window is shorter); `examples=lines` makes every line its own example, as LM1B
sentence-level models do.

Metrics: per-token cross-entropy (`loss`) and perplexity (`ppl`); per-word perplexity (`word_ppl`: the
same total log-likelihood over the number of whitespace words, EOS counted as one, so that runs with
different vocabularies compare; words as the tokenizer's normaliser separates them, so U+200B separates
words and U+000B does not, unlike str.split()); `unigram_ppl`, the perplexity of the training split's
unigram distribution (add-one), the floor a model has to beat. A sample of generated text goes to
`outputs/sample.txt` in the run directory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from sparse_runner.checks import ConfigError, DataError, choice, fail, positive
from sparse_runner.data.documents import SPLITS, Document, load_documents
from sparse_runner.example_scores import ExampleScores
from sparse_runner.io import atomic_write_text
from sparse_runner.models import LM_KEYS, build_lm
from sparse_runner.tasks.base import StepOutput, Task
from sparse_runner.tasks.batching import pad_sequences
from sparse_runner.tasks.registry import register_task
from sparse_runner.tasks.text_source import DocumentSourceConfig, check_document_source
from sparse_runner.tokenization import BOS_ID, EOS_ID, PAD_ID, train_or_load

EXAMPLES = ("blocks", "lines")


@dataclass
class LanguageModelingTaskConfig(DocumentSourceConfig):
    examples: str
    block_size: int
    sample_tokens: int
    sample_prompt: str
    sample_seed: int


@register_task("lm", config=LanguageModelingTaskConfig)
class LanguageModelingTask(Task):
    val_metrics = ("ppl", "loss", "word_ppl")
    primary_metric = "ppl"
    model_keys = LM_KEYS

    @classmethod
    def check_config(cls, t) -> None:
        check_document_source(t, hub_example="billion-word-benchmark/lm1b")
        choice("task.examples", t.examples, EXAMPLES)
        positive("task.block_size", t.block_size)
        if t.max_length < t.block_size:
            fail("task.max_length", f"must be >= task.block_size={t.block_size} (the positions the model needs), got {t.max_length}")
        positive("task.sample_tokens", t.sample_tokens, allow_zero=True)

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        docs = load_documents(self.cfg)
        train_lines = [line for doc in docs["train"] for line in doc]
        if not train_lines:  # the data's fault, not task.vocab_size's
            raise DataError(f"task {self.name}: the train split has no text; check the task's data (task.*)")
        try:
            self.tokenizer = train_or_load(
                train_lines, vocab_size=self.cfg.vocab_size, character_coverage=self.cfg.character_coverage,
                cache_dir=Path(self.cache_dir).expanduser(),
            )
        except ValueError as exc:  # e.g. a vocabulary larger than the data can fill
            raise ConfigError(f"task.vocab_size: {exc}") from None
        self.examples = {split: self._make_examples(docs[split]) for split in SPLITS}
        for split in SPLITS:
            if not self.examples[split]:
                raise ConfigError(f"task {self.name}: the {split} split has no text")
        self._lengths = {split: np.array([len(x) - 1 for x in self.examples[split]], dtype=np.int64) for split in SPLITS}
        # Which ids start a whitespace word (sentencepiece marks them with "▁"); EOS ends a line and
        # counts as a word, as in LM1B's per-word perplexity. The words are those of the tokenizer's
        # normalised text (sentencepiece nmt_nfkc), whatever the vocabulary, not str.split()'s: zero-width
        # and direction marks (U+200B, U+200C, U+200E, U+200F, U+FEFF) become spaces and separate words
        # ("cat\u200bdog" is 2 words, str.split() says 1), while the control characters str.split() takes
        # as whitespace (U+000B, U+001C..U+001F) are removed and join them ("cat\x0bdog" is 1 word).
        pieces = [self.tokenizer.id_to_piece(i) for i in range(self.tokenizer.vocab_size)]
        self.word_start = torch.tensor([p.startswith("▁") or i == EOS_ID for i, p in enumerate(pieces)])
        targets = np.concatenate([x[1:] for x in self.examples["train"]])
        counts = np.bincount(targets, minlength=self.tokenizer.vocab_size).astype(np.float64) + 1.0
        self.unigram_nll = torch.from_numpy(-np.log(counts / counts.sum()))  # (vocab,) float64, add-one smoothing

    # ------------------------------------------------------------------------------ data
    def _make_examples(self, docs: list[Document]) -> list[np.ndarray]:
        """Token windows: BOS + a line's (lines mode) or a document's (blocks mode) ids, each line ending
        in EOS; windows of block_size + 1 tokens overlapping by one, so each token is predicted once."""
        line_ids = self.tokenizer.encode([line for doc in docs for line in doc])
        eos, bos = np.array([EOS_ID], dtype=np.int64), np.array([BOS_ID], dtype=np.int64)
        size = self.cfg.block_size
        out: list[np.ndarray] = []
        start = 0
        for doc in docs:
            ids = [np.concatenate([line_ids[i].astype(np.int64), eos]) for i in range(start, start + len(doc))]
            start += len(doc)
            streams = [np.concatenate([bos, x]) for x in ids] if self.cfg.examples == "lines" else [np.concatenate([bos, *ids])]
            for stream in streams:
                out.extend(stream[i : i + size + 1] for i in range(0, len(stream) - 1, size))
        return out

    def sizes(self) -> dict[str, int]:
        return {split: len(x) for split, x in self.examples.items()}

    def lengths(self, split: str) -> np.ndarray:
        return self._lengths[split]

    def describe(self) -> dict[str, Any]:
        return {
            "tokenizer": {"type": "sentencepiece-bpe", "vocab_size": self.tokenizer.vocab_size, "model": str(self.tokenizer.path)},
            "examples": self.cfg.examples,
            "tokens": {split: int(self._lengths[split].sum()) for split in SPLITS},
        }

    def build_model(self, model_cfg: Any) -> torch.nn.Module:
        return build_lm(model_cfg, vocab_size=self.tokenizer.vocab_size, max_length=self.cfg.max_length, pad_id=PAD_ID)

    def make_batch(self, split: str, indices: np.ndarray, device: torch.device) -> dict[str, Any]:
        windows = [self.examples[split][int(i)] for i in indices]
        inputs, lengths = pad_sequences([w[:-1] for w in windows], pad_id=PAD_ID)
        targets, _ = pad_sequences([w[1:] for w in windows], pad_id=PAD_ID)
        return {
            "inputs": inputs.to(device, non_blocking=True),
            # None when nothing is padded (blocks mode, mostly): attention then needs no mask.
            "lengths": None if bool((lengths == inputs.shape[1]).all()) else lengths.to(device, non_blocking=True),
            "targets": targets.to(device, non_blocking=True),
            "num_tokens": int(lengths.sum()),
            "indices": indices,
        }

    # ------------------------------------------------------------------------------ steps
    def forward_loss(self, model, batch) -> StepOutput:
        logits = model(batch["inputs"], batch["lengths"])
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), batch["targets"].flatten(), ignore_index=PAD_ID, label_smoothing=self.label_smoothing
        )
        return StepOutput(loss=loss, logits=logits, tokens=batch["num_tokens"], mask=batch["targets"] != PAD_ID, loss_count=batch["num_tokens"])

    def eval_step(self, model, batch, split):
        targets = batch["targets"]
        logits = model(batch["inputs"], batch["lengths"])
        real = targets != PAD_ID
        nll = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=PAD_ID, reduction="sum")
        sums = {
            "nll": float(nll),
            "tokens": batch["num_tokens"],
            "words": int((self.word_start.to(targets.device)[targets] & real).sum()),
            "unigram_nll": float(self.unigram_nll.to(targets.device)[targets][real].sum()),
        }
        if split == "test":  # per window, for example_scores (a second loss pass: `nll` stays as it always was)
            per_token = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=PAD_ID, reduction="none")
            rows = per_token.double().sum(1).tolist()
            sums["windows"] = list(zip(np.asarray(batch["indices"]).tolist(), rows, real.sum(1).tolist()))
        return sums

    def example_scores(self, split: str, sums) -> ExampleScores | None:
        """Per window: its summed loss and its tokens; perplexity is exp(sum / sum)."""
        windows = sorted(sums.get("windows", []))
        if not windows:
            return None
        return ExampleScores(f"{split}/ppl", "exp_ratio", np.array([[nll, n] for _, nll, n in windows], dtype=np.float64),
                             np.array([i for i, _, _ in windows]))

    def finalise(self, split: str, sums, output_dir: Path | None = None) -> dict[str, float]:
        tokens, words = max(sums.get("tokens", 0), 1), max(sums.get("words", 0), 1)
        nll = sums.get("nll", 0.0)
        loss = nll / tokens
        return {
            f"{split}/loss": loss,
            f"{split}/ppl": math.exp(min(loss, 50.0)),
            f"{split}/word_ppl": math.exp(min(nll / words, 50.0)),
            f"{split}/unigram_ppl": math.exp(min(sums.get("unigram_nll", 0.0) / tokens, 50.0)),
        }

    @torch.no_grad()
    def write_outputs(self, model, output_dir: Path) -> None:
        """`sample.txt`: `sample_tokens` tokens sampled (top-k 40) after `sample_prompt`, seeded."""
        t = self.cfg
        if t.sample_tokens == 0:
            return
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(t.sample_seed)  # its own RNG: training's is untouched
        prompt = self.tokenizer.encode([t.sample_prompt])[0].tolist() if t.sample_prompt else []
        ids = torch.tensor([[BOS_ID, *prompt]], device=device)
        for _ in range(t.sample_tokens):
            logits = model(ids[:, -t.block_size :])[0, -1].float()
            logits[[PAD_ID, BOS_ID]] = float("-inf")
            top = logits.topk(40)
            next_id = top.indices[torch.multinomial(torch.softmax(top.values, -1), 1, generator=generator)]
            ids = torch.cat([ids, next_id[None]], dim=1)
        lines, line = [], []
        for i in ids[0, 1:].tolist():  # EOS ends a line
            if i == EOS_ID:
                lines.append(line)
                line = []
            else:
                line.append(i)
        texts = self.tokenizer.decode(lines + [line]) if (lines or line) else []
        atomic_write_text(Path(output_dir) / "sample.txt", "".join(text + "\n" for text in texts))
