"""The inference pipeline: labels, scores and explanations whose spans point back into the input."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from han import DocumentError, InvalidDocumentError, Pipeline, SavedModel, TopK
from tests.tiny_model import train_tiny_model


@pytest.fixture(scope="module")
def pipeline(tiny_model_dir: Path) -> Pipeline:
    return Pipeline(SavedModel.load(tiny_model_dir), batch_size=3)


def test_predicts_the_fixture_labels_with_scores_of_every_label(pipeline: Pipeline) -> None:
    results = pipeline(["A wonderful, superb film. Loved it.", "Awful and boring. Hated it."])
    assert [r.label for r in results] == ["pos", "neg"]
    assert [r.labels for r in results] == [["pos"], ["neg"]]
    for r in results:
        assert set(r.scores) == {"neg", "pos"}
        assert abs(sum(r.scores.values()) - 1) < 1e-5


def test_explanations_point_back_into_the_input_and_weights_are_distributions(pipeline: Pipeline) -> None:
    text = "Great cast.<br /><br />The story is  wonderful!  I loved it."
    (result,) = pipeline([text], explain=True)
    assert [s.text for s in result.sentences] == ["Great cast.", "The story is  wonderful!", "I loved it."]
    assert abs(sum(s.weight for s in result.sentences) - 1) < 1e-5
    for sentence in result.sentences:
        assert text[sentence.start : sentence.end] == sentence.text
        assert abs(sum(w.weight for w in sentence.words) - 1) < 1e-5
        for word in sentence.words:
            assert text[word.start : word.end] == word.text


def test_results_keep_input_order_across_internal_batches(pipeline: Pipeline) -> None:
    texts = [("Superb. " * n) if n % 2 else ("Awful. " * n) for n in range(1, 12)]
    batched = pipeline(texts)
    one_by_one = [pipeline([t])[0] for t in texts]
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
def test_bad_documents_raise_an_error_naming_the_document(pipeline: Pipeline, texts, message: str) -> None:
    with pytest.raises(InvalidDocumentError, match=message):
        pipeline(texts)


def test_odd_but_valid_documents_are_classified(pipeline: Pipeline) -> None:
    texts = ["?!?!", "wonderful", "😀🎬👍", "Фильм отличный. 素晴らしい。", "Superb film. " * 5000]
    results = pipeline(texts, explain=True)
    assert len(results) == 5
    assert results[-1].truncated and not results[0].truncated
    assert len(results[-1].sentences) == pipeline.saved.segmenter.max_sentences


def test_multi_label_models_return_every_label_over_the_threshold() -> None:
    saved, _ = train_tiny_model(steps=80, multi_label=True)
    (result,) = Pipeline(saved)(["Oil companies and grain traders were hit by higher interest rates."])
    assert sorted(result.labels) == ["crude", "grain", "interest"]
    assert all(0 <= p <= 1 for p in result.scores.values())


def test_with_errors_returned_a_bad_document_gets_an_error_in_its_place(pipeline: Pipeline) -> None:
    cap = pipeline.saved.segmenter.max_chars
    results = pipeline(["Superb.", "", None, "<br />", "Awful.", "<br>" * cap + " Superb."], errors="return")
    assert [type(r).__name__ for r in results] == ["DocumentResult", "DocumentError", "DocumentError",
                                                   "DocumentError", "DocumentResult", "DocumentError"]
    errors = [r for r in results if isinstance(r, DocumentError)]
    assert [(e.index, e.reason) for e in errors] == [
        (1, "the document is empty or whitespace only"),
        (2, "the text is missing (null)"),
        (3, "the document has no words (only whitespace or markup)"),
        (5, f"the document has no word within its first {cap:,} characters, where the model stops reading"),
    ]
    assert [r.label for r in results if not isinstance(r, DocumentError)] == ["pos", "neg"]


def test_top_k_explanations_are_the_heaviest_spans_of_the_full_one(pipeline: Pipeline) -> None:
    text = "Great cast. The story is wonderful! I loved it. Dull ending though."
    (full,) = pipeline([text], explain=True)
    (top,) = pipeline([text], explain=True, top=TopK(sentences=2, words=3))
    assert top.sentences is None and full.top_words is None
    assert top.scores == full.scores
    by_weight = sorted(full.sentences, key=lambda s: -s.weight)
    assert [(s.start, s.end) for s in top.top_sentences] == [(s.start, s.end) for s in by_weight[:2]]
    assert all(s.words is None for s in top.top_sentences)
    doc_words = sorted(((s.weight * w.weight, w.start) for s in full.sentences for w in s.words), reverse=True)
    assert [w.start for w in top.top_words] == [start for _, start in doc_words[:3]]
    for word, (weight, _) in zip(top.top_words, doc_words, strict=False):
        assert abs(word.weight - weight) < 1e-5
        assert text[word.start : word.end] == word.text


def test_progress_hears_every_document_of_each_stage_and_changes_nothing(pipeline: Pipeline) -> None:
    """What evaluation's progress bar is fed: segmenting, then classifying, each counting every document
    once; the results and logits are those of the same call without it (the batches are the same)."""
    texts = [("Superb acting, a wonderful film. " * (n % 5 + 1)) if n % 2 else "Awful. Boring. " * (n % 3 + 1)
             for n in range(300)]  # more than one report's worth of segmented documents (256)
    heard: list[tuple[str, int]] = []
    results, logits = pipeline.with_logits(texts, lambda stage, n: heard.append((stage, n)))
    plain, plain_logits = pipeline.with_logits(texts)
    assert results == plain and (logits == plain_logits).all()
    stages = [stage for stage, _ in heard]
    assert stages == ["segment"] * stages.count("segment") + ["classify"] * stages.count("classify")
    assert stages.count("segment") == 2 and stages.count("classify") == 100  # batches of 3
    assert sum(n for stage, n in heard if stage == "segment") == sum(n for stage, n in heard if stage == "classify")
    assert sum(n for stage, n in heard if stage == "segment") == len(texts)


def test_released_caches_are_emptied_and_rebuilt_with_the_same_results(tiny_model_dir: Path) -> None:
    """What a serving worker drops when idle: the word ids, the segmenter's vocabulary and tokenizer
    cache. Afterwards they start again from a fresh segmenter's state, and every output is the same."""
    pipeline = Pipeline(SavedModel.load(tiny_model_dir))
    at_start = len(pipeline.segmenter.nlp.vocab.strings)
    texts = ["A quiet zyxwvut film. Gripping and oddly moving qwertzuiop.", "Dull, long; I left early."]
    before = [asdict(r) for r in pipeline(texts, explain=True)]
    assert pipeline._ids and len(pipeline.segmenter.nlp.vocab.strings) > at_start
    old_segmenter = pipeline.segmenter

    pipeline.release_caches()
    assert not pipeline._ids
    assert pipeline.segmenter is not old_segmenter
    assert len(pipeline.segmenter.nlp.vocab.strings) == at_start
    assert [asdict(r) for r in pipeline(texts, explain=True)] == before


