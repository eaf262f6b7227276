"""Faithfulness measures give the known answer on a hand-made model that reads one word."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from han import HAN, HANConfig, Pipeline, SavedModel, SegmenterConfig, Vocabulary
from han.faithfulness import GROUP, K_PERCENT, MIN_DOCUMENTS, evaluate_faithfulness, ratio_interval, sentence_drops
from training.faithfulness_report import faithfulness_report

WORDS = ["plot", "film", "acting", "story", "long", "music", "scene", "cast"]


def one_word_model(word: str = "superb") -> SavedModel:
    """A HAN that says "pos" exactly when ``word`` occurs: only that word has an embedding, the GRUs
    keep no memory (update gate shut), and both attentions put all their weight on a non-zero state."""
    vocab = Vocabulary([word, *WORDS])
    config = HANConfig(
        vocab_size=len(vocab),
        num_labels=2,
        embed_dim=4,
        word_hidden=4,
        sentence_hidden=4,
        attention_dim=4,
        dropout=0.0,
        word_dropout=0.0,
    )
    model = HAN(config)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embedding.weight[vocab.stoi[word], 0] = 3.0
        for rnn in (model.word_rnn, model.sentence_rnn):
            for gru in (rnn.forward_rnn, rnn.backward_rnn):
                gru.bias_ih_l0[4:8] = -30.0  # update gate z = 0: h_t = n_t, no memory
                gru.weight_ih_l0[8, 0] = 3.0  # candidate n_t = tanh(3 x_t[0])
        for attention in (model.word_attention, model.sentence_attention):
            attention.proj.weight[0, 0] = 10.0
            attention.context[0] = 20.0
        model.head.weight[1, 0] = 8.0
        model.head.weight[0, 0] = -8.0
        model.head.bias.copy_(torch.tensor([2.0, -2.0]))
    return SavedModel(model.eval(), vocab, ["neg", "pos"], SegmenterConfig(max_sentences=10, max_words=30))


def test_the_hand_made_model_reads_only_its_word() -> None:
    pipeline = Pipeline(one_word_model())
    with_word, without = pipeline(["The plot was long. The acting was superb, the music too.", "The plot was long."])
    assert with_word.label == "pos" and with_word.scores["pos"] > 0.99
    assert without.label == "neg" and without.scores["pos"] < 0.03


def test_attention_finds_the_word_and_scores_what_removing_it_does() -> None:
    pipeline = Pipeline(one_word_model())
    texts = [
        "The plot was long and the film was long. The acting was superb. The music, the scene, the cast.",
        "Superb. The story was long, the film was long, the plot was long, the cast was long.",
        "The film. The plot. The story. The superb acting. The music. The scene.",
    ]
    p = [r.scores["pos"] for r in pipeline(texts)]
    gap = sum(p) / len(p) - pipeline(["The plot was long."])[0].scores["pos"]
    result = evaluate_faithfulness(pipeline, texts, methods=["attention"], tau_documents=0)
    attention, random = result["methods"]["attention"], result["methods"]["random"]
    # The word is ranked first, so removing even the top 1% removes it; keeping only it keeps the label.
    assert attention["comprehensiveness"] == pytest.approx([gap] * len(K_PERCENT), abs=1e-3)
    assert attention["sufficiency"] == pytest.approx([0.0] * len(K_PERCENT), abs=1e-3)
    assert attention["top1_sentence_drop"] == pytest.approx(gap, abs=1e-3)
    assert attention["top1_sentence_flip_rate"] == 1.0
    # A random order finds it late: at 50% it has removed it in about half the documents at most.
    assert (
        random["comprehensiveness"][0] < 0.1 and random["comprehensiveness_aopc"] < attention["comprehensiveness_aopc"]
    )
    assert random["sufficiency_aopc"] > 0.3
    # Each measure also comes as a ratio to random's (with no interval on three documents: too few).
    ratio = attention["x_random"]["top1_sentence_drop"]
    assert ratio["ratio"] == pytest.approx(attention["top1_sentence_drop"] / random["top1_sentence_drop"])
    assert ratio["interval"] is None and ratio["confidence"] == 0.95
    assert set(attention["x_random"]) == {"comprehensiveness_aopc", "sufficiency_aopc", "top1_sentence_drop",
                                          "top3_sentence_drop"}
    assert "x_random" not in random


def test_the_random_rankings_sentence_deletion_is_its_expectation_not_one_draw() -> None:
    """Removing a random sentence removes the word's sentence with probability 1/n: the random baseline's
    drop and flip rate are exactly that expectation (one draw per document made them too noisy to divide by)."""
    pipeline = Pipeline(one_word_model())
    texts = [
        "The plot was long and the film was long. The acting was superb. The music, the scene, the cast.",
        "Superb. The story was long, the film was long, the plot was long, the cast was long.",
        "The film. The plot. The story. The superb acting. The music. The scene.",
    ]
    sentences = [3, 2, 6]
    assert [len(s.lengths) for s in pipeline.segment(texts)] == sentences
    p = [r.scores["pos"] for r in pipeline(texts)]
    p_without = pipeline(["The plot was long."])[0].scores["pos"]
    result = evaluate_faithfulness(pipeline, texts, methods=["attention"], tau_documents=0)
    random = result["methods"]["random"]
    expected = sum((pd - p_without) / n for pd, n in zip(p, sentences, strict=True)) / len(texts)
    assert random["top1_sentence_drop"] == pytest.approx(expected, abs=1e-4)
    assert random["top1_sentence_flip_rate"] == pytest.approx((1 / 3 + 1 / 2 + 1 / 6) / 3)
    assert result["sentences_per_document"] == pytest.approx({"mean": 11 / 3, "harmonic_mean": 3.0})
    # Removing three sentences removes all of the first two texts; of the six, every 3-set, half with the word.
    assert random["top3_sentence_flip_rate"] == pytest.approx((1 + 1 + 0.5) / 3)


def test_sentence_drops_are_what_removing_each_sentence_alone_does() -> None:
    """Only the word's sentence moves the one-word model: removing it costs the whole gap, any other nothing."""
    pipeline = Pipeline(one_word_model())
    texts = ["The plot was long. The acting was superb. The music was long.", "The film. The superb cast."]
    p = [r.scores["pos"] for r in pipeline(texts)]
    p_without = pipeline(["The plot was long."])[0].scores["pos"]
    drops, p_predicted = sentence_drops(pipeline, texts)
    assert p_predicted.tolist() == pytest.approx(p, abs=1e-6)
    assert [d.tolist() for d in drops] == [
        pytest.approx([0.0, p[0] - p_without, 0.0], abs=1e-4),
        pytest.approx([0.0, p[1] - p_without], abs=1e-4),
    ]


