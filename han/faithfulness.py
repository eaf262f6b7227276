"""How far to trust an explanation: does removing what it points at change the prediction (p, the
probability of the predicted label)? Each method's ranking of words and sentences against a random one:

* comprehensiveness and sufficiency at k% (ERASER, DeYoung et al. 2020): p minus p without the top k% of
  words, and with only them; averaged over k = 1, 5, 10, 20, 50% into an AOPC;
* sentence deletion: the drop in p, and how often the label flips, without the top 1 or 3 sentences;
* Kendall tau of a method's word weights against leave-one-word-out (Jain & Wallace 2019);

each also as a ratio to the random ranking's ("x random") with a bootstrap interval over the documents,
and with the sentence counts, which set the top-1 ratio's scale (a random one of n sentences is the top
one with probability 1/n). It runs on token ids through the pipeline's own stages, a few documents at a
time, so that a time budget (a share of a fit's time) can end it after any of them.
"""

from __future__ import annotations

import itertools
import math
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from han.methods import METHODS, WITHIN_SENTENCE
from han.pipeline import Encoded, Pipeline
from han.vocab import Vocabulary

K_PERCENT = (1, 5, 10, 20, 50)
RANDOM = "random"
RANDOM_DRAWS = 20  # sentence sets a random ranking's deletion is averaged over, per document
CONFIDENCE = 0.95  # of the bootstrap interval on each "x random" ratio
RESAMPLES = 1000
MIN_DOCUMENTS = 20  # fewer, and no interval is given
GROUP = 10  # documents measured together: a progress step, and how finely a time budget is kept
_DOCUMENT = zlib.crc32(b"document")  # seeds each document's random draws with its position
Document = list[np.ndarray]  # sentences of word ids


def _encode(doc: Document) -> Encoded:
    """A document as the model's flat input; a document with nothing left becomes one unknown word."""
    doc = [s for s in doc if len(s)] or [np.array([Vocabulary.unk_id], dtype=np.int64)]
    return np.concatenate(doc).astype(np.int64), np.array([len(s) for s in doc], dtype=np.int64)


def _scores(pipeline: Pipeline, encoded: Sequence[Encoded]) -> np.ndarray:
    """The label probabilities [documents, labels], through the pipeline's forward and scores stages."""
    probs = np.zeros((len(encoded), len(pipeline.labels)))
    for chunk, output in pipeline.forward(encoded):
        probs[chunk] = pipeline.scores(output.logits)
    return probs


def _probabilities(pipeline: Pipeline, docs: Sequence[Document], labels: np.ndarray) -> np.ndarray:
    """p(labels[i] | docs[i]) for each document."""
    return _scores(pipeline, [_encode(d) for d in docs])[np.arange(len(docs)), labels]


def _split(ids: np.ndarray, lengths: np.ndarray) -> Document:
    return np.split(ids, np.cumsum(lengths)[:-1])


def _keep_words(ids: np.ndarray, lengths: np.ndarray, keep: np.ndarray) -> Document:
    mask = np.zeros(len(ids), dtype=bool)
    mask[keep] = True
    return [s[m] for s, m in zip(_split(ids, lengths), _split(mask, lengths), strict=True)]


