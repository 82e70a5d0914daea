"""Tests of extractive QA: the readers (sparse_runner.data.squad_examples), the cloze substitute
(sparse_runner.data.cloze) and its baselines, the windows and span decoding
(sparse_runner.tasks.squad_windows), and of SubwordTokenizer.encode_with_offsets, which maps predicted
pieces back to the passage."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sparse_runner.checks import ConfigError
from sparse_runner.data.cloze import BLANK, answer_kind, cloze_examples
from sparse_runner.data.corpora import load_sotu_en
from sparse_runner.data.documents import split_sentences
from sparse_runner.data.squad_examples import QAExample, examples_from_rows, read_squad_json
from sparse_runner.tasks.squad import cloze_baselines
from sparse_runner.tasks.squad_windows import QAFeature, best_span, make_features, predict_answers
from sparse_runner.tokenization import BOS_ID, EOS_ID, train_or_load

NON_ASCII = "Zürich — 5 € in der Straße, ﬁne Ｆｕｌｌ ½ 😀!"


@pytest.fixture(scope="module")
def sotu_sentences() -> dict[str, list[list[str]]]:
    """Each split's speeches as lists of sentences."""
    return {split: [split_sentences(text) for text in texts] for split, texts in load_sotu_en().items()}


@pytest.fixture(scope="module")
def tokenizer(sotu_sentences, tmp_path_factory):
    texts = [s for speech in sotu_sentences["train"][-40:] for s in speech] + [NON_ASCII]
    return train_or_load(texts, vocab_size=1000, cache_dir=tmp_path_factory.mktemp("squad_tok"))


@pytest.fixture(scope="module")
def byte_tokenizer(sotu_sentences, tmp_path_factory):
    """A vocabulary without ü, —, €, ½, 😀 and with byte_fallback: those become byte pieces."""
    texts = [s for speech in sotu_sentences["train"][-10:] for s in speech if s.isascii()]
    return train_or_load(texts, vocab_size=600, byte_fallback=True, cache_dir=tmp_path_factory.mktemp("squad_tok_bytes"))


@pytest.fixture(scope="module")
def cloze(sotu_sentences) -> list[QAExample]:
    return cloze_examples(sotu_sentences["val"][:3], seed=0, id_prefix="val")


# --------------------------------------------------------------------------------------------------
# Official JSON and Hugging Face rows

CONTEXT_1 = "Super Bowl 50 was an American football game. The Denver Broncos defeated the Carolina Panthers."
CONTEXT_2 = "Zürich is a city in Switzerland. It had 402,762 inhabitants in 2017."


