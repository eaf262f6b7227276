"""The monitor's figures on streams whose truth is known: the estimate follows the realised accuracy,
a faithful stream is not flagged, a shifted one is, and the interval covers the truth."""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitoring.report import report, series, version_report, wilson

LABELS = ["neg", "pos"]


def _stream(
    n: int, seed: int, words_mean: float = 200, oov: float = 0.02, calibrated: bool = True, pos_share: float = 0.5
) -> tuple[list[dict], dict[tuple[str, str], list[str]]]:
    """Documents whose top score is the true chance of being right (calibrated) or 0.15 above it."""
    rng = np.random.default_rng(seed)
    records: list[dict] = []
    truth: dict[tuple[str, str], list[str]] = {}
    for i in range(n):
        p_right = rng.uniform(0.55, 0.99)
        top = p_right if calibrated else min(0.999, p_right + 0.15)
        label = "pos" if rng.random() < pos_share else "neg"
        other = "neg" if label == "pos" else "pos"
        records.append(
            {
                "id": f"d{i}",
                "request_id": f"q{i}",
                "time": f"2026-11-27T12:{i // 600:02d}:00.000Z",
                "model": "m:1",
                "role": "production",
                "label": label,
                "labels": [label],
                "scores": {label: round(top, 4), other: round(1 - top, 4)},
                "words": int(rng.poisson(words_mean)),
                "oov": float(np.clip(rng.normal(oov, 0.01), 0, 1)),
            }
        )
        truth[f"d{i}", f"q{i}"] = [label if rng.random() < p_right else other]
    return records, truth


def _profile(seed: int = 99) -> dict:
    records, _ = _stream(2000, seed)
    return {
        "words": [r["words"] for r in records],
        "oov": [r["oov"] for r in records],
        "predicted": {"neg": 0.5, "pos": 0.5},
    }


def test_on_a_calibrated_in_domain_stream_the_estimate_is_close_and_nothing_is_flagged() -> None:
    records, truth = _stream(3000, seed=1)
    figures = version_report(records, truth, _profile(), LABELS, multi_label=False)
    assert abs(figures["estimated_accuracy"] - figures["feedback"]["accuracy"]) < 0.02
    low, high = figures["feedback"]["interval"]
    assert low <= figures["estimated_accuracy"] <= high
    assert figures["shift"]["flagged"] is False
    assert figures["documents"] == 3000 and set(figures["predicted"]) == {"neg", "pos"}


def test_the_profile_corrects_overconfident_scores() -> None:
    records, truth = _stream(3000, seed=2, calibrated=False)
    plain = version_report(records, truth, _profile(), LABELS, multi_label=False)
    assert plain["estimated_accuracy"] - plain["feedback"]["accuracy"] > 0.1  # the raw scores overstate it
    reference, reference_truth = _stream(5000, seed=3, calibrated=False)
    from sklearn.isotonic import IsotonicRegression

    top = np.array([max(r["scores"].values()) for r in reference])
    right = np.array([r["label"] == reference_truth[r["id"], r["request_id"]][0] for r in reference], dtype=float)
    fit = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(top, right)
    profile = {
        **_profile(),
        "confidence": {"top_score": fit.X_thresholds_.tolist(), "accuracy": fit.y_thresholds_.tolist()},
    }
    corrected = version_report(records, truth, profile, LABELS, multi_label=False)
    assert corrected["estimate_from"] == "profile"
    assert abs(corrected["estimated_accuracy"] - corrected["feedback"]["accuracy"]) < 0.02


def test_longer_documents_with_new_words_and_other_labels_are_flagged() -> None:
    records, truth = _stream(1000, seed=4, words_mean=80, oov=0.08, pos_share=0.8)
    figures = version_report(records, truth, _profile(), LABELS, multi_label=False)
    shift = figures["shift"]
    assert shift["flagged"] and shift["words"]["flagged"] and shift["oov"]["flagged"] and shift["predicted"]["flagged"]
    assert shift["words"]["median"] < shift["words"]["reference_median"]


def test_a_tiny_difference_on_a_large_stream_is_not_flagged() -> None:
    records, truth = _stream(20000, seed=5, words_mean=202)  # significant at this size, but not material
    assert version_report(records, truth, _profile(), LABELS, multi_label=False)["shift"]["words"]["flagged"] is False


def test_versions_and_roles_are_reported_apart_and_series_cover_the_stream() -> None:
    records, truth = _stream(600, seed=6)
    for r in records[300:]:
        r["model"], r["role"] = "m:2", "shadow"
    out = report(records, truth, {"m:1": (_profile(), LABELS, False)})
    assert [(r["model"], r["role"], r["documents"]) for r in out] == [
        ("m:1", "production", 300),
        ("m:2", "shadow", 300),
    ]
    assert out[1]["shift"]["words"] is None  # no profile for m:2
    for i, r in enumerate(records[:300]):
        r["time"] = f"2026-11-27T12:{i // 60:02d}:{i % 60:02d}.000Z"  # one a second
    points = series(records[:300], truth, _profile(), LABELS, False, buckets=6)
    assert len(points) == 6 and sum(p["documents"] for p in points) == 300


def test_series_buckets_span_equal_times_not_equal_counts() -> None:
    records, truth = _stream(400, seed=7)
    # 300 documents in the first minute, none for an hour and a half, 100 in the last minute of two hours
    for i, r in enumerate(records):
        r["time"] = f"2026-11-27T10:00:{i // 5:02d}.000Z" if i < 300 else f"2026-11-27T11:59:{(i - 300) // 2:02d}.000Z"
    points = series(records, truth, _profile(), LABELS, False, buckets=4)
    assert [p["documents"] for p in points] == [300, 100]  # the empty half hours are left out
    assert points[0]["from"] == "2026-11-27T10:00:00.000Z" and points[0]["to"] == "2026-11-27T10:29:57.250Z"
    assert points[1]["from"] == "2026-11-27T11:29:51.750Z" and points[1]["to"] == "2026-11-27T11:59:49.000Z"
    assert set(points[0]) == {"from", "to", "documents", "estimated_accuracy", "accuracy", "feedback", "words",
                              "oov", "shift"}
    same = series(records[:5], truth, _profile(), LABELS, False)  # one instant: one bucket
    assert len(same) == 1 and same[0]["documents"] == 5


def test_wilson_interval() -> None:
    assert wilson(0, 0) is None
    low, high = wilson(90, 100)
    assert low < 0.9 < high and low > 0.82 and high < 0.95
    # 95%: each bound is where the score test of p = 0.9 against it reaches z = 1.96 (to the 4 decimals kept)
    for bound in (low, high):
        assert abs(0.9 - bound) / math.sqrt(bound * (1 - bound) / 100) == pytest.approx(1.959964, abs=0.01)
    # the figures worked out by hand with z = 1.959964 (norm.ppf(0.975)), rounded to 4 decimals
    assert wilson(90, 100) == [0.8256, 0.9448]
    assert wilson(0, 10) == [0.0, 0.2775] and wilson(10, 10) == [0.7225, 1.0]
    assert wilson(1, 3) == [0.0615, 0.7923] and wilson(450, 1000) == [0.4194, 0.481]
