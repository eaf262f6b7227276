"""The forward without gradients in numpy equals the torch network's, and a process that only classifies
never imports torch (issue 62: ``import torch`` is about 200 MB of a serving worker)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from han import collate
from han.numpy_forward import NumpyHAN, check_weights
from han.saved_model import ModelDirectoryError, SavedModel
from tests.test_model import make_model, random_document

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("sentence_values", ["contextual", "own"])
@pytest.mark.parametrize("multi_label", [False, True])
def test_the_numpy_forward_gives_the_torch_networks_logits_weights_and_vectors(
    sentence_values: str, multi_label: bool
) -> None:
    model = make_model(seed=3, multi_label=multi_label, sentence_values=sentence_values)
    network = NumpyHAN(model.config, {k: v.numpy() for k, v in model.state_dict().items()})
    g = torch.Generator().manual_seed(5)
    docs = [random_document(g, s, w) for s, w in ((1, 1), (1, 9), (6, 1), (4, 12), (9, 5), (2, 3))]
    batch = collate(docs)
    read: list[torch.Tensor] = []
    model.head.register_forward_hook(lambda _m, i, _o: read.append(i[0]))
    with torch.inference_mode():
        expected = model(*batch)
    ids = np.concatenate([np.array(s) for d in docs for s in d])
    got = network(ids, batch.sentence_lengths.numpy(), batch.document_lengths.numpy())
    np.testing.assert_allclose(got.logits, expected.logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(got.word_weights, expected.word_weights.numpy(), atol=1e-6)
    np.testing.assert_allclose(got.sentence_weights, expected.sentence_weights.numpy(), atol=1e-6)
    np.testing.assert_allclose(got.document_vectors, read[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(network.probabilities(got.logits), model.probabilities(expected.logits).numpy(),
                               atol=1e-6)


def test_weights_that_do_not_fit_the_config_are_named() -> None:
    model = make_model()
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    weights.pop("head.bias")
    weights["word_rnn.forward_rnn.weight_hh_l0"] = np.zeros((3, 3), dtype=np.float32)
    weights["extra"] = np.zeros(1, dtype=np.float32)
    with pytest.raises(ValueError, match=r"missing head\.bias; unexpected extra; wrong shape: "
                                         r"word_rnn\.forward_rnn\.weight_hh_l0 \(3, 3\) \(expected \(18, 6\)\)"):
        check_weights(model.config, weights)


def test_a_directory_with_weights_of_another_shape_is_refused_naming_the_file(tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    saved = SavedModel.load(tiny_model_dir)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config["model"]["word_hidden"] += 1
    target = saved.save(tmp_path / "m")
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelDirectoryError, match=r"model\.safetensors: unreadable or mismatched weights \(wrong sh"):
        SavedModel.load(target)


def test_a_loaded_model_builds_the_same_torch_network_when_a_gradient_method_needs_it(tiny_model_dir: Path) -> None:
    saved = SavedModel.load(tiny_model_dir)
    weights = {k: v.copy() for k, v in saved.weights.items()}
    state = saved.model.state_dict()  # built now
    assert set(state) == set(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(state[name].numpy(), value)


CLASSIFY_WITHOUT_TORCH = """
import sys
from han.environment import tune_process
from han.pipeline import Pipeline
tune_process(1)
pipeline = Pipeline.from_directory(sys.argv[1])
texts = ["A wonderful film. I loved every minute of it.", "Dull and far too long. I left early."]
attention = pipeline(texts, explain=True)
plain = pipeline(texts)
print("torch imported:", "torch" in sys.modules)
gradients = pipeline(texts, explain="integrated_gradients")
print("after a gradient method:", "torch" in sys.modules)
print("labels:", [r.label for r in attention] == [r.label for r in plain] == [r.label for r in gradients])
print("scores:", [r.scores for r in attention] == [r.scores for r in plain] == [r.scores for r in gradients])
print("words:", all(len(s.words) > 0 for r in attention for s in r.sentences))
"""


def test_classifying_and_explaining_with_attention_never_imports_torch(tiny_model_dir: Path) -> None:
    out = subprocess.run([sys.executable, "-c", CLASSIFY_WITHOUT_TORCH, str(tiny_model_dir)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:5] == ["torch imported: False", "after a gradient method: True",
                                          "labels: True", "scores: True", "words: True"], out.stdout
