"""The n-gram head (han.ngrams): scikit-learn's TF-IDF + logistic regression recomputed from plain
arrays, saved with the model, averaged with the HAN by the one inference path, and chosen on validation."""

from __future__ import annotations

import json
import re
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from han import Pipeline, SavedModel
from han.ngrams import TOKEN, TOKEN_BEFORE_UNSPACED, NgramHasher, NgramHead
from han.pipeline import TopK
from han.saved_model import ModelDirectoryError
from tests.tiny_model import read_jsonl
from training.baseline import train_baseline
from training.ngram_head import choose_head, head_from_baseline

REVIEWS = Path(__file__).resolve().parent.parent / "data" / "fixtures" / "reviews.jsonl"

ODD = ["", "   ", "Ünïcödé naïve café — déjà vu", "a b c", "x" * 5000, "don't stop; DON'T STOP!!! 42 42 42",
       "tab\tseparated\nlines\r\nand <br /> markup", "数字 123 和 中文"]


def _corpus(shared_datasets: Path, name: str, n: int) -> tuple[list[str], np.ndarray, list[str]]:
    table = pq.read_table(shared_datasets / name / "train.parquet").to_pandas().sample(n, random_state=0)
    labels = sorted(set(table.label))
    return table.text.tolist(), np.array([labels.index(v) for v in table.label]), labels


@pytest.mark.parametrize(("name", "buckets"),
                         [("imdb", 0), ("20newsgroups", 0), ("imdb", 2**20), ("20newsgroups", 2**12)])
def test_the_head_computes_what_scikit_learn_computes(shared_datasets: Path, name: str, buckets: int) -> None:
    texts, targets, labels = _corpus(shared_datasets, name, 700)
    baseline = train_baseline(texts[:400], targets[:400], multi_label=False, buckets=buckets)
    head = head_from_baseline(baseline, len(labels))
    assert head.buckets == buckets
    assert head.size == (baseline.vectorizer.size if buckets else len(baseline.vectorizer.vocabulary_))
    if buckets == 2**12:  # more n-grams than buckets: the head's table is the buckets, whatever the corpus
        assert head.size <= buckets and int(head.keys.max()) < buckets
    if buckets:  # the fitted regression keeps one [labels, buckets] table, not SGD's three
        arrays = [v for v in vars(baseline.classifier).values() if isinstance(v, np.ndarray)]
        assert sum(a.nbytes for a in arrays) < 1.5 * baseline.classifier.coef_.nbytes
        assert not baseline.classifier.models_
    scored = texts[400:] + ODD
    expected = baseline.classifier.predict_proba(baseline.vectorizer.transform(scored))
    full = np.zeros((len(scored), len(labels)))
    full[:, baseline.classifier.classes_] = expected
    np.testing.assert_allclose(head.probabilities(scored), full, atol=1e-9)
    # the explanation's n-gram weights are the logit, term by term (the batched logits, one document at a time)
    logits = head.logits(scored[:20])
    for text, row in zip(scored[:20], logits, strict=True):
        for label in range(len(labels)):
            terms = sum(n.weight for n in head.evidence(text, label, top=10**9))
            assert terms + head.intercept[label] == pytest.approx(row[label], abs=1e-4)
    # read in chunks for a whole call, the evidence is each document's own, and its n-grams are the text's
    reading = head.read(scored, evidence=True, chunk=7)
    np.testing.assert_allclose(reading.probs, full, atol=1e-9)
    for k, text in enumerate(scored):
        words = TOKEN.findall(text.lower())
        grams = set(words) | {f"{a} {b}" for a, b in pairwise(words)}
        for label in range(len(labels)):
            evidence = head.evidence_of(reading, k, label)
            assert evidence == head.evidence(text, label)
            assert len(evidence) == min(5, len({n.text for n in head.evidence(text, label, top=10**9)}))
            assert all(n.text in grams for n in evidence)


