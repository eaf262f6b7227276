"""Calibrated scores: temperature scaling (Guo et al., 2017) and expected calibration error.

A network trained to low loss is over-confident: its 0.99 is right less often than 99% of the
time. Dividing the logits by one temperature fitted on held-out data fixes most of that without
changing which label is on top. Multi-label models get one shared temperature over every label's
sigmoid (a temperature per label overfits the rare labels' handful of examples).
"""

from __future__ import annotations

import numpy as np
import torch

ECE_BINS = 15


def probabilities(logits: np.ndarray, multi_label: bool, temperature: float = 1.0) -> np.ndarray:
    """Label probabilities of ``logits / temperature``: sigmoid per label, or softmax."""
    scaled = torch.from_numpy(np.asarray(logits, dtype=np.float32)) / temperature
    return (torch.sigmoid(scaled) if multi_label else torch.softmax(scaled, dim=-1)).numpy()


def fit_temperature(logits: np.ndarray, targets: np.ndarray, multi_label: bool) -> float:
    """The temperature that minimises the negative log-likelihood of ``targets`` (class indices, or
    a 0/1 matrix for multi-label) under ``logits / T``; between 0.05 and 20."""
    with torch.inference_mode(False), torch.enable_grad():  # callers may run under inference mode
        return _fit_temperature(logits, targets, multi_label)


def _fit_temperature(logits: np.ndarray, targets: np.ndarray, multi_label: bool) -> float:
    z = torch.from_numpy(np.asarray(logits, dtype=np.float64))
    y = torch.from_numpy(np.asarray(targets))
    loss_fn = torch.nn.BCEWithLogitsLoss() if multi_label else torch.nn.CrossEntropyLoss()
    y = y.double() if multi_label else y.long()
    log_t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_fn(z / log_t.exp(), y)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(np.clip(log_t.exp().item(), 0.05, 20.0))


def calibration_bins(probs: np.ndarray, targets: np.ndarray, multi_label: bool, bins: int = ECE_BINS) -> dict:
    """Confidence against accuracy in ``bins`` equal-width bins.

    Single-label: each document's top probability, correct when its top label is the target.
    Multi-label: every (document, label) probability, correct when it says what the target says.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if multi_label:
        confidence = np.where(probs >= 0.5, probs, 1 - probs).ravel()
        correct = ((probs >= 0.5) == np.asarray(targets, dtype=bool)).ravel()
    else:
        confidence = probs.max(1)
        correct = probs.argmax(1) == np.asarray(targets)
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1], right=True), 0, bins - 1)
    count = np.bincount(which, minlength=bins)
    safe = np.maximum(count, 1)
    return {
        "edges": edges.tolist(),
        "count": count.tolist(),
        "confidence": (np.bincount(which, confidence, bins) / safe).tolist(),
        "accuracy": (np.bincount(which, correct.astype(np.float64), bins) / safe).tolist(),
    }


def expected_calibration_error(
    probs: np.ndarray, targets: np.ndarray, multi_label: bool, bins: int = ECE_BINS
) -> float:
    """ECE: the count-weighted mean gap between confidence and accuracy over the bins."""
    b = calibration_bins(probs, targets, multi_label, bins)
    count = np.asarray(b["count"], dtype=np.float64)
    gap = np.abs(np.asarray(b["confidence"]) - np.asarray(b["accuracy"]))
    return float((count * gap).sum() / max(count.sum(), 1))
