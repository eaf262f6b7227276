"""Self-training in `han-train fit`: a teacher fit, its labels for the unlabelled text, a second fit on both."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import yaml

from han import Pipeline, SavedModel
from tests.test_training import REVIEWS, TOPICS, fit, rows
from training.data import HANDataModule
from training.self_training import TEACHER_SCORES, SelfTraining, pseudo_label

NEW_WORD = "zorblaxian"  # only in the unlabelled text


def unlabelled(tmp_path: Path) -> Path:
    """The fixture reviews again, without labels, each with a word no labelled review has."""
    path = tmp_path / "unlabelled.jsonl"
    path.write_text("".join(json.dumps({"text": f"{r['text']} A {NEW_WORD} thing."}) + "\n" for r in rows(REVIEWS)))
    return path


def test_the_second_model_trains_on_the_teachers_most_confident_labels(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extra = unlabelled(tmp_path)
    out = tmp_path / "exported"  # --export.output_dir is the second model's; the teacher's stays in the run
    root = fit(tmp_path, "--data.unlabeled", str(extra), "--self_training.fraction", "0.5",
               "--trainer.max_time", "00:00:30:00", "--export.output_dir", str(out))
    teacher, student = SavedModel.load(root / "teacher" / "model"), SavedModel.load(out / "model")
    pseudo = pq.read_table(root / "pseudo-labelled.parquet").to_pylist()
    # 0.5 of 32 documents, as an equal quota for each of the 2 classes, the most confident first
    assert [r["label"] for r in pseudo].count("pos") == 8 and [r["label"] for r in pseudo].count("neg") == 8
    truth = {f"{r['text']} A {NEW_WORD} thing.": r["label"] for r in rows(REVIEWS)}
    assert sum(truth[r["text"]] == r["label"] for r in pseudo) >= 15, "the teacher fits these reviews"
    # the most confident: each label's chosen documents are those the teacher scores highest for it
    answers = dict(zip(truth, Pipeline(teacher, batch_size=128)(list(truth)), strict=True))  # as pseudo_label reads
    for label in teacher.labels:
        chosen = {r["text"] for r in pseudo if r["label"] == label}
        kept = [a.scores[label] for text, a in answers.items() if a.label == label and text in chosen]
        passed = [a.scores[label] for text, a in answers.items() if a.label == label and text not in chosen]
        assert len(kept) == 8 and passed and min(kept) >= max(passed), (label, sorted(kept), sorted(passed))
    # the teacher never saw the unlabelled words; the second model's training split holds them
    assert NEW_WORD not in teacher.vocab and NEW_WORD in student.vocab
    # validation stays human-labelled: the same documents in both reports
    reports = [json.loads((r / "report" / "validation" / "metrics.json").read_text()) for r in (root / "teacher", out)]
    assert reports[0]["documents"] == reports[1]["documents"] == len(rows(REVIEWS))
    assert student.metadata["metrics"]["test"]["accuracy"] >= 0.9
    # the TF-IDF baseline learns from the human-labelled documents only (the second fit's training
    # split also holds the 16 pseudo-labelled ones); the teacher trains one too, to label with the
    # HAN averaged with its n-gram head where validation keeps the head
    assert teacher.metadata["baseline"]["training_documents"] == len(rows(REVIEWS))
    assert student.metadata["baseline"]["training_documents"] == len(rows(REVIEWS))
    # soft targets (the default): the second fit learns the teacher's scores, not only its top label
    scores = pq.read_table(root / "pseudo-labelled.parquet").column(TEACHER_SCORES).to_pylist()
    assert all(abs(sum(s) - 1) < 1e-4 and len(s) == 2 for s in scores)
    assert [teacher.labels[max(range(2), key=s.__getitem__)] for s in scores] == [r["label"] for r in pseudo]
    config = yaml.safe_load(next((root / "csv").glob("version_*/config.yaml")).read_text())
    data = HANDataModule(**config["data"])
    data.setup()
    targets = data.splits["train"].targets
    assert targets.shape == (len(data.splits["train"]), 2) and data.pseudo_labelled_rows == 16
    by_text = dict(zip([r["text"] for r in pseudo], scores, strict=True))
    for text, row in zip(data.texts("train")[-16:], targets[-16:].tolist(), strict=True):
        expected = [by_text[text][teacher.labels.index(name)] for name in data.label_names]
        assert row == pytest.approx(expected, abs=1e-5)
    assert set(targets[:-16].sum(1).tolist()) == {1.0} and set(targets[:-16].flatten().tolist()) == {0.0, 1.0}
    # the budget is the whole run's: the second fit gets what the first and the labelling left
    left = int(re.search(r"the second fit has (\d+) s of trainer.max_time left", capsys.readouterr().err)[1])
    assert 1000 < left < 1800 and config["trainer"]["max_time"] == f"00:00:{left // 60:02d}:{left % 60:02d}"
    assert not (root / "teacher" / "report" / "test").exists()  # only the exported model is read on test
    # hard targets: the teacher's top label alone
    settings = SimpleNamespace(data=SimpleNamespace(**config["data"]),
                               self_training=SelfTraining(fraction=0.5, targets="hard"))
    hard = pseudo_label(root / "teacher" / "model", settings, tmp_path / "hard.parquet")
    table = pq.read_table(tmp_path / "hard.parquet")
    assert hard["chosen"] == 16 and table.column_names == ["text", "label"]
    assert table.column("label").to_pylist() == [r["label"] for r in pseudo]


def test_without_unlabelled_text_one_model_is_trained(tmp_path: Path) -> None:
    root = fit(tmp_path, "--self_training.fraction", "0.5")
    assert (root / "model").is_dir() and not (root / "teacher").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--self_training.fraction", "1.5"], "self_training.fraction must be between 0 and 1"),
        (["--self_training.targets", "fuzzy"], "self_training.targets must be one of soft, hard"),
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