def test_ratio_interval_is_exact_where_every_document_agrees_and_none_where_it_cannot_be_trusted() -> None:
    rng = np.random.default_rng(0)
    baseline = rng.uniform(0.01, 0.2, size=50)
    exact = ratio_interval(7 * baseline, baseline, rng)
    assert exact["ratio"] == pytest.approx(7.0) and exact["interval"] == pytest.approx([7.0, 7.0])
    assert ratio_interval(baseline, np.zeros(50), rng)["ratio"] is None
    few = ratio_interval(7 * baseline[:19], baseline[:19], rng)  # too few documents for a percentile interval
    assert few["ratio"] == pytest.approx(7.0) and few["interval"] is None
    # One document in 20 carries the whole baseline: some resample leaves it out, so no upper end exists.
    lone = ratio_interval(np.ones(20), np.eye(20)[0], rng)
    assert lone["ratio"] == pytest.approx(20.0) and lone["interval"] is None


def test_ratio_interval_covers_the_true_ratio_about_as_often_as_it_says() -> None:
    """Samples of 200 documents whose top drop is n times their random drop, n from 2 to 20 (as sentence
    counts are), the top drop shrinking with n as on IMDB: the true ratio of means is known. A 95%
    percentile interval covers it in about 93% of samples here (the ratio is skewed); a 90% interval
    (0.89) or one that resamples the two means apart (0.99) falls outside the bounds."""
    rng = np.random.default_rng(1)
    n = np.arange(2, 21)
    top_mean = 0.3 / np.sqrt(n)
    truth = top_mean.sum() / (top_mean / n).sum()
    covered, widths = 0, []
    for _ in range(1000):
        counts = rng.choice(n, size=200)
        top = rng.gamma(4.0, top_mean[counts - 2] / 4)
        random = top / counts * rng.uniform(0.8, 1.2, size=200)
        low, high = ratio_interval(top, random, rng, resamples=400)["interval"]
        covered += low <= truth <= high
        widths.append(high - low)
    assert 0.91 <= covered / 1000 <= 0.975
    assert 0.5 < np.median(widths) < truth  # an interval, neither a point nor everything