def evaluate_faithfulness(
    pipeline: Pipeline,
    texts: Sequence[str],
    methods: Sequence[str] = METHODS,
    tau_documents: int = 50,
    seed: int = 0,
    budget_seconds: float | None = None,
    min_documents: int = MIN_DOCUMENTS,
    progress: Callable[[int], object] | None = None,
) -> dict:
    """The measures above for each method and a random ranking, on ``texts`` (non-empty documents), in
    order, GROUP at a time (``progress`` hears of each group). With ``budget_seconds`` it stops before a
    group that would end past the budget, at its cost per word so far, once ``min_documents`` are
    measured: ``documents`` says how many were (of ``offered``), ``stopped_by`` whether the "budget" or
    the "count" (the end of ``texts``) ended it, ``seconds`` how long it took. Each document's random
    draws come from a stream of its own, so the figures on the first n documents are the same however
    many follow."""
    start = time.monotonic()
    encoded = [pipeline.encode(s) for s in pipeline.segment(list(texts))]
    if not encoded:
        raise ValueError("no documents to measure")
    words = np.array([len(ids) for ids, _ in encoded])
    parts: list[dict] = []
    done, measuring, stopped_by = 0, 0.0, "count"
    while done < len(encoded):
        size = min(GROUP, len(encoded) - done)
        if done < min_documents:
            size = min(size, min_documents - done)
        elif budget_seconds is not None:  # the longest next group that fits, at the cost per word so far
            rate = measuring / max(int(words[:done].sum()), 1)
            ends = time.monotonic() - start + rate * np.cumsum(words[done : done + size])
            size = int(np.searchsorted(ends, budget_seconds, side="right"))
            if not size:
                stopped_by = "budget"
                break
        began = time.monotonic()
        parts.append(_measure(pipeline, encoded[done : done + size], methods, seed, done, tau_documents - done))
        measuring += time.monotonic() - began
        done += size
        if progress is not None:
            progress(size)
    result: dict = {
        "documents": done,
        "offered": len(encoded),
        "stopped_by": stopped_by,
        "budget_seconds": budget_seconds,
        "sentences_per_document": sentence_counts([len(lengths) for _, lengths in encoded[:done]]),
        "k_percent": list(K_PERCENT),
        "methods": {},
    }
    per_document: dict[str, dict[str, np.ndarray]] = {}
    for method in [*methods, RANDOM]:
        measured = {key: np.concatenate([part[method][key] for part in parts], axis=-1) for key in parts[0][method]}
        comp, suff = measured["comprehensiveness"], measured["sufficiency"]  # [k, documents]
        m: dict = {
            "comprehensiveness": comp.mean(1).tolist(),
            "sufficiency": suff.mean(1).tolist(),
            "comprehensiveness_aopc": float(comp.mean()),
            "sufficiency_aopc": float(suff.mean()),
        }
        per_document[method] = {"comprehensiveness_aopc": comp.mean(0), "sufficiency_aopc": suff.mean(0)}
        for top in (1, 3):
            drop, flip = measured[f"top{top}_sentence_drop"], measured[f"top{top}_sentence_flip_rate"]
            per_document[method][f"top{top}_sentence_drop"] = drop
            m[f"top{top}_sentence_drop"], m[f"top{top}_sentence_flip_rate"] = float(drop.mean()), float(flip.mean())
        result["methods"][method] = m
    for method in methods:
        # A stream of its own per method and measure: adding a method leaves the others' intervals alone.
        result["methods"][method]["x_random"] = {
            key: ratio_interval(values, per_document[RANDOM][key], _stream(seed, method, key))
            for key, values in per_document[method].items()
        }
    result["kendall_tau"] = _kendall_tau([part["kendall_tau"] for part in parts])
    result["seconds"] = time.monotonic() - start
    return result


