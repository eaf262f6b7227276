"""How far to trust an explanation: does removing what it points at change the prediction?

For each document the pipeline predicts a label with probability p. An explanation method ranks
the words (document-level weights) and the sentences; a faithful ranking puts first what the
prediction rests on. Measured against a random ranking:

* comprehensiveness at k% (ERASER, DeYoung et al. 2020): p minus p with the top k% of words removed
  (higher is better); sufficiency at k%: p minus p with only the top k% kept (lower is better);
  each averaged over k = 1, 5, 10, 20, 50% into an AOPC;
* sentence deletion: the drop in p, and how often the label flips, when the top 1 or 3 sentences
  are removed (for the random ranking, the expectation: averaged over every choice, or 20 of them);
* Kendall tau between a method's word weights and leave-one-word-out (occlusion), per document
  (Jain & Wallace 2019), on a smaller sample.

Each method's AOPCs and sentence drops also come as ratios to the random ranking's ("x random") with
a bootstrap interval over the documents: a ratio of two small means moves a lot from one sample of a
few hundred documents to another.

The sentence counts come with the result because they set the scale of the top-1 ratio: a random
one of n sentences is the top one with probability 1/n. Where no other sentence moves p, the random
drop is 1/n of the top one's and the ratio a weighted mean of n: the harmonic mean when every
document's top drop is the same, less where short documents' top sentences weigh more (as on IMDB).
Only sentences whose removal raises p take it above that.

Everything runs on token ids through the pipeline's own stages (encode, forward, scores).
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from han.attribution import METHODS, WITHIN_SENTENCE
from han.pipeline import Encoded, Pipeline
from han.vocab import Vocabulary

K_PERCENT = (1, 5, 10, 20, 50)
RANDOM = "random"
RANDOM_DRAWS = 20  # sentence sets a random ranking's deletion is averaged over, per document
CONFIDENCE = 0.95  # of the bootstrap interval on each "x random" ratio
RESAMPLES = 1000
MIN_DOCUMENTS = 20  # fewer, and no interval is given
Document = list[np.ndarray]  # sentences of word ids


def _encode(doc: Document) -> Encoded:
    """A document as the model's flat input; a document with nothing left becomes one unknown word."""
    doc = [s for s in doc if len(s)] or [np.array([Vocabulary.unk_id], dtype=np.int64)]
    return np.concatenate(doc).astype(np.int64), np.array([len(s) for s in doc], dtype=np.int64)


def _probabilities(pipeline: Pipeline, docs: Sequence[Document], labels: np.ndarray) -> np.ndarray:
    """p(labels[i] | docs[i]) for each document, through the pipeline's forward and scores stages."""
    out = np.zeros(len(docs))
    for chunk, output in pipeline.forward([_encode(d) for d in docs]):
        probs = pipeline.scores(output.logits)
        out[chunk] = probs[np.arange(len(chunk)), labels[chunk]]
    return out


def _split(ids: np.ndarray, lengths: np.ndarray) -> Document:
    return np.split(ids, np.cumsum(lengths)[:-1])


