"""Whether the exported model keeps the baseline as an n-gram head beside the HAN (han.ngrams), and its share.

Both models' probabilities are calibrated on the validation split before they are averaged: the HAN's
by the model's temperature, the head's by its own (folded into its weights), so that the share says how
far each is trusted, not how sharp its scores are. Uncalibrated, logistic regression's scores are the
softer (its temperature fitted 0.3 to 0.4 on the suite's few-label runs), and a HAN share of 0.1 could
still leave the HAN most of the decision.

The HAN's share is chosen on the validation split alone, on a grid of 0.05: the best validation score
(accuracy; micro-F1 for multi-label data, each share at its best threshold unless the threshold is
fixed), ties going to the larger share (the HAN alone when averaging does not help). With a few
thousand labelled long documents the two models err on different documents and the average scores
above both; where the HAN alone is best no head is kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pytorch_lightning.utilities import rank_zero_info
from sklearn.metrics import f1_score

from han.calibration import fit_temperature, probabilities
from han.ngrams import NgramHead, align_classes
from training.baseline import Baseline
from training.hashed_ngrams import HashedTfidf
from training.progress import Step
from training.report import threshold_with_best_micro_f1

STEP = 0.05
CONSTANT_LOGIT = 30.0  # a label every (or no) training document has: the head's probability 1 (or 0)


def head_from_baseline(baseline: Baseline, labels: int, han_share: float = 0.0) -> NgramHead:
    """The fitted TF-IDF + logistic regression as plain arrays over every label (multi-label: one row
    per one-vs-rest regression)."""
    vectorizer, classifier = baseline.vectorizer, baseline.classifier
    hashed = isinstance(vectorizer, HashedTfidf)
    if hashed:
        coef, intercept = classifier.coef_, classifier.intercept_
        if not baseline.multi_label:
            coef, intercept = align_classes(coef, intercept, classifier.classes_.tolist(), labels)
        return NgramHead.from_buckets(vectorizer.columns_, vectorizer.idf_, coef, intercept, han_share,
                                      baseline.multi_label, vectorizer.buckets)
    if baseline.multi_label:
        width = len(vectorizer.vocabulary_)
        rows = [(e.coef_[0], float(e.intercept_[0])) if hasattr(e, "coef_")
                else (np.zeros(width), CONSTANT_LOGIT if int(np.ravel(e.y_)[0]) else -CONSTANT_LOGIT)
                for e in classifier.estimators_]
        coef, intercept = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    else:
        coef, intercept = align_classes(classifier.coef_, classifier.intercept_, classifier.classes_.tolist(), labels)
    return NgramHead.from_ngrams(vectorizer.vocabulary_, vectorizer.idf_, coef, intercept, han_share,
                                 baseline.multi_label)


def _size(head: NgramHead) -> str:
    grams = f"{head.size:,} of {head.buckets:,} hashed buckets" if head.buckets else f"{head.size:,} n-grams"
    return f"{grams}, {head.nbytes / 1e6:.1f} MB"


def _scores(probs: np.ndarray, targets: np.ndarray, multi_label: bool,
            threshold: float | None) -> tuple[float, float | None]:
    """The validation score of ``probs`` and, multi-label, the threshold it was read at."""
    if not multi_label:
        return float((probs.argmax(1) == targets).mean()), None
    chosen = threshold if threshold is not None else threshold_with_best_micro_f1(probs, targets)
    return float(f1_score(targets.astype(bool), probs >= chosen, average="micro", zero_division=0)), chosen


def choose_head(baseline: Baseline, han_probs: np.ndarray, texts: list[str], targets: np.ndarray,
                threshold: float | None = None) -> tuple[NgramHead | None, dict[str, Any]]:
    """The head with the HAN's share that scores best on validation (None when that share is 1), and
    what the choice saw: each model's validation score and the average's (multi-label: each at its
    best threshold, or at ``threshold`` when it is fixed, and the threshold the average decides at)."""
    multi_label = baseline.multi_label
    head = head_from_baseline(baseline, han_probs.shape[1])
    with Step("n-gram head on validation", len(texts)) as step:
        logits = head.logits(texts)
        step.update(len(texts))
    temperature = fit_temperature(logits, targets, multi_label)
    head.coef, head.intercept = head.coef / temperature, head.intercept / temperature
    head_probs = probabilities(logits, multi_label, temperature).astype(np.float64)
    shares = np.round(np.arange(0.0, 1.0 + STEP / 2, STEP), 2)
    scored = [_scores(s * han_probs + (1 - s) * head_probs, targets, multi_label, threshold) for s in shares]
    best = max(range(len(shares)), key=lambda i: (scored[i][0], shares[i]))
    share, metric = float(shares[best]), "micro_f1" if multi_label else "accuracy"
    summary: dict[str, Any] = {
        "han_share": share, "chosen_by": f"best {metric} on the validation split (ties: the larger HAN share)",
        f"validation_{metric}": {"han": round(scored[-1][0], 4), "ngrams": round(scored[0][0], 4),
                                 "averaged": round(scored[best][0], 4)},
        "ngrams": head.size, "buckets": head.buckets, "megabytes": round(head.nbytes / 1e6, 1),
        "head_temperature": round(temperature, 4)}
    name = "micro-F1" if multi_label else "accuracy"
    if share >= 1.0:
        rank_zero_info(f"n-gram head not kept: the HAN alone scores best on validation ({name} {scored[-1][0]:.4f}; "
                       f"the n-grams alone {scored[0][0]:.4f})")
        return None, summary
    head.han_share = share
    if multi_label:
        summary["threshold"], summary["han_threshold"] = scored[best][1], scored[-1][1]
    at = f" at threshold {scored[best][1]}" if multi_label else ""
    rank_zero_info(f"n-gram head kept: scores are {share:.2f} x the HAN's + {1 - share:.2f} x TF-IDF 1-2 grams' "
                   f"({_size(head)}); validation {name} {scored[best][0]:.4f}{at}, against the HAN alone "
                   f"{scored[-1][0]:.4f} and the n-grams alone {scored[0][0]:.4f}")
    return head, summary
