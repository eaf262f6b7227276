"""Self-training in `han-train fit`: a teacher fit, its labels for the unlabelled text, a second fit on both."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from han import SavedModel
from tests.test_training import REVIEWS, TOPICS, fit, rows

NEW_WORD = "zorblaxian"  # only in the unlabelled text


def unlabelled(tmp_path: Path) -> Path:
    """The fixture reviews again, without labels, each with a word no labelled review has."""
    path = tmp_path / "unlabelled.jsonl"
    path.write_text("".join(json.dumps({"text": f"{r['text']} A {NEW_WORD} thing."}) + "\n" for r in rows(REVIEWS)))
    return path


def test_the_second_model_trains_on_the_teachers_most_confident_labels(tmp_path: Path) -> None:
    extra = unlabelled(tmp_path)
    root = fit(tmp_path, "--data.unlabeled", str(extra), "--self_training.fraction", "0.5")
    teacher, student = SavedModel.load(root / "teacher" / "model"), SavedModel.load(root / "model")
    pseudo = pq.read_table(root / "pseudo-labelled.parquet").to_pylist()
    # 0.5 of 32 documents, as an equal quota for each of the 2 classes, the most confident first
    assert [r["label"] for r in pseudo].count("pos") == 8 and [r["label"] for r in pseudo].count("neg") == 8
    truth = {f"{r['text']} A {NEW_WORD} thing.": r["label"] for r in rows(REVIEWS)}
    assert sum(truth[r["text"]] == r["label"] for r in pseudo) >= 15, "the teacher fits these reviews"
    # the teacher never saw the unlabelled words; the second model's training split holds them
    assert NEW_WORD not in teacher.vocab and NEW_WORD in student.vocab
    # validation stays human-labelled: the same documents in both reports
    reports = [json.loads((r / "report" / "validation" / "metrics.json").read_text()) for r in (root / "teacher", root)]
    assert reports[0]["documents"] == reports[1]["documents"] == len(rows(REVIEWS))
    assert student.metadata["metrics"]["test"]["accuracy"] >= 0.9
    # the TF-IDF baseline learns from the human-labelled documents only (the second fit's training
    # split also holds the 16 pseudo-labelled ones); the teacher trains one too, to label with the
    # HAN averaged with its n-gram head where validation keeps the head
    assert teacher.metadata["baseline"]["training_documents"] == len(rows(REVIEWS))
    assert student.metadata["baseline"]["training_documents"] == len(rows(REVIEWS))


def test_without_unlabelled_text_one_model_is_trained(tmp_path: Path) -> None:
    root = fit(tmp_path, "--self_training.fraction", "0.5")
    assert (root / "model").is_dir() and not (root / "teacher").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--self_training.fraction", "1.5"], "self_training.fraction must be between 0 and 1"),
        (
            [
                "--data.label_column",
                "labels",
                "--data.multi_label",
                "true",
                f"--data.train={TOPICS}",
                f"--data.validation={TOPICS}",
                f"--data.test={TOPICS}",
            ],
            "self-training",
        ),
    ],
)
def test_bad_self_training_settings_stop_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        fit(tmp_path, "--data.unlabeled", str(unlabelled(tmp_path)), "--self_training.fraction", "0.5", *overrides)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err