def _measure(
    pipeline: Pipeline, encoded: Sequence[Encoded], methods: Sequence[str], seed: int, offset: int, tau_documents: int
) -> dict:
    """One group's per-document figures, per method: comprehensiveness and sufficiency [k, documents], the
    sentence deletions' drops and flip rates [documents]; and the Kendall taus of its first ``tau_documents``."""
    label, p = _predicted(pipeline, encoded)
    draws = [np.random.default_rng([seed, _DOCUMENT, offset + i]) for i in range(len(encoded))]
    out: dict = {}
    word_weights: dict[str, list[np.ndarray]] = {}
    for method in [*methods, RANDOM]:
        if method == RANDOM:
            word_rank = [rng.permutation(len(ids)) for rng, (ids, _) in zip(draws, encoded, strict=True)]
        else:
            word_weights[method], sentence_weights = _weights(pipeline, encoded, method)
            word_rank = [np.argsort(-w, kind="stable") for w in word_weights[method]]
            sentence_rank = [np.argsort(-w, kind="stable") for w in sentence_weights]
        removed, kept = [], []  # every k's variants, run in one pass: [k * documents]
        for k in K_PERCENT:
            for (ids, lengths), order in zip(encoded, word_rank, strict=True):
                top = order[: max(1, round(len(ids) * k / 100))]
                removed.append(_keep_words(ids, lengths, np.setdiff1d(np.arange(len(ids)), top)))
                kept.append(_keep_words(ids, lengths, top))
        after = _probabilities(pipeline, removed + kept, np.tile(label, 2 * len(K_PERCENT)))
        drops = p - after.reshape(2, len(K_PERCENT), len(p))
        m = out[method] = {"comprehensiveness": drops[0], "sufficiency": drops[1]}
        for top in (1, 3):
            if method == RANDOM:
                removals = [_random_removals(len(n), top, rng) for rng, (_, n) in zip(draws, encoded, strict=True)]
            else:
                removals = [[order[:top]] for order in sentence_rank]
            drop, flip = _sentence_deletion(pipeline, encoded, removals, label, p)
            m[f"top{top}_sentence_drop"], m[f"top{top}_sentence_flip_rate"] = drop, flip
    out["kendall_tau"] = {}
    tau_documents = max(0, min(tau_documents, len(encoded)))
    if tau_documents:  # the methods' word weights as ranked above, against occlusion's
        if "occlusion" in word_weights:
            reference = word_weights["occlusion"]
        else:
            reference = _weights(pipeline, encoded[:tau_documents], "occlusion")[0]
        word_weights[RANDOM] = [draws[i].random(len(encoded[i][0])) for i in range(tau_documents)]
        for method, scores in word_weights.items():
            if method != "occlusion":
                out["kendall_tau"][method] = np.array(
                    [
                        kendalltau(a, b).statistic if len(a) > 1 else np.nan
                        for a, b in zip(scores[:tau_documents], reference[:tau_documents], strict=True)
                    ]
                )
    return out


def _predicted(pipeline: Pipeline, encoded: Sequence[Encoded]) -> tuple[np.ndarray, np.ndarray]:
    """The documents' predicted labels and the probability of each."""
    probs = _scores(pipeline, encoded)
    label = probs.argmax(1)
    return label, probs[np.arange(len(encoded)), label]


def _predict(pipeline: Pipeline, texts: Sequence[str]) -> tuple[list[Encoded], np.ndarray, np.ndarray]:
    """The documents encoded, their predicted labels and the probability of each."""
    encoded = [pipeline.encode(s) for s in pipeline.segment(list(texts))]
    return encoded, *_predicted(pipeline, encoded)


def sentence_counts(counts: Sequence[int] | np.ndarray) -> dict[str, float]:
    """The mean and harmonic mean of the documents' sentence counts (the top-1 ratio's scale)."""
    n = np.asarray(counts, dtype=float)
    return {"mean": float(n.mean()), "harmonic_mean": float(1 / np.mean(1 / n))}


def sentence_drops(pipeline: Pipeline, texts: Sequence[str]) -> tuple[list[np.ndarray], np.ndarray]:
    """Per document: the drop in p(predicted label) when each sentence alone is removed, and p. The largest
    drop is the most any ranking's top-1 sentence deletion can cause, the mean the random ranking's."""
    encoded, label, p = _predict(pipeline, texts)
    removals = [[np.array([j]) for j in range(len(lengths))] for _, lengths in encoded]
    drop, _, _ = _removal_effects(pipeline, encoded, removals, label, p)
    return np.split(drop, np.cumsum([len(lengths) for _, lengths in encoded])[:-1]), p


def ratio_interval(
    values: np.ndarray,
    baseline: np.ndarray,
    rng: np.random.Generator,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
) -> dict[str, Any]:
    """``values``' mean over ``baseline``'s (per-document figures of the same documents), and a paired
    percentile bootstrap interval for it, resampling documents: how far a sample's "x random" can be
    trusted. The ratio is None where the baseline's mean is 0; the interval is None with fewer than
    MIN_DOCUMENTS documents (where percentile intervals cover too little) or where some resample's
    baseline sums to 0 (its upper end is unbounded)."""
    values, baseline = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    out: dict[str, Any] = {"ratio": None, "interval": None, "confidence": confidence}
    if not len(values) or baseline.sum() == 0:
        return out
    out["ratio"] = float(values.sum() / baseline.sum())
    if len(values) < MIN_DOCUMENTS:
        return out
    ratios = []
    for start in range(0, resamples, 100):  # 100 resamples at a time: bounded memory on 25,000 documents
        picks = rng.integers(0, len(values), size=(min(100, resamples - start), len(values)))
        totals = baseline[picks].sum(1)
        if (totals == 0).any():
            return out
        ratios.append(values[picks].sum(1) / totals)
    tail = (1 - confidence) / 2
    out["interval"] = [float(q) for q in np.quantile(np.concatenate(ratios), [tail, 1 - tail])]
    return out


