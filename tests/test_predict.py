"""The predictor: labels, scores and explanations whose spans point back into the input."""

from __future__ import annotations

from pathlib import Path

import pytest

from han import InvalidDocumentError, Predictor, SavedModel
from tests.tiny_model import train_tiny_model


@pytest.fixture(scope="module")
def predictor(tiny_model_dir: Path) -> Predictor:
    return Predictor(SavedModel.load(tiny_model_dir), batch_size=3)


def test_predicts_the_fixture_labels_with_scores_of_every_label(predictor: Predictor) -> None:
    results = predictor.predict(["A wonderful, superb film. Loved it.", "Awful and boring. Hated it."])
    assert [r.label for r in results] == ["pos", "neg"]
    assert [r.labels for r in results] == [["pos"], ["neg"]]
    for r in results:
        assert set(r.scores) == {"neg", "pos"}
        assert abs(sum(r.scores.values()) - 1) < 1e-5


def test_explanations_point_back_into_the_input_and_weights_are_distributions(predictor: Predictor) -> None:
    text = "Great cast.<br /><br />The story is  wonderful!  I loved it."
    (result,) = predictor.predict([text])
    assert [s.text for s in result.sentences] == ["Great cast.", "The story is  wonderful!", "I loved it."]
    assert abs(sum(s.weight for s in result.sentences) - 1) < 1e-5
    for sentence in result.sentences:
        assert text[sentence.start : sentence.end] == sentence.text
        assert abs(sum(w.weight for w in sentence.words) - 1) < 1e-5
        for word in sentence.words:
            assert text[word.start : word.end] == word.text


def test_results_keep_input_order_across_internal_batches(predictor: Predictor) -> None:
    texts = [("Superb. " * n) if n % 2 else ("Awful. " * n) for n in range(1, 12)]
    batched = predictor.predict(texts, explain=False)
    one_by_one = [predictor.predict([t], explain=False)[0] for t in texts]
    for a, b in zip(batched, one_by_one, strict=True):
        assert a.label == b.label
        assert a.sentences is None
        for label in a.scores:
            assert abs(a.scores[label] - b.scores[label]) < 1e-5


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["fine", ""], "document 1: the document is empty"),
        (["   \n "], "document 0: the document is empty"),
        (["ok", 42], "document 1: the document must be a string, not int"),
        (["<br /><br />"], "document 0: the document has no words"),
    ],
)
def test_bad_documents_raise_an_error_naming_the_document(predictor: Predictor, texts, message: str) -> None:
    with pytest.raises(InvalidDocumentError, match=message):
        predictor.predict(texts)


def test_odd_but_valid_documents_are_classified(predictor: Predictor) -> None:
    texts = ["?!?!", "wonderful", "😀🎬👍", "Фильм отличный. 素晴らしい。", "Superb film. " * 5000]
    results = predictor.predict(texts)
    assert len(results) == 5
    assert results[-1].truncated and not results[0].truncated
    assert len(results[-1].sentences) == predictor.saved.segmenter.max_sentences


def test_multi_label_models_return_every_label_over_the_threshold() -> None:
    saved, _ = train_tiny_model(steps=80, multi_label=True)
    (result,) = Predictor(saved).predict(["Oil companies and grain traders were hit by higher interest rates."])
    assert sorted(result.labels) == ["crude", "grain", "interest"]
    assert all(0 <= p <= 1 for p in result.scores.values())
