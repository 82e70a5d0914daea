"""Long-document QA: TriviaQA and HotpotQA readers on small files in the official layouts (and Hugging
Face rows), distant supervision by alias matching, windows that learn the occurrence they hold, the
official metrics' differences from SQuAD's, the whole-speech cloze substitute, tiny runs through the
runner, and the ERNIE-Sparse QA presets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sparse_runner.checks import ConfigError
from sparse_runner.config import validate
from sparse_runner.data import hotpotqa, triviaqa
from sparse_runner.data.cloze import BLANK, long_cloze_examples
from sparse_runner.data.errors import DataFormatError
from sparse_runner.data.squad_examples import QAExample, find_spans
from sparse_runner.metrics.squad import normalize_answer_triviaqa, squad_scores
from sparse_runner.run import run
from sparse_runner.tasks import build_task
from sparse_runner.tasks.bert_text import CLS_ID, SEP_ID
from sparse_runner.tasks.squad_windows import make_features
from tests.conftest import compose_config

MODEL = ["model=bigbird", "model.d_model=32", "model.num_heads=2", "model.ffn_dim=64", "model.num_layers=1", "model.pattern_options.block_size=16"]
TRAINER = ["trainer.batch_size=8", "trainer.max_steps=4", "trainer.eval_every=4", "trainer.warmup_steps=1", "trainer.log_every=2",
           "trainer.progress=false", "trainer.num_threads=1", "trainer.analysis=false"]
SMALL = ["task.max_length=64", "task.doc_stride=24", "task.max_query_length=12", "task.vocab_size=80", "task.val_size=2"]


def config(cache_dir, *overrides):
    return validate(compose_config([*MODEL, *TRAINER, *overrides], cache_dir=cache_dir, tiny=False))


# ------------------------------------------------------------------------------------ data files
PEOPLE = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "John McCarthy", "Edsger Dijkstra", "Barbara Liskov"]
PLACES = ["London", "Manchester", "New York", "Boston", "Amsterdam", "Austin"]


def article(person: str, place: str, filler: int) -> str:
    """A long-ish evidence article where the answer (the place) comes after `filler` sentences."""
    lines = [f"{person} was a person of note in the history of computing."]
    lines += [f"Sentence {k} says something about {person} and the work of others." for k in range(filler)]
    lines += [f"In later years {person} lived in {place}, far from the old home.", f"{place} remembers {person}."]
    return " ".join(lines)


def write_triviaqa(root: Path) -> Path:
    """triviaqa-rc layout: qa/wikipedia-{train,dev}.json + evidence/wikipedia/<Filename>."""
    (root / "qa").mkdir(parents=True, exist_ok=True)
    (root / "evidence" / "wikipedia").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 12), ("dev", 4)):
        data = []
        for i in range(n):
            person, place = PEOPLE[i % len(PEOPLE)], PLACES[(i * 5 + 1) % len(PLACES)]
            filename = f"{person.replace(' ', '_')}_{split}_{i}.txt"
            (root / "evidence" / "wikipedia" / filename).write_text(article(person, place, filler=3 + i % 4), encoding="utf-8")
            pages = [{"DocSource": "TagMe", "Filename": filename, "Title": f"{person} {split} {i}"}]
            answer = {"Aliases": [place, place.upper()], "NormalizedAliases": [place.lower()], "Value": place,
                      "NormalizedValue": place.lower(), "Type": "WikipediaEntity"}
            if split == "dev" and i == 3:  # an answer the evidence never mentions: scored, never answerable
                answer = {"Aliases": ["Atlantis"], "NormalizedAliases": ["atlantis"], "Value": "Atlantis", "NormalizedValue": "atlantis", "Type": "WikipediaEntity"}
            data.append({"Answer": answer, "EntityPages": pages, "Question": f"Where did {person} live later?", "QuestionId": f"tqa_{split}_{i}",
                         "QuestionSource": "http://example.org", "SearchResults": []})
        (root / "qa" / f"wikipedia-{split}.json").write_text(json.dumps({"Data": data, "Domain": "Wikipedia", "Split": split, "Version": 1.0, "VerifiedEval": False}))
    return root


def hotpot_item(i: int, split: str) -> dict:
    """One distractor-setting question: ten paragraphs, two supporting sentences; every third is yes/no."""
    person, place = PEOPLE[i % len(PEOPLE)], PLACES[(i * 5 + 1) % len(PLACES)]
    context = [[f"Filler {k}", [f"Filler paragraph {k} mentions {PLACES[k % len(PLACES)]} once.", " It says nothing else."]] for k in range(8)]
    context.insert(3, [person, [f"{person} worked in computing.", f" {person} moved to {place}."]])
    context.insert(6, [place, [f"{place} is a city.", " It has a harbour."]])
    kind = i % 3
    question = f"Which city did {person} move to?" if kind else f"Did {person} move to {place}?"
    answer = place if kind else ("yes" if i % 2 == 0 else "no")
    return {"_id": f"hp_{split}_{i}", "question": question, "answer": answer, "type": "bridge" if kind else "comparison", "level": "easy",
            "supporting_facts": [[person, 1], [place, 0]], "context": context}


def write_hotpotqa(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, name, n in (("train", "hotpot_train_v1.1.json", 12), ("dev", "hotpot_dev_distractor_v1.json", 6)):
        (root / name).write_text(json.dumps([hotpot_item(i, split) for i in range(n)]))
    return root


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("long_qa")
    return {"triviaqa": write_triviaqa(root / "triviaqa-rc"), "hotpotqa": write_hotpotqa(root / "hotpot")}


# ------------------------------------------------------------------------------------ metrics
def test_triviaqa_normalisation_turns_punctuation_into_spaces():
    assert normalize_answer_triviaqa("U.S.A.") == "u s"  # "u s a", then the article "a" goes, as in the official script
    assert normalize_answer_triviaqa("Rock_and_Roll") == "rock and roll"
    assert normalize_answer_triviaqa("The Who’s ‘Tommy’") == "who s tommy"
    assert normalize_answer_triviaqa("an  Apple`s") == "apple s"
    # SQuAD deletes the dots (usa), TriviaQA spaces them out (u s a): the same pair scores differently.
    assert squad_scores({"q": "U.S.A."}, {"q": ["u s a"]}, style="triviaqa")["exact_match"] == 100.0
    assert squad_scores({"q": "U.S.A."}, {"q": ["u s a"]}, style="squad")["exact_match"] == 0.0


def test_triviaqa_scores_take_the_best_alias_by_hand():
    golds = {"a": ["london", "city of london"], "b": ["paris"]}
    # a: "the City of London" -> [city, of, london] matches the second alias exactly; b: [paris, france] vs [paris]: P 1/2, R 1, F1 2/3
    scores = squad_scores({"a": "the City of London", "b": "Paris, France"}, golds, style="triviaqa")
    assert scores["exact_match"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)


def test_hotpotqa_yes_no_answers_are_all_or_nothing():
    # SQuAD's F1 gives "yes it is" vs "yes" 0.5 (P 1/3, R 1); HotpotQA's gives 0 because the gold is yes/no and they differ.
    assert squad_scores({"q": "yes it is"}, {"q": ["yes"]}, style="squad")["f1"] == pytest.approx(50.0)
    assert squad_scores({"q": "yes it is"}, {"q": ["yes"]}, style="hotpotqa")["f1"] == 0.0
    assert squad_scores({"q": "no"}, {"q": ["no way out"]}, style="hotpotqa")["f1"] == 0.0
    assert squad_scores({"q": "Yes."}, {"q": ["yes"]}, style="hotpotqa") == {"exact_match": 100.0, "f1": 100.0, "count": 1, "missing": 0}
    assert squad_scores({"q": "New York City"}, {"q": ["New York"]}, style="hotpotqa")["f1"] == pytest.approx(80.0)
    with pytest.raises(ValueError, match="unknown style 'bleu'; valid: squad, triviaqa, hotpotqa"):
        squad_scores({}, {}, style="bleu")


# ------------------------------------------------------------------------------------ locating answers
def test_find_spans_whole_words_any_case_in_context_order():
    context = "Parisian food. PARIS is big; in Paris, Texas too. Paris."
    assert find_spans(context, ["Paris"]) == [(15, 20), (32, 37), (50, 55)]
    assert find_spans(context, ["Paris", "Paris, Texas"]) == [(15, 20), (32, 44), (50, 55)]  # overlap: the longer at the same start
    assert find_spans(context, ["paris"], limit=1) == [(15, 20)]
    assert find_spans(context, ["Paris"], within=[(45, 56)]) == [(50, 55)]
    assert find_spans(context, ["Paris"], within=[(0, 5)]) == [(15, 20), (32, 37), (50, 55)]  # none inside: every hit
    assert find_spans(context, ["Rome", " "]) == []


def test_each_window_learns_the_first_occurrence_it_holds(tokenizer):
    words = [f"w{k}" for k in range(60)]
    words[5] = words[40] = "Zanzibar"
    context = " ".join(words)
    spans = find_spans(context, ["zanzibar"])
    ex = QAExample("q", "t", context, "where", [context[a:b] for a, b in spans], [a for a, _ in spans], gold_answers=["zanzibar"])
    features = make_features([ex], tokenizer, max_length=48, doc_stride=16, max_query_length=8, cls_id=CLS_ID, sep_id=SEP_ID, train=True)
    assert len(features) > 2
    targets = 0
    for f in features:
        if f.start_position:
            text = ex.context[f.token_starts[f.start_position - f.context_start]:f.token_ends[f.end_position - f.context_start]]
            assert text.strip() == "Zanzibar"
            targets += 1
        else:  # a window without a target holds no whole occurrence
            held = ex.context[f.token_starts[0]:f.token_ends[-1]] if f.num_context_tokens else ""
            assert "Zanzibar" not in held[1:-1] or not held
    assert targets >= 2  # the windows around the second occurrence learn it too, not only those of the first


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from sparse_runner.tokenization import train_or_load
    texts = [article(p, q, 3) for p in PEOPLE for q in PLACES] + [f"w{k} Zanzibar where" for k in range(60)]
    return train_or_load(texts, vocab_size=120, character_coverage=1.0, cache_dir=tmp_path_factory.mktemp("tok"))


# ------------------------------------------------------------------------------------ TriviaQA
def test_triviaqa_release_files(files):
    train = triviaqa.read_triviaqa(files["triviaqa"], "train")
    dev = triviaqa.read_triviaqa(files["triviaqa"], "test")
    assert len(train) == 12 and len(dev) == 4
    ex = train[1]
    assert ex.id == "tqa_train_1" and ex.question == "Where did Alan Turing live later?" and ex.title == "Alan Turing train 1"
    assert ex.context.startswith("Alan Turing train 1\nAlan Turing was a person")
    place = PLACES[6 % len(PLACES)]
    assert ex.answers == [place, place] and ex.gold_answers == [place.lower()]
    for text, start in zip(ex.answers, ex.answer_starts):
        assert ex.context[start:start + len(text)] == text
    assert ex.answer_starts == sorted(ex.answer_starts)
    assert dev[3].answers == [] and dev[3].golds == ["atlantis"]  # not in the evidence: no span, still scored
    cut = triviaqa.read_triviaqa(files["triviaqa"], "train", max_context_words=12)
    assert len(cut[1].context.split()) == 12 and ex.context.startswith(cut[1].context) and cut[1].answers == []


def test_triviaqa_release_problems_are_one_line(files, tmp_path):
    with pytest.raises(DataFormatError, match=r"has no qa/wikipedia-train.json; valid: the TriviaQA release folder"):
        triviaqa.read_triviaqa(tmp_path, "train")
    broken = write_triviaqa(tmp_path / "broken")
    (broken / "evidence" / "wikipedia" / "Alan_Turing_train_1.txt").unlink()
    with pytest.raises(DataFormatError, match=r"Data\[1\]: evidence file .*Alan_Turing_train_1.txt does not exist") as err:
        triviaqa.read_triviaqa(broken, "train")
    assert "\n" not in str(err.value)
    (broken / "qa" / "wikipedia-dev.json").write_text('{"Data": [{"QuestionId": "x"}]}')
    with pytest.raises(DataFormatError, match=r"Data\[0\] needs QuestionId, Question, Answer and EntityPages"):
        triviaqa.read_triviaqa(broken, "test")


def test_triviaqa_hub_rows():
    rows = [{"question_id": "q1", "question": "Capital?", "question_source": "x",
             "answer": {"aliases": ["Paris", "Paree"], "normalized_aliases": ["paris", "paree"], "value": "Paris", "normalized_value": "paris",
                        "matched_wiki_entity_name": "", "normalized_matched_wiki_entity_name": "", "type": "WikipediaEntity"},
             "entity_pages": {"doc_source": ["TagMe", "TagMe"], "filename": ["France.txt", "Seine.txt"], "title": ["France", "Seine"],
                              "wiki_context": ["France is a country. Its capital is Paris.", "The Seine flows through Paree."]},
             "search_results": {"description": [], "filename": [], "rank": [], "title": [], "url": [], "search_context": []}}]
    (ex,) = triviaqa.examples_from_rows(rows)
    assert ex.context == "France\nFrance is a country. Its capital is Paris.\n\nSeine\nThe Seine flows through Paree."
    assert ex.answers == ["Paris", "Paree"] and ex.gold_answers == ["paris", "paree"] and ex.title == "France"
    with pytest.raises(DataFormatError, match="row 0 has no entity_pages"):
        triviaqa.examples_from_rows([{"question_id": "q", "question": "?", "answer": {}}])


# ------------------------------------------------------------------------------------ HotpotQA
def test_hotpotqa_release_files(files):
    train = hotpotqa.read_hotpotqa(files["hotpotqa"], "train")
    assert len(train) == 12 and len(hotpotqa.read_hotpotqa(files["hotpotqa"], "test")) == 6
    yes, no, span = train[0], train[3], train[1]
    assert yes.context.startswith("yes no Filler 0: Filler paragraph 0")
    assert (yes.answers, yes.answer_starts, yes.golds) == (["yes"], [0], ["yes"])
    assert (no.answers, no.answer_starts, no.golds) == (["no"], [4], ["no"])
    place = PLACES[6 % len(PLACES)]
    # The place is named first in a filler paragraph, but the span is the one in the supporting sentence.
    assert span.context.index(place) < span.answer_starts[0]
    assert span.context[span.answer_starts[0] - len("Alan Turing moved to "):span.answer_starts[0] + len(place)] == f"Alan Turing moved to {place}"


def test_hotpotqa_problems_and_hub_rows(tmp_path):
    with pytest.raises(DataFormatError, match="has no hotpot_train_v1.1.json; valid: a folder with the official"):
        hotpotqa.read_hotpotqa(tmp_path, "train")
    (tmp_path / "hotpot_train_v1.1.json").write_text('{"data": []}')
    with pytest.raises(DataFormatError, match="must hold a list of questions"):
        hotpotqa.read_hotpotqa(tmp_path, "train")
    item = hotpot_item(1, "train")
    row = {"id": item["_id"], "question": item["question"], "answer": item["answer"], "type": item["type"], "level": item["level"],
           "supporting_facts": {"title": [t for t, _ in item["supporting_facts"]], "sent_id": [k for _, k in item["supporting_facts"]]},
           "context": {"title": [t for t, _ in item["context"]], "sentences": [s for _, s in item["context"]]}}
    (from_row,) = hotpotqa.examples_from_rows([row])
    (tmp_path / "hotpot_train_v1.1.json").write_text(json.dumps([item]))
    (from_file,) = hotpotqa.read_hotpotqa(tmp_path, "train")
    assert from_row == from_file


# ------------------------------------------------------------------------------------ the substitute
def test_long_cloze_contexts_are_whole_speeches_up_to_the_budget():
    speeches = [[f"Sentence {k} of speech {d} names the Grand Duchy of Fenwick {k + 1000} times." for k in range(30)] for d in range(3)]
    examples = long_cloze_examples(speeches, seed=0, max_words=100, questions_per_document=4, id_prefix="x")
    assert examples == long_cloze_examples(speeches, seed=0, max_words=100, questions_per_document=4, id_prefix="x")
    assert len(examples) == 12
    for ex in examples:
        assert len(ex.context.split()) <= 100 and ex.context.startswith(f"Sentence 0 of speech {ex.title[-1]}")
        assert ex.context[ex.answer_starts[0]:ex.answer_starts[0] + len(ex.answers[0])] == ex.answers[0]
        assert ex.question.count(BLANK) == 1 and ex.question.replace(BLANK, ex.answers[0]) in ex.context
    assert max(ex.answer_starts[0] for ex in examples) > 300  # answers lie deep in the context, not only near its start



def test_long_cloze_segments_ask_over_the_rest_of_each_speech():
    speeches = [[f"Sentence {k} of speech {d} names the Grand Duchy of Fenwick {k + 1000} times." for k in range(30)] for d in range(3)]
    first = long_cloze_examples(speeches, seed=0, max_words=100, questions_per_document=4, id_prefix="x")
    every = long_cloze_examples(speeches, seed=0, max_words=100, questions_per_document=4, id_prefix="x", segments=None)
    two = long_cloze_examples(speeches, seed=0, max_words=100, questions_per_document=4, id_prefix="x", segments=2)
    # 13 words a sentence: 7 sentences a segment, 5 segments a speech (the last of 2 sentences)
    assert len(every) == 3 * (4 * 4 + 2) and len(two) == 3 * 2 * 4
    assert [ex.id for ex in every if ex.id.split("-")[2] == "0"] == [ex.id for ex in first]
    assert {ex.id.split("-")[2] for ex in every} == {"0", "1", "2", "3", "4"} and len({ex.id for ex in every}) == len(every)
    for ex in every:
        d, s = (int(part) for part in ex.id.split("-")[1:3])
        assert ex.title == f"x-{d}" and ex.context.startswith(f"Sentence {7 * s} of speech {d} ")
        assert len(ex.context.split()) <= 100 and ex.question.replace(BLANK, ex.answers[0]) in ex.context
    with pytest.raises(ValueError, match="segments must be >= 1"):
        long_cloze_examples(speeches, seed=0, max_words=100, questions_per_document=4, id_prefix="x", segments=0)

def test_sotu_long_cloze_task_is_a_labelled_substitute_with_floors(cache_dir):
    cfg = config(cache_dir, "task=sotu_long_cloze", "task.max_context_words=150", "task.questions_per_passage=2", "task.max_length=256",
                 "task.doc_stride=128", "task.max_query_length=48", "task.vocab_size=500")
    task = build_task(cfg)
    info = task.describe()
    assert info["data"]["source"] == "substitute" and info["data"]["name"] == "sotu_long_cloze"
    assert "TriviaQA" in info["data"]["substitute_for"]
    # 2 questions per speech (214 / 8 / 11 speeches); a few train speeches open with a sentence over the budget: too short for two
    assert info["questions"]["val"] == 16 and info["questions"]["test"] == 22 and 400 < info["questions"]["train"] <= 428
    assert set(info["baselines"]) == {"first_sentence_exact_match", "first_sentence_f1", "same_kind_first_exact_match", "same_kind_first_f1"}
    assert all(0 <= v <= 100 for v in info["baselines"].values())


def test_whole_speeches_need_a_word_budget(cache_dir):
    with pytest.raises(ConfigError, match="task.max_context_words: is null, and cloze questions over whole speeches"):
        config(cache_dir, "task=sotu_long_cloze", "task.max_context_words=null")
    with pytest.raises(ConfigError, match="task.dataset: unknown value 'naturalqa'; valid: squad, triviaqa, hotpotqa"):
        config(cache_dir, "task=triviaqa", "task.dataset=naturalqa")


# ------------------------------------------------------------------------------------ runs
@pytest.mark.parametrize("name", ["triviaqa", "hotpotqa"])
def test_tiny_run_on_release_files(name, files, cache_dir, tmp_path):
    cfg = config(cache_dir, f"task={name}", "task.source=files", f"task.data_dir={files[name]}", *SMALL)
    run(cfg, tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["status"] == "completed" and m["task_info"]["data"] == {**m["task_info"]["data"], "name": name, "source": "release"}
    assert 0 <= m["metrics"]["test/exact_match"] <= m["metrics"]["test/f1"] + 1e-9 <= 100 + 1e-9
    predictions = json.loads((tmp_path / "outputs" / "predictions.json").read_text())
    assert len(predictions) == m["dataset_sizes"]["test"] == (4 if name == "triviaqa" else 6)
    task = build_task(cfg)
    test = task.examples["test"]
    # The run's test scores are the official metric of the dataset applied to the predictions it wrote.
    style = {"triviaqa": "triviaqa", "hotpotqa": "hotpotqa"}[name]
    expected = squad_scores(predictions, {ex.id: ex.golds for ex in test}, style=style)
    assert m["metrics"]["test/f1"] == pytest.approx(expected["f1"]) and m["metrics"]["test/exact_match"] == pytest.approx(expected["exact_match"])
    # An oracle reaches 100 on every answerable question: the gold spans survive windows and decoding.
    gold = {ex.id: ex.answers[0] for ex in test if ex.answers}
    assert squad_scores(gold, {k: next(ex.golds for ex in test if ex.id == k) for k in gold}, style=style)["exact_match"] == 100.0
    assert all(len(f.tokens) <= 64 for f in task.features["train"])


def test_training_questions_without_a_span_are_dropped(files, cache_dir):
    cfg = config(cache_dir, "task=triviaqa", "task.source=files", f"task.data_dir={files['triviaqa']}", "task.max_context_words=12", *SMALL)
    with pytest.raises(ConfigError, match="the train split has no questions"):
        build_task(cfg)  # 12 words never reach the answer
    task = build_task(config(cache_dir, "task=triviaqa", "task.source=files", f"task.data_dir={files['triviaqa']}", "task.max_context_words=60", *SMALL))
    dropped = task.data_info.get("train_questions_without_span", 0)
    assert dropped > 0 and len(task.examples["train"]) + dropped + len(task.examples["val"]) == 12
    assert all(ex.answers for ex in task.examples["train"])


# ------------------------------------------------------------------------------------ presets
@pytest.mark.parametrize("name", ["liu2022_triviaqa", "liu2022_hotpotqa"])
def test_gpu_presets_are_pretrained_long_and_block_sparse(name, cache_dir):
    cfg = validate(compose_config([f"experiment={name}"], cache_dir=cache_dir, tiny=False))
    assert cfg.task.name == name.split("_")[1] and cfg.task.max_length == 4096
    assert cfg.model.pattern in ("bigbird", "local", "hst") and cfg.pretrain.task is not None and cfg.pretrain.task.family == "mlm"
    for pattern in ("bigbird", "hst"):
        validate(compose_config([f"experiment={name}", f"model={pattern}"], cache_dir=cache_dir, tiny=False))


def test_cpu_preset_runs_the_substitute_from_pretraining(cache_dir):
    cfg = validate(compose_config(["experiment=liu2022_qa_cpu"], cache_dir=cache_dir, tiny=False))
    assert cfg.task.name == "sotu_long_cloze" and cfg.task.source == "cloze" and cfg.task.max_length >= 1024
    assert cfg.model.pattern in ("bigbird", "local", "hst") and cfg.pretrain.task is not None
