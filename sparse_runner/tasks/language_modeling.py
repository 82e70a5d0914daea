"""Language modelling (Bhojanapalli et al. 2020's LM1B experiment): text -> BPE -> causal LM -> perplexity.

Text comes as documents made of lines:
  embedded  the State of the Union addresses shipped in the package (`sparse_runner.data.load_sotu_en`),
            offline: a speech is a document and, as the source has no paragraph breaks, a sentence a line;
  files     `task.data_dir/{train,valid,test}.txt`, one sentence (or document) per line, an empty line
            between documents (without empty lines a file is one document);
  hf        a Hugging Face dataset with a text column (LM1B: `billion-word-benchmark/lm1b`, one sentence
            per row, no document boundaries).
Every line ends with EOS and every document starts with BOS. `task.examples=blocks` packs each
document's tokens into windows of `block_size` predictions that never cross a document boundary (a
document's last window is shorter); `examples=lines` makes every line its own example, as LM1B
sentence-level models do.

Metrics: per-token cross-entropy (`loss`) and perplexity (`ppl`); per-word perplexity (`word_ppl`: the
same total log-likelihood over the number of whitespace words, EOS counted as one, so that runs with
different vocabularies compare); `unigram_ppl`, the perplexity of the training split's unigram
distribution (add-one), the floor a model has to beat. A sample of generated text goes to
`outputs/sample.txt` in the run directory.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from sparse_runner.checks import ConfigError, choice, fail, positive
from sparse_runner.io import atomic_write_text
from sparse_runner.models import LM_KEYS, build_lm
from sparse_runner.tasks.base import StepOutput, Task
from sparse_runner.tasks.batching import pad_sequences
from sparse_runner.tasks.hub import hub_splits, load_hub_splits
from sparse_runner.tasks.registry import register_task
from sparse_runner.tasks.text_source import TextTaskConfig, check_text_source
from sparse_runner.tokenization import BOS_ID, EOS_ID, PAD_ID, train_or_load

SPLITS = ("train", "val", "test")
EXAMPLES = ("blocks", "lines")
# File-name stems tried for each split under task.data_dir (`{stem}.txt`).
SPLIT_STEMS = {"train": ("train",), "val": ("valid", "val", "dev"), "test": ("test",)}
TEXT_FILES = "a folder with {train,valid,test}.txt (one sentence or document per line, an empty line between documents)"

Document = list[str]  # its lines


@dataclass
class LanguageModelingTaskConfig(TextTaskConfig):
    name: str = "sotu_en"
    family: str = "lm"
    hf_text_field: str = "text"
    val_size: Optional[int] = None
    max_train_lines: Optional[int] = None
    examples: str = "blocks"
    block_size: int = 256
    max_length: int = 256
    sample_tokens: int = 100
    sample_prompt: str = ""
    sample_seed: int = 0


@register_task("lm", config=LanguageModelingTaskConfig)
class LanguageModelingTask(Task):
    val_metrics = ("ppl", "loss", "word_ppl")
    primary_metric = "ppl"
    model_keys = LM_KEYS

    @classmethod
    def check_config(cls, t) -> None:
        check_text_source(t, files=TEXT_FILES, hub_example="billion-word-benchmark/lm1b")
        choice("task.examples", t.examples, EXAMPLES)
        positive("task.block_size", t.block_size)
        if t.max_length < t.block_size:
            fail("task.max_length", f"must be >= task.block_size={t.block_size} (the positions the model needs), got {t.max_length}")
        for key in ("val_size", "max_train_lines"):
            positive(f"task.{key}", t[key], allow_none=True)
        positive("task.sample_tokens", t.sample_tokens, allow_zero=True)

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        docs = self._load_documents()
        train_lines = [line for doc in docs["train"] for line in doc]
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
        # counts as a word, as in LM1B's per-word perplexity.
        pieces = [self.tokenizer.id_to_piece(i) for i in range(self.tokenizer.vocab_size)]
        self.word_start = torch.tensor([p.startswith("▁") or i == EOS_ID for i, p in enumerate(pieces)])
        targets = np.concatenate([x[1:] for x in self.examples["train"]])
        counts = np.bincount(targets, minlength=self.tokenizer.vocab_size).astype(np.float64) + 1.0
        self.unigram_nll = torch.from_numpy(-np.log(counts / counts.sum()))  # (vocab,) float64, add-one smoothing

    # ------------------------------------------------------------------------------ data
    def _load_documents(self) -> dict[str, list[Document]]:
        t = self.cfg
        if t.source == "embedded":
            from sparse_runner.data import load_sotu_en

            docs = {split: [split_sentences(text) for text in texts] for split, texts in load_sotu_en().items()}
        elif t.source == "files":
            docs = {split: _read_documents(Path(t.data_dir).expanduser(), split) for split in SPLITS}
        else:
            docs = self._load_hub()
        docs = {split: [[line.strip() for line in doc if line.strip()] for doc in split_docs] for split, split_docs in docs.items()}
        docs = {split: [doc for doc in split_docs if doc] for split, split_docs in docs.items()}
        if t.max_train_lines is not None:
            docs["train"] = _first_lines(docs["train"], t.max_train_lines)
        return docs

    def _load_hub(self) -> dict[str, list[Document]]:
        t = self.cfg
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
        }

    # ------------------------------------------------------------------------------ steps
    def forward_loss(self, model, batch) -> StepOutput:
        logits = model(batch["inputs"], batch["lengths"])
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), batch["targets"].flatten(), ignore_index=PAD_ID, label_smoothing=self.label_smoothing
        )
        return StepOutput(loss=loss, logits=logits, tokens=batch["num_tokens"], mask=batch["targets"] != PAD_ID)

    def eval_step(self, model, batch, split):
        targets = batch["targets"]
        logits = model(batch["inputs"], batch["lengths"])
        real = targets != PAD_ID
        nll = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=PAD_ID, reduction="sum")
        return {
            "nll": float(nll),
            "tokens": batch["num_tokens"],
            "words": int((self.word_start.to(targets.device)[targets] & real).sum()),
            "unigram_nll": float(self.unigram_nll.to(targets.device)[targets][real].sum()),
        }

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


def _read_documents(directory: Path, split: str) -> list[Document]:
    """Documents of `{stem}.txt`: lines, an empty line between documents."""
    for stem in SPLIT_STEMS[split]:
        path = directory / f"{stem}.txt"
        if path.is_file():
            break
    else:
        raise ConfigError(f"task.data_dir: {directory} has no {' / '.join(s + '.txt' for s in SPLIT_STEMS[split])} for the {split} split; valid: {TEXT_FILES}")
    docs: list[Document] = [[]]
    with path.open(encoding="utf-8-sig") as handle:  # a BOM is not text
        for line in handle:
            line = line.rstrip("\n").rstrip("\r")
            if line.strip():
                docs[-1].append(line)
            elif docs[-1]:
                docs.append([])
    return [doc for doc in docs if doc]


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