@pytest.mark.parametrize("buckets", [0, 2**16])
def test_a_multi_label_head_computes_what_one_vs_rest_computes(shared_datasets: Path, buckets: int) -> None:
    table = pq.read_table(shared_datasets / "reuters21578" / "train.parquet").to_pandas().sample(900, random_state=0)
    labels = sorted({label for row in table.labels for label in row})
    targets = np.array([[label in row for label in labels] for row in table.labels], dtype=int)
    texts = table.text.tolist()
    baseline = train_baseline(texts[:600], targets[:600], multi_label=True, buckets=buckets)
    if not buckets:  # labels none of 600 has
        assert sum(not hasattr(e, "coef_") for e in baseline.classifier.estimators_) > 0
    head = head_from_baseline(baseline, len(labels))
    scored = texts[600:] + ODD
    expected = baseline.classifier.predict_proba(baseline.vectorizer.transform(scored))
    np.testing.assert_allclose(head.probabilities(scored), expected, atol=1e-9)
    # a text with no known n-gram is unlikely to have a rare label (the streamed fit once left rare labels'
    # intercepts at -0.7: probability 0.34, and every such label at a threshold of 0.25)
    rare = targets[:600].sum(0) <= 2
    assert rare.sum() > 10 and head.probabilities([""])[0, rare].max() < 0.05
    valid, truth = texts[600:], targets[600:]
    noise = np.random.default_rng(0).random((len(valid), len(labels))) * 0.6
    kept, summary = choose_head(baseline, noise, valid, truth)
    assert kept is not None and kept.multi_label and summary["validation_micro_f1"]["averaged"] > 0.5
    assert 0.05 <= summary["threshold"] <= 0.95 and summary["han_share"] < 0.5


def test_a_label_no_training_document_has_gets_probability_zero(shared_datasets: Path) -> None:
    texts, targets, labels = _corpus(shared_datasets, "20newsgroups", 300)
    keep = targets != 3
    baseline = train_baseline([t for t, k in zip(texts, keep, strict=True) if k], targets[keep], multi_label=False)
    probs = head_from_baseline(baseline, len(labels)).probabilities(texts[:50])
    assert probs.shape == (50, len(labels)) and np.all(probs[:, 3] < 1e-12)
    np.testing.assert_allclose(probs.sum(1), 1.0)


@pytest.mark.parametrize("buckets", [0, 2**20])
def test_the_head_survives_saving_with_the_model(tmp_path: Path, tiny_model_dir: Path, buckets: int) -> None:
    rows = read_jsonl("reviews.jsonl")
    saved = SavedModel.load(tiny_model_dir)
    targets = np.array([saved.labels.index(r["label"]) for r in rows])
    texts = [r["text"] for r in rows]
    saved.ngrams = head_from_baseline(train_baseline(texts, targets, multi_label=False, buckets=buckets),
                                      len(saved.labels), 0.25)
    expected = saved.ngrams.probabilities(texts)
    loaded = SavedModel.load(saved.save(tmp_path / "model"))
    assert loaded.ngrams is not None and loaded.ngrams.han_share == 0.25 and loaded.ngrams.buckets == buckets
    assert json.loads((tmp_path / "model" / "config.json").read_text())["ngram_head"]["ngrams"] == saved.ngrams.size
    # float32 on disk; the arrays must come back in their order (a column-indexed copy is Fortran-ordered)
    np.testing.assert_allclose(loaded.ngrams.probabilities(texts), expected, atol=1e-5)
    # the one inference path averages: han_share of the HAN's calibrated probabilities, the rest the head's
    plain = Pipeline(SavedModel.load(tiny_model_dir))(texts)
    alone = np.array([[r.scores[label] for label in saved.labels] for r in plain])
    results = Pipeline(loaded)(texts, explain=True, top=TopK(words=3))
    mixed = np.array([[r.scores[label] for label in saved.labels] for r in results])
    np.testing.assert_allclose(mixed, 0.25 * alone + 0.75 * expected, atol=2e-5)
    for text, result in zip(texts, results, strict=True):
        label = saved.labels.index(result.label)
        assert result.top_ngrams == loaded.ngrams.evidence(text, label) and len(result.top_ngrams) == 5
        # a 2-gram's words may stand either side of punctuation
        assert all(word in text.lower() for n in result.top_ngrams for word in n.text.split())
        weights = [abs(n.weight) for n in result.top_ngrams]
        assert weights == sorted(weights, reverse=True) and weights[0] > 0
    assert Pipeline(loaded)(texts[:1])[0].top_ngrams is None  # no explanation asked: none
    assert Pipeline(SavedModel.load(tiny_model_dir))(texts[:1], explain=True)[0].top_ngrams is None  # no head
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(tmp_path / "model" / NgramHead.FILE))
    save_file({**arrays, "buckets": np.zeros(0, dtype=np.int64)}, str(tmp_path / "model" / NgramHead.FILE))
    with pytest.raises(ModelDirectoryError, match="ngram_head.safetensors: unreadable n-gram head"):
        SavedModel.load(tmp_path / "model")  # an empty buckets entry: an IndexError traceback before
    (tmp_path / "model" / NgramHead.FILE).unlink()
    with pytest.raises(ModelDirectoryError, match="ngram_head.safetensors: missing"):
        SavedModel.load(tmp_path / "model")
    saved.save(tmp_path / "model")
    saved.ngrams = None  # saving over it without a head removes the file
    SavedModel.load(saved.save(tmp_path / "model"))
    assert not (tmp_path / "model" / NgramHead.FILE).exists()


