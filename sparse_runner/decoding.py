"""Greedy and beam-search decoding for `TransformerSeq2Seq`, batched, with a key/value cache.

Written here rather than taken from a library: Hugging Face `generate` needs its own model classes
and fairseq pins an old Hydra; the search itself is ~100 lines.

Both searches feed the decoder only the newest token per step (`use_cache=True`, the default); with
`use_cache=False` they recompute the whole prefix every step, which gives the same output (tested)
and is what the decoding benchmark compares against.

Lengths: a hypothesis may have at most `max_len_a * source_length + max_len_b` tokens before EOS,
never more than the model's positions allow; at that length EOS is forced.
Beam score of a finished hypothesis: sum of token log-probabilities / (length ** length_penalty),
length counting the EOS (0 = raw log-probability, 1 = per-token average).
"""

from __future__ import annotations

import torch

from sparse_runner.models.seq2seq import TransformerSeq2Seq


def max_lengths(src_lengths: torch.Tensor, max_len_a: float, max_len_b: int, limit: int) -> torch.Tensor:
    """(B,) the most tokens (EOS included) each output may have."""
    return (src_lengths.float() * max_len_a + max_len_b).long().clamp(1, limit)


class _Stepper:
    """Log-probabilities of the next token for each row, with or without the key/value cache."""

    def __init__(self, model: TransformerSeq2Seq, memory, memory_mask, use_cache: bool, bos_id: int) -> None:
        self.model, self.memory, self.memory_mask = model, memory, memory_mask
        self.cache = model.new_cache() if use_cache else None
        self.never = [bos_id, model.pad_id]  # ids a hypothesis may not contain

    def __call__(self, prefix: torch.Tensor) -> torch.Tensor:
        """prefix (R, t) every token so far -> (R, V) float32 log-probabilities of token t+1."""
        fed = prefix[:, -1:] if self.cache is not None else prefix
        logits = self.model.decode(fed, self.memory, self.memory_mask, cache=self.cache)[:, -1].float()
        logits[:, self.never] = float("-inf")
        return torch.log_softmax(logits, dim=-1)

    def keep(self, rows: torch.Tensor) -> None:
        """Continue only with rows `rows` (R',) of the current batch."""
        self.memory = self.memory.index_select(0, rows)
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, rows)
        if self.cache is not None:
            self.model.reorder_cache(self.cache, rows)


def _limit(model: TransformerSeq2Seq) -> int:
    return model.positions.shape[0] - 1  # room for BOS


@torch.no_grad()
def greedy_search(
    model: TransformerSeq2Seq,
    src: torch.Tensor,
    src_lengths: torch.Tensor | None,
    *,
    bos_id: int,
    eos_id: int,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
) -> list[list[int]]:
    """Most probable next token at every step. src (B, S) -> B token lists (without BOS/EOS)."""
    b, s = src.shape
    lengths = src_lengths if src_lengths is not None else torch.full((b,), s, device=src.device)
    limits = max_lengths(lengths, max_len_a, max_len_b, _limit(model))
    memory, memory_mask = model.encode(src, src_lengths)
    step = _Stepper(model, memory, memory_mask, use_cache, bos_id)
    prefix = torch.full((b, 1), bos_id, dtype=torch.long, device=src.device)
    alive = torch.arange(b, device=src.device)  # original row of each row still decoding
    outputs: list[list[int]] = [[] for _ in range(b)]
    for t in range(int(limits.max())):
        next_token = step(prefix).argmax(-1)
        next_token = torch.where(limits[alive] <= t + 1, torch.full_like(next_token, eos_id), next_token)
        done = next_token == eos_id
        for row, token in zip(alive.tolist(), next_token.tolist()):
            if token != eos_id:
                outputs[row].append(token)
        if bool(done.all()):
            break
        prefix = torch.cat([prefix, next_token[:, None]], dim=1)
        if bool(done.any()):  # drop finished rows so the batch shrinks as sentences end
            keep = (~done).nonzero().squeeze(1)
            prefix, alive = prefix.index_select(0, keep), alive.index_select(0, keep)
            step.keep(keep)
    return outputs


@torch.no_grad()
def beam_search(
    model: TransformerSeq2Seq,
    src: torch.Tensor,
    src_lengths: torch.Tensor | None,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
) -> list[list[int]]:
    """Beam search for a batch of sources. src (B, S) -> B best token lists (without BOS/EOS).

    Each sentence keeps `beam_size` open hypotheses; at every step the 2 x beam_size best extensions
    are considered, those ending in EOS are set aside as finished, and the best open ones continue.
    A sentence is done once it has `beam_size` finished hypotheses, or at its length limit.
    """
    k = beam_size
    b, s = src.shape
    device = src.device
    lengths = src_lengths if src_lengths is not None else torch.full((b,), s, device=device)
    limits = max_lengths(lengths, max_len_a, max_len_b, _limit(model))
    memory, memory_mask = model.encode(src, src_lengths)
    rows = torch.arange(b, device=device).repeat_interleave(k)  # beam row -> sentence
    step = _Stepper(model, memory.index_select(0, rows), None if memory_mask is None else memory_mask.index_select(0, rows), use_cache, bos_id)

    prefix = torch.full((b * k, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    active = list(range(b))  # sentences still searching, in the order of the beam rows
    for t in range(int(limits.max())):
        logp = step(prefix)                                        # (A*k, V)
        vocab = logp.shape[-1]
        candidates = (scores[:, :, None] + logp.view(len(active), k, vocab)).view(len(active), k * vocab)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=-1)  # (A, 2k)
        beam, token = top_index // vocab, top_index % vocab
        at_limit = limits[active] <= t + 1                          # (A,) EOS is the only choice now

        next_beams, next_tokens, next_scores, still = [], [], [], []
        hist = prefix.view(len(active), k, -1)
        for a, sentence in enumerate(active):
            if at_limit[a]:
                # Close every open beam with EOS (its score includes the EOS log-probability).
                for j in range(k):
                    if scores[a, j] > float("-inf"):
                        total = float(scores[a, j] + logp[a * k + j, eos_id])
                        finished[sentence].append((total / (t + 1) ** length_penalty, hist[a, j, 1:].tolist()))
                continue
            chosen = []
            for score, j, tok in zip(top_scores[a].tolist(), beam[a].tolist(), token[a].tolist()):
                if score == float("-inf"):
                    break
                if tok == eos_id:
                    if len(finished[sentence]) < k:
                        finished[sentence].append((score / (t + 1) ** length_penalty, hist[a, j, 1:].tolist()))
                elif len(chosen) < k:
                    chosen.append((score, j, tok))
                if len(chosen) == k:
                    break
            if len(finished[sentence]) >= k or not chosen:
                continue
            while len(chosen) < k:  # pad with impossible beams so every sentence keeps k rows
                chosen.append((float("-inf"), chosen[0][1], chosen[0][2]))
            still.append(a)
            next_beams.extend(a * k + j for _, j, _ in chosen)
            next_tokens.extend(tok for _, _, tok in chosen)
            next_scores.append([sc for sc, _, _ in chosen])
        if not still:
            break
        keep = torch.tensor(next_beams, device=device)
        prefix = torch.cat([prefix.index_select(0, keep), torch.tensor(next_tokens, device=device)[:, None]], dim=1)
        scores = torch.tensor(next_scores, device=device)
        step.keep(keep)
        active = [active[a] for a in still]
    return [max(hyps, key=lambda h: h[0])[1] if hyps else [] for hyps in finished]
