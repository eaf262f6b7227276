"""Temperature scaling: it lowers the calibration error of an over-confident model and keeps its labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from han import Pipeline, SavedModel
from han.calibration import calibration_bins, expected_calibration_error, fit_temperature, probabilities


def over_confident(n: int, labels: int, multi_label: bool, inflate: float = 4.0, seed: int = 0):
    """Targets drawn from calibrated logits, and those logits multiplied by ``inflate``: a model
    whose scores are over-confident by a known temperature."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1.5, size=(n, labels))
    probs = probabilities(logits, multi_label)
    if multi_label:
        targets = (rng.random((n, labels)) < probs).astype(np.float32)
    else:
        targets = np.array([rng.choice(labels, p=p / p.sum()) for p in probs.astype(np.float64)])
    return (logits * inflate).astype(np.float32), targets


@pytest.mark.parametrize("multi_label", [False, True])
def test_the_fitted_temperature_undoes_over_confidence_and_lowers_ece(multi_label: bool) -> None:
    logits, targets = over_confident(4000, 5, multi_label)
    t = fit_temperature(logits, targets, multi_label)
    assert 3.0 < t < 5.0  # the inflation was 4
    before = expected_calibration_error(probabilities(logits, multi_label), targets, multi_label)
    after = expected_calibration_error(probabilities(logits, multi_label, t), targets, multi_label)
    assert before > 0.1 and after < before / 3


def test_ece_of_a_perfectly_calibrated_model_is_near_zero_and_bins_add_up() -> None:
    logits, targets = over_confident(20000, 3, False, inflate=1.0)
    probs = probabilities(logits, False)
    assert expected_calibration_error(probs, targets, False) < 0.02
    bins = calibration_bins(probs, targets, False)
    assert sum(bins["count"]) == 20000 and len(bins["count"]) == 15


def test_a_model_directory_carries_its_temperature_and_the_pipeline_applies_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    texts = ["A wonderful, superb film. Loved it.", "Awful and boring. Hated it."]
    saved = SavedModel.load(tiny_model_dir)
    assert saved.temperature == 1.0  # written before calibration existed: unchanged scores
    raw = Pipeline(saved)(texts)
    saved.temperature = 3.0
    hot = Pipeline(SavedModel.load(saved.save(tmp_path / "m")))(texts)
    assert [r.label for r in hot] == [r.label for r in raw]
    for r, h in zip(raw, hot, strict=True):
        assert max(h.scores.values()) < max(r.scores.values())  # softer, same order
