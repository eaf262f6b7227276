"""``han-model compare``'s figures (training/compare.py): real models on the fixture reviews."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from han import SavedModel
from tests.service_server import REPO, base_env, register_model
from tests.tiny_model import FIXTURES, read_jsonl, train_tiny_model, with_ngram_head, worse_model
from training.compare import CompareError, compare, format_comparison, mcnemar_exact, worse_beyond_noise

DATA = FIXTURES / "reviews.jsonl"  # 32 reviews, the 16 positive ones first
TOPICS = FIXTURES / "topics.jsonl"  # multi-label: a "labels" column of lists


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    import torch

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("compare")
    good = tiny_model_dir  # with its faithfulness recorded, as a fit records it
    return {"good": good, "other": with_ngram_head(train_tiny_model(seed=3)[0], 0.5).save(tmp / "other"),
            "worse": worse_model(SavedModel.load(good)).save(tmp / "worse"),
            "multi": train_tiny_model(multi_label=True)[0].save(tmp / "multi"),
            "multi_one_off": one_label_negated(train_tiny_model(multi_label=True)[0]).save(tmp / "multi_one_off")}


def one_label_negated(saved: SavedModel) -> SavedModel:
    """A multi-label model wrong on its first label alone (that label's logit negated), right on the rest."""
    import torch

    with torch.no_grad():
        saved.model.head.weight[0].neg_()
        saved.model.head.bias[0].neg_()
    return saved


def test_mcnemar_exact_against_a_hand_computed_case() -> None:
    # 9 documents only the new model gets right, 1 only the old: 2 * P(X <= 1 | n=10, p=1/2) = 2 * 11/1024
    assert mcnemar_exact(9, 1) == pytest.approx(22 / 1024)
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(3, 3) == 1.0


def test_a_model_against_itself_differs_in_nothing(models: dict[str, Path], tmp_path: Path) -> None:
    data = tmp_path / "reviews.jsonl"  # the reviews and two documents without a word, which are left out
    data.write_text(DATA.read_text() + "".join(json.dumps({"text": t, "label": "pos"}) + "\n" for t in ("", " \n")))
    result = compare(str(models["good"]), str(models["good"]), data)
    assert result["documents"] == 32 and result["skipped"] == 2 and result["sample"] is None
    assert result["difference"] == 0 and result["p_value"] == 1.0 and result["verdict"] == "no clear difference"
    assert result["interval"] == [0.0, 0.0] and not worse_beyond_noise(result)
    assert result["calibration"]["new"] == result["calibration"]["old"]
    assert all(c["now_right"] == c["now_wrong"] == 0 and not c["moved"] for c in result["classes"].values())
    assert "2 without words left out" in format_comparison(result)
    json.dumps(result)  # kept as JSON


def test_two_models_give_every_figure(models: dict[str, Path]) -> None:
    result = compare(str(models["other"]), str(models["good"]), DATA, limit=12)
    assert result["documents"] == 12 and result["task"] == "single-label" and result["metric"] == "accuracy"
    assert result["sample"] == {"rows": 12, "of": 32, "seed": 0}
    assert result["test"] == "exact McNemar" and result["verdict"] in ("better", "worse", "no clear difference")
    low, high = result["interval"]
    assert low <= result["difference"] <= high and 0 <= result["p_value"] <= 1
    assert set(result["classes"]) == {"neg", "pos"}
    assert {"f1_new", "f1_old", "change", "now_right", "now_wrong", "moved"} <= set(result["classes"]["pos"])
    # a seeded sample, not the first rows (which are all positive)
    assert all(0 < c["support"] < 12 for c in result["classes"].values())
    assert result["ngram_share"] == {"new": 0.5, "old": None}
    assert result["faithfulness"]["new"] is None
    attention = result["faithfulness"]["old"]["attention"]
    assert attention["top_sentence_x_random"] > 0 and len(attention["interval"]) == 2
    assert 0 <= attention["comprehensiveness"] <= 1 and attention["sufficiency"] is not None
    assert all(0 <= ece <= 1 for ece in result["calibration"].values())
    assert compare(str(models["other"]), str(models["good"]), DATA, limit=12) == result  # seeded
    text = format_comparison(result)
    assert "accuracy: new" in text and "exact McNemar" in text and "calibration (ECE)" in text
    assert "a sample of 32 rows, seed 0" in text and "new 0.5, old none (the HAN alone)" in text
    json.dumps(result)


def test_multi_label_models_are_compared_on_micro_f1(models: dict[str, Path]) -> None:
    result = compare(str(models["multi_one_off"]), str(models["multi"]), TOPICS)
    assert result["task"] == "multi-label" and result["metric"] == "micro_f1" and result["test"] == "paired bootstrap"
    assert result["documents"] == 16 and result["old_score"] == 1.0 and result["difference"] < 0
    low, high = result["interval"]
    assert low <= result["difference"] <= high < 0
    assert result["p_value"] < 0.05 and result["verdict"] == "worse" and worse_beyond_noise(result)
    labels = sorted({label for row in read_jsonl("topics.jsonl") for label in row["labels"]})
    assert list(result["classes"]) == labels and "now_right" not in result["classes"][labels[0]]
    assert [label for label, c in result["classes"].items() if c["moved"]] == [labels[0]]  # only the one negated
    assert "micro_f1: new" in format_comparison(result)
    same = compare(str(models["multi_one_off"]), str(models["multi_one_off"]), TOPICS)
    assert same["difference"] == 0 and same["p_value"] == 1.0 and same["verdict"] == "no clear difference"
    json.dumps(result)


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
    with pytest.raises(CompareError, match=r"row 0 has the label \['crude'\], but the models are single-label"):
        compare(str(models["good"]), str(models["good"]), TOPICS, label_column="labels")
    with pytest.raises(CompareError, match=r"limit must be 1 or more, not 0"):
        compare(str(models["good"]), str(models["good"]), DATA, limit=0)


def test_the_command_compares_stored_models_and_keeps_the_result(models: dict[str, Path], tmp_path: Path) -> None:
    home = tmp_path / "bentoml"
    good = register_model(models["good"], home, "han-cmp")  # the first version: han-cmp:production
    worse = register_model(models["worse"], home, "han-cmp")  # a later fit: served only once promoted
    data = tmp_path / "reviews.jsonl"  # a file datasets has not cached: it reads it anew
    data.write_bytes(DATA.read_bytes())
    done = subprocess.run([sys.executable, "-m", "registry.cli", "compare", worse, "han-cmp:production",
                           "--data", str(data), "--json", str(tmp_path / "out.json")],
                          cwd=REPO, env=base_env(home), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "): worse" in done.stdout
    assert "Generating" not in done.stderr, done.stderr  # no progress bar of datasets' reading the file
    kept = home / "deployments" / "han-cmp" / "comparisons" / f"{worse.split(':')[1]}-vs-{good.split(':')[1]}.json"
    assert json.loads(kept.read_text())["verdict"] == "worse"
    assert json.loads((tmp_path / "out.json").read_text())["new_tag"] == worse
    bad = subprocess.run([sys.executable, "-m", "registry.cli", "compare", worse, "han-cmp:nope", "--data",
                          str(DATA)], cwd=REPO, env=base_env(home), capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and bad.stderr.startswith("error: no model directory or BentoML model named")
    assert len(bad.stderr.strip().splitlines()) == 1
    corrupt = home / "models" / "han-cmp" / worse.split(":")[1] / "model.safetensors"
    corrupt.write_bytes(corrupt.read_bytes()[:100])
    broken = subprocess.run([sys.executable, "-m", "registry.cli", "compare", worse, good, "--data", str(DATA)],
                            cwd=REPO, env=base_env(home), capture_output=True, text=True, timeout=300)
    assert broken.returncode == 1 and "unreadable or mismatched weights" in broken.stderr, broken.stderr
    assert len(broken.stderr.strip().splitlines()) == 1