def test_the_share_is_chosen_on_validation(shared_datasets: Path) -> None:
    texts, targets, labels = _corpus(shared_datasets, "20newsgroups", 600)
    baseline = train_baseline(texts[:400], targets[:400], multi_label=False)
    valid, truth = texts[400:], targets[400:]
    perfect = np.eye(len(labels))[truth] * 0.9 + 0.1 / len(labels)
    head, summary = choose_head(baseline, perfect, valid, truth)
    assert head is None and summary["han_share"] == 1.0 and summary["validation_accuracy"]["han"] == 1.0
    noise = np.random.default_rng(0).dirichlet(np.ones(len(labels)), size=len(valid))
    head, summary = choose_head(baseline, noise, valid, truth)
    assert head is not None and head.han_share == summary["han_share"] < 0.5
    shown = summary["validation_accuracy"]
    assert shown["averaged"] >= max(shown["han"], shown["ngrams"]) and shown["ngrams"] > shown["han"]
    mixed = head.mix(noise, head.probabilities(valid))
    assert round(float((mixed.argmax(1) == truth).mean()), 4) == shown["averaged"]
    # the head is averaged calibrated: its temperature, fitted on validation, is folded into its weights
    raw = head_from_baseline(baseline, len(labels))
    t = summary["head_temperature"]
    assert t != 1.0 and np.allclose(head.logits(valid), raw.logits(valid) / t, atol=1e-3 / t)
    nll = [-np.log(p[np.arange(len(truth)), truth]).mean()
           for p in (raw.probabilities(valid), head.probabilities(valid))]
    assert nll[1] < nll[0]


