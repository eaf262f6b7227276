"""The report on the model in production, from the inference log, the feedback and the training profile.

For each version (and role: production, or shadow) that answered in a window: the documents, the
predicted labels' shares, the accuracy estimated from the scores before any label (confidence-based:
each top score read through the profile's isotonic fit of how often the model was right at that
score on held-out data; the calibrated score itself where the model has no profile), the accuracy
realised on the feedback so far with a Wilson interval, and the shift of the inputs against the
training data's profile: two-sample Kolmogorov-Smirnov tests on length and out-of-vocabulary share,
a chi-square test on the predicted labels. A shift is flagged when a test is beyond noise (p under
ALPHA) and the difference is material, so that a large, faithful stream is not flagged for differences
too small to matter: EFFECT or more of a KS distance (length) or of the labels' total variation
distance; for the out-of-vocabulary share, OOV_POINTS or more of its mean. (Most documents have almost
no unknown word, so the KS distance there reacts to changes of a fraction of a point, such as the new
names a held-out set of other movies brings, which change nothing the model reads.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

ALPHA = 0.01
EFFECT = 0.1
SUM_SLACK = 0.05  # a single-label model's scores sum to 1 (rounded): further off, they are per label
OOV_POINTS = 0.02  # unknown words: material when their mean share moves by 2 points of the words read
Z95 = 1.959964


def wilson(right: float, n: int) -> list[float] | None:
    """The 95% Wilson score interval of a proportion of ``right`` out of ``n``."""
    if n == 0:
        return None
    p = right / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def expected_right(record: Mapping[str, Any], profile: Mapping[str, Any] | None, multi_label: bool) -> float:
    """How likely the logged answer is right, from its scores alone (see the module's docstring)."""
    scores: Mapping[str, float] = record["scores"]
    if multi_label:  # the expected share of labels decided right
        chosen = set(record.get("labels") or [])
        return float(np.mean([p if label in chosen else 1 - p for label, p in scores.items()]))
    top = max(scores.values())
    table = (profile or {}).get("confidence")
    if table:
        return float(np.interp(top, table["top_score"], table["accuracy"]))
    return float(top)


def realised_right(record: Mapping[str, Any], truth: Sequence[str], labels: Sequence[str], multi_label: bool) -> float:
    """1 or 0 for a single-label answer; the share of labels decided right for a multi-label one."""
    if not multi_label:
        return float(bool(truth) and record["label"] == truth[0])  # no label given: not the answer's
    chosen, true = set(record.get("labels") or []), set(truth)
    return float(np.mean([(label in chosen) == (label in true) for label in labels]))


def looks_multi_label(records: Iterable[Mapping[str, Any]]) -> bool:
    """What a version's logged answers show of it, where its config is gone from the store: multi-label if
    any answer has other than one label, or scores that are not one distribution (a sigmoid a label)."""
    for record in records:
        scores = record.get("scores")
        if len(record.get("labels") or []) != 1 or (
                isinstance(scores, Mapping) and scores and abs(sum(scores.values()) - 1.0) > SUM_SLACK):
            return True
    return False


def ks_distance(values: Sequence[float], reference: Sequence[float]) -> float:
    """The two-sample Kolmogorov-Smirnov statistic alone (no p-value: scipy's exact one can take milliseconds),
    for a serving worker's gauge: the largest gap between the two empirical distribution functions."""
    a, b = np.sort(np.asarray(values, dtype=float)), np.sort(np.asarray(reference, dtype=float))
    points = np.concatenate([a, b])
    gaps = np.searchsorted(a, points, side="right") / len(a) - np.searchsorted(b, points, side="right") / len(b)
    return float(np.abs(gaps).max())


def _ks(values: Sequence[float], reference: Sequence[float] | None, points: float | None = None
        ) -> dict[str, Any] | None:
    """The KS test; material at EFFECT of its distance, or (``points``) at that change of the mean."""
    if not reference or len(values) < 2:
        return None
    from scipy.stats import ks_2samp  # here: a serving worker imports this module and runs no test

    result = ks_2samp(values, reference)
    mean, reference_mean = float(np.mean(values)), float(np.mean(reference))
    material = abs(mean - reference_mean) >= points if points is not None else result.statistic >= EFFECT
    return {
        "statistic": round(float(result.statistic), 4),
        "p_value": float(f"{result.pvalue:.3g}"),
        "median": round(float(np.median(values)), 4),
        "reference_median": round(float(np.median(reference)), 4),
        "mean": round(mean, 4),
        "reference_mean": round(reference_mean, 4),
        "flagged": bool(result.pvalue < ALPHA and material),
    }


def _labels_test(counts: Mapping[str, int], reference: Mapping[str, float] | None) -> dict[str, Any] | None:
    if not reference:
        return None
    labels = list(reference)
    observed = np.array([counts.get(label, 0) for label in labels], dtype=float)
    n = observed.sum()
    if n < 2:
        return None
    shares = np.array([reference[label] for label in labels], dtype=float) + 0.5 / n  # no empty expected cell
    expected = shares / shares.sum() * n
    from scipy.stats import chisquare

    result = chisquare(observed, expected)
    distance = 0.5 * float(np.abs(observed / n - expected / n).sum())
    return {
        "statistic": round(float(result.statistic), 4),
        "p_value": float(f"{result.pvalue:.3g}"),
        "distance": round(distance, 4),
        "flagged": bool(result.pvalue < ALPHA and distance >= EFFECT),
    }


def version_report(
    records: list[Mapping[str, Any]],
    feedback: Mapping[tuple[str, str], Sequence[str]],
    profile: Mapping[str, Any] | None,
    labels: Sequence[str],
    multi_label: bool,
) -> dict[str, Any]:
    """The report on one version's records (one role), ``feedback`` mapping the (id, request_id) of each answer a
    feedback judged to its true labels (a reused id's other answers are not judged by it)."""
    counts: dict[str, int] = {}
    for r in records:
        counts[r["label"]] = counts.get(r["label"], 0) + 1
    n = len(records)
    expected = [expected_right(r, profile, multi_label) for r in records]
    labelled = [(r, e) for r, e in zip(records, expected, strict=True) if (r["id"], r.get("request_id")) in feedback]
    right = [realised_right(r, feedback[r["id"], r.get("request_id")], labels, multi_label) for r, _ in labelled]
    shift = {
        "words": _ks([r["words"] for r in records], (profile or {}).get("words")),
        "oov": _ks([r["oov"] for r in records], (profile or {}).get("oov"), OOV_POINTS),
        "predicted": _labels_test(counts, (profile or {}).get("predicted")),
    }
    tested = [test for test in shift.values() if test is not None]
    return {
        "documents": n,
        "first": records[0]["time"] if records else None,
        "last": records[-1]["time"] if records else None,
        "predicted": {label: round(c / n, 4) for label, c in sorted(counts.items())} if n else {},
        "estimated_accuracy": round(float(np.mean(expected)), 4) if n else None,
        "estimate_from": "profile" if (profile or {}).get("confidence") and not multi_label else "scores",
        "feedback": {
            "documents": len(labelled),
            "accuracy": round(float(np.mean(right)), 4) if right else None,
            "interval": wilson(float(np.sum(right)), len(right)),
            "estimated_on_them": round(float(np.mean([e for _, e in labelled])), 4) if labelled else None,
        },
        "shift": {
            **shift,
            "flagged": any(test["flagged"] for test in tested) if tested else None,
            "alpha": ALPHA,
            "effect": EFFECT,
        },
    }


def report(
    records: Iterable[Mapping[str, Any]],
    feedback: Mapping[tuple[str, str], Sequence[str]],
    models: Mapping[str, tuple[Mapping[str, Any] | None, Sequence[str], bool]],
) -> list[dict[str, Any]]:
    """One report per (version, role) in the records, in order of first appearance. ``models`` maps a tag
    to (its profile, its labels, multi-label?); a tag it lacks is reported without a profile."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["model"], record.get("role", "production")), []).append(record)
    out = []
    for (tag, role), rows in groups.items():
        profile, labels, multi_label = models.get(tag) or (None, sorted(rows[0]["scores"]), looks_multi_label(rows))
        out.append({"model": tag, "role": role, **version_report(rows, feedback, profile, labels, multi_label)})
    return out


def _seconds(stamp: str) -> float:
    """A log time (``2026-11-27T12:00:00.000Z``) as seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def series(
    records: Sequence[Mapping[str, Any]],
    feedback: Mapping[tuple[str, str], Sequence[str]],
    profile: Mapping[str, Any] | None,
    labels: Sequence[str],
    multi_label: bool,
    buckets: int = 24,
) -> list[dict[str, Any]]:
    """The same figures over time, for charts: ``buckets`` equal spans of time from the first record to the
    last (not of record counts, so that a quiet night and a busy day read as such); a span without a record
    is left out. ``from`` and ``to`` are the span's bounds; the last span includes the last record."""
    if not records:
        return []
    times = [_seconds(str(r["time"])) for r in records]
    start, end = min(times), max(times)
    width = (end - start) / buckets
    chunks: dict[int, list[Mapping[str, Any]]] = {}
    for record, when in zip(records, times, strict=True):
        index = min(buckets - 1, int((when - start) / width)) if width > 0 else 0
        chunks.setdefault(index, []).append(record)
    out = []
    for index in sorted(chunks):
        chunk = chunks[index]
        figures = version_report(chunk, feedback, profile, labels, multi_label)
        low = start + index * width
        high = end if width == 0 or index == buckets - 1 else start + (index + 1) * width
        out.append(
            {
                "from": _iso(low),
                "to": _iso(high),
                "documents": figures["documents"],
                "estimated_accuracy": figures["estimated_accuracy"],
                "accuracy": figures["feedback"]["accuracy"],
                "feedback": figures["feedback"]["documents"],
                "words": figures["shift"]["words"]["median"] if figures["shift"]["words"] else None,
                "oov": round(float(np.mean([r["oov"] for r in chunk])), 4),
                "shift": figures["shift"]["flagged"],
            }
        )
    return out


def _iso(seconds: float) -> str:
    """Seconds since the epoch as the log writes times (UTC, milliseconds, Z)."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
