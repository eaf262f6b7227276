"""``han-model compare``'s figures (training/compare.py): real models on the fixture reviews."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from han import SavedModel
from tests.service_server import REPO, base_env, register_model
from tests.tiny_model import FIXTURES, train_tiny_model, worse_model
from training.compare import CompareError, compare, format_comparison, mcnemar_exact, worse_beyond_noise

DATA = FIXTURES / "reviews.jsonl"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("compare")
    good = train_tiny_model(seed=0)[0].save(tmp / "good")
    return {"good": good, "other": train_tiny_model(seed=3)[0].save(tmp / "other"),
            "worse": worse_model(SavedModel.load(good)).save(tmp / "worse"),
            "multi": train_tiny_model(multi_label=True)[0].save(tmp / "multi")}


def test_mcnemar_exact_against_a_hand_computed_case() -> None:
    # 9 documents only the new model gets right, 1 only the old: 2 * P(X <= 1 | n=10, p=1/2) = 2 * 11/1024
    assert mcnemar_exact(9, 1) == pytest.approx(22 / 1024)
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(3, 3) == 1.0


def test_a_model_against_itself_differs_in_nothing(models: dict[str, Path]) -> None:
    result = compare(str(models["good"]), str(models["good"]), DATA)
    assert result["difference"] == 0 and result["p_value"] == 1.0 and result["verdict"] == "no clear difference"
    assert result["interval"] == [0.0, 0.0] and not worse_beyond_noise(result)
    assert result["calibration"]["new"] == result["calibration"]["old"]
    json.dumps(result)  # kept as JSON


def test_two_models_give_every_figure(models: dict[str, Path]) -> None:
    result = compare(str(models["other"]), str(models["good"]), DATA, limit=30)
    assert result["documents"] == 30 and result["task"] == "single-label" and result["metric"] == "accuracy"
    low, high = result["interval"]
    assert low <= result["difference"] <= high
    assert set(result["classes"]) == {"neg", "pos"}
    assert {"f1_new", "f1_old", "change", "now_right", "now_wrong", "moved"} <= set(result["classes"]["pos"])
    assert result["ngram_share"] == {"new": None, "old": None}
    text = format_comparison(result)
    assert "accuracy: new" in text and "exact McNemar" in text and "calibration (ECE)" in text


def test_a_deliberately_worse_model_is_worse_beyond_the_noise(models: dict[str, Path]) -> None:
    result = compare(str(models["worse"]), str(models["good"]), DATA)
    assert result["difference"] < -0.5 and result["p_value"] < 0.001
    assert result["verdict"] == "worse" and worse_beyond_noise(result)
    assert result["interval"][1] < 0
    assert all(c["moved"] for c in result["classes"].values())
    better = compare(str(models["good"]), str(models["worse"]), DATA)
    assert better["verdict"] == "better" and not worse_beyond_noise(better)


def test_what_cannot_be_compared_is_said_in_one_line(models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(CompareError, match=r"is multi-label and .* single-label: they cannot be compared"):
        compare(str(models["multi"]), str(models["good"]), DATA)
    with pytest.raises(CompareError, match=r"no model directory or BentoML model named 'han-nothing:v1'"):
        compare("han-nothing:v1", str(models["good"]), DATA)
    with pytest.raises(CompareError, match=r"no column 'verdict'"):
        compare(str(models["good"]), str(models["good"]), DATA, label_column="verdict")
    unknown = tmp_path / "labels.jsonl"
    unknown.write_text(json.dumps({"text": "Fine.", "label": "meh"}) + "\n")
    with pytest.raises(CompareError, match=r"row 0 has the label 'meh', which the models do not know"):
        compare(str(models["good"]), str(models["good"]), unknown)
    with pytest.raises(CompareError, match=r"missing.csv: file not found"):
        compare(str(models["good"]), str(models["good"]), tmp_path / "missing.csv")


def test_the_command_compares_stored_models_and_keeps_the_result(models: dict[str, Path], tmp_path: Path) -> None:
    home = tmp_path / "bentoml"
    worse = register_model(models["worse"], home, "han-cmp")
    good = register_model(models["good"], home, "han-cmp")  # the latest: han-cmp:production before a promotion
    done = subprocess.run([sys.executable, "-m", "training.model_cli", "compare", worse, "han-cmp:production",
                           "--data", str(DATA), "--json", str(tmp_path / "out.json")],
                          cwd=REPO, env=base_env(home), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "): worse" in done.stdout
    kept = home / "deployments" / "han-cmp" / "comparisons" / f"{worse.split(':')[1]}-vs-{good.split(':')[1]}.json"
    assert json.loads(kept.read_text())["verdict"] == "worse"
    assert json.loads((tmp_path / "out.json").read_text())["new_tag"] == worse
    bad = subprocess.run([sys.executable, "-m", "training.model_cli", "compare", worse, "han-cmp:nope", "--data",
                          str(DATA)], cwd=REPO, env=base_env(home), capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and bad.stderr.startswith("error: no model directory or BentoML model named")
    assert len(bad.stderr.strip().splitlines()) == 1
