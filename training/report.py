"""Evaluation report: per-class precision/recall/F1, confusion matrix PNG, metrics JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, f1_score

from han import calibration
from han.pipeline import Pipeline, Progress
from han.results import DocumentResult


def evaluate(pipeline: Pipeline, texts: list[str], targets: np.ndarray,
             progress: Progress | None = None) -> dict[str, Any]:
    """Classify ``texts`` through the inference pipeline and compare with ``targets``: class
    indices (single-label) or a 0/1 matrix (multi-label). ``results`` holds each document's result;
    ``calibration`` the expected calibration error before and after the model's temperature.
    ``progress`` follows the pipeline's stages (training.progress.Step.stage)."""
    results, logits = pipeline.with_logits(texts, progress)
    labels = pipeline.labels
    report: dict[str, Any] = {
        "documents": len(texts),
        "results": results,
        "calibration": calibration_report(logits, targets, pipeline.multi_label, pipeline.saved.temperature),
    }
    head = pipeline.saved.metadata.get("ngram_head") if pipeline.saved.ngrams is not None else None
    if pipeline.multi_label:
        predicted = np.array([[label in r.labels for label in labels] for r in results], dtype=bool)
        truth = targets.astype(bool)
        per_label = f1_score(truth, predicted, average=None, zero_division=0)
        if head is not None:  # the HAN's own figures at its own threshold, beside its average with the head
            alone = calibration.probabilities(logits, True, pipeline.saved.temperature) >= head["han_threshold"]
            report["han_alone"] = {key: float(f1_score(truth, alone, average=key.removesuffix("_f1"), zero_division=0))
                                   for key in ("micro_f1", "macro_f1")} | {
                                       "exact_match": float(accuracy_score(truth, alone))}
        return report | {
            "task": "multi-label",
            "micro_f1": float(f1_score(truth, predicted, average="micro", zero_division=0)),
            "macro_f1": float(f1_score(truth, predicted, average="macro", zero_division=0)),
            "samples_f1": float(f1_score(truth, predicted, average="samples", zero_division=0)),
            "exact_match": float(accuracy_score(truth, predicted)),
            "per_label_f1": {label: float(f) for label, f in zip(labels, per_label, strict=True)},
            "support": {label: int(n) for label, n in zip(labels, truth.sum(0), strict=True)},
            "text": classification_report(truth, predicted, target_names=labels, zero_division=0, digits=3),
        }
    index = {label: i for i, label in enumerate(labels)}
    predicted = np.array([index[r.label] for r in results])
    if head is not None:  # the HAN's own figures, beside those of its average with the head
        alone = logits.argmax(1)
        report["han_alone"] = {"accuracy": float(accuracy_score(targets, alone)),
                               "macro_f1": float(f1_score(targets, alone, average="macro", zero_division=0))}
    return report | {
        "task": "single-label",
        "accuracy": float(accuracy_score(targets, predicted)),
        "macro_f1": float(f1_score(targets, predicted, average="macro", zero_division=0)),
        "per_class": classification_report(
            targets, predicted, labels=range(len(labels)), target_names=labels, zero_division=0, output_dict=True
        ),
        "confusion_matrix": confusion_matrix(targets, predicted, labels=range(len(labels))).tolist(),
        "labels": labels,
        "text": classification_report(
            targets, predicted, labels=range(len(labels)), target_names=labels, zero_division=0, digits=3
        ),
    }


def calibration_report(logits: np.ndarray, targets: np.ndarray, multi_label: bool, temperature: float) -> dict:
    """ECE (15 bins) and the reliability bins of the raw scores and of the calibrated ones."""
    raw = calibration.probabilities(logits, multi_label)
    scaled = calibration.probabilities(logits, multi_label, temperature)
    return {
        "temperature": temperature,
        "ece_before": round(calibration.expected_calibration_error(raw, targets, multi_label), 4),
        "ece_after": round(calibration.expected_calibration_error(scaled, targets, multi_label), 4),
        "bins_before": calibration.calibration_bins(raw, targets, multi_label),
        "bins_after": calibration.calibration_bins(scaled, targets, multi_label),
    }


