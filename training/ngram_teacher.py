"""The n-gram teacher: with few labels, each training document's target mixes its label with the TF-IDF
baseline's scores for it, the baseline fitted on the other folds of the training split (cross-fitted,
so it scores documents it has not seen, as it would a new one).

A label says which class a document is, not how clearly; the baseline's scores add that, from a model
whose errors differ from the HAN's. On 3,000 of IMDB's and 20 Newsgroups' training documents outside
the suite's 1,000 and 2,000 (never test), a share of 0.3 raised the HAN alone's accuracy (docs/experiments.md).
Distillation from a cross-fitted teacher is Hinton et al. 2015's soft targets without a second fit.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from pytorch_lightning.utilities import rank_zero_info
from sklearn.model_selection import StratifiedKFold

from training.baseline import train_baseline

FOLDS = 5  # each fold's baseline is fitted on 80% of the training split


def cross_fitted_scores(texts: list[str], labels: np.ndarray, classes: int, folds: int = FOLDS,
                        seed: int = 0) -> np.ndarray:
    """Each document's class probabilities from a baseline fitted on the other ``folds - 1`` folds
    (stratified, seeded); a class missing from a fold's training part gets probability 0. A class with a
    single document is in every fold's training part and its document is not scored (a row of zeros)."""
    scores = np.zeros((len(texts), classes))
    single = np.bincount(labels)[labels] < 2
    common, always = np.flatnonzero(~single), np.flatnonzero(single)
    split = StratifiedKFold(folds, shuffle=True, random_state=seed).split(np.zeros(len(common)), labels[common])
    for fitted, held in ((np.concatenate([common[f], always]), common[h]) for f, h in split):
        baseline = train_baseline([texts[i] for i in fitted], labels[fitted], False)
        features = baseline.vectorizer.transform([texts[i] for i in held])
        scores[np.ix_(held, baseline.classifier.classes_)] = baseline.classifier.predict_proba(features)
    return scores


def mixed_targets(texts: list[str], targets: torch.Tensor, classes: int, share: float, seed: int) -> torch.Tensor:
    """``targets`` (class ids, or probability rows whose first ``len(texts)`` are one-hot human labels and
    the rest self-training's, or its top labels) as probability rows, with ``share`` of each human row
    taken from the cross-fitted scores, in as many folds as the smallest class has documents (of those
    with two or more), up to five. A class's single document keeps its label as its target (nothing to
    cross-fit it with); the targets unchanged when fewer than two classes have two documents."""
    human = len(texts)
    rows = (targets if targets.ndim == 2 else torch.nn.functional.one_hot(targets, classes)).float().clone()
    labels = rows[:human].argmax(1).numpy()
    counts = np.bincount(labels, minlength=classes)
    if (counts >= 2).sum() < 2:
        rank_zero_info("n-gram teacher: off, fewer than two classes have two training documents to cross-fit")
        return targets
    folds = min(FOLDS, int(counts[counts >= 2].min()))
    start = time.perf_counter()
    scores = cross_fitted_scores(list(texts), labels, classes, folds, seed)
    scored = counts[labels] >= 2
    singles = "" if scored.all() else f"; {(~scored).sum()} classes of a single document keep their labels"
    rank_zero_info(f"n-gram teacher: each training target is {1 - share:g} its label and {share:g} the TF-IDF "
                   f"baseline's scores from the other {folds - 1} of {folds} folds (its top class right on "
                   f"{(scores[scored].argmax(1) == labels[scored]).mean():.1%}; {time.perf_counter() - start:.1f} s"
                   f"{singles})")
    mix = torch.as_tensor(np.where(scored, share, 0.0), dtype=torch.float32)[:, None]
    rows[:human] = (1 - mix) * rows[:human] + mix * torch.as_tensor(scores, dtype=torch.float32)
    return rows