def _stream(seed: int, *names: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(name.encode()) for name in names)])


def _random_removals(n: int, top: int, rng: np.random.Generator, draws: int = RANDOM_DRAWS) -> list[np.ndarray]:
    """The sets of ``top`` sentences a random ranking removes first, to average over: every one of them
    when there are at most ``draws``, else ``draws`` random ones (one draw made the baseline too noisy)."""
    if n <= top:
        return [np.arange(n)]
    if math.comb(n, top) <= draws:
        return [np.array(c) for c in itertools.combinations(range(n), top)]
    return [rng.permutation(n)[:top] for _ in range(draws)]


def _sentence_deletion(
    pipeline: Pipeline,
    encoded: Sequence[Encoded],
    removals: Sequence[Sequence[np.ndarray]],
    label: np.ndarray,
    p: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per document: the drop in p(label), and the share of flipped labels, each averaged over its
    removals (sets of sentence indices)."""
    drop, flipped, owner = _removal_effects(pipeline, encoded, removals, label, p)
    count = np.bincount(owner, minlength=len(encoded))
    per_document = np.bincount(owner, weights=drop, minlength=len(encoded)) / count
    flip = np.bincount(owner, weights=flipped, minlength=len(encoded)) / count
    return per_document, flip


def _removal_effects(
    pipeline: Pipeline,
    encoded: Sequence[Encoded],
    removals: Sequence[Sequence[np.ndarray]],
    label: np.ndarray,
    p: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per removal, in document order: the drop in p(label), whether the label flipped, and its document."""
    variants = []
    for (ids, lengths), sets in zip(encoded, removals, strict=True):
        doc = _split(ids, lengths)
        for gone in sets:
            variants.append([s for j, s in enumerate(doc) if j not in set(gone.tolist())])
    owner = np.repeat(np.arange(len(encoded)), [len(sets) for sets in removals])  # each variant's document
    probs = _scores(pipeline, [_encode(d) for d in variants])
    after = probs[np.arange(len(variants)), label[owner]]
    flipped = (probs.argmax(1) != label[owner]).astype(float)
    return p[owner] - after, flipped, owner


def _kendall_tau(groups: Sequence[dict[str, np.ndarray]]) -> dict:
    """Each method's mean per-document Kendall tau against leave-one-word-out, over the groups' documents
    of more than one word (None if none has); {} where no document was measured."""
    measured = [g for g in groups if g]
    if not measured:
        return {}
    out: dict = {"documents": sum(len(next(iter(g.values()))) for g in measured)}
    for method in measured[0]:
        taus = np.concatenate([g[method] for g in measured])
        known = taus[~np.isnan(taus)]
        out[method] = float(known.mean()) if len(known) else None
    return out


def _weights(pipeline: Pipeline, encoded: Sequence[Encoded], method: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per document: each word's document-level weight (flat), and each sentence's weight."""
    words: list[np.ndarray] = [np.empty(0)] * len(encoded)
    sentences: list[np.ndarray] = [np.empty(0)] * len(encoded)
    for chunk, output in pipeline.forward(encoded, method):
        sw, ww = output.sentence_weights, output.word_weights
        for row, i in enumerate(chunk):
            lengths = encoded[i][1]
            n = len(lengths)
            doc_words = ww[row, :n] * (sw[row, :n, None] if method in WITHIN_SENTENCE else 1.0)
            words[i] = np.concatenate([doc_words[s, : lengths[s]] for s in range(n)])
            sentences[i] = sw[row, :n]
    return words, sentences