def best_threshold(pipeline: Pipeline, texts: list[str], targets: np.ndarray) -> float:
    """The multi-label decision threshold (0.05 to 0.95 in steps of 0.05) with the best micro-F1 on these documents."""
    probs = np.array([[r.scores[label] for label in pipeline.labels] for r in pipeline(texts)])
    return threshold_with_best_micro_f1(probs, targets)


def threshold_with_best_micro_f1(probs: np.ndarray, targets: np.ndarray) -> float:
    """Of 0.05 to 0.95 in steps of 0.05, the threshold on ``probs`` with the best micro-F1 against
    ``targets`` (a 0/1 matrix); shared by the HAN and its TF-IDF baseline so both decide alike."""
    truth = targets.astype(bool)
    candidates = [round(0.05 * i, 2) for i in range(1, 20)]
    scores = {t: f1_score(truth, probs >= t, average="micro", zero_division=0) for t in candidates}
    return max(candidates, key=lambda t: (scores[t], -abs(t - 0.5)))  # ties: the one nearest 0.5


def write_predictions(path: Path, results: list[DocumentResult], rows: list[int] | None = None) -> None:
    """One JSON line per document, in input order: row (``rows``' entry, else its position), label, labels
    and every label's score (``han-train predict`` and the evaluation report)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for k, r in enumerate(results):
            row = rows[k] if rows is not None else k
            record = {"row": row, "label": r.label, "labels": r.labels, "scores": r.scores}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def headline(report: dict[str, Any]) -> dict[str, float]:
    """The few numbers worth putting in model metadata."""
    keys = ("accuracy", "macro_f1") if report["task"] == "single-label" else ("micro_f1", "macro_f1", "exact_match")
    calibrated = report["calibration"]
    alone = {f"han_alone_{k}": round(v, 4) for k, v in report.get("han_alone", {}).items()}
    return {k: round(report[k], 4) for k in keys} | {k: calibrated[k] for k in ("ece_before", "ece_after")} | alone


def write_report(report: dict[str, Any], directory: Path, title: str) -> Path:
    """Write metrics.json, classification_report.txt, predictions.jsonl, reliability.png and
    (single-label) confusion_matrix.png."""
    directory.mkdir(parents=True, exist_ok=True)
    summary = {k: v for k, v in report.items() if k not in ("text", "results")}
    (directory / "metrics.json").write_text(json.dumps(summary, indent=2))
    write_predictions(directory / "predictions.jsonl", report["results"])
    _plot_reliability(report["calibration"], directory / "reliability.png", title)
    (directory / "classification_report.txt").write_text(f"{title}\n\n{report['text']}")
    if report["task"] == "single-label":
        matrix = np.array(report["confusion_matrix"])
        _plot_confusion(matrix, report["labels"], directory / "confusion_matrix.png", title)
    return directory


def _plot_confusion(matrix: np.ndarray, labels: list[str], path: Path, title: str) -> None:
    n = len(labels)
    size = min(4 + 0.45 * n, 16)
    fig, ax = plt.subplots(figsize=(size, size))
    normalised = matrix / np.maximum(matrix.sum(1, keepdims=True), 1)
    ax.imshow(normalised, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(n), labels, rotation=60 if n > 4 else 0, ha="right" if n > 4 else "center", fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    if n <= 25:
        for i in range(n):
            for j in range(n):
                colour = "white" if normalised[i, j] > 0.5 else "black"
                ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7 if n > 10 else 10, color=colour)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_reliability(calibrated: dict[str, Any], path: Path, title: str) -> None:
    """Accuracy against confidence per bin, before and after temperature scaling (the diagonal is perfect)."""
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfectly calibrated")
    for key, name, colour in (("before", "raw", "tab:red"), ("after", "calibrated", "tab:blue")):
        b = calibrated[f"bins_{key}"]
        used = [i for i, n in enumerate(b["count"]) if n]
        ax.plot([b["confidence"][i] for i in used], [b["accuracy"][i] for i in used], marker="o", color=colour,
                label=f"{name} (ECE {calibrated[f'ece_{key}']:.3f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title}\ntemperature {calibrated['temperature']:.3g}", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
