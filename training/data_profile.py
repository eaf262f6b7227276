"""The training data's profile, kept with the model (``profile.json``) so that the monitor can tell,
from the inference log alone, whether today's traffic still looks like what the model learned from,
and how accurate the model probably is on it before any label arrives.

- lengths and out-of-vocabulary shares of a sample of held-out documents, as the model reads them
  (held-out: the training documents built the vocabulary, so their own share is not what new text has);
- the training labels' shares, and the labels the model predicts on the held-out sample;
- how often the model is right at each top score on that sample (an isotonic fit): confidence-based
  performance estimation (NannyML's CBPE) reads the accuracy off the scores with it, correcting what
  calibration left.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.isotonic import IsotonicRegression

from han.pipeline import Pipeline
from han.saved_model import SavedModel

SAMPLE = 5000  # held-out documents profiled: a two-sample test's reference, and the isotonic fit's data


def label_shares(targets: np.ndarray, labels: list[str]) -> dict[str, float]:
    """Each label's share of documents: class indices, or a 0/1 matrix (multi-label)."""
    if targets.ndim == 2:
        shares = targets.mean(axis=0)
    else:
        shares = np.bincount(targets.astype(int), minlength=len(labels)) / max(len(targets), 1)
    return {label: round(float(s), 6) for label, s in zip(labels, shares, strict=True)}


def build_profile(saved: SavedModel, texts: list[str], targets: np.ndarray, train_targets: np.ndarray,
                  split: str, seed: int = 0) -> dict[str, Any]:
    """The profile of ``saved`` on held-out ``texts`` (a seeded sample of at most SAMPLE of them)."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(texts), size=min(SAMPLE, len(texts)), replace=False))
    sample = [texts[i] for i in chosen]
    profiles: list[tuple[int, int]] = []
    results = Pipeline(saved)(sample, errors="return", profiles=profiles)
    kept = [k for k, r in enumerate(results) if not hasattr(r, "reason")]
    words = [profiles[k][0] for k in kept]
    oov = [round(profiles[k][1] / profiles[k][0], 4) if profiles[k][0] else 0.0 for k in kept]
    labels = saved.labels
    profile: dict[str, Any] = {
        "split": split,
        "documents": len(kept),
        "words": words,
        "oov": oov,
        "labels": label_shares(train_targets, labels),
        "predicted": label_shares(np.array([labels.index(results[k].label) for k in kept]), labels),  # type: ignore[union-attr]
    }
    if targets.ndim == 1 and kept:
        top = np.array([max(results[k].scores.values()) for k in kept])  # type: ignore[union-attr]
        right = np.array([labels.index(results[k].label) == int(targets[chosen[k]]) for k in kept], dtype=float)  # type: ignore[union-attr]
        fit = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(top, right)
        profile["confidence"] = {
            "top_score": [round(float(x), 6) for x in fit.X_thresholds_],
            "accuracy": [round(float(y), 6) for y in fit.y_thresholds_],
            "accuracy_on_sample": round(float(right.mean()), 6),
            "mean_top_score": round(float(top.mean()), 6),
        }
    return profile