def _rankings(
    pipeline: Pipeline, encoded: Sequence[Encoded], method: str, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per document: words (flat positions) and sentences, most important first."""
    if method == RANDOM:
        return [rng.permutation(len(ids)) for ids, _ in encoded], [rng.permutation(len(n)) for _, n in encoded]
    words, sentences = _weights(pipeline, encoded, method)
    return [np.argsort(-w, kind="stable") for w in words], [np.argsort(-s, kind="stable") for s in sentences]


def _keep_words(ids: np.ndarray, lengths: np.ndarray, keep: np.ndarray) -> Document:
    mask = np.zeros(len(ids), dtype=bool)
    mask[keep] = True
    return [s[m] for s, m in zip(_split(ids, lengths), _split(mask, lengths), strict=True)]


def evaluate_faithfulness(
    pipeline: Pipeline, texts: Sequence[str], methods: Sequence[str] = METHODS, tau_documents: int = 50, seed: int = 0
) -> dict:
    """The measures above for each method and a random ranking, on ``texts`` (non-empty documents)."""
    rng = np.random.default_rng(seed)
    encoded, label, p = _predict(pipeline, texts)
    result: dict = {
        "documents": len(encoded),
        "sentences_per_document": sentence_counts([len(lengths) for _, lengths in encoded]),
        "k_percent": list(K_PERCENT),
        "methods": {},
    }
    per_document: dict[str, dict[str, np.ndarray]] = {}
    for method in [*methods, RANDOM]:
        word_rank, sentence_rank = _rankings(pipeline, encoded, method, rng)
        comprehensiveness, sufficiency = [], []  # [k] of per-document drops
        for k in K_PERCENT:
            removed, kept = [], []
            for (ids, lengths), order in zip(encoded, word_rank, strict=True):
                top = order[: max(1, round(len(ids) * k / 100))]
                rest = np.setdiff1d(np.arange(len(ids)), top)
                removed.append(_keep_words(ids, lengths, rest))
                kept.append(_keep_words(ids, lengths, top))
            comprehensiveness.append(p - _probabilities(pipeline, removed, label))
            sufficiency.append(p - _probabilities(pipeline, kept, label))
        comp, suff = np.array(comprehensiveness), np.array(sufficiency)  # [k, documents]
        m: dict = {
            "comprehensiveness": comp.mean(1).tolist(),
            "sufficiency": suff.mean(1).tolist(),
            "comprehensiveness_aopc": float(comp.mean()),
            "sufficiency_aopc": float(suff.mean()),
        }
        per_document[method] = {"comprehensiveness_aopc": comp.mean(0), "sufficiency_aopc": suff.mean(0)}
        for top in (1, 3):
            if method == RANDOM:
                removals = [_random_removals(len(lengths), top, rng) for _, lengths in encoded]
            else:
                removals = [[order[:top]] for order in sentence_rank]
            drop, flip = _sentence_deletion(pipeline, encoded, removals, label, p)
            per_document[method][f"top{top}_sentence_drop"] = drop
            m[f"top{top}_sentence_drop"], m[f"top{top}_sentence_flip_rate"] = float(drop.mean()), float(flip.mean())
        result["methods"][method] = m
    for method in methods:
        # A stream of its own per method and measure: adding a method leaves the others' intervals alone.
        result["methods"][method]["x_random"] = {
            key: ratio_interval(values, per_document[RANDOM][key], _stream(seed, method, key))
            for key, values in per_document[method].items()
        }
    result["kendall_tau"] = _kendall_tau(pipeline, encoded[:tau_documents], methods, rng)
    return result


def _predict(pipeline: Pipeline, texts: Sequence[str]) -> tuple[list[Encoded], np.ndarray, np.ndarray]:
    """The documents encoded, their predicted labels and the probability of each."""
    encoded = [pipeline.encode(s) for s in pipeline.segment(list(texts))]
    probs = np.zeros((len(encoded), len(pipeline.labels)))
    for chunk, output in pipeline.forward(encoded):
        probs[chunk] = pipeline.scores(output.logits)
    label = probs.argmax(1)
    return encoded, label, probs[np.arange(len(encoded)), label]


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
    when there are at most ``draws``, else ``draws`` random ones. One draw per document made the random
    baseline's drop too noisy to compare with (14.9x on one 100-review sample, 7.5x on 500)."""
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
    after = np.zeros(len(variants))
    flipped = np.zeros(len(variants))
    for chunk, output in pipeline.forward([_encode(d) for d in variants]):
        probs = pipeline.scores(output.logits)
        after[chunk] = probs[np.arange(len(chunk)), label[owner[chunk]]]
        flipped[chunk] = probs.argmax(1) != label[owner[chunk]]
    return p[owner] - after, flipped, owner


def _kendall_tau(
    pipeline: Pipeline, encoded: Sequence[Encoded], methods: Sequence[str], rng: np.random.Generator
) -> dict:
    """Mean per-document Kendall tau of each method's word ranking against leave-one-word-out."""
    if not encoded:
        return {}
    reference, _ = _weights(pipeline, encoded, "occlusion")
    out = {"documents": len(encoded)}
    for method in [m for m in methods if m != "occlusion"] + [RANDOM]:
        scores = (
            [rng.random(len(ids)) for ids, _ in encoded] if method == RANDOM else _weights(pipeline, encoded, method)[0]
        )
        taus = [kendalltau(a, b).statistic for a, b in zip(scores, reference, strict=True) if len(a) > 1]
        out[method] = float(np.nanmean(taus)) if taus else None
    return out


def _weights(pipeline: Pipeline, encoded: Sequence[Encoded], method: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per document: each word's document-level weight (flat), and each sentence's weight."""
    words: list[np.ndarray] = [np.empty(0)] * len(encoded)
    sentences: list[np.ndarray] = [np.empty(0)] * len(encoded)
    for chunk, output in pipeline.forward(encoded, method):
        sw, ww = output.sentence_weights.numpy(), output.word_weights.numpy()
        for row, i in enumerate(chunk):
            lengths = encoded[i][1]
            n = len(lengths)
            doc_words = ww[row, :n] * (sw[row, :n, None] if method in WITHIN_SENTENCE else 1.0)
            words[i] = np.concatenate([doc_words[s, : lengths[s]] for s in range(n)])
            sentences[i] = sw[row, :n]
    return words, sentences
