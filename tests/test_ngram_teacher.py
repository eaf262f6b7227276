"""The n-gram teacher: training targets partly the TF-IDF baseline's scores, cross-fitted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from training.baseline import labelled_training_split, train_baseline
from training.data import HANDataModule
from training.ngram_teacher import cross_fitted_scores, mixed_targets
from training.sources import DataError

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "data" / "fixtures" / "reviews.jsonl"


def _corpus() -> tuple[list[str], np.ndarray]:
    """Clear documents of two classes and, last, one worded like the first class but labelled the
    second, with a word no other document has."""
    texts = [f"wonderful lovely superb film number{i}" for i in range(15)]
    texts += [f"dreadful awful boring film number{i}" for i in range(15)]
    texts.append("wonderful lovely superb film zzzunique")
    return texts, np.array([0] * 15 + [1] * 16)


def test_each_document_is_scored_by_a_baseline_that_never_saw_it() -> None:
    texts, labels = _corpus()
    scores = cross_fitted_scores(texts, labels, 2, folds=5, seed=0)
    assert scores.shape == (31, 2) and np.allclose(scores.sum(1), 1)
    # Fitted on every document, the baseline learns the odd one's own word and gives it its label;
    # cross-fitted, it has not seen that word and reads the document as its words say: the first class.
    everything = train_baseline(texts, labels, False)
    seen = everything.classifier.predict_proba(everything.vectorizer.transform(texts[-1:]))[0]
    assert seen[1] > 0.5 > scores[-1, 1]
    assert (scores[:30].argmax(1) == labels[:30]).all()  # the clear ones, right
    assert np.array_equal(scores, cross_fitted_scores(texts, labels, 2, folds=5, seed=0))  # seeded
    assert not np.array_equal(scores, cross_fitted_scores(texts, labels, 2, folds=5, seed=1))  # by the seed given


def test_mixed_targets_keep_the_label_on_top_and_leave_self_trainings_rows_alone() -> None:
    texts, labels = _corpus()
    mixed = mixed_targets(texts, torch.as_tensor(labels), 2, 0.3, seed=0)
    scores = torch.as_tensor(cross_fitted_scores(texts, labels, 2, seed=0), dtype=torch.float32)
    expected = 0.7 * torch.nn.functional.one_hot(torch.as_tensor(labels), 2).float() + 0.3 * scores
    assert torch.allclose(mixed, expected) and torch.allclose(mixed.sum(1), torch.ones(31))
    assert (mixed.argmax(1) == torch.as_tensor(labels)).all()
    assert mixed[-1, 1] < 0.75  # the odd document's target is less sure than a clear one's
    # Probability rows: the first ones human (one-hot), then a self-training teacher's, which stay as they are.
    pseudo = torch.tensor([[0.8, 0.2], [0.1, 0.9]])
    rows = torch.cat([torch.nn.functional.one_hot(torch.as_tensor(labels), 2).float(), pseudo])
    out = mixed_targets(texts, rows, 2, 0.3, seed=0)
    assert torch.allclose(out[:31], expected) and torch.equal(out[31:], pseudo)
    # Top labels appended (hard self-training, or a pseudo-labelled file without scores): kept as one-hot rows.
    out = mixed_targets(texts, torch.cat([torch.as_tensor(labels), torch.tensor([1, 0])]), 2, 0.3, seed=0)
    assert out.shape == (33, 2) and torch.equal(out[31:], torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    # A class with one document cannot be cross-fitted: the targets stay the labels.
    single = torch.tensor([0] * 10 + [1])
    assert torch.equal(mixed_targets([f"w{i}" for i in range(11)], single, 2, 0.3, seed=0), single)


def test_the_datamodule_mixes_the_training_split_only(tmp_path: Path) -> None:
    def module(share: float | None) -> HANDataModule:
        dm = HANDataModule(train=str(FIXTURE), test=str(FIXTURE), val_fraction=0.25, min_freq=1,
                           ngram_teacher=share, cache_dir=str(tmp_path))
        dm.setup()
        return dm

    plain, taught = module(None), module(0.3)
    assert plain.splits["train"].targets.ndim == 1  # unset: the labels alone
    targets = taught.splits["train"].targets
    assert targets.shape == (24, 2) and torch.allclose(targets.sum(1), torch.ones(24))
    assert torch.equal(targets.argmax(1), plain.splits["train"].targets)
    assert not torch.equal(targets, torch.nn.functional.one_hot(plain.splits["train"].targets, 2).float())
    assert targets.min() < 0.3 < targets.max() and (targets.max(1).values >= 0.7).all()
    for split in ("validation", "test"):  # scored against the human labels alone
        assert torch.equal(taught.splits[split].targets, plain.splits[split].targets)
    # The fit's own baseline (and n-gram head) learns from the labels, not the mixed targets.
    assert np.array_equal(labelled_training_split(taught)[1], plain.splits["train"].targets.numpy())
    # Self-training's documents (here their top labels alone) follow the human ones and keep their labels.
    pseudo = tmp_path / "pseudo.parquet"
    pq.write_table(pa.table({"text": ["a dull, tiresome film", "a joyful delight"], "label": ["neg", "pos"]}), pseudo)
    both = HANDataModule(train=str(FIXTURE), pseudo_labelled=str(pseudo), val_fraction=0.25, min_freq=1,
                         ngram_teacher=0.3, cache_dir=str(tmp_path))
    both.setup()
    rows = both.splits["train"].targets
    assert torch.allclose(rows[:24], targets) and torch.equal(rows[24:], torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    with pytest.raises(DataError, match="data.ngram_teacher must be at least 0 and under 0.5, not 0.5"):
        HANDataModule(train=str(FIXTURE), ngram_teacher=0.5)
    multi = HANDataModule(train=str(REPO / "data" / "fixtures" / "topics.jsonl"), label_column="labels",
                          multi_label=True, ngram_teacher=0.3, min_freq=1, cache_dir=str(tmp_path))
    with pytest.raises(DataError, match="data.ngram_teacher is for single-label data"):
        multi.setup()
