"""Query strategies with a linear model alone: how many labels could any strategy save on a corpus?

    python benchmarks/query_strategies_linear.py imdb --strategies random margin mix diverse
    python benchmarks/query_strategies_linear.py 20newsgroups --strategies random margin mix

``benchmarks/active_learning.py`` fits the HAN each round (minutes a round); this reads the same pool,
start and rounds (``active_learning.load``: the same split and test sample; 200 random labels, rounds
of 200 to 2,000, seeds 0-2) with TF-IDF 1-2 grams (fitted once on the pool's text, which a user has)
and logistic regression (C=10, the n-gram head's), refitted from scratch each round: seconds a round.
At a few thousand labels the n-gram head carries most of the exported model (HAN shares 0.05-0.55), so
if no strategy reaches random's 2,000-label accuracy with far fewer labels here, the queue's ceiling is
the corpus's, not the HAN's. Strategies: ``margin`` (the smallest top-two margin, as ``uncertainty``),
``mix`` (half by margin, half at random), ``diverse`` (k-means over the 10 x N least certain documents'
100-d SVD vectors, the nearest to each centre, as ``diverse``), ``random``; and, to see whether any
other family does better: ``entropy``, ``least`` (least confidence), ``balanced`` (round-robin over the
predicted labels, each one's smallest margins first), ``density`` (information density: 1 - margin
times the cosine to the pool's mean; Settles & Craven 2008) and ``badge`` (k-means++ seeding over the
gradient embeddings, in SVD space; Ash et al. 2020). ``--split validation`` reads each round on the
pool's held-out validation documents (choose there), ``test`` (the default) on the test sample.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.active_learning import load

START, STEP, BUDGET = 200, 200, 2_000
STRATEGIES = ("random", "margin", "mix", "diverse", "entropy", "least", "balanced", "density", "badge")


def margins(probs: np.ndarray) -> np.ndarray:
    top = np.partition(probs, -2, axis=1)[:, -2:]
    return top[:, 1] - top[:, 0]


def choose(strategy: str, probs: np.ndarray | None, rest: np.ndarray, embedded: np.ndarray, n: int,
           rng: np.random.Generator) -> np.ndarray:
    """``n`` of the unlabelled rows ``rest`` (``probs``: the model's scores of them)."""
    from sklearn.cluster import KMeans

    if strategy not in STRATEGIES:  # never another strategy's rows under this name
        raise ValueError(f"unknown strategy {strategy!r}; the strategies are {', '.join(STRATEGIES)}")
    if strategy == "random":
        return rng.choice(rest, n, replace=False)
    assert probs is not None
    ranked = rest[np.argsort(margins(probs))]
    if strategy == "margin":
        return ranked[:n]
    if strategy == "entropy":
        return rest[np.argsort((probs * np.log(probs + 1e-12)).sum(1))[:n]]
    if strategy == "least":
        return rest[np.argsort(probs.max(1))[:n]]
    if strategy == "balanced":  # round-robin over predicted labels, each label's least certain first
        order = np.argsort(margins(probs), kind="stable")
        predicted = probs.argmax(1)[order]
        rank_in_label = np.zeros(len(order), dtype=int)
        for label in np.unique(predicted):
            at = np.flatnonzero(predicted == label)
            rank_in_label[at] = np.arange(len(at))
        return rest[order[np.lexsort((np.arange(len(order)), rank_in_label))[:n]]]
    if strategy == "density":  # information density (Settles & Craven 2008): margin x typicality
        e = embedded[rest]
        typical = e @ e.mean(0)
        return rest[np.argsort((1 - margins(probs)) * np.clip(typical, 1e-6, None))[::-1][:n]]
    if strategy == "badge":  # Ash et al. 2020: k-means++ seeding over gradient embeddings
        onehot = np.eye(probs.shape[1])[probs.argmax(1)]
        g = ((probs - onehot)[:, :, None] * embedded[rest][:, None, :]).reshape(len(rest), -1)
        norms = (g * g).sum(1)
        chosen = [int(np.argmax(norms))]
        d2 = ((g - g[chosen[0]]) ** 2).sum(1)
        for _ in range(n - 1):
            k = int(rng.choice(len(rest), p=d2 / d2.sum()))
            chosen.append(k)
            d2 = np.minimum(d2, ((g - g[k]) ** 2).sum(1))
        return rest[np.array(chosen)]
    if strategy == "mix":
        half = ranked[: n // 2]
        return np.concatenate([half, rng.choice(np.setdiff1d(rest, half), n - n // 2, replace=False)])
    assert strategy == "diverse"
    candidates = ranked[: n * 10]
    distances = KMeans(n, n_init=1, random_state=int(rng.integers(1e6))).fit(embedded[candidates]).transform(
        embedded[candidates])
    chosen: list[int] = []
    for centre in range(n):
        chosen.append(next(int(candidates[i]) for i in np.argsort(distances[:, centre]) if candidates[i] not in chosen))
    return np.array(chosen)


def main() -> None:
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("corpus", choices=["imdb", "20newsgroups"])
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=["random", "margin", "mix", "diverse"],
                        metavar="STRATEGY", help=f"any of {', '.join(STRATEGIES)} (default: random margin mix diverse)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--split", choices=["validation", "test"], default="test",
                        help="what reads each round's model (choose a strategy on validation)")
    args = parser.parse_args()
    pool_texts, pool_labels, val_texts, val_labels, test_texts, test_labels = load(args.corpus, 5_000)
    if args.split == "validation":
        test_texts, test_labels = val_texts, val_labels
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, max_features=300_000)
    x, y = vectorizer.fit_transform(pool_texts), np.array(pool_labels)
    x_test, y_test = vectorizer.transform(test_texts), np.array(test_labels)
    embedded = x
    if set(args.strategies) & {"diverse", "badge", "density"}:  # unit length: k-means then clusters by cosine
        embedded = TruncatedSVD(100, random_state=0).fit_transform(x)
        embedded /= np.linalg.norm(embedded, axis=1, keepdims=True) + 1e-9
    curves = {}
    for strategy in args.strategies:
        runs = []
        for seed in args.seeds:
            rng = np.random.default_rng(seed)
            labelled, curve = rng.choice(len(y), START, replace=False), []
            while True:
                model = LogisticRegression(C=10, max_iter=1000).fit(x[labelled], y[labelled])
                curve.append(float((model.predict(x_test) == y_test).mean()))
                if len(labelled) >= BUDGET:
                    break
                rest = np.setdiff1d(np.arange(len(y)), labelled)
                probs = None if strategy == "random" else model.predict_proba(x[rest])
                labelled = np.concatenate([labelled, choose(strategy, probs, rest, embedded, STEP, rng)])
            runs.append(curve)
        curves[strategy] = np.mean(runs, axis=0)
        print(strategy, " ".join(f"{v:.4f}" for v in curves[strategy]), flush=True)
    if "random" in curves:
        target, counts = curves["random"][-1], np.arange(START, BUDGET + 1, STEP)
        for strategy, curve in curves.items():
            above = np.flatnonzero(curve >= target)
            if not len(above):
                print(f"{strategy}: random's {target:.4f} not reached")
                continue
            k = above[0]
            need = counts[k] if k == 0 else counts[k - 1] + STEP * (target - curve[k - 1]) / (curve[k] - curve[k - 1])
            print(f"{strategy}: reaches random's {target:.4f} at {need:,.0f} labels ({need / BUDGET:.2f})")


if __name__ == "__main__":
    main()