def test_a_long_input_is_read_a_window_at_a_time_with_the_same_results(pipeline: Pipeline, monkeypatch) -> None:
    """Evaluating a large split segments and classifies a window of documents at a time (its memory is a
    window's, not the split's): results, logits, vectors, profiles and error positions are those of one
    window over the whole input."""
    import numpy as np

    from han import pipeline as module

    texts = [("Superb acting. " * (n % 4 + 1)) if n % 3 else "Awful. Boring. " * (n % 2 + 1) for n in range(23)]
    texts[9], texts[17] = "", "<br />"
    whole = pipeline(texts, errors="return", explain=True, profiles=(whole_profiles := []))
    _, whole_vectors = pipeline.with_vectors(texts)
    good = [t for t in texts if t.strip() and t != "<br />"]
    _, whole_logits = pipeline.with_logits(good)
    monkeypatch.setattr(module, "WINDOW", 5)
    segmented: list[int] = []
    segment = pipeline.segment
    monkeypatch.setattr(pipeline, "segment", lambda batch: segmented.append(len(batch)) or segment(batch))
    windowed = pipeline(texts, errors="return", explain=True, profiles=(windowed_profiles := []))
    assert segmented == [5, 4, 5, 5, 3], "a window at a time (the empty document 9 left out before segmenting)"
    assert [(e.index, e.reason) for e in windowed if isinstance(e, DocumentError)] == [
        (9, "the document is empty or whitespace only"), (17, "the document has no words (only whitespace or markup)")]
    for a, b in zip(windowed, whole, strict=True):  # batched with other documents: equal up to float sums
        if isinstance(b, DocumentError):
            assert a == b
            continue
        assert a.label == b.label and [s.text for s in a.sentences] == [s.text for s in b.sentences]
        assert np.allclose([a.scores[k] for k in b.scores], list(b.scores.values()), atol=1e-5)
        assert np.allclose([s.weight for s in a.sentences], [s.weight for s in b.sentences], atol=1e-5)
    assert windowed_profiles == whole_profiles and len(windowed_profiles) == 23
    _, vectors = pipeline.with_vectors(texts)
    _, logits = pipeline.with_logits(good)
    assert np.allclose(vectors, whole_vectors, atol=1e-6) and not vectors[9].any()
    assert np.allclose(logits, whole_logits, atol=1e-6)
    with pytest.raises(InvalidDocumentError, match="document 7: the document has no words"):
        pipeline(texts[10:])  # the bad document 7 of this input, found in its second window


def test_a_window_is_encoded_as_each_document_alone(tiny_model_dir: Path, monkeypatch) -> None:
    """``encode_many`` looks each distinct word of a window up once: the ids of each word's key in the
    vocabulary, as ``encode`` gives them document by document, unknown words, words in several documents
    and a word-id cache emptied midway included."""
    import numpy as np

    from han import pipeline as module

    texts = ["A wonderful film. The film was wonderful, truly.", "Zyxwvut qwertzuiop! A film? FILM.",
             "Awful and boring. Hated it.", "One.", "wonderful wonderful zyxwvut"]
    alone = Pipeline(SavedModel.load(tiny_model_dir))
    vocab = alone.saved.vocab
    expected = [(np.array([vocab.stoi.get(key, vocab.unk_id) for keys in s.token_keys for key in keys]), s.lengths)
                for s in alone.segment(texts)]
    assert [alone.encode(s)[0].tolist() for s in alone.segment(texts)] == [ids.tolist() for ids, _ in expected]
    assert any((ids == vocab.unk_id).any() for ids, _ in expected)  # unknown words in the test
    for cache_size in (25_000, 2):  # 2: the cache is emptied while a window is encoded
        monkeypatch.setattr(module, "WORD_ID_CACHE", cache_size)
        together = Pipeline(SavedModel.load(tiny_model_dir))
        for _ in range(2):  # from an empty cache, then a full one
            got = together.encode_many(together.segment(texts))
            assert len(got) == len(expected)
            for (ids, lengths), (want_ids, want_lengths) in zip(got, expected, strict=True):
                assert ids.dtype == np.int64 and ids.tolist() == want_ids.tolist()
                assert lengths.tolist() == want_lengths.tolist()
    assert together.encode_many([]) == []
