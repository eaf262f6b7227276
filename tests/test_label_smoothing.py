"""Label smoothing: the training loss against smoothed targets, and a real fit with it (and the sentence
attention's two losses) on the fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from han import Pipeline, SavedModel
from tests.conftest import REPO
from training.cli import main
from training.module import HANModule

SMOKE = str(REPO / "data" / "configs" / "smoke.yaml")


def test_a_fit_with_label_smoothing_and_the_attention_losses_exports_a_model_that_predicts(tmp_path: Path) -> None:
    root = tmp_path / "run"
    main(["fit", "--config", SMOKE, "--trainer.default_root_dir", str(root), "--data.cache_dir",
          str(tmp_path / "cache"), "--model.label_smoothing", "0.1", "--model.sentence_focus", "0.5",
          "--model.sentence_evidence", "0.5", "--model.sentence_values", "own", "--export.faithfulness", "0"])
    saved = SavedModel.load(root / "model")
    (result,) = Pipeline(saved)(["A wonderful film. Superb acting, I loved it."])
    assert result.label == "pos"
    (metrics,) = (root / "csv").rglob("metrics.csv")
    columns = metrics.read_text().splitlines()[0].split(",")
    assert {"train/sentence_entropy", "train/sentence_evidence"} <= set(columns)  # both were in the loss
    assert saved.model.config.sentence_values == "own"


def test_a_model_directory_with_the_removed_nb_features_setting_is_refused_in_one_line() -> None:
    from han.model import HANConfig

    assert HANConfig.from_dict({"vocab_size": 5, "num_labels": 2, "nb_features": 0}).vocab_size == 5
    with pytest.raises(ValueError, match="nb_features .* is no longer supported"):
        HANConfig.from_dict({"vocab_size": 5, "num_labels": 2, "nb_features": 1})


def test_label_smoothing_softens_the_training_loss_target() -> None:
    logits = torch.tensor([[8.0, -8.0]])
    target = torch.tensor([0])
    plain = HANModule(vocab_size=10, num_labels=2).loss_fn(logits, target)
    smoothed = HANModule(vocab_size=10, num_labels=2, label_smoothing=0.2).loss_fn(logits, target)
    assert smoothed > plain + 1.0  # a confident right answer is penalised once targets are smoothed
    with pytest.raises(ValueError, match="label_smoothing"):
        HANModule(vocab_size=10, num_labels=2, label_smoothing=1.0)


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")  # the step's logging, without a trainer
def test_the_sentence_attentions_losses_enter_the_training_loss_with_their_weights() -> None:
    """A training step's loss is the label's loss plus sentence_focus x the attention's entropy (a share of
    log n) plus sentence_evidence x the evidence loss; validation's is the label's loss alone."""
    from han.batch import Batch
    from training.attention_losses import sentence_evidence

    torch.manual_seed(0)
    sizes = {"vocab_size": 30, "num_labels": 2, "embed_dim": 8, "word_hidden": 6, "sentence_hidden": 6,
             "attention_dim": 8, "dropout": 0.0, "word_dropout": 0.0}
    batch = Batch(torch.randint(2, 30, (5, 4)), torch.tensor([4, 3, 2, 4, 1]), torch.tensor([3, 2]))
    target = torch.tensor([0, 1])
    plain = HANModule(**sizes)
    plain.net.train()
    label_loss = plain._loss(batch, target, "train")[0]
    output = plain.net(*batch)
    assert label_loss.item() == pytest.approx(torch.nn.functional.cross_entropy(output.logits, target).item(), abs=1e-6)
    w = output.sentence_weights
    entropy = torch.stack([-(w[d, :n] * w[d, :n].log()).sum() / torch.log(torch.tensor(float(n)))
                           for d, n in enumerate(batch.document_lengths.tolist())]).mean()
    evidence = sentence_evidence(w, output.sentence_logits, batch.document_lengths, target, False)
    assert entropy.item() > 0.1 and evidence.item() > 0.1  # both terms are there to be added
    for focus, weight in ((0.5, 0.0), (0.0, 0.3), (0.5, 0.3)):
        module = HANModule(**sizes, sentence_focus=focus, sentence_evidence=weight)
        module.net.load_state_dict(plain.net.state_dict())
        module.net.train()
        loss = module._loss(batch, target, "train")[0]
        expected = label_loss + focus * entropy + weight * evidence
        assert loss.item() == pytest.approx(expected.item(), abs=1e-5), (focus, weight)
        assert module._loss(batch, target, "val")[0].item() == pytest.approx(label_loss.item(), abs=1e-6)
