"""Bhojanapalli et al. (2020), Tables 1 and 2 (docs/papers.md): the published numbers, the parameter count of
our masked LM (`bert_parameters`), and the presets that fill our cells (the tables' experiments, one job per
fine-tuning task). Plain data and arithmetic, used by bert.py and bert_runs.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparse_runner.reporting.presets import Preset

CITATION = "Bhojanapalli et al., ICML 2020"

# The BERT vocabulary (WordPiece, uncased) and position table the paper's models inherit from BERT.
BERT_VOCAB = 30522
BERT_MAX_POSITIONS = 512

SQUAD, MNLI = "squad", "mnli"
SQUAD_F1, SQUAD_EM = "test/f1", "test/exact_match"                          # percent 0-100
MNLI_MATCHED, MNLI_MISMATCHED = "test/accuracy_matched", "test/accuracy_mismatched"  # fractions 0-1
MNLI_ACCURACY = "test/accuracy"  # = matched; read when a run lacks test/accuracy_matched

SUBSTITUTE = "†"
# What a substitute measures, per family: the reader must not take it for SQuAD or MNLI.
SUBSTITUTE_KIND = {
    SQUAD: "cloze questions generated over real text",
    MNLI: "sentence-pair substitute, not entailment",
}
OFFICIAL_DATA = {SQUAD: "SQuAD v1.1", MNLI: "MNLI (matched / mismatched dev sets)"}


# ------------------------------------------------------------------------------- parameter count
def bert_parameters(*, d_model: int, num_layers: int, num_heads: int, head_size: int, ffn_dim: int, vocab_size: int,
                    max_positions: int, learned_positions: bool, norm_first: bool, learned_alpha: bool = False) -> int:
    """The exact parameter count of our masked-LM model (models/bert.py MaskedLM):

    token embedding vocab x d; a learned position table max_positions x d (none when sinusoidal); per layer,
    with inner = heads x head size, the query, key and value projections 3 (d inner + inner), the output
    projection inner d + d, two LayerNorms 4 d, the feed-forward d f + f + f d + d, and one alpha per head when
    alpha is learned; a final LayerNorm 2 d only in pre-LN (norm_first) encoders; the MLM head: dense d d + d,
    LayerNorm 2 d and an output bias of vocab (its weight is the tied embedding).
    """
    d, f, inner = d_model, ffn_dim, num_heads * head_size
    attention = 3 * (d * inner + inner) + inner * d + d + (num_heads if learned_alpha else 0)
    layer = attention + 4 * d + d * f + f + f * d + d
    embeddings = vocab_size * d + (max_positions * d if learned_positions else 0)
    head = d * d + d + 2 * d + vocab_size
    return embeddings + num_layers * layer + (2 * d if norm_first else 0) + head


@dataclass(frozen=True, order=True)
class Geometry:
    d_model: int
    num_layers: int
    num_heads: int
    head_size: int
    ffn_dim: int

    def parameters(self, *, vocab_size: int = BERT_VOCAB, max_positions: int = BERT_MAX_POSITIONS,
                   learned_positions: bool = True, norm_first: bool = False, learned_alpha: bool = False) -> int:
        """bert_parameters of this geometry; the defaults are the paper's models (BERT's vocabulary, 512
        learned positions, post-LN, softmax)."""
        return bert_parameters(d_model=self.d_model, num_layers=self.num_layers, num_heads=self.num_heads,
                               head_size=self.head_size, ffn_dim=self.ffn_dim, vocab_size=vocab_size,
                               max_positions=max_positions, learned_positions=learned_positions,
                               norm_first=norm_first, learned_alpha=learned_alpha)

    @property
    def label(self) -> str:
        return f"d {self.d_model}, {self.num_layers} layers, FFN {self.ffn_dim}"


# ------------------------------------------------------------------------------ published numbers
@dataclass(frozen=True)
class Published:
    """One published row: SQuAD F1 / EM and MNLI accuracy in percent, ± where the transcription has one."""

    num_heads: int
    head_size: int
    params_m: float
    f1: float
    em: float
    mnli: float
    f1_std: float | None = None
    mnli_std: float | None = None


@dataclass(frozen=True)
class PaperTable:
    key: str
    slug: str
    title: str
    experiment: str       # the GPU preset; its CPU-sized twin is experiment + "_cpu"
    swept: str            # the config key its sweep varies
    d_model: int
    num_layers: int
    ffn_dim: int
    rows: tuple[Published, ...]
    note: str

    @property
    def cpu_experiment(self) -> str:
        return f"{self.experiment}_cpu"

    def geometry(self, pub: Published) -> Geometry:
        return Geometry(self.d_model, self.num_layers, pub.num_heads, pub.head_size, self.ffn_dim)

    @property
    def swept_name(self) -> str:
        """`heads` or `head size`, as the notes name the swept value."""
        return "head size" if self.swept == "model.head_size" else "heads"

    def swept_value(self, geometry: Geometry) -> int:
        return geometry.head_size if self.swept == "model.head_size" else geometry.num_heads

    def command(self, setting: str, values: list[int], *, scratch: bool = False, variant: tuple[str, ...] = ()) -> str:
        """The multirun that fills the rows of `values` (each job a squad or an mnli fine-tuning run)."""
        experiment = self.experiment if setting == GPU else self.cpu_experiment
        parts = ["sparse-run -m", f"experiment={experiment}", f"{self.swept}={','.join(str(v) for v in values)}",
                 *variant, *(["pretrain=none"] if scratch else [])]
        return " ".join(parts)


# Bhojanapalli, Yun, Rawat, Reddi, Kumar, "Low-Rank Bottleneck in Multi-head Attention Models", ICML 2020
# (arXiv:2002.07028 v1), Tables 1 and 2, as transcribed in docs/papers.md (SECONDARY: one transcription;
# ± only where it gave one). Table 1's models all have 336M parameters (one number for the three rows).
TABLE1 = PaperTable(
    key="table1", slug="bhojanapalli2020_table1",
    title="Bhojanapalli et al. 2020, Table 1: BERT-large (24 layers, d 1024), head size d/h; SQuAD F1/EM and MNLI accuracy (%)",
    experiment="bhojanapalli2020_table1", swept="model.num_heads", d_model=1024, num_layers=24, ffn_dim=4096,
    rows=(
        Published(8, 128, 336, 90.89, 84.1, 85.0, f1_std=0.15, mnli_std=0.2),
        Published(16, 64, 336, 90.61, 83.75, 84.5, f1_std=0.14, mnli_std=0.4),
        Published(32, 32, 336, 90.45, 83.48, 84.4, f1_std=0.08, mnli_std=0.2),
    ),
    note="Table 1: standard multi-head attention (head size d/h) at a fixed 336M parameters: more heads, "
         "smaller heads, slightly worse (the low-rank bottleneck once d/h < n = 128).",
)
TABLE2A = PaperTable(
    key="table2a", slug="bhojanapalli2020_table2a",
    title="Bhojanapalli et al. 2020, Table 2A: fixed head size 128, d 512, 24 layers, more heads; SQuAD F1/EM and MNLI accuracy (%)",
    experiment="bhojanapalli2020_table2a", swept="model.num_heads", d_model=512, num_layers=24, ffn_dim=4096,
    rows=(
        Published(8, 128, 168, 89.6, 82.73, 83.5),
        Published(12, 128, 193, 90.25, 83.18, 84.2),
        Published(16, 128, 218, 90.43, 83.59, 83.9),
        Published(32, 128, 319, 90.95, 84.4, 84.9, f1_std=0.14),
    ),
    note="Table 2A: the head size fixed at d_p = 128 (the pre-training length n) and decoupled from d = 512; "
         "more heads add parameters and help.",
)
TABLE2B = PaperTable(
    key="table2b", slug="bhojanapalli2020_table2b",
    title="Bhojanapalli et al. 2020, Table 2B: 8 heads, d 512, 24 layers, growing head size; SQuAD F1/EM and MNLI accuracy (%)",
    experiment="bhojanapalli2020_table2b", swept="model.head_size", d_model=512, num_layers=24, ffn_dim=4096,
    rows=(
        Published(8, 32, 130, 88.53, 81.19, 82.5),
        Published(8, 64, 142, 89.51, 82.41, 83.4),
        Published(8, 128, 168, 89.6, 82.73, 83.5),
        Published(8, 256, 218, 90.33, 83.36, 83.9),
    ),
    note="Table 2B: 8 heads at d = 512 with the head size growing from 32 to 256: larger heads help.",
)
PAPER_TABLES = (TABLE1, TABLE2A, TABLE2B)

GPU, CPU = "gpu", "cpu"
SETTING_LABEL = {GPU: "GPU preset", CPU: "CPU-sized preset"}

# The fine-tuning recipe (conf/finetune/) a job of each setting runs for each task: what the experiments' sweep
# over `finetune` gives a job.
FINETUNE = {GPU: {SQUAD: "squad", MNLI: "mnli"}, CPU: {SQUAD: "squad_cpu", MNLI: "mnli_cpu"}}


def cell_preset(paper: PaperTable, setting: str, family: str, value: object, *, scratch: bool) -> Preset:
    """The job of the table's multirun that fills one cell: its experiment, the swept key at `value`, the
    fine-tuning recipe of `family`, and `pretrain=none` from scratch."""
    experiment = paper.experiment if setting == GPU else paper.cpu_experiment
    return Preset((f"experiment={experiment}", f"{paper.swept}={'null' if value is None else value}",
                   f"finetune={FINETUNE[setting][family]}", *(("pretrain=none",) if scratch else ())))
