"""Which documents to label next: query strategies over a scored pool (small-text's, where one fits).

Every strategy reads the pool as the model scores it: ``probs`` [documents, labels] (the calibrated
scores the service returns) and, for the batch-diverse one, ``vectors`` [documents, width] (the
document vectors the head reads, ``Pipeline.with_vectors``). small-text's strategies take a classifier
and a dataset; ``Scored`` is a classifier whose answers are those precomputed arrays, and the dataset
is the pool's row numbers, so the pool is scored once, by the one inference path, and never again.

- ``uncertainty``: small-text's ``BreakingTies`` (the smallest margin between the top two labels;
  Luo et al. 2005); for a multi-label model the smallest distance of any label's score to the threshold.
- ``diverse``: the ``DIVERSE_POOL`` x N least certain, then small-text's ``EmbeddingKMeans`` on their
  vectors picks N, one nearest each of N centres: uncertain documents unlike each other (Zhdanov's
  diverse mini-batch active learning, 2019; the cluster-margin idea of Citovsky et al. 2021).
- ``random``: small-text's ``RandomSampling``, the baseline the benchmark measures against.
"""

from __future__ import annotations

import numpy as np

STRATEGIES = ("uncertainty", "diverse", "random")
DEFAULT_STRATEGY = "uncertainty"
DIVERSE_POOL = 10  # candidates for ``diverse``, as a multiple of N


class Scored:
    """A small-text classifier whose answers were computed before: rows of ``probs`` and ``vectors``."""

    def __init__(self, probs: np.ndarray, vectors: np.ndarray | None = None) -> None:
        self.probs = probs
        self.vectors = vectors

    def predict_proba(self, rows: np.ndarray) -> np.ndarray:
        return self.probs[rows]

    def embed(self, rows: np.ndarray, **_: object) -> np.ndarray:
        if self.vectors is None:
            raise ValueError("this strategy needs the documents' vectors")
        return self.vectors[rows]


def margins(probs: np.ndarray, multi_label: bool = False, threshold: float = 0.5) -> np.ndarray:
    """How certain the model is of each document (lower: less): the top two scores' margin, or for a
    multi-label model the smallest distance of a label's score to the threshold."""
    if multi_label:
        return np.abs(probs - threshold).min(axis=1)
    top2 = np.partition(probs, -2, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def choose(strategy: str, n: int, probs: np.ndarray, vectors: np.ndarray | None = None, *,
           seed: int = 0, multi_label: bool = False, threshold: float = 0.5) -> np.ndarray:
    """The rows of the pool (``probs``' rows) to label next, ``n`` of them, by ``strategy``."""
    from small_text.query_strategies import BreakingTies, EmbeddingKMeans, RandomSampling

    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    size = len(probs)
    if n > size:
        raise ValueError(f"the pool has {size:,} documents to choose from, fewer than the {n:,} asked for")
    rows = np.arange(size)
    if n == size:
        return rows
    if n <= 0:  # han-label's --holdout may draw all N at random, leaving none to the strategy
        return rows[:0]
    if strategy == "random":
        state = np.random.get_state()
        np.random.seed(seed)  # small-text samples with numpy's global generator
        try:
            return np.sort(RandomSampling().query(None, rows, rows, np.array([], dtype=int), None, n=n))
        finally:
            np.random.set_state(state)
    if multi_label:  # small-text's margin is the top two labels'; here each label's own decision
        ranked = np.argsort(margins(probs, True, threshold), kind="stable")
    else:
        scored = Scored(probs.astype(np.float64), vectors)
        ranked = BreakingTies().query(scored, rows, rows, np.array([], dtype=int), None, n=min(size, n * DIVERSE_POOL))
        ranked = ranked[np.argsort(margins(probs[ranked]), kind="stable")]
    if strategy == "uncertainty":
        return np.sort(ranked[:n])
    if vectors is None:
        raise ValueError("the diverse strategy needs the documents' vectors")
    candidates = ranked[: n * DIVERSE_POOL]
    if len(candidates) <= n:
        return np.sort(candidates)
    state = np.random.get_state()
    np.random.seed(seed)  # KMeans's seeding draws from numpy's global generator too
    try:
        picked = EmbeddingKMeans().query(Scored(probs, vectors), candidates, np.arange(len(candidates)),
                                         np.array([], dtype=int), None, n=n, embeddings=vectors[candidates])
    finally:
        np.random.set_state(state)
    return np.sort(candidates[picked])
