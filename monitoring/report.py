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
    columns = _columns(records, feedback, profile, labels, multi_label)
    return figures(*columns, str(records[0]["time"]) if records else None,
                   str(records[-1]["time"]) if records else None, profile, multi_label)


def _columns(records: Sequence[Mapping[str, Any]], feedback: Mapping[tuple[str, str], Sequence[str]],
             profile: Mapping[str, Any] | None, labels: Sequence[str], multi_label: bool
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[Any]]:
    """The per-document numbers the figures are made of (``monitoring.estimates`` gathers the same while
    it streams the log): expected, realised (NaN where no feedback judged it), words, oov, label codes."""
    names: dict[Any, int] = {}
    right = [realised_right(r, feedback[key], labels, multi_label)
             if (key := (r["id"], r.get("request_id"))) in feedback else math.nan for r in records]
    return (np.array([expected_right(r, profile, multi_label) for r in records], dtype=float),
            np.array(right, dtype=float), np.array([r["words"] for r in records], dtype=float),
            np.array([r["oov"] for r in records], dtype=float),
            np.array([names.setdefault(r["label"], len(names)) for r in records], dtype=np.int64), list(names))


def figures(expected: np.ndarray, right: np.ndarray, words: np.ndarray, oov: np.ndarray, codes: np.ndarray,
            names: Sequence[Any], first: str | None, last: str | None, profile: Mapping[str, Any] | None,
            multi_label: bool) -> dict[str, Any]:
    """The figures of one version's documents, from their numbers alone (``right``: NaN where not judged;
    ``codes``: each predicted label as an index into ``names``)."""
    n = len(expected)
    counts = {names[code]: int(c) for code, c in enumerate(np.bincount(codes, minlength=len(names))) if c}
    judged = ~np.isnan(right)
    realised, on_them = right[judged], expected[judged]
    shift = {
        "words": _ks(words, (profile or {}).get("words")),
        "oov": _ks(oov, (profile or {}).get("oov"), OOV_POINTS),
        "predicted": _labels_test(counts, (profile or {}).get("predicted")),
    }
    tested = [test for test in shift.values() if test is not None]
    return {
        "documents": n,
        "first": first,
        "last": last,
        "predicted": {label: round(c / n, 4) for label, c in sorted(counts.items())} if n else {},
        "estimated_accuracy": round(float(np.mean(expected)), 4) if n else None,
        "estimate_from": "profile" if (profile or {}).get("confidence") and not multi_label else "scores",
        "feedback": {
            "documents": len(realised),
            "accuracy": round(float(np.mean(realised)), 4) if len(realised) else None,
            "interval": wilson(float(np.sum(realised)), len(realised)),
            "estimated_on_them": round(float(np.mean(on_them)), 4) if len(on_them) else None,
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
    times = np.array([_seconds(str(r["time"])) for r in records], dtype=float)
    return series_of(times, *_columns(records, feedback, profile, labels, multi_label), profile, multi_label, buckets)


def series_of(times: np.ndarray, expected: np.ndarray, right: np.ndarray, words: np.ndarray, oov: np.ndarray,
              codes: np.ndarray, names: Sequence[Any], profile: Mapping[str, Any] | None, multi_label: bool,
              buckets: int = 24) -> list[dict[str, Any]]:
    """``series`` from the documents' numbers (``times``: seconds since the epoch)."""
    if not len(times):
        return []
    start, end = float(times.min()), float(times.max())
    width = (end - start) / buckets
    index = (np.minimum(buckets - 1, ((times - start) / width).astype(np.int64)) if width > 0
             else np.zeros(len(times), dtype=np.int64))
    out = []
    for bucket in np.unique(index).tolist():
        at = index == bucket
        chunk = figures(expected[at], right[at], words[at], oov[at], codes[at], names, None, None, profile, multi_label)
        low = start + bucket * width
        high = end if width == 0 or bucket == buckets - 1 else start + (bucket + 1) * width
        out.append(
            {
                "from": _iso(low),
                "to": _iso(high),
                "documents": chunk["documents"],
                "estimated_accuracy": chunk["estimated_accuracy"],
                "accuracy": chunk["feedback"]["accuracy"],
                "feedback": chunk["feedback"]["documents"],
                "words": chunk["shift"]["words"]["median"] if chunk["shift"]["words"] else None,
                "oov": round(float(np.mean(oov[at])), 4),
                "shift": chunk["shift"]["flagged"],
            }
        )
    return out


def _iso(seconds: float) -> str:
    """Seconds since the epoch as the log writes times (UTC, milliseconds, Z)."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
