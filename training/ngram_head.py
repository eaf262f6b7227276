"""Whether the exported model keeps the baseline as an n-gram head beside the HAN (han.ngrams), and its share.

The HAN's share of the averaged probabilities is chosen on the validation split alone, on a grid of
0.05: the highest validation accuracy, ties going to the larger share (the HAN alone when averaging
does not help). With a few thousand labelled long documents the two models err on different documents
and the average scores above both; with many labels the HAN alone usually wins and no head is kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pytorch_lightning.utilities import rank_zero_info

from han.ngrams import NgramHead, align_classes
from training.baseline import Baseline
from training.progress import Step

STEP = 0.05


def head_from_baseline(baseline: Baseline, labels: int, han_share: float = 0.0) -> NgramHead:
    """The fitted TF-IDF + logistic regression as plain arrays over every label."""
    vectorizer, classifier = baseline.vectorizer, baseline.classifier
    coef, intercept = align_classes(classifier.coef_, classifier.intercept_, classifier.classes_.tolist(), labels)
    return NgramHead.from_ngrams(vectorizer.vocabulary_, vectorizer.idf_, coef, intercept, han_share)


def choose_head(baseline: Baseline, han_probs: np.ndarray, texts: list[str],
                targets: np.ndarray) -> tuple[NgramHead | None, dict[str, Any]]:
    """The head with the HAN's share that scores best on validation (None when that share is 1),
    and what the choice saw: each model's validation accuracy and the average's."""
    head = head_from_baseline(baseline, han_probs.shape[1])
    with Step("n-gram head on validation", len(texts)) as step:
        head_probs = head.probabilities(texts)
        step.update(len(texts))
    shares = np.round(np.arange(0.0, 1.0 + STEP / 2, STEP), 2)
    accuracy = [float(((s * han_probs + (1 - s) * head_probs).argmax(1) == targets).mean()) for s in shares]
    best = max(range(len(shares)), key=lambda i: (accuracy[i], shares[i]))
    share = float(shares[best])
    summary = {"han_share": share, "chosen_by": "best accuracy on the validation split (ties: the larger HAN share)",
               "validation_accuracy": {"han": round(accuracy[-1], 4), "ngrams": round(accuracy[0], 4),
                                       "averaged": round(accuracy[best], 4)},
               "ngrams": head.size}
    if share >= 1.0:
        rank_zero_info(f"n-gram head not kept: the HAN alone scores best on validation (accuracy {accuracy[-1]:.4f}; "
                       f"the n-grams alone {accuracy[0]:.4f})")
        return None, summary
    head.han_share = share
    rank_zero_info(f"n-gram head kept: scores are {share:.2f} x the HAN's + {1 - share:.2f} x TF-IDF 1-2 grams' "
                   f"({head.size:,} n-grams); validation accuracy {accuracy[best]:.4f}, against the HAN alone "
                   f"{accuracy[-1]:.4f} and the n-grams alone {accuracy[0]:.4f}")
    return head, summary