def reviews(n: int) -> list[str]:
    """``n`` documents of one to five sentences of WORDS; every other one has the word in one sentence."""
    rng = np.random.default_rng(7)
    texts = []
    for i in range(n):
        sentences = [" ".join(rng.choice(WORDS, size=rng.integers(3, 8))) for _ in range(rng.integers(1, 6))]
        if i % 2:
            sentences[rng.integers(len(sentences))] = "the acting was superb"
        texts.append(" ".join(f"{s.capitalize()}." for s in sentences))
    return texts


def numbers(value: object, path: str = "") -> dict[str, float | None]:
    """Every number of a nested result, by its path: to compare two results key by key."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in numbers(item, f"{path}/{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in numbers(item, f"{path}/{i}").items()}
    return {path: value} if value is None or isinstance(value, int | float) else {}


def test_a_spent_budget_stops_after_the_minimum_and_says_so() -> None:
    pipeline = Pipeline(one_word_model())
    texts = reviews(45)
    groups: list[int] = []
    result = evaluate_faithfulness(pipeline, texts, tau_documents=50, budget_seconds=1e-9, progress=groups.append)
    assert result["documents"] == MIN_DOCUMENTS == sum(groups) and max(groups) <= GROUP
    assert (result["stopped_by"], result["offered"], result["budget_seconds"]) == ("budget", 45, 1e-9)
    assert result["kendall_tau"]["documents"] == MIN_DOCUMENTS  # the Kendall tau part is cut with the rest
    assert result["methods"]["occlusion"]["x_random"]["top1_sentence_drop"]["interval"] is not None  # the minimum's use
    # Without a budget every document offered is measured; with fewer than the minimum, all of them.
    everything = evaluate_faithfulness(pipeline, texts, methods=["attention"], tau_documents=0, progress=groups.append)
    assert (everything["documents"], everything["stopped_by"], sum(groups)) == (45, "count", 20 + 45)
    few = evaluate_faithfulness(pipeline, texts[:7], methods=["attention"], tau_documents=0, budget_seconds=1e-9)
    assert (few["documents"], few["stopped_by"]) == (7, "count")


def test_a_budget_cut_result_is_exactly_the_measure_of_the_documents_it_counts(tmp_path: Path) -> None:
    """Cut short by its budget, the result is the full measurement of its first ``documents`` texts, and
    no more: each document's random draws are its own, so the documents left out change nothing. The
    report (faithfulness.json, the summary) counts the same documents, from its random sample's start."""
    pipeline = Pipeline(one_word_model())
    texts = reviews(45)
    cut = evaluate_faithfulness(pipeline, texts, tau_documents=50, budget_seconds=1e-9)
    alone = evaluate_faithfulness(pipeline, texts[: cut["documents"]], tau_documents=50)
    assert alone["stopped_by"] == "count"
    same = {key for key in numbers(cut) if key not in ("/offered", "/stopped_by", "/budget_seconds", "/seconds")}
    assert {k: numbers(cut)[k] for k in same} == pytest.approx({k: numbers(alone)[k] for k in same}, abs=1e-9)

    groups: list[int] = []
    summary = faithfulness_report(pipeline, texts, 30, 50, tmp_path, "cut", budget_seconds=1e-9,
                                  progress=groups.append)
    written = json.loads((tmp_path / "faithfulness.json").read_text())
    assert summary["documents"] == written["documents"] == written["kendall_tau"]["documents"] == sum(groups) == 20
    assert (summary["offered"], summary["stopped_by"], written["stopped_by"]) == (30, "budget", "budget")
    sample = [texts[i] for i in np.random.default_rng(0).choice(len(texts), size=30, replace=False)]  # the report's
    counts = [len(s.lengths) for s in pipeline.segment(sample)]
    assert written["sentences_per_document"]["mean"] == pytest.approx(np.mean(counts[:20]))
    assert np.mean(counts[:20]) != pytest.approx(np.mean(counts))  # so the line above tells them apart