def squad_file(tmp_path, data, name="dev-v1.1.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


def answer(context: str, text: str, occurrence: int = 0) -> dict:
    start = -1
    for _ in range(occurrence + 1):
        start = context.index(text, start + 1)
    return {"text": text, "answer_start": start}


def official() -> dict:
    return {
        "version": "1.1",
        "data": [
            {"title": "Super_Bowl_50", "paragraphs": [{"context": CONTEXT_1, "qas": [
                {"id": "q1", "question": "Who won Super Bowl 50?",
                 "answers": [answer(CONTEXT_1, "Denver Broncos"), answer(CONTEXT_1, "The Denver Broncos"), answer(CONTEXT_1, "Denver Broncos")]},
                {"id": "q2", "question": "Who lost?", "answers": [answer(CONTEXT_1, "Carolina Panthers")]},
            ]}]},
            {"title": "Zürich", "paragraphs": [{"context": CONTEXT_2, "qas": [
                {"id": "q3", "question": "How many people lived in Zürich in 2017?", "answers": [answer(CONTEXT_2, "402,762")]},
            ]}]},
        ],
    }


def test_read_squad_json_reads_the_official_layout(tmp_path):
    examples = read_squad_json(squad_file(tmp_path, official()))
    assert [ex.id for ex in examples] == ["q1", "q2", "q3"]
    q1, _, q3 = examples
    assert q1.title == "Super_Bowl_50" and q1.context == CONTEXT_1 and q1.question == "Who won Super Bowl 50?"
    assert q1.answers == ["Denver Broncos", "The Denver Broncos", "Denver Broncos"]  # dev: several, duplicates kept
    assert q1.answer_starts == [CONTEXT_1.index("Denver"), CONTEXT_1.index("The Denver"), CONTEXT_1.index("Denver")]
    assert q3.title == "Zürich" and q3.answers == ["402,762"]
    for ex in examples:
        for text, start in zip(ex.answers, ex.answer_starts):
            assert ex.context[start:start + len(text)] == text


def broken(kind: str):
    data = official()
    qa = data["data"][0]["paragraphs"][0]["qas"][1]
    if kind == "not_json":
        return '{"version": "1.1", "data": [', "not JSON"
    if kind == "top_level_list":
        return [data], "layout"
    if kind == "no_paragraphs":
        del data["data"][1]["paragraphs"]
        return data, "paragraphs"
    if kind == "misaligned":
        qa["answers"][0]["answer_start"] += 1
        return data, "q2"
    if kind == "beyond_context":
        qa["answers"][0]["answer_start"] = 10_000
        return data, "q2"
    if kind == "v2_version":
        data["version"] = "v2.0"
        return data, "v1.1"
    if kind == "is_impossible":
        qa["is_impossible"] = False
        return data, "q2"
    if kind == "no_answer":
        qa["answers"] = []
        return data, "q2"
    if kind == "duplicate_id":
        qa["id"] = "q1"
        return data, "q1"
    if kind == "answer_start_not_int":
        qa["answers"][0]["answer_start"] = "12"
        return data, "q2"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    ["not_json", "top_level_list", "no_paragraphs", "misaligned", "beyond_context", "v2_version", "is_impossible",
     "no_answer", "duplicate_id", "answer_start_not_int"],
)
def test_read_squad_json_refuses_bad_files_in_one_line(tmp_path, kind):
    data, expected = broken(kind)
    path = squad_file(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        read_squad_json(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and expected in message


def test_read_squad_json_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        read_squad_json(tmp_path / "absent.json")


def test_examples_from_hf_rows():
    rows = [
        {"id": "a", "title": "Super_Bowl_50", "context": CONTEXT_1, "question": "Who won?",
         "answers": {"text": ["Denver Broncos", "The Denver Broncos"], "answer_start": [CONTEXT_1.index("Denver"), CONTEXT_1.index("The Denver")]}},
        {"id": "b", "title": "Zürich", "context": CONTEXT_2, "question": "When?",
         "answers": {"text": ["2017"], "answer_start": [CONTEXT_2.index("2017")]}},
    ]
    examples = examples_from_rows(iter(rows))
    assert [(ex.id, ex.title, ex.answers) for ex in examples] == [
        ("a", "Super_Bowl_50", ["Denver Broncos", "The Denver Broncos"]), ("b", "Zürich", ["2017"]),
    ]
    assert examples[1].answer_starts == [CONTEXT_2.index("2017")]
    rows[1]["answers"]["answer_start"] = [0]
    with pytest.raises(ConfigError, match=r"rajpurkar/squad: question b: answer '2017' is not at answer_start 0") as err:
        examples_from_rows(rows)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="row 0 has no answers"):
        examples_from_rows([{"id": "x", "context": "c", "question": "q"}])


# --------------------------------------------------------------------------------------------------
# encode_with_offsets


def check_offsets(tokenizer, texts):
    results = tokenizer.encode_with_offsets(texts)
    assert len(results) == len(texts)
    for text, expected_ids, (ids, starts, ends) in zip(texts, tokenizer.encode(texts), results):
        assert ids.dtype == np.int32 and starts.dtype == np.int64 and ends.dtype == np.int64
        np.testing.assert_array_equal(ids, expected_ids)
        assert len(ids) == len(starts) == len(ends)
        assert np.all(starts <= ends) and np.all(ends[:-1] <= starts[1:])  # in order, never overlapping
        assert np.all((starts >= 0) & (ends <= len(text)))
        spans = [text[s:e] for s, e in zip(starts, ends)]
        # no span starts with whitespace, and together the spans are the text less its whitespace
        assert not any(span[:1].isspace() for span in spans)
        assert "".join(spans) == "".join(text.split())
        for i, span in zip(ids, spans):
            piece = tokenizer.id_to_piece(i).lstrip("▁")
            if text.isascii() and i > 3:  # a known piece of ASCII text: its span is its own text
                assert span == piece
    return results


def test_encode_with_offsets_on_real_sentences(tokenizer, sotu_sentences):
    texts = [s for speech in sotu_sentences["test"][:2] for s in speech][:300]
    check_offsets(tokenizer, texts + ["", "   ", "  two  spaces\tand a tab \n", "a"])


def test_encode_with_offsets_whitespace_is_outside_the_spans(tokenizer):
    text = "  The   Union, strong."
    (ids, starts, ends), = check_offsets(tokenizer, [text])
    spans = [text[s:e] for s, e in zip(starts, ends)]
    assert "".join(spans) == "TheUnion,strong."
    assert starts[0] == 2  # the leading whitespace is in no span
    words = {"The": 2, "Union": 8, "strong": 15}
    for word, at in words.items():  # every word starts a span exactly where it starts in the text
        assert at in starts.tolist() and text[at:at + len(word)] == word


@pytest.mark.parametrize("which", ["tokenizer", "byte_tokenizer"])
def test_encode_with_offsets_non_ascii(which, request):
    tok = request.getfixturevalue(which)
    texts = ["Zürich — 5 €", NON_ASCII, "naïve café, 402,762 €"]
    for text, (_ids, starts, ends) in zip(texts, check_offsets(tok, texts)):
        spans = [text[s:e] for s, e in zip(starts, ends)]
        # offsets are characters, not UTF-8 bytes: the last piece ends at the last character
        assert ends[-1] == len(text.rstrip())
        assert any(span.endswith("€") or span.endswith("!") for span in spans)
    # "ü" is two bytes and "—" three: character offsets, not byte offsets, of "—" and "5"
    text = texts[0]
    (ids, starts, ends), = tok.encode_with_offsets([text])
    assert text.index("—") in starts.tolist() and text.index("5") in starts.tolist()
    if which == "byte_tokenizer":  # the byte pieces of "€": the first two empty, the last one the character
        assert tok.id_to_piece(int(ids[-1])) == "<0xAC>"
        assert [text[s:e] for s, e in zip(starts[-3:], ends[-3:])] == ["", "", "€"]


@pytest.mark.parametrize("which", ["tokenizer", "byte_tokenizer"])
def test_encode_with_offsets_on_random_mixed_text(which, request):
    """Runs of spaces, tabs, NFKC-changed characters (ﬁ, ½, full-width), accents, emoji, unknown ones."""
    tok = request.getfixturevalue(which)
    alphabet = list("abcdefghij ABC  .,;5\t\n") + ["ü", "—", "€", "😀", "\u3000", "\xa0", "ﬁ", "½", "Ｆ", "é", "e\u0301"]
    rng = np.random.default_rng(0)
    texts = ["".join(rng.choice(alphabet, size=int(rng.integers(0, 40)))) for _ in range(300)]
    check_offsets(tok, texts)


def test_encode_with_offsets_takes_a_list(tokenizer):
    with pytest.raises(TypeError):
        tokenizer.encode_with_offsets("one string")


# --------------------------------------------------------------------------------------------------
# Windows and decoding

MAX_LENGTH, MAX_QUERY, STRIDE = 64, 16, 12


def one_hot(feature: QAFeature, start: int, end: int, length: int | None = None):
    length = length or len(feature.tokens)
    s, e = np.zeros(length), np.zeros(length)
    s[start] = e[end] = 1.0
    return s, e


def aligned(ex: QAExample, starts, ends) -> tuple[int, int] | None:
    """The gold answer's first and last token if its span starts and ends on token boundaries."""
    begin, end = ex.answer_starts[0], ex.answer_starts[0] + len(ex.answers[0])
    inside = np.flatnonzero((starts < end) & (ends > begin))
    if inside.size == 0 or starts[inside[0]] != begin or ends[inside[-1]] != end:
        return None
    return int(inside[0]), int(inside[-1])


@pytest.fixture(scope="module")
def qa_set(cloze, tokenizer):
    hand = [
        QAExample("h1", "t", CONTEXT_2, "How many inhabitants?", ["402,762"], [CONTEXT_2.index("402,762")]),
        QAExample("h2", "t", "In  Zürich — 5 € buys a coffee,  said   the guide.", "What buys a coffee?",
                  ["5 €"], [len("In  Zürich — ")]),
    ]
    examples = cloze[:100] + hand
    features = make_features(examples, tokenizer, max_length=MAX_LENGTH, doc_stride=STRIDE, max_query_length=MAX_QUERY,
                             cls_id=BOS_ID, sep_id=EOS_ID, train=True)
    return examples, features


def test_features_layout_and_coverage(qa_set, tokenizer):
    examples, features = qa_set
    assert [f.example_index for f in features] == sorted(f.example_index for f in features)
    assert {f.example_index for f in features} == set(range(len(examples)))
    encoded = tokenizer.encode_with_offsets([ex.context for ex in examples])
    questions = tokenizer.encode([ex.question for ex in examples])
    by_example: dict[int, list[QAFeature]] = {}
    for f in features:
        by_example.setdefault(f.example_index, []).append(f)
    multi_window = 0
    for k in range(len(examples)):
        ids, starts, ends = encoded[k]
        windows = by_example[k]
        covered = np.zeros(len(ids), dtype=int)
        for w, f in enumerate(windows):
            q = questions[k][:MAX_QUERY]
            n = f.num_context_tokens
            assert len(f.tokens) <= MAX_LENGTH and f.tokens.dtype == np.int32
            assert f.tokens[0] == BOS_ID and f.tokens[f.context_start - 1] == EOS_ID and f.tokens[-1] == EOS_ID
            assert f.context_start == len(q) + 2 and len(f.tokens) == f.context_start + n + 1
            np.testing.assert_array_equal(f.tokens[1:f.context_start - 1], q)
            o = f.context_offset
            np.testing.assert_array_equal(f.tokens[f.context_start:f.context_start + n], ids[o:o + n])
            np.testing.assert_array_equal(f.token_starts, starts[o:o + n])
            np.testing.assert_array_equal(f.token_ends, ends[o:o + n])
            covered[o:o + n] += 1
            if w + 1 < len(windows):  # a full window, and the next starts doc_stride later
                assert n == MAX_LENGTH - len(q) - 3
                assert windows[w + 1].context_offset == o + STRIDE
                assert o + n > windows[w + 1].context_offset  # neighbouring windows overlap
            else:
                assert o + n == len(ids)  # the last window reaches the end
        assert np.all(covered >= 1)  # every context token is in some window
        multi_window += len(windows) > 1
    assert multi_window > len(examples) // 2  # the windowing is exercised


def test_gold_positions_map_back_to_the_answer_text(qa_set, tokenizer):
    examples, features = qa_set
    encoded = tokenizer.encode_with_offsets([ex.context for ex in examples])
    logits, expected, outside, max_context_windows = [], {}, 0, {}
    for f in features:
        ex = examples[f.example_index]
        ids, starts, ends = encoded[f.example_index]
        gold = aligned(ex, starts, ends)
        holds = f.start_position != 0
        if holds:
            # the positions index the answer's tokens in `tokens`
            first = f.context_offset + f.start_position - f.context_start
            last = f.context_offset + f.end_position - f.context_start
            assert starts[first] <= ex.answer_starts[0] < ends[first]
            assert starts[last] < ex.answer_starts[0] + len(ex.answers[0]) <= ends[last]
            assert f.end_position >= f.start_position
        else:
            assert f.end_position == 0
            outside += 1
        if gold is not None:
            expected[ex.id] = ex.answers[0]
            o, n = f.context_offset, f.num_context_tokens
            assert holds == (o <= gold[0] and gold[1] < o + n)
        if holds and gold is not None:
            s, e = one_hot(f, f.start_position, f.end_position, length=MAX_LENGTH)  # padded logits are fine
            assert f.tokens[f.start_position] == ids[gold[0]]
            score, char_start, char_end = best_span(s, e, f, max_answer_length=30)
            if f.max_context[f.start_position - f.context_start]:
                assert score == 2.0 and ex.context[char_start:char_end] == ex.answers[0]
                max_context_windows[ex.id] = max_context_windows.get(ex.id, 0) + 1
            else:  # the answer starts in another window (BERT's max-context rule): not here
                assert score < 2.0
            logits.append((s, e))
        else:
            logits.append((np.zeros(len(f.tokens)), np.zeros(len(f.tokens))))
    assert outside > 0  # some windows miss the answer: they point at CLS
    assert len(expected) >= 0.8 * len(examples) and {"h1", "h2"} <= set(expected)
    predictions = predict_answers(examples, features, logits, max_answer_length=30)
    assert set(predictions) == {ex.id for ex in examples}
    for qid, text in expected.items():
        assert predictions[qid] == text
    assert predictions["h2"] == "5 €"
    assert max_context_windows == {qid: 1 for qid in expected}  # the answer starts in exactly one window


def test_predictions_never_end_on_empty_pieces(tokenizer):
    """Real pieces with empty spans (a standalone ▁ before "(" or a digit, the first pieces of NFKC's
    "½" or "ﬁ") are never a predicted span's start or end, however high their logits."""
    context = "In (1990) the ﬁne ½ of [the] \"Union\" paid 402,762 € — see ¼ and Ｆｕｌｌ (2017)."
    ex = QAExample("e", "t", context, "What?", ["1990"], [context.index("1990")])
    features = make_features([ex], tokenizer, max_length=24, doc_stride=4, max_query_length=4, cls_id=BOS_ID, sep_id=EOS_ID, train=True)
    (ids, starts, ends), = tokenizer.encode_with_offsets([context])
    empty = np.flatnonzero(starts == ends)
    assert len(empty) >= 3 and any(tokenizer.id_to_piece(int(ids[i])) == "▁" for i in empty)
    for f in features:
        if f.start_position:
            assert f.token_ends[f.start_position - f.context_start] > f.token_starts[f.start_position - f.context_start]
    rng = np.random.default_rng(0)
    for i in empty.tolist():
        for trial in range(3):
            pairs = []
            for f in features:
                s, e = rng.normal(size=len(f.tokens)), rng.normal(size=len(f.tokens))
                if f.context_offset <= i < f.context_offset + f.num_context_tokens:
                    s[f.context_start + i - f.context_offset] = e[f.context_start + i - f.context_offset] = 50.0
                pairs.append((s, e))
            text = predict_answers([ex], features, pairs, max_answer_length=1 + trial)["e"]
            assert text != "" and text in context


def test_make_features_checks(tokenizer):
    ex = [QAExample("x", "t", CONTEXT_1, "Who?", [], [])]
    kwargs = dict(max_length=32, max_query_length=8, cls_id=BOS_ID, sep_id=EOS_ID)
    with pytest.raises(ConfigError, match="doc_stride=22"):
        make_features(ex, tokenizer, doc_stride=22, train=False, **kwargs)
    with pytest.raises(ConfigError, match="max_length=10"):
        make_features(ex, tokenizer, doc_stride=1, train=False, **{**kwargs, "max_length": 10})
    with pytest.raises(ValueError, match="training question x has no answer"):
        make_features(ex, tokenizer, doc_stride=4, train=True, **kwargs)
    features = make_features(ex, tokenizer, doc_stride=4, train=False, **kwargs)
    assert features and all(f.start_position == f.end_position == 0 for f in features)
    empty = make_features([QAExample("e", "t", "", "Who?", [], [])], tokenizer, doc_stride=4, train=False, **kwargs)
    assert len(empty) == 1 and empty[0].num_context_tokens == 0
    assert best_span(np.ones(8), np.ones(8), empty[0], max_answer_length=3) == (-np.inf, 0, 0)
    assert predict_answers([QAExample("e", "t", "", "Who?", [], [])], empty, [(np.ones(8), np.ones(8))], 3) == {"e": ""}


def test_best_span_rules():
    # tokens: CLS q q SEP c0..c5 SEP ; context "aa bb cc dd ee ff"
    feature = QAFeature(
        example_index=0, tokens=np.arange(11, dtype=np.int32), context_start=4,
        token_starts=np.array([0, 3, 6, 9, 12, 15]), token_ends=np.array([2, 5, 8, 11, 14, 17]),
    )
    s = np.array([9.0, 9, 9, 9, 0, 1, 0, 0, 0, 0, 9])  # high on CLS, question, SEP: ignored
    e = np.array([9.0, 9, 9, 9, 0, 0, 0, 0, 2, 0, 9])
    assert best_span(s, e, feature, max_answer_length=30) == (3.0, 3, 14)  # c1..c4: "bb cc dd ee"
    # c1..c4 is 4 tokens: with at most 3, c2..c4 (0 + 2) beats c1..c3 (1 + 0); ties go to the earliest start
    assert best_span(s, e, feature, max_answer_length=3) == (2.0, 6, 14)
    assert best_span(s, e, feature, max_answer_length=1) == (2.0, 12, 14)
    # end before start is never chosen, even when n_best keeps only such pairs: all valid spans are searched
    s2 = np.zeros(11)
    e2 = np.zeros(11)
    s2[9], e2[4] = 5.0, 5.0  # best start c5 (chars 15..17), best end c0
    score, a, b = best_span(s2, e2, feature, max_answer_length=30, n_best=1)
    assert (score, a, b) == (5.0, 0, 2)  # c0..c0 and c5..c5 both score 5: the earlier start wins
    with pytest.raises(ValueError):
        best_span(np.zeros(5), np.zeros(5), feature, max_answer_length=3)


# --------------------------------------------------------------------------------------------------
# Cloze substitute


def test_cloze_examples_are_deterministic_and_well_formed(cloze, sotu_sentences):
    again = cloze_examples(sotu_sentences["val"][:3], seed=0, id_prefix="val")
    assert again == cloze
    other = cloze_examples(sotu_sentences["val"][:3], seed=1, id_prefix="val")
    assert [ex.answers for ex in other] != [ex.answers for ex in cloze]
    assert len(cloze) > 100 and len({ex.id for ex in cloze}) == len(cloze)
    kinds = {answer_kind(ex.answers[0]) for ex in cloze}
    assert kinds == {"number", "name", "word"}
    per_passage: dict[str, int] = {}
    for ex in cloze:
        (text,), (start,) = ex.answers, ex.answer_starts
        assert ex.context[start:start + len(text)] == text
        assert ex.question.count(BLANK) == 1 and BLANK not in ex.context
        assert ex.question.replace(BLANK, text) in ex.context  # the question is a sentence of the passage
        # the question's sentence is where the answer is
        sentence_start = ex.context.index(ex.question.replace(BLANK, text))
        assert sentence_start + ex.question.index(BLANK) == start
        passage = ex.id.rsplit("-", 1)[0]
        per_passage[passage] = per_passage.get(passage, 0) + 1
        if answer_kind(text) == "name":
            assert ex.question.index(BLANK) > 0  # a name never starts its sentence
    assert max(per_passage.values()) == 2


def test_cloze_passages_join_sentences_with_single_spaces():
    documents = [["It is here.", "  The President met the Prime Minister in 1990. ", "A remarkable achievement."]]
    examples = cloze_examples(documents, seed=3, passage_sentences=3, questions_per_passage=3, id_prefix="t")
    context = "It is here. The President met the Prime Minister in 1990. A remarkable achievement."
    assert {ex.context for ex in examples} == {context}
    answers = {ex.answers[0] for ex in examples}
    # the middle sentence offers a number and a name, the last only long words, the first none
    assert len(examples) == 2 and answers & {"1990", "Prime Minister"} and answers & {"remarkable", "achievement"}
    with pytest.raises(ValueError):
        cloze_examples(documents, seed=0, passage_sentences=0, id_prefix="t")


def test_cloze_baselines_are_percentages(cloze):
    baselines = cloze_baselines(cloze)
    assert set(baselines) == {"first_sentence_exact_match", "first_sentence_f1", "same_kind_first_exact_match", "same_kind_first_f1"}
    assert all(0.0 <= v <= 100.0 for v in baselines.values())
    assert baselines["same_kind_first_exact_match"] > baselines["first_sentence_exact_match"]
    # a passage whose first span of the answer's kind is the answer: the baseline gets it
    ex = QAExample("a", "t", "Taxes rose in 1990. They fell in 1991.", "Taxes rose in _____.", ["1990"], [14])
    assert cloze_baselines([ex])["same_kind_first_exact_match"] == 100.0
