"""Documents in other languages: German, French and Chinese fixtures (data/fixtures/*_*.jsonl, written
for these tests) through segmentation, a real fit, the model directory, han-score and a real server.

The one property every caller depends on: a word's or sentence's (start, end) are offsets into the
text the user sent, so ``text[start:end]`` is exactly that word, whatever the script.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from han import LanguageError, ModelDirectoryError, Pipeline, SavedModel, Segmenter, SegmenterConfig
from han.vectors import load_vectors
from scoring.cli import main as score_main
from service.process import free_port, start_server
from tests.conftest import REPO
from tests.service_server import ServiceServer, base_env, register_model
from training.cli import main as train_main

FIXTURES = REPO / "data" / "fixtures"
SMOKE = str(REPO / "data" / "configs" / "smoke.yaml")
CORPORA = {"de": "de_news.jsonl", "fr": "fr_reviews.jsonl", "zh": "zh_news.jsonl"}


def rows(language: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / CORPORA[language]).read_text(encoding="utf-8").splitlines()]


def segment(language: str, text: str) -> tuple[list[str], list[list[str]]]:
    """(sentences as text slices, the words' keys per sentence), checking every offset on the way."""
    seg = Segmenter(SegmenterConfig(language=language)).segment(text)
    for spans, keys in zip(seg.token_spans, seg.token_keys, strict=True):
        for (start, end), key in zip(spans, keys, strict=True):
            assert text[start:end].lower() == key
    return [text[a:b] for a, b in seg.sentence_spans], seg.token_keys


def test_german_keeps_abbreviations_compounds_and_sharp_s() -> None:
    text = "Die Straße in Köln ist groß, z.B. am 3. Okt. um acht Uhr. Grüße aus der Fußballmannschaft!\nNeu hier."
    sentences, keys = segment("de", text)
    assert sentences == ["Die Straße in Köln ist groß, z.B. am 3. Okt. um acht Uhr.",
                         "Grüße aus der Fußballmannschaft!", "Neu hier."]
    assert keys[0][:6] == ["die", "straße", "in", "köln", "ist", "groß"]
    assert "z.b." in keys[0] and "okt." in keys[0] and "fußballmannschaft" in keys[1]
    # English rules would split "z.B." and end the sentence at "Okt.".
    english, _ = segment("en", text)
    assert english != sentences


def test_french_splits_elisions_from_their_word() -> None:
    text = "L'homme n'est pas là. J'ai vu l’acteur qu'on aime !"
    sentences, keys = segment("fr", text)
    assert sentences == ["L'homme n'est pas là.", "J'ai vu l’acteur qu'on aime !"]
    assert keys[0] == ["l'", "homme", "n'", "est", "pas", "là", "."]
    assert keys[1][:4] == ["j'", "ai", "vu", "l’"] and "acteur" in keys[1] and "qu'" in keys[1]


def test_chinese_is_segmented_by_character_with_sentences_at_its_punctuation() -> None:
    text = "主队昨晚获胜。  球迷们庆祝到深夜！股价下跌了吗？"
    sentences, keys = segment("zh", text)
    assert sentences == ["主队昨晚获胜。", "球迷们庆祝到深夜！", "股价下跌了吗？"]
    assert keys[0] == ["主", "队", "昨", "晚", "获", "胜", "。"]


def test_an_unknown_code_or_a_missing_tokenizer_package_is_one_line() -> None:
    with pytest.raises(LanguageError, match=r"^unknown language code 'qq': spaCy has no tokenizer for it"):
        Segmenter(SegmenterConfig(language="qq"))
    with pytest.raises(LanguageError, match=r"^language 'ja' needs a tokenizer package .*pip install sudachipy"):
        Segmenter(SegmenterConfig(language="ja"))


def fit(tmp_path: Path, language: str, *extra: str) -> Path:
    data = str(FIXTURES / CORPORA[language])
    root = tmp_path / f"run-{language}"
    train_main(["fit", "--config", SMOKE, "--data.train", data, "--data.validation", data, "--data.test", data,
                "--data.language", language, "--data.cache_dir", str(tmp_path / "cache"),
                "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false",
                "--export.faithfulness", "0", *extra])
    return root / "model"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A smoke fit per language (seconds each)."""
    tmp = tmp_path_factory.mktemp("languages")
    return {language: fit(tmp, language) for language in CORPORA}


@pytest.mark.parametrize("language", list(CORPORA))
def test_a_fit_learns_the_fixture_and_the_model_directory_keeps_its_language(
    models: dict[str, Path], language: str, tmp_path: Path
) -> None:
    config = json.loads((models[language] / "config.json").read_text(encoding="utf-8"))
    assert config["segmenter"]["language"] == language
    saved = SavedModel.load(models[language])
    assert saved.segmenter.language == language
    texts = [r["text"] for r in rows(language)]
    before = Pipeline(saved)(texts)
    assert np.mean([r.label == row["label"] for r, row in zip(before, rows(language), strict=True)]) >= 0.9
    again = Pipeline(SavedModel.load(saved.save(tmp_path / "copy")))(texts, explain=True)
    assert [r.scores for r in again] == [r.scores for r in before]
    for text, result in zip(texts, again, strict=True):  # every span marks its own characters
        for sentence in result.sentences:
            assert text[sentence.start:sentence.end] == sentence.text
            for word in sentence.words:
                assert text[word.start:word.end] == word.text
    # Vocabulary keys in the language's own letters.
    if language == "de":
        assert {"fußballmannschaft", "börse", "läuferin"} <= set(saved.vocab.itos)
    if language == "zh":
        assert {"球", "股"} <= set(saved.vocab.itos)


def test_an_old_model_directory_without_a_language_loads_as_english() -> None:
    config = json.loads((FIXTURES / "model_v1" / "model" / "config.json").read_text(encoding="utf-8"))
    assert "language" not in config.get("segmenter", {})
    assert SavedModel.load(FIXTURES / "model_v1" / "model").segmenter.language == "en"


def test_fit_with_an_unusable_language_stops_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for code, expected in (("qq", "unknown language code 'qq'"), ("ja", "pip install sudachipy")):
        with pytest.raises(SystemExit):
            fit(tmp_path, "fr", "--data.language", code)
        err = capsys.readouterr().err
        assert "han-train: error: data.language: " in err and expected in err and "Traceback" not in err
        assert not (tmp_path / "run-fr" / "model").exists()


def needing_sudachipy(model: Path, tmp_path: Path) -> Path:
    """A copy of ``model`` that says its documents are Japanese (whose tokenizer needs SudachiPy)."""
    copy = SavedModel.load(model).save(tmp_path / "ja-model")
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    config["segmenter"]["language"] = "ja"
    (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return copy


def test_a_model_whose_tokenizer_package_is_missing_fails_to_load_in_one_line(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = needing_sudachipy(models["de"], tmp_path)
    with pytest.raises(ModelDirectoryError, match=r"language 'ja' needs a tokenizer package .*pip install sudachipy"):
        SavedModel.load(model)
    assert score_main([str(FIXTURES / "de_news.jsonl"), str(tmp_path / "out.jsonl"), "--model", str(model),
                       "--quiet"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install sudachipy" in err, err


def test_the_service_refuses_such_a_model_before_it_reports_ready(models: dict[str, Path], tmp_path: Path) -> None:
    home = tmp_path / "bentoml"
    register_model(models["de"], home)  # then made Japanese in the store (registering loads it, which would fail)
    [stored] = home.glob("models/han-test/*/config.json")
    config = json.loads(stored.read_text(encoding="utf-8"))
    config["segmenter"]["language"] = "ja"
    stored.write_text(json.dumps(config), encoding="utf-8")
    process = start_server("han-test:latest", free_port(), env=base_env(home), log=subprocess.PIPE)
    try:
        out, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    text = out.decode(errors="replace")
    assert process.returncode != 0
    assert "error: cannot serve han-test:latest" in text and "pip install sudachipy" in text, text[-2000:]
    assert "Traceback" not in text, text[-2000:]


def test_han_score_gives_spans_into_the_original_french_text(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "scored.jsonl"
    assert score_main([str(FIXTURES / "fr_reviews.jsonl"), str(out), "--model", str(models["fr"]), "--quiet",
                       "--explain"]) == 0
    texts = [r["text"] for r in rows("fr")]
    scored = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(scored) == len(texts)
    for row in scored:
        text = texts[row["row"]]
        for span in row["top_sentences"] + row["top_words"]:
            assert text[span["start"]:span["end"]] == span["text"]
    assert any("'" in span["text"] for row in scored for span in row["top_words"])  # élisions kept as words


def test_the_served_model_reports_its_language_and_marks_the_right_characters(models: dict[str, Path]) -> None:
    server = ServiceServer.start(models["zh"])
    try:
        status, info = server.get_json("/model")
        assert status == 200 and info["language"] == "zh" and "language" not in info["limits"]
        texts = [r["text"] for r in rows("zh")[:6]]
        status, body = server.post_json("/classify", {"documents": texts, "explain": "integrated_gradients"})
        assert status == 200
        for text, result in zip(texts, body["results"], strict=True):
            assert "".join(s["text"] for s in result["sentences"]) == text  # no spaces to lose
            for sentence in result["sentences"]:
                assert text[sentence["start"]:sentence["end"]] == sentence["text"]
                for word in sentence["words"]:
                    assert text[word["start"]:word["end"]] == word["text"] and len(word["text"]) == 1
    finally:
        server.stop()


def test_vectors_for_a_german_vocabulary_match_whatever_the_case_or_unicode_form(tmp_path: Path) -> None:
    import unicodedata

    from han import Vocabulary

    vocab = Vocabulary(["straße", "köln", "grüße", "größe"])
    nfd = unicodedata.normalize("NFD", "Größe")  # o + combining diaeresis, as some files store it
    (path := tmp_path / "cc.de.4.vec").write_text(
        "4 4\nStraße 1 1 1 1\nKöln 2 2 2 2\ngrüße 3 3 3 3\n" + f"{nfd} 4 4 4 4\n", encoding="utf-8")
    vectors = load_vectors(path, vocab, dim=4)
    for word, value in (("straße", 1), ("köln", 2), ("grüße", 3), ("größe", 4)):
        np.testing.assert_array_equal(vectors.matrix[vocab.stoi[word]], value)


def test_a_german_vectors_file_sets_the_dimension_of_a_german_fit(tmp_path: Path) -> None:
    words = {"die": 0.1, "börse": 0.2, "fußballmannschaft": 0.3, "läuferin": 0.4}
    (path := tmp_path / "cc.de.8.vec").write_text(
        f"{len(words)} 8\n" + "".join(f"{w} {' '.join([str(v)] * 8)}\n" for w, v in words.items()), encoding="utf-8")
    saved = SavedModel.load(fit(tmp_path, "de", "--model.embeddings", str(path), "--model.embed_dim", "8",
                                "--trainer.max_epochs", "1", "--model.freeze_embeddings", "1"))
    assert saved.model.config.embed_dim == 8
    for word, value in words.items():  # frozen for the one epoch: exactly the file's vectors
        np.testing.assert_allclose(saved.model.embedding.weight[saved.vocab.stoi[word]].detach().numpy(), value)

