"""Tests of load_parallel (sparse_runner.data.parallel) on tiny files written here.

The hub path is exercised offline: with ``hf_path="json"`` the real ``datasets.load_dataset`` reads
local files in the hub's ``translation`` layout; a fake entry in a temporary HF cache stands for a
hub dataset in the local cache; and an unreachable endpoint checks the one-line, fast failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparse_runner.config import ConfigError
from sparse_runner.data import parallel
from sparse_runner.data.errors import DataFormatError, DataUnavailable
from sparse_runner.data.parallel import load_parallel

PAIRS = {
    "train": [("Guten Morgen.", "Good morning."), ("Wie geht's?", "How are you?"), ("Danke!", "Thanks!")],
    "val": [("Ja.", "Yes."), ("Nein.", "No.")],
    "test": [("Vielleicht.", "Maybe.")],
}


def expected(pairs=PAIRS):
    return {split: ([s for s, _ in p], [t for _, t in p]) for split, p in pairs.items()}


def write_aligned(directory: Path, names=None, src="de", tgt="en", pairs=PAIRS) -> Path:
    names = names or {"train": "train", "val": "valid", "test": "test"}
    directory.mkdir(parents=True, exist_ok=True)
    for split, rows in pairs.items():
        (directory / f"{names[split]}.{src}").write_text("".join(s + "\n" for s, _ in rows), encoding="utf-8")
        (directory / f"{names[split]}.{tgt}").write_text("".join(t + "\n" for _, t in rows), encoding="utf-8")
    return directory


def one_line_error(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------------ aligned
@pytest.mark.parametrize("val_name", ["valid", "val", "dev"])
def test_aligned_files(tmp_path, val_name):
    write_aligned(tmp_path, {"train": "train", "val": val_name, "test": "test"})
    for fmt in ("aligned", "auto"):
        assert load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path, file_format=fmt) == expected()
    # the other direction reads the same files the other way round
    reverse = load_parallel("files", src_lang="en", tgt_lang="de", data_dir=str(tmp_path))
    assert reverse["val"] == tuple(reversed(expected()["val"]))


def test_kftt_release_naming(tmp_path):
    data = write_aligned(tmp_path / "kftt-data-1.0" / "data" / "orig", {"train": "kyoto-train", "val": "kyoto-dev", "test": "kyoto-test"}, src="ja", tgt="en",
                         pairs={"train": [("京都は古い都です。", "Kyoto is an old capital.")], "val": [("寺", "temple")], "test": [("金閣寺", "Kinkaku-ji")]})
    (data / "kyoto-tune.ja").write_text("x\n", encoding="utf-8")  # present in the release, not used
    (data / "kyoto-tune.en").write_text("x\n", encoding="utf-8")
    out = load_parallel("files", src_lang="ja", tgt_lang="en", data_dir=data)
    assert out["train"] == (["京都は古い都です。"], ["Kyoto is an old capital."])
    assert out["val"] == (["寺"], ["temple"]) and out["test"] == (["金閣寺"], ["Kinkaku-ji"])


def test_line_breaks_crlf_bom_and_unicode_separators(tmp_path):
    # \r\n endings, a BOM, and characters str.splitlines() would split on (\x85, \u2028, lone \r)
    tmp_path.joinpath("train.de").write_bytes("\ufeffeins\r\nzwei\u2028drei\r\nvier\x85fünf\rsechs\n".encode("utf-8"))
    tmp_path.joinpath("train.en").write_bytes(b"one\r\ntwo three\r\nfour five six\n")
    for split in ("valid", "test"):
        tmp_path.joinpath(f"{split}.de").write_text("a\n", encoding="utf-8")
        tmp_path.joinpath(f"{split}.en").write_text("b\n", encoding="utf-8")
    src, tgt = load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)["train"]
    assert src == ["eins", "zwei\u2028drei", "vier\x85fünf\rsechs"] and tgt == ["one", "two three", "four five six"]


def test_cleaning_drops_empty_train_pairs_but_keeps_evaluation_sets_whole(tmp_path, caplog):
    pairs = {
        "train": [("  Hallo  ", "Hello"), ("", "orphan"), ("allein", "   "), ("Tschüss", "Bye")],
        "val": [("", "empty source kept"), ("x", "y")],
        "test": [("a", "")],
    }
    write_aligned(tmp_path, pairs=pairs)
    out = load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    assert out["train"] == (["Hallo", "Tschüss"], ["Hello", "Bye"])
    assert out["val"] == (["", "x"], ["empty source kept", "y"])
    assert out["test"] == (["a"], [""])
    assert "empty side" in caplog.text


def test_train_with_no_usable_pair_is_an_error(tmp_path):
    write_aligned(tmp_path, pairs={**PAIRS, "train": [("", "x"), ("y", "")]})
    with pytest.raises(DataFormatError, match="no sentence pairs with both sides non-empty") as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    one_line_error(info)


def test_line_count_mismatch_names_both_files(tmp_path):
    write_aligned(tmp_path)
    with open(tmp_path / "valid.en", "a", encoding="utf-8") as handle:
        handle.write("extra\n")
    with pytest.raises(DataFormatError) as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path, task_name="t1")
    message = one_line_error(info)
    assert message.startswith("task t1:")
    assert f"{tmp_path / 'valid.de'} has 2 lines but {tmp_path / 'valid.en'} has 3" in message
    assert "line 3" in message and "line-aligned" in message


def test_missing_split_and_missing_partner(tmp_path):
    write_aligned(tmp_path)
    (tmp_path / "test.de").unlink()
    with pytest.raises(DataFormatError) as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    assert f"{tmp_path / 'test.en'} has no partner file {tmp_path / 'test.de'}" in one_line_error(info)
    (tmp_path / "test.en").unlink()
    with pytest.raises(DataFormatError) as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    assert "no test split" in one_line_error(info) and "test.de+test.en" in str(info.value)


def test_ambiguous_split_names(tmp_path):
    write_aligned(tmp_path)
    write_aligned(tmp_path, {"train": "train", "val": "dev", "test": "test"})
    with pytest.raises(DataFormatError, match="more than one val split") as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    assert "valid.de+valid.en; dev.de+dev.en" in one_line_error(info)


def test_invalid_utf8_names_file_and_line(tmp_path):
    write_aligned(tmp_path)
    (tmp_path / "train.de").write_bytes(b"ok\nbad \xff byte\nok\n")
    with pytest.raises(DataFormatError) as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    assert f"{tmp_path / 'train.de'}:2: not valid UTF-8" in one_line_error(info)


def test_no_data_and_bad_arguments(tmp_path):
    (tmp_path / "README").write_text("nothing here")
    with pytest.raises(DataFormatError) as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    assert "train.de+train.en" in one_line_error(info) and "README" in str(info.value)
    with pytest.raises(ConfigError, match="not a directory"):
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path / "missing")
    with pytest.raises(ConfigError, match="needs task.data_dir"):
        load_parallel("files", src_lang="de", tgt_lang="en")
    with pytest.raises(ConfigError, match="file_format='xml' is not one of auto, aligned, tsv, jsonl"):
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path, file_format="xml")
    with pytest.raises(ConfigError, match="source='web' is not one of embedded, files, hf"):
        load_parallel("web", src_lang="de", tgt_lang="en")
    with pytest.raises(ConfigError, match="must differ"):
        load_parallel("files", src_lang="en", tgt_lang="en", data_dir=tmp_path)


# ------------------------------------------------------------------------------------------ tsv / jsonl
def write_tsv(directory: Path, header: str | None = None, swap: bool = False):
    names = {"train": "train", "val": "dev", "test": "test"}
    for split, rows in PAIRS.items():
        lines = [header] if header else []
        lines += [f"{t}\t{s}" if swap else f"{s}\t{t}" for s, t in rows]
        (directory / f"{names[split]}.tsv").write_text("\n".join(lines) + "\n\n", encoding="utf-8")


@pytest.mark.parametrize("header, swap", [(None, False), ("de\ten", False), ("source\ttarget", False), ("EN\tDE", True)])
def test_tsv(tmp_path, header, swap):
    write_tsv(tmp_path, header, swap)
    assert load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path) == expected()
    assert load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path, file_format="tsv") == expected()


def test_tsv_wrong_column_count(tmp_path):
    write_tsv(tmp_path)
    (tmp_path / "test.tsv").write_text("a\tb\nonly one column\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    assert f"{tmp_path / 'test.tsv'}:2: expected 2 tab-separated columns (de<TAB>en), found 1" in one_line_error(info)


def write_jsonl(directory: Path, hf_style: bool):
    names = {"train": "train", "val": "valid", "test": "test"}
    for split, rows in PAIRS.items():
        with open(directory / f"{names[split]}.jsonl", "w", encoding="utf-8") as handle:
            for s, t in rows:
                row = {"translation": {"de": s, "en": t}} if hf_style else {"id": 1, "en": t, "de": s}
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")


@pytest.mark.parametrize("hf_style", [False, True])
def test_jsonl(tmp_path, hf_style):
    write_jsonl(tmp_path, hf_style)
    assert load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path) == expected()


def test_jsonl_errors_name_file_and_line(tmp_path):
    write_jsonl(tmp_path, hf_style=True)
    (tmp_path / "valid.jsonl").write_text('{"translation": {"de": "a", "en": "b"}}\n{"de": "a", "en": \n', encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    assert f"{tmp_path / 'valid.jsonl'}:2: not valid JSON" in one_line_error(info)
    (tmp_path / "valid.jsonl").write_text('{"de": "a", "fr": "b"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    assert f"{tmp_path / 'valid.jsonl'}:1: expected a JSON object" in one_line_error(info) and "['de', 'fr']" in str(info.value)
    (tmp_path / "valid.jsonl").write_text('{"de": "a", "en": 3}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match="the 'en' value is int, expected a string"):
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)


def test_auto_refuses_several_formats(tmp_path):
    write_aligned(tmp_path)
    write_tsv(tmp_path)
    with pytest.raises(DataFormatError, match="several formats") as info:
        load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path)
    one_line_error(info)
    assert load_parallel("files", src_lang="de", tgt_lang="en", data_dir=tmp_path, file_format="tsv") == expected()


# ------------------------------------------------------------------------------------------ embedded
@pytest.fixture
def fake_bible(monkeypatch):
    monkeypatch.setattr(parallel, "load_bible_es_en", lambda: {
        "train": (["En el principio.", "Y dijo Dios."], ["In the beginning.", "And God said."]),
        "val": (["Luz."], ["Light."]),
        "test": (["Agua."], ["Water."]),
    })


def test_embedded(fake_bible):
    out = load_parallel("embedded", src_lang="es", tgt_lang="en")
    assert out["train"] == (["En el principio.", "Y dijo Dios."], ["In the beginning.", "And God said."])
    assert load_parallel("embedded", src_lang="en", tgt_lang="es")["test"] == (["Water."], ["Agua."])


def test_embedded_rejects_other_pairs():
    with pytest.raises(ConfigError, match="only the Bible Spanish-English corpus") as info:
        load_parallel("embedded", src_lang="de", tgt_lang="en", task_name="iwslt")
    assert one_line_error(info).startswith("task iwslt:")


# ------------------------------------------------------------------------------------------ hub
@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """A private HF datasets cache and an endpoint nothing listens on (refused at once, anywhere)."""
    import datasets.config
    from huggingface_hub import constants

    cache = tmp_path / "hf_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    return cache


def write_hub_jsonl(directory: Path, splits=("train", "validation", "test")) -> dict[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    ours = {"train": "train", "validation": "val", "dev": "val", "test": "test"}
    files = {}
    for split in splits:
        path = directory / f"{split}.jsonl"
        with open(path, "w", encoding="utf-8") as handle:
            for s, t in PAIRS[ours[split]]:
                handle.write(json.dumps({"translation": {"de": s, "en": t}}, ensure_ascii=False) + "\n")
        files[split] = str(path)
    return files


def test_hf_loader_on_local_files_in_hub_layout(tmp_path, hf_cache):
    files = write_hub_jsonl(tmp_path / "hub")
    out = load_parallel("hf", src_lang="de", tgt_lang="en", hf_path="json", hf_data_files=files)
    assert out == expected()
    # en->de from the same de-en rows (as for WMT14 en-de)
    assert load_parallel("hf", src_lang="en", tgt_lang="de", hf_path="json", hf_data_files=files)["test"] == (["Maybe."], ["Vielleicht."])
    assert hf_cache.is_dir()  # datasets wrote its Arrow cache to the private directory


def test_hf_split_mapping_and_errors(tmp_path, hf_cache):
    files = write_hub_jsonl(tmp_path / "hub", splits=("train", "dev", "test"))
    with pytest.raises(ConfigError, match="has no split 'validation' for val; it has train, dev, test") as info:
        load_parallel("hf", src_lang="de", tgt_lang="en", hf_path="json", hf_data_files=files)
    one_line_error(info)
    out = load_parallel("hf", src_lang="de", tgt_lang="en", hf_path="json", hf_data_files=files, hf_splits={"val": "dev"})
    assert out == expected()
    with pytest.raises(ConfigError, match="unknown key"):
        load_parallel("hf", src_lang="de", tgt_lang="en", hf_path="json", hf_data_files=files, hf_splits={"valid": "dev"})
    with pytest.raises(DataFormatError, match="the translation column has languages") as info:
        load_parallel("hf", src_lang="fr", tgt_lang="en", hf_path="json", hf_data_files=files, hf_splits={"val": "dev"})
    one_line_error(info)
    with pytest.raises(ConfigError, match="needs task.hf_path"):
        load_parallel("hf", src_lang="de", tgt_lang="en")


def test_hf_flat_language_columns(tmp_path, hf_cache):
    files = {}
    for split, ours in (("train", "train"), ("validation", "val"), ("test", "test")):
        path = tmp_path / f"{split}.jsonl"
        path.write_text("".join(json.dumps({"de": s, "en": t}) + "\n" for s, t in PAIRS[ours]), encoding="utf-8")
        files[split] = str(path)
    assert load_parallel("hf", src_lang="de", tgt_lang="en", hf_path="json", hf_data_files=files) == expected()


def make_cached_hub_dataset(cache: Path, files: dict[str, str], repo: str = "testorg/fake_mt", config: str = "de-en") -> None:
    """Put ``repo`` (config ``config``) into the HF datasets cache as a download would have.

    Builds the Arrow files with the packaged json builder, then moves them to the cache layout of a
    hub dataset: ``<cache>/<namespace>___<name>/<config>/<version>/<hash>/`` (datasets 5.x).
    """
    import shutil

    from datasets.packaged_modules.json.json import Json

    name = repo.split("/")[1]
    builder = Json(cache_dir=str(cache / "build"), dataset_name=name, config_name=config, data_files=files)
    builder.download_and_prepare()
    target = cache / repo.replace("/", "___") / config / "0.0.0"
    target.mkdir(parents=True)
    shutil.move(builder.cache_dir, target / "0123456789abcdef")
    shutil.rmtree(cache / "build")


@pytest.fixture
def offline_calls(monkeypatch):
    """Records, for every `datasets.load_dataset` call, whether the hub was switched to offline mode:
    offline, `datasets` reads the local cache at once instead of retrying the network for ~25 s."""
    import datasets

    seen: list[bool] = []
    real = datasets.load_dataset

    def spy(*args, **kwargs):
        seen.append(bool(datasets.config.HF_HUB_OFFLINE))
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    return seen


def test_hf_unreachable_hub_uses_the_local_cache(tmp_path, hf_cache, offline_calls):
    make_cached_hub_dataset(hf_cache, write_hub_jsonl(tmp_path / "src"))
    out = load_parallel("hf", src_lang="de", tgt_lang="en", hf_path="testorg/fake_mt", hf_name="de-en")
    assert out == expected()
    assert offline_calls == [True]


def test_hf_unreachable_hub_not_cached_fails_fast_in_one_line(tmp_path, hf_cache, offline_calls):
    make_cached_hub_dataset(hf_cache, write_hub_jsonl(tmp_path / "src"))
    with pytest.raises(DataUnavailable) as info:  # cached, but not this config
        load_parallel("hf", src_lang="de", tgt_lang="en", hf_path="testorg/fake_mt", hf_name="ro-en", task_name="t")
    assert "cannot download testorg/fake_mt (ro-en)" in one_line_error(info)
    with pytest.raises(DataUnavailable) as info:
        load_parallel("hf", src_lang="de", tgt_lang="en", hf_path="IWSLT/iwslt2017", hf_name="iwslt2017-de-en", task_name="iwslt17_de_en")
    message = one_line_error(info)
    assert message.startswith("task iwslt17_de_en: cannot download IWSLT/iwslt2017 (iwslt2017-de-en) from the Hugging Face hub")
    assert "task.source=files task.data_dir=DIR (train/valid/test.{de,en})" in message
    assert issubclass(DataUnavailable, ConfigError)
    assert offline_calls == [True, True]


def test_hf_unreachable_hub_in_a_fresh_process(tmp_path):
    """The whole path as a run sees it (fresh interpreter): one line, with `datasets` in offline mode."""
    script = textwrap.dedent(
        """
        import datasets
        from sparse_runner.data.errors import DataUnavailable
        from sparse_runner.data.parallel import load_parallel
        real = datasets.load_dataset
        def spy(*args, **kwargs):
            print("OFFLINE", datasets.config.HF_HUB_OFFLINE)
            return real(*args, **kwargs)
        datasets.load_dataset = spy
        try:
            load_parallel("hf", src_lang="ro", tgt_lang="en", hf_path="wmt/wmt16", hf_name="ro-en", task_name="wmt16_ro_en")
        except DataUnavailable as err:
            print("ERROR", err)
        """
    )
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper() and not k.startswith("HF_")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf_home"))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr[-2000:]
    errors = [line for line in lines if line.startswith("ERROR ")]
    assert len(errors) == 1 and errors[0].startswith("ERROR task wmt16_ro_en: cannot download wmt/wmt16 (ro-en)"), proc.stdout
    assert "OFFLINE True" in lines  # the unreachable hub was detected: no network retries
