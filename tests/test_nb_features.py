"""Naive Bayes log-count ratios beside the embedding, and label smoothing: real fits on the fixture."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from han import Pipeline, SavedModel
from tests.conftest import REPO
from training.cli import main
from training.module import HANClassifier
from training.nb_features import nb_ratios

SMOKE = str(REPO / "data" / "configs" / "smoke.yaml")


def test_a_word_seen_only_with_one_label_leans_to_it() -> None:
    # vocab ids: 2 "good" (positive documents only), 3 "bad" (negative only), 4 "film" (both)
    documents = [(np.array([2, 4]), np.array([2])), (np.array([2]), np.array([1])),
                 (np.array([3, 4]), np.array([2])), (np.array([3, 3]), np.array([2]))]
    ratios = nb_ratios(documents, torch.tensor([1, 1, 0, 0]), vocab_size=5, multi_label=False)
    assert ratios.shape == (5, 1)
    assert ratios[2, 0] > 0 > ratios[3, 0] and abs(ratios[4, 0]) < 1e-6
    np.testing.assert_array_equal(ratios[:2], 0)  # padding and <unk>


def test_fit_with_nb_features_and_label_smoothing_exports_a_model_that_predicts(tmp_path: Path) -> None:
    root = tmp_path / "run"
    main(["fit", "--config", SMOKE, "--trainer.default_root_dir", str(root), "--data.cache_dir",
          str(tmp_path / "cache"), "--model.nb_features", "true", "--model.label_smoothing", "0.1",
          "--export.faithfulness", "0"])
    saved = SavedModel.load(root / "model")
    assert saved.model.config.nb_features == 1
    ratios = saved.model.nb_ratios
    assert ratios[saved.vocab.stoi["wonderful"], 0] > 0 > ratios[saved.vocab.stoi["boring"], 0]
    (result,) = Pipeline(saved)(["A wonderful film. Superb acting, I loved it."])
    assert result.label == "pos"


def test_label_smoothing_softens_the_training_loss_target() -> None:
    logits = torch.tensor([[8.0, -8.0]])
    target = torch.tensor([0])
    plain = HANClassifier(vocab_size=10, num_labels=2).loss_fn(logits, target)
    smoothed = HANClassifier(vocab_size=10, num_labels=2, label_smoothing=0.2).loss_fn(logits, target)
    assert smoothed > plain + 1.0  # a confident right answer is penalised once targets are smoothed
    with pytest.raises(ValueError, match="label_smoothing"):
        HANClassifier(vocab_size=10, num_labels=2, label_smoothing=1.0)
