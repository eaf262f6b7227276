"""Model directories: save/load round trip; every missing or corrupt file is named in the error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from han import ModelDirectoryError, Pipeline, SavedModel

TEXTS = ["A wonderful film, superb acting.", "Boring. The plot made no sense at all!"]


def test_save_then_load_gives_identical_outputs(tiny_model_dir: Path, tmp_path: Path) -> None:
    loaded = SavedModel.load(tiny_model_dir)
    again = SavedModel.load(loaded.save(tmp_path / "copy"))
    a, b = Pipeline(loaded)(TEXTS, explain=True), Pipeline(again)(TEXTS, explain=True)
    assert [p.scores for p in a] == [p.scores for p in b]
    assert [s.weight for s in a[1].sentences] == [s.weight for s in b[1].sentences]
    assert sorted(p.name for p in tiny_model_dir.iterdir()) == [
        "config.json", "labels.json", "model.safetensors", "vocab.json",
    ]
    state = loaded.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in again.model.state_dict().items())


@pytest.mark.parametrize("name", ["config.json", "vocab.json", "labels.json", "model.safetensors"])
def test_a_missing_file_is_named(tiny_model_dir: Path, tmp_path: Path, name: str) -> None:
    broken = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    (broken / name).unlink()
    with pytest.raises(ModelDirectoryError, match=rf"{name}: missing"):
        SavedModel.load(broken)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("config.json", "{not json", "not valid JSON"),
        ("config.json", '{"model": {"vocab_size": 3}}', "invalid model config"),
        ("vocab.json", '{"tokens": 1}', "unreadable vocabulary"),
        ("labels.json", '["only-one"]', "1 labels but the model has 2"),
        ("model.safetensors", "garbage bytes", "unreadable or mismatched weights"),
    ],
)
def test_a_corrupt_file_is_named(tiny_model_dir: Path, tmp_path: Path, name: str, content: str, message: str) -> None:
    broken = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    (broken / name).write_text(content)
    with pytest.raises(ModelDirectoryError, match=rf"{name}: {message}"):
        SavedModel.load(broken)


def test_truncated_weights_are_reported(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ModelDirectoryError, match=r"model\.safetensors: unreadable"):
        SavedModel.load(broken)


def test_no_pickle_in_a_model_directory(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model"]["num_labels"] == 2
    for path in tiny_model_dir.iterdir():
        assert not path.read_bytes().startswith(b"\x80"), f"{path.name} looks like a pickle"


def test_a_path_that_is_not_a_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelDirectoryError, match="nowhere: not a model directory"):
        SavedModel.load(tmp_path / "nowhere")


MODEL_V1 = Path(__file__).resolve().parent.parent / "data" / "fixtures" / "model_v1"


def test_a_model_directory_written_before_the_pipeline_still_loads_and_scores_the_same() -> None:
    """data/fixtures/model_v1 was written by the code before the inference pipeline (commit b2eca57),
    with the labels, scores and attention it gave then: users' stored models survive the upgrade."""
    expected = json.loads((MODEL_V1 / "expected.json").read_text())
    results = Pipeline.from_directory(MODEL_V1 / "model")([e["text"] for e in expected], explain=True)
    for result, then in zip(results, expected, strict=True):
        assert (result.label, result.labels) == (then["label"], then["labels"])
        assert result.scores == pytest.approx(then["scores"], abs=1e-6)
        assert [s.weight for s in result.sentences] == pytest.approx(then["sentence_weights"], abs=1e-6)
        for sentence, weights in zip(result.sentences, then["word_weights"], strict=True):
            assert [w.weight for w in sentence.words] == pytest.approx(weights, abs=1e-6)


@pytest.mark.parametrize(("change", "message"), [
    ({"segmenter": {"max_words": 0}}, "segmenter.max_words must be a whole number of at least 1, not 0"),
    ({"segmenter": {"max_chars": "100000"}}, "segmenter.max_chars must be a whole number of at least 1"),
    ({"threshold": 2}, "threshold must be between 0 and 1, not 2.0"),
    ({"temperature": "inf"}, "temperature must be positive and finite, not inf"),
])
def test_values_every_call_would_fail_on_are_refused_at_load(tiny_model_dir: Path, tmp_path: Path, change: dict,
                                                             message: str) -> None:
    """They loaded, then every document raised (ZeroDivisionError, TypeError) or got no label / a score of
    0.5: a model directory edited by hand, or written by another tool."""
    broken = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    config = json.loads((broken / "config.json").read_text())
    for key, value in change.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelDirectoryError, match=f"config.json: invalid model config \\({message}"):
        SavedModel.load(broken)


def test_repeated_labels_and_a_tensor_numpy_cannot_read_are_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    (broken / "labels.json").write_text('["pos", "pos"]')  # scores are a dict by label: one would vanish
    with pytest.raises(ModelDirectoryError, match="labels.json: a label is named twice"):
        SavedModel.load(broken)
    shutil.copy(tiny_model_dir / "labels.json", broken / "labels.json")
    weights = load_file(str(broken / "model.safetensors"))
    weights[next(iter(weights))] = next(iter(weights.values())).to(torch.bfloat16)  # a bf16 export
    save_file(weights, str(broken / "model.safetensors"))
    with pytest.raises(ModelDirectoryError, match="model.safetensors: unreadable or mismatched weights"):
        SavedModel.load(broken)


# Saves the model directory argv[1] into argv[2]; once the weights are written it pauses, so the test can
# kill the process in the middle of the save.
_SLOW_SAVE = """
import sys, time
import han.saved_model as sm
real = sm.save_file
def slow(*args, **kwargs):
    real(*args, **kwargs)
    print("weights written", flush=True)
    time.sleep(60)
sm.save_file = slow
sm.SavedModel.load(sys.argv[1]).save(sys.argv[2])
"""


def test_a_save_killed_midway_leaves_the_previous_model_whole(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A fit killed while it exports over the previous fit's model directory: the previous model stays,
    whole and alone (it once became new config and weights beside the old n-gram head and profile)."""
    import signal
    import subprocess
    import sys

    from tests.tiny_model import with_ngram_head

    previous = with_ngram_head(SavedModel.load(tiny_model_dir), 0.3)
    previous.profile = {"documents": 3}
    target = previous.save(tmp_path / "runs" / "model")
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    repo = Path(__file__).resolve().parent.parent
    child = subprocess.Popen([sys.executable, "-c", _SLOW_SAVE, str(tiny_model_dir), str(target)], cwd=repo,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "weights written\n", child.stderr
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert SavedModel.load(target).ngrams is not None

    SavedModel.load(tiny_model_dir).save(target)  # the next export replaces it whole: nothing of the old one
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in tiny_model_dir.iterdir())
    assert [p.name for p in target.parent.iterdir()] == ["model"]  # what the killed save left is swept
