"""The n-gram head's table: the vocabulary against hashed buckets (and NB weighting), on the suite's settings.

    python benchmarks/ngram_buckets.py                      # every setting, every variant
    python benchmarks/ngram_buckets.py --only imdb-2000 --variants vocab hashed-20 hashed-20-nb

Each setting's training file (benchmarks/suite.py) is split as a fit splits it (``stable_holdout``,
10%, seed 42); TF-IDF 1-2 grams + logistic regression (C=10; one-vs-rest for multi-label, at the
threshold with the best validation micro-F1) is fitted on the rest, with each variant's features:

- ``vocab``: scikit-learn's TfidfVectorizer (today's baseline and head, training.baseline);
- ``hashed-K``: training.hashed_ngrams at 2^K buckets (the head's own hashing), min_df 2;
- ``hashed-K-sgd``: the same features, the regression fitted in a stream (training.hashed_ngrams'
  ``StreamedRegression``: SGD on the log loss, averaged, 5 passes over chunks of 2,000);
- ``hashed-K-nb``: the same, each feature scaled by its Naive Bayes log-count ratio (NBSVM, Wang &
  Manning 2012); binary tasks only (the ratio is per class).

It prints each variant's validation score (what a choice reads), its test score (read only), the
head's size (kept columns x labels x 8 bytes) and the seconds of the fit. One process, one thread.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.suite import SETTINGS, setting_files  # noqa: E402
from training.hashed_ngrams import HashedTfidf, StreamedRegression  # noqa: E402
from training.report import threshold_with_best_micro_f1  # noqa: E402
from training.splits import stable_holdout  # noqa: E402

SETTING_NAMES = ["imdb-1000", "reuters-titles", "20ng-subjects", "imdb-2000", "20ng-2000", "imdb-6400",
                 "reuters-full", "imdb-25000", "20ng-full"]


def _read(path: Path) -> tuple[list[str], list]:
    table = pq.read_table(path)
    column = "labels" if "labels" in table.column_names else "label"
    return table.column("text").to_pylist(), table.column(column).to_pylist()


def _targets(labels: list, names: list[str]) -> np.ndarray:
    index = {n: i for i, n in enumerate(names)}
    if labels and isinstance(labels[0], list):
        out = np.zeros((len(labels), len(names)), dtype=int)
        for row, ls in enumerate(labels):
            out[row, [index[x] for x in ls if x in index]] = 1
        return out
    return np.array([index.get(x, -1) for x in labels])


def _nb_ratio(features, y: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    p = alpha + np.asarray(features[y == 1].sum(0)).ravel()
    q = alpha + np.asarray(features[y == 0].sum(0)).ravel()
    return np.log((p / p.sum()) / (q / q.sum()))


def run(setting: str, variant: str, workdir: Path) -> dict:
    from scipy import sparse
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.multiclass import OneVsRestClassifier

    train_path, test_path, _ = setting_files(setting, workdir)
    texts, labels = _read(train_path)
    test_texts, test_labels = _read(test_path)
    multi = isinstance(labels[0], list)
    names = sorted({x for ls in labels for x in ls}) if multi else sorted(set(labels))
    keep, held = stable_holdout(texts, None if multi else labels, 0.1, 42)
    y_all, y_test = _targets(labels, names), _targets(test_labels, names)
    fit_texts, val_texts = [texts[i] for i in keep], [texts[i] for i in held]
    y, y_val = y_all[keep], y_all[held]
    start = time.perf_counter()
    if variant == "vocab":
        vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2)
    else:
        vectorizer = HashedTfidf(2 ** int(variant.split("-")[1]), min_df=2)
    x = vectorizer.fit_transform(fit_texts)
    columns = x.shape[1]
    scale = None
    if variant.endswith("-nb"):
        if multi or len(names) != 2:
            return {"setting": setting, "variant": variant, "skipped": "NB weighting: binary tasks only"}
        scale = sparse.diags(_nb_ratio(x, y))
        x = x @ scale
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        warnings.filterwarnings("ignore", category=UserWarning)
        if variant.endswith("-sgd"):
            model = StreamedRegression(10, multi, len(names)).fit(vectorizer, fit_texts, y)
        else:
            regression = LogisticRegression(C=10, max_iter=2000)
            model = (OneVsRestClassifier(regression) if multi else regression).fit(x, y)
    seconds = time.perf_counter() - start

    def features(t: list[str]):
        f = vectorizer.transform(t)
        return f @ scale if scale is not None else f

    val, test = model.predict_proba(features(val_texts)), model.predict_proba(features(test_texts))
    if multi:
        threshold = threshold_with_best_micro_f1(val, y_val)
        score = [float(f1_score(t.astype(bool), p >= threshold, average="micro", zero_division=0))
                 for p, t in ((val, y_val), (test, y_test))]
    else:
        score = [float((model.classes_[p.argmax(1)] == t).mean()) for p, t in ((val, y_val), (test, y_test))]
    rows = 1 if len(names) == 2 else len(names)
    return {"setting": setting, "variant": variant, "validation": round(score[0], 4), "test": round(score[1], 4),
            "columns": columns, "head_mb": round(columns * max(rows, 2) * 8 / 1e6, 1), "fit_s": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", default=SETTING_NAMES, choices=sorted(SETTINGS))
    parser.add_argument("--variants", nargs="+",
                        default=["vocab", "hashed-18", "hashed-20", "hashed-20-nb", "hashed-20-sgd"])
    parser.add_argument("--workdir", default="runs/suite-data")
    args = parser.parse_args()
    print("| setting | variant | validation | test | columns | head (MB) | fit (s) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for setting in args.only:
        for variant in args.variants:
            r = run(setting, variant, Path(args.workdir))
            if "skipped" in r:
                print(f"| {setting} | {variant} | {r['skipped']} | | | | |", flush=True)
                continue
            print(f"| {setting} | {variant} | {r['validation']:.4f} | {r['test']:.4f} | {r['columns']:,} | "
                  f"{r['head_mb']} | {r['fit_s']} |", flush=True)


if __name__ == "__main__":
    main()