@pytest.mark.parametrize("buckets", [0, 2**18])
def test_a_fit_keeps_the_head_when_it_helps_and_test_and_predict_use_it(tmp_path: Path, buckets: int,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """One epoch at a tiny learning rate leaves the HAN near chance on the smoke reviews, which the
    baseline (trained on them, the smoke run's validation split too) gets right: the head is kept,
    with the vocabulary or hashed (``--export.ngram_buckets``)."""
    import logging

    from tests.test_training import SMOKE, fit, rows
    from training.cli import main

    caplog.set_level(logging.INFO)
    weak = ("--trainer.max_epochs", "1", "--model.lr", "0.0001", "--export.faithfulness", "0",
            "--export.ngram_buckets", str(buckets))
    root = fit(tmp_path, *weak)
    saved = SavedModel.load(root / "model")
    head = saved.metadata["ngram_head"]
    assert saved.ngrams is not None and saved.ngrams.han_share == head["han_share"] < 1
    assert saved.ngrams.buckets == head["buckets"] == buckets and head["megabytes"] >= 0
    assert head["validation_accuracy"]["averaged"] == 1.0 > head["validation_accuracy"]["han"]
    assert "n-gram head kept: scores are" in caplog.text and "the HAN alone: accuracy" in caplog.text
    test = saved.metadata["metrics"]["test"]
    assert test["accuracy"] == 1.0 > test["han_alone_accuracy"]
    metrics = json.loads((root / "report" / "test" / "metrics.json").read_text())
    assert metrics["han_alone"]["accuracy"] == test["han_alone_accuracy"]
    # predict scores with the model as exported: the same head, the same share
    main(["predict", "--config", SMOKE, "--trainer.default_root_dir", str(root), "--data.cache_dir",
          str(tmp_path / "cache"), "--ckpt_path", saved.metadata["checkpoint"], *weak])
    predicted = [line["scores"] for line in rows(root / "predictions" / "test.jsonl")]
    expected = Pipeline(saved)([r["text"] for r in rows(REVIEWS)])
    assert [p["pos"] for p in predicted] == pytest.approx([r.scores["pos"] for r in expected], abs=1e-5)
    (root / "report" / "test" / "metrics.json").unlink()
    main(["test", "--config", SMOKE, "--trainer.default_root_dir", str(root), "--data.cache_dir",
          str(tmp_path / "cache"), "--ckpt_path", saved.metadata["checkpoint"], *weak])
    assert json.loads((root / "report" / "test" / "metrics.json").read_text())["han_alone"] == metrics["han_alone"]
    # --export.ngram_head false: test_training's EMA and threshold tests, whose weak HANs a head would rescue


def test_a_multi_label_fit_decides_at_the_threshold_chosen_with_the_share(tmp_path: Path) -> None:
    from tests.test_training import TOPICS, fit, rows
    from training.report import evaluate

    root = fit(tmp_path, "--data.label_column", "labels", "--data.multi_label", "true", "--trainer.max_epochs", "1",
               "--model.lr", "0.0001", "--export.faithfulness", "0", data=TOPICS)
    saved = SavedModel.load(root / "model")
    head = saved.metadata["ngram_head"]
    assert saved.ngrams is not None and saved.ngrams.multi_label and saved.ngrams.han_share < 1
    seen = head["validation_micro_f1"]
    assert saved.threshold == head["threshold"] and seen["averaged"] > seen["han"]
    truth = np.array([[label in r["labels"] for label in saved.labels] for r in rows(TOPICS)])
    report = evaluate(Pipeline(saved), [r["text"] for r in rows(TOPICS)], truth)
    micro_f1 = saved.metadata["metrics"]["test"]["micro_f1"]
    assert micro_f1 == round(report["micro_f1"], 4) > report["han_alone"]["micro_f1"]


def test_a_signed_explanation_explains_the_averaged_label_and_the_head_reads_what_the_han_reads(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    saved = SavedModel.load(tiny_model_dir)
    rows_ = read_jsonl("reviews.jsonl")
    texts = [r["text"] for r in rows_]
    flipped = np.array([1 - saved.labels.index(r["label"]) for r in rows_])  # a head that says the opposite
    saved.ngrams = head_from_baseline(train_baseline(texts, flipped, multi_label=False), len(saved.labels), 0.05)
    mixed, alone = Pipeline(saved), Pipeline(SavedModel.load(tiny_model_dir))
    with_head = mixed(texts, explain="attention_gradient")
    without = alone(texts, explain="attention_gradient")
    differ = [k for k in range(len(texts)) if with_head[k].label != without[k].label]
    assert len(differ) >= len(texts) // 2
    for k in differ:  # binary: the gradient of p(the other label) is the opposite of p(the HAN's label)'s
        got = [w.weight for s in with_head[k].sentences for w in s.words]
        assert got == pytest.approx([-w.weight for s in without[k].sentences for w in s.words], abs=1e-5)
    cap = saved.segmenter.max_chars
    long = texts[0] + " " * (cap - len(texts[0])) + " awful terrible dull" * 2000  # past the HAN's cut
    assert mixed([long])[0].scores == mixed([long[:cap]])[0].scores and mixed([long])[0].truncated


def test_unspaced_scripts_are_read_by_character_and_other_text_as_before(tmp_path: Path) -> None:
    """Chinese, Japanese and Thai have no spaces between words: their characters are the tokens, so a new
    sentence shares 1-2 grams with the training text; any other text gives scikit-learn's default tokens, and
    a head saved before (no ``tokens`` entry) reads as it did."""
    assert TOKEN.findall("我喜欢这部电影，真好看！") == list("我喜欢这部电影真好看")
    assert TOKEN.findall("東京タワーでbig tower 見た") == [*"東京タワーで", "big", "tower", *"見た"]
    for row in read_jsonl("reviews.jsonl") + [{"text": t} for t in ODD if not re.search("[\u4e00-\u9fff]", t)]:
        assert TOKEN.findall(row["text"].lower()) == TOKEN_BEFORE_UNSPACED.findall(row["text"].lower())
    texts = ["这部电影很好看", "演员的表演很精彩", "故事太无聊了", "这部电影很难看", "剧情拖沓无聊",
             "表演很精彩好看"] * 3
    targets = np.array([1, 1, 0, 0, 0, 1] * 3)
    head = head_from_baseline(train_baseline(texts, targets, multi_label=False), 2)
    new = "这个故事很无聊"  # no clause of it was seen whole, its characters and pairs were
    baseline = train_baseline(texts, targets, multi_label=False)
    np.testing.assert_allclose(head.probabilities([new]), baseline.classifier.predict_proba(
        baseline.vectorizer.transform([new])), atol=1e-9)
    assert {n.text for n in head.evidence(new, 0, top=10**9)} >= {"无", "聊", "无 聊"}
    head.save(tmp_path)
    assert NgramHead.load(tmp_path, 0.5, False).hasher.pattern is TOKEN
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(tmp_path / NgramHead.FILE))
    del arrays["tokens"]  # as a head saved before
    save_file(arrays, str(tmp_path / NgramHead.FILE))
    assert NgramHead.load(tmp_path, 0.5, False).hasher.pattern is TOKEN_BEFORE_UNSPACED
    assert NgramHasher(tokens=1).tokens(new)[0] == ["这个故事很无聊"]
