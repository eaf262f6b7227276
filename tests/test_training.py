"""han-train: real Lightning runs on the fixture data in every input format, resume after kill -9, clear errors."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import datasets
import numpy as np
import pytest

import model_store
from han import Pipeline, SavedModel
from tests.conftest import REPO
from training.baseline import advice
from training.cli import main
from training.data import HANDataModule

SMOKE = str(REPO / "data" / "configs" / "smoke.yaml")
REVIEWS = REPO / "data" / "fixtures" / "reviews.jsonl"
TOPICS = REPO / "data" / "fixtures" / "topics.jsonl"


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def fit(tmp_path: Path, *overrides: str, data: Path | None = None) -> Path:
    """Run `han-train fit` in-process on the smoke config (train = validation = test = ``data``
    when given); returns the run's root directory."""
    root = tmp_path / "run"
    sources = [f"--data.{split}={data}" for split in ("train", "validation", "test")] if data else []
    main(["fit", "--config", SMOKE, "--trainer.default_root_dir", str(root),
          "--data.cache_dir", str(tmp_path / "cache"), *sources, *overrides])
    return root


def write_format(tmp_path: Path, fmt: str) -> Path:
    data = rows(REVIEWS)
    if fmt == "folder":
        for r in data:
            folder = tmp_path / "reviews" / r["label"]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{r['id']}.txt").write_text(r["text"])
        return tmp_path / "reviews"
    ds = datasets.Dataset.from_list(data)
    path = tmp_path / f"reviews.{fmt}"
    {"csv": ds.to_csv, "parquet": ds.to_parquet, "jsonl": ds.to_json}[fmt](str(path))
    return path


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl", "folder"])
def test_fit_reads_every_input_format_and_exports_a_loadable_model(tmp_path: Path, fmt: str) -> None:
    root = fit(tmp_path, data=write_format(tmp_path, fmt))
    saved = SavedModel.load(root / "model")
    assert saved.labels == ["neg", "pos"]
    metrics = saved.metadata["metrics"]
    assert set(metrics["test"]) == {"accuracy", "macro_f1", "ece_before", "ece_after"}
    assert metrics["test"]["accuracy"] >= 0.9, "the smoke run should fit its own training data"
    report = json.loads((root / "report" / "test" / "metrics.json").read_text())
    assert report["documents"] == 32 and len(report["confusion_matrix"]) == 2
    assert (root / "report" / "test" / "confusion_matrix.png").stat().st_size > 1000
    assert (root / "report" / "test" / "reliability.png").stat().st_size > 1000
    assert report["calibration"]["temperature"] == saved.temperature > 0
    assert list((root / "csv").rglob("metrics.csv")), "CSV metrics are logged"
    assert list((root / "tensorboard").rglob("events.out.tfevents.*")), "TensorBoard events are logged"
    (pred,) = Pipeline(saved)(["A wonderful film. Superb acting, I loved it."])
    assert pred.label == "pos"


def test_fit_registers_the_model_in_the_bentoml_store_with_its_metrics(tmp_path: Path) -> None:
    fit(tmp_path, "--export.register", "true", "--export.name", "han-smoke-test")
    saved = model_store.load("han-smoke-test:latest")
    assert saved.labels == ["neg", "pos"]
    assert "test" in saved.metadata["metrics"] and saved.metadata["trained_at"]
    import bentoml

    info = bentoml.models.get("han-smoke-test:latest").info
    assert info.labels["task"] == "single-label"
    assert info.metadata["metrics"]["test"]["accuracy"] == saved.metadata["metrics"]["test"]["accuracy"]


def test_weight_averaging_from_the_command_line_exports_the_averaged_weights(tmp_path: Path) -> None:
    """Lightning's own EMAWeightAveraging from the command line (which docs/training.md tells apart from
    --model.ema): the exported model holds the averaged weights, not the last ones."""
    import torch

    root = fit(tmp_path, "--trainer.max_epochs", "6",
               "--trainer.callbacks+=pytorch_lightning.callbacks.EMAWeightAveraging",
               "--trainer.callbacks.decay", "0.9", "--trainer.callbacks.update_starting_at_step", "2")
    best = next(p for p in (root / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")
    checkpoint = torch.load(best, weights_only=True)
    averaged = checkpoint["state_dict"]["net.embedding.weight"]
    current = checkpoint["current_model_state"]["net.embedding.weight"]
    assert not torch.allclose(averaged, current)
    exported = SavedModel.load(root / "model").model.state_dict()["embedding.weight"]
    torch.testing.assert_close(exported, averaged)


def test_the_warm_ema_follows_a_short_run_where_plain_ema_stays_at_the_start() -> None:
    import torch

    from training.callbacks import _warm_ema

    plain, warm = torch.zeros(1), torch.zeros(1)
    for n in range(100):  # 100 updates towards 1.0 with decay 0.999
        plain = 0.999 * plain + 0.001 * torch.ones(1)
        warm = _warm_ema(warm, torch.ones(1), torch.tensor(n), decay=0.999)
    assert plain.item() < 0.1 and warm.item() > 0.9


@pytest.mark.parametrize(("callback", "good"), [("training.callbacks.EMA", True),
                                                 ("pytorch_lightning.callbacks.EMAWeightAveraging", False)])
def test_a_short_fit_with_the_configs_ema_exports_a_trained_model(tmp_path: Path, callback: str, good: bool) -> None:
    # the smoke fit is about a hundred steps: far fewer than 1 / (1 - 0.999)
    root = fit(tmp_path, f"--trainer.callbacks+={callback}", "--export.faithfulness", "0",
               "--export.ngram_head", "false")  # the HAN's own weights: a head would rescue a bad average
    accuracy = SavedModel.load(root / "model").metadata["metrics"]["test"]["accuracy"]
    assert (accuracy >= 0.9) == good, accuracy


def test_a_run_without_test_data_registers_its_validation_metrics(tmp_path: Path) -> None:
    """`--data.test null` leaves unset entries in the metadata; registration must still work. With
    --export.compare_with, the comparison with the champion (on validation here) is registered too."""
    from tests.tiny_model import train_tiny_model

    champion = model_store.register(train_tiny_model()[0], "han-champion")
    fit(tmp_path, "--data.test", "null", "--export.register", "true", "--export.name", "han-no-test",
        "--export.compare_with", "han-champion:latest")
    import bentoml

    comparison = bentoml.models.get("han-no-test:latest").info.metadata["comparison"]
    assert comparison["old_tag"] == champion and comparison["data"] == "the validation split"
    assert comparison["metric"] == "accuracy" and comparison["verdict"] in ("better", "worse", "no clear difference")

    info = bentoml.models.get("han-no-test:latest").info
    assert "validation" in info.metadata["metrics"] and "test" not in info.metadata["metrics"]
    assert "test_data" not in info.metadata
    assert model_store.load("han-no-test:latest").metadata["test_data"] is None


def test_an_unknown_champion_stops_the_fit_before_it_trains(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        fit(tmp_path, "--export.compare_with", "han-nothing:v1")
    assert "export.compare_with: no BentoML model named 'han-nothing:v1'" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()
    # a champion of another task (or other labels) is refused once the data is read, before the first step
    from tests.tiny_model import train_tiny_model

    topics = model_store.register(train_tiny_model(multi_label=True, steps=1)[0], "han-topics")
    with pytest.raises(SystemExit):
        fit(tmp_path, "--export.compare_with", "han-topics:latest")
    assert (f"han-train: error: the new model is single-label and {topics} multi-label: they cannot be compared"
            in capsys.readouterr().err)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_predict_writes_one_line_per_document_in_input_order(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    root = fit(tmp_path)
    for subcommand in ("predict", "test"):  # without a model to run: one line, and the run's files left alone
        with pytest.raises(SystemExit) as exit_info:
            main([subcommand, "--config", SMOKE, "--trainer.default_root_dir", str(root),
                  "--data.cache_dir", str(tmp_path / "cache")])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
            f"han-train: error: han-train {subcommand} needs the model to {subcommand}: --ckpt_path")
    assert not (root / "predictions").exists()
    # a --ckpt_path that is no checkpoint: one line naming it (Lightning reads it before any hook, where
    # text raised a KeyError from the unpickler), and nothing written
    not_zip, other_zip = tmp_path / "notes.ckpt", tmp_path / "other.ckpt"
    not_zip.write_text("hello\n")
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("a.txt", "hi")
    for path, why in ((not_zip, "not a PyTorch checkpoint"), (other_zip, "not a readable checkpoint"),
                      (tmp_path / "missing.ckpt", "no such file"), (tmp_path, "a folder, not a checkpoint file")):
        with pytest.raises(SystemExit) as exit_info:
            main(["predict", "--config", SMOKE, "--trainer.default_root_dir", str(root),
                  "--data.cache_dir", str(tmp_path / "cache"), "--ckpt_path", str(path)])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
            f"han-train: error: --ckpt_path {path}: {why}")
    assert not (root / "predictions").exists()
    main(["predict", "--config", SMOKE, "--trainer.default_root_dir", str(root),
          "--data.cache_dir", str(tmp_path / "cache"), "--ckpt_path", str(root / "checkpoints" / "last.ckpt")])
    lines = rows(root / "predictions" / "test.jsonl")
    truth = [r["label"] for r in rows(REVIEWS)]
    assert [line["row"] for line in lines] == list(range(len(truth)))
    assert all(set(line["scores"]) == {"neg", "pos"} and line["labels"] == [line["label"]] for line in lines)
    # the smoke model fits its data: rows out of order would score near chance
    assert sum(line["label"] == t for line, t in zip(lines, truth, strict=True)) >= 0.9 * len(truth)
    # documents with no word are left out, said so, and every other line keeps its file's row
    gaps = [dict(r, text="   ") if k in (1, 2) else r for k, r in enumerate(rows(REVIEWS))]
    gapped = tmp_path / "gaps.jsonl"
    gapped.write_text("".join(json.dumps(r) + "\n" for r in gaps))
    caplog.set_level(logging.INFO)
    main(["predict", "--config", SMOKE, "--trainer.default_root_dir", str(root), "--data.test", str(gapped),
          "--data.cache_dir", str(tmp_path / "cache"), "--ckpt_path", str(root / "checkpoints" / "last.ckpt")])
    again = rows(root / "predictions" / "test.jsonl")
    assert [line["row"] for line in again] == [k for k in range(len(gaps)) if k not in (1, 2)]
    assert [line["scores"] for line in again] == [lines[line["row"]]["scores"] for line in again]
    assert "test: row(s) 1, 2 have no word and were left out" in caplog.text
    # a training file grown since the fit (a labelling round): the vocabulary built again from it has other
    # words at the checkpoint's ids; it scored silently wrong (0.44 where the fit had 0.91)
    grown = tmp_path / "grown.jsonl"
    grown.write_text(REVIEWS.read_text() + "".join(json.dumps({"text": f"Zyzzyva quokka xylophone number {k}.",
                                                                 "label": "pos"}) + "\n" for k in range(6)))
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--config", SMOKE, "--trainer.default_root_dir", str(root), "--data.train", str(grown),
              "--data.cache_dir", str(tmp_path / "cache"), "--ckpt_path", str(root / "checkpoints" / "last.ckpt")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "the checkpoint's fit read other data" in err and "earlier release" not in err
    # an earlier release's checkpoint (no record of its data): the message says why its settings cannot help
    import torch

    earlier = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    del earlier["han_data"]
    torch.save(earlier, tmp_path / "earlier.ckpt")
    with pytest.raises(SystemExit):
        main(["predict", "--config", SMOKE, "--trainer.default_root_dir", str(root), "--data.train", str(grown),
              "--data.cache_dir", str(tmp_path / "cache"), "--ckpt_path", str(tmp_path / "earlier.ckpt")])
    assert "this checkpoint, from an earlier release, records no data" in capsys.readouterr().err
    # predict --model.init_from: the stored model's weights (an untrained network before, at chance)
    (root / "predictions" / "test.jsonl").unlink()
    main(["predict", "--config", SMOKE, "--trainer.default_root_dir", str(root), "--data.train", str(grown),
          "--data.cache_dir", str(tmp_path / "cache"), "--model.init_from", str(root / "model")])
    warm = rows(root / "predictions" / "test.jsonl")
    assert sum(line["label"] == t for line, t in zip(warm, truth, strict=True)) >= 0.9 * len(truth)


def test_a_fit_run_again_into_its_folder_replaces_last_ckpt(tmp_path: Path) -> None:
    """Run again into the same folder, last.ckpt is the new run's: Lightning's default wrote last-v1.ckpt
    beside it, and `test --ckpt_path .../last.ckpt` read the first run's weights. The second run is a
    onecycle schedule of exactly 10 steps (a warm-up of one step), which divided by zero."""
    import torch

    quick = ("--export.faithfulness", "0", "--export.baseline", "false")
    root = fit(tmp_path, "--trainer.max_epochs", "1", *quick)
    # an earlier run's best under a name this run does not write (it read as this run's best), and a user's file
    shutil.copy(root / "checkpoints" / "last.ckpt", root / "checkpoints" / "epoch99-score0.9999.ckpt")
    shutil.copy(root / "checkpoints" / "last.ckpt", root / "checkpoints" / "mine.ckpt")
    fit(tmp_path, "--trainer.max_epochs", "5", "--data.batch_size", "16", "--model.scheduler", "onecycle", *quick)
    assert sorted(p.name for p in (root / "checkpoints").glob("last*.ckpt")) == ["last.ckpt"]
    for path in (root / "checkpoints").glob("*.ckpt"):
        scheduler = torch.load(path, weights_only=True)["hyper_parameters"]["scheduler"]
        assert scheduler == ("constant" if path.name == "mine.ckpt" else "onecycle"), path.name  # the second run's
    assert (root / "checkpoints" / "mine.ckpt").exists()


def test_test_subcommand_writes_the_report_with_faithfulness(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    root = fit(tmp_path, "--export.faithfulness", "0", "--export.baseline", "false")
    assert not (root / "report" / "test" / "faithfulness.json").exists()
    # --export.baseline false: no TF-IDF baseline in the log, the report or the model's metadata
    assert "baseline" not in json.loads((root / "report" / "test" / "metrics.json").read_text())
    assert "baseline" not in SavedModel.load(root / "model").metadata
    assert "baseline (TF-IDF" not in caplog.text and "HAN against the baseline" not in caplog.text
    main(["test", "--config", SMOKE, "--trainer.default_root_dir", str(root),
          "--data.cache_dir", str(tmp_path / "cache"), "--ckpt_path", str(root / "checkpoints" / "last.ckpt")])
    # `han-train test` trains the baseline (on by default) and reports it beside the model on the test split
    baseline = json.loads((root / "report" / "test" / "metrics.json").read_text())["baseline"]
    assert set(baseline) == {"model", "accuracy", "macro_f1"} and 0 < baseline["accuracy"] <= 1
    assert "baseline (TF-IDF 1-2 grams + logistic regression) on 32 training documents: " in caplog.text
    assert "test: HAN against the baseline" in caplog.text
    faithfulness = json.loads((root / "report" / "test" / "faithfulness.json").read_text())
    assert set(faithfulness["methods"]) == {"attention", "attention_gradient", "integrated_gradients", "occlusion",
                                            "random"}
    assert (root / "report" / "test" / "faithfulness.png").stat().st_size > 1000
    # Each measure as a ratio to random's, None where random's is 0 (the smoke model is sure of its own reviews).
    random = faithfulness["methods"]["random"]
    for key, ratio in faithfulness["methods"]["occlusion"]["x_random"].items():
        value = faithfulness["methods"]["occlusion"][key]
        assert ratio["ratio"] == (pytest.approx(value / random[key]) if random[key] else None), key
        assert ratio["interval"] is None or ratio["interval"][0] <= ratio["ratio"] <= ratio["interval"][1]
    assert "faithfulness on test (24 documents)" in caplog.text


def test_a_failing_report_stops_the_faithfulness_check_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With several torch threads the check runs beside the reports; when they fail (or Ctrl+C), the
    error reaches the fit at once, the check ends without writing its report, and the threads are as before."""
    import threading

    import torch

    from tests.tiny_model import train_tiny_model
    from training.export import ExportModel

    saved, _ = train_tiny_model(steps=20)
    data = HANDataModule(str(REVIEWS), test=str(REVIEWS), val_fraction=0.25, min_freq=1, max_sentences=8,
                         max_words=20, cache_dir=str(tmp_path / "cache"))
    data.setup()
    started = threading.Event()

    def failing_report(*args: object, **kwargs: object) -> dict:
        started.wait(10)  # the check has begun
        raise RuntimeError("the report failed")

    export = ExportModel(faithfulness=32, faithfulness_tau=0, faithfulness_budget=None)
    real_faithfulness = export._faithfulness
    monkeypatch.setattr(export, "_faithfulness", lambda *a: (started.set(), real_faithfulness(*a))[1])
    monkeypatch.setattr(ExportModel, "_report", staticmethod(failing_report))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="the report failed"):
            export._measure(saved, data, ["test"], tmp_path / "report", None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert not any(t.name == "han-faithfulness" for t in threading.enumerate())
    assert not (tmp_path / "report" / "test" / "faithfulness.json").exists(), "stopped before its end"


def test_multi_label_training_on_lists_of_labels(tmp_path: Path) -> None:
    root = fit(tmp_path, "--data.label_column", "labels", "--data.multi_label", "true", data=TOPICS)
    saved = SavedModel.load(root / "model")
    assert saved.labels == ["crude", "grain", "interest"] and saved.model.config.multi_label
    assert set(saved.metadata["metrics"]["test"]) == {"micro_f1", "macro_f1", "exact_match", "ece_before", "ece_after"}
    report = json.loads((root / "report" / "test" / "metrics.json").read_text())
    assert set(report["per_label_f1"]) == {"crude", "grain", "interest"}
    # The TF-IDF baseline, one-vs-rest, with its threshold chosen like the HAN's (validation = test here)
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.multiclass import OneVsRestClassifier

    from training.report import threshold_with_best_micro_f1

    baseline = saved.metadata["baseline"]
    texts = [r["text"] for r in rows(TOPICS)]
    truth = np.array([[label in r["labels"] for label in saved.labels] for r in rows(TOPICS)], dtype=int)
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)
    ovr = OneVsRestClassifier(LogisticRegression(C=10, max_iter=2000)).fit(vectorizer.fit_transform(texts), truth)
    probs = ovr.predict_proba(vectorizer.transform(texts))
    assert baseline["threshold"] == threshold_with_best_micro_f1(probs, truth)
    micro_f1 = round(float(f1_score(truth, probs >= baseline["threshold"], average="micro")), 4)
    assert report["baseline"]["micro_f1"] == baseline["test"]["micro_f1"] == micro_f1 > 0
    assert set(baseline["test"]) == {"micro_f1", "macro_f1", "exact_match"}


def test_multi_label_threshold_is_tuned_on_validation_unless_given(tmp_path: Path) -> None:
    from training.report import best_threshold, evaluate

    root = fit(tmp_path / "tuned", "--data.label_column", "labels", "--data.multi_label", "true",
               "--trainer.max_epochs", "4", "--export.ngram_head", "false",  # the HAN's own threshold
               data=TOPICS)  # short: not yet perfect on its data
    saved = SavedModel.load(root / "model")
    assert saved.metadata["threshold_from"] == "best micro-F1 on the validation split"
    topics = rows(TOPICS)
    texts = [r["text"] for r in topics]
    truth = np.array([[label in r["labels"] for label in saved.labels] for r in topics])
    # validation is the topics file: the threshold is the grid's best micro-F1 on its probabilities
    assert saved.threshold == best_threshold(Pipeline(saved), texts, truth)
    tuned = evaluate(Pipeline(saved), texts, truth)["micro_f1"]
    saved.threshold = 0.5
    assert tuned >= evaluate(Pipeline(saved), texts, truth)["micro_f1"]

    root = fit(tmp_path / "fixed", "--data.label_column", "labels", "--data.multi_label", "true",
               "--trainer.max_epochs", "4", "--export.threshold", "0.3", data=TOPICS)  # with or without a head
    assert SavedModel.load(root / "model").threshold == 0.3


def test_fit_trains_the_tfidf_baseline_on_the_hans_training_split_and_reports_it_beside_the_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TF-IDF + logistic regression on the HAN's training split (validation carved out of it), scored on
    the same validation and test documents: the log, metrics.json, the text report and the model's
    metadata hold the figures a plain scikit-learn pipeline gets on that split."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    caplog.set_level(logging.INFO)
    root = fit(tmp_path, "--data.validation", "null", "--data.val_fraction", "0.25", "--export.faithfulness", "0")
    saved = SavedModel.load(root / "model")
    baseline = saved.metadata["baseline"]
    assert baseline["model"] == "TF-IDF 1-2 grams + logistic regression"
    assert baseline["training_documents"] == 24  # 32 reviews, a quarter held out for validation
    assert re.search(r"baseline \(TF-IDF 1-2 grams \+ logistic regression\) on 24 training documents: [\d.]+ s",
                     caplog.text)
    data = HANDataModule(str(REVIEWS), test=str(REVIEWS), val_fraction=0.25, min_freq=1, max_sentences=8,
                         max_words=20, cache_dir=str(tmp_path / "cache"))  # the smoke run's data
    data.setup()
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)  # min_df=2 from 100 documents
    model = LogisticRegression(C=10, max_iter=2000).fit(vectorizer.fit_transform(data.texts("train")),
                                                        data.splits["train"].targets.numpy())
    for split in ("validation", "test"):
        truth = data.splits[split].targets.numpy()
        predicted = model.predict(vectorizer.transform(data.texts(split)))
        expected = {"accuracy": round(float(accuracy_score(truth, predicted)), 4),
                    "macro_f1": round(float(f1_score(truth, predicted, average="macro")), 4)}
        assert baseline[split] == expected and 0 <= expected["accuracy"] <= 1 and 0 <= expected["macro_f1"] <= 1
        assert json.loads((root / "report" / split / "metrics.json").read_text())["baseline"] == {
            "model": baseline["model"], **expected}
        text = (root / "report" / split / "classification_report.txt").read_text()
        assert f"baseline, TF-IDF 1-2 grams + logistic regression: accuracy {expected['accuracy']:.3f}" in text
        han = saved.metadata["metrics"][split]["accuracy"]  # the log's table: HAN, baseline, difference
        assert f"{split}: HAN against the baseline" in caplog.text
        assert f"accuracy {han:>7.4f} {expected['accuracy']:>9.4f} {han - expected['accuracy']:>+11.4f}" in caplog.text
    ahead = baseline["validation"]["accuracy"] > saved.metadata["metrics"]["validation"]["accuracy"]
    assert ("advice" in baseline) == ("the TF-IDF baseline is ahead on validation" in caplog.text) == ahead


def test_the_baseline_advice_is_given_only_when_it_is_ahead_on_validation() -> None:
    line = advice({"accuracy": 0.864, "macro_f1": 0.86}, {"accuracy": 0.889, "macro_f1": 0.88})
    assert line and line.startswith("the TF-IDF baseline is ahead on validation (accuracy 0.889 against 0.864): try")
    assert "--model.embeddings" in line and "--data.unlabeled" in line
    assert advice({"accuracy": 0.889}, {"accuracy": 0.864}) is None
    assert advice({"accuracy": 0.889}, {"accuracy": 0.889}) is None
    assert "(micro-F1 0.850 against 0.800)" in (advice({"micro_f1": 0.8}, {"micro_f1": 0.85}) or "")


def test_integer_labels_are_read_as_class_names(tmp_path: Path) -> None:
    data = [{"text": r["text"], "label": int(r["label"] == "pos")} for r in rows(REVIEWS)]
    path = tmp_path / "ints.parquet"
    datasets.Dataset.from_list(data).to_parquet(str(path))
    root = fit(tmp_path, data=path)
    assert SavedModel.load(root / "model").labels == ["0", "1"]


def test_second_run_reuses_the_tokenisation_cache(tmp_path: Path) -> None:
    fit(tmp_path, "--trainer.max_epochs", "1")
    cached = sorted((tmp_path / "cache").glob("*.arrow"))
    # train and validation; a fit runs test only through the inference pipeline, which segments it itself
    assert [p.name.split("-")[0] for p in cached] == ["train", "validation"]
    stamps = [p.stat().st_mtime_ns for p in cached]
    fit(tmp_path, "--trainer.max_epochs", "1")
    assert sorted((tmp_path / "cache").glob("*.arrow")) == cached
    assert [p.stat().st_mtime_ns for p in cached] == stamps, "a cached split must not be tokenised again"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--data.train", "no/such/file.csv"], "no/such/file.csv: file not found"),
        (["--data.text_column", "body"], "no column 'body'; its columns are"),
        (["--data.val_fraction", "1.5"], "val_fraction must be between 0 and 1"),
        (["--model.lr", "-1"], "model.lr must be positive"),
        (["--model.optimizer", "adam2"], "optimizer"),
    ],
)
def test_bad_settings_fail_with_a_message_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        fit(tmp_path, *overrides)
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_a_label_column_with_one_class_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text("".join(json.dumps({"text": r["text"], "label": "pos"}) + "\n" for r in rows(REVIEWS)))
    with pytest.raises(SystemExit):
        fit(tmp_path, data=path)
    assert "has only one class ('pos')" in capsys.readouterr().err


def test_ctrl_c_in_the_first_seconds_is_one_line(tmp_path: Path) -> None:
    """han-train's entry point (training.launch): Ctrl-C while torch and Lightning import, or while the
    recipe reads the data, ends with one line and status 130."""
    import signal

    for delay in (0.3, 2.0):
        proc = subprocess.Popen([sys.executable, "-m", "training.launch", "fit", "--config", SMOKE,
                                 "--trainer.default_root_dir", str(tmp_path / "run"), "--data.cache_dir",
                                 str(tmp_path / "cache")], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err and "KeyboardInterrupt:" not in err, err[-2000:]
        lines = err.splitlines()
        if delay < 1:  # inside the imports (torch alone takes longer): the launcher's line, and nothing else
            assert (proc.returncode, err) == (130, "han-train: interrupted\n"), (proc.returncode, err[-500:])
        elif "han-train: interrupted" in lines:
            # the imports (the line alone), or the recipe reading the data (after its progress lines): the line
            # once, last, and status 130
            assert proc.returncode == 130 and lines.count("han-train: interrupted") == 1, (proc.returncode, err[-500:])
            assert lines[-1] == "han-train: interrupted", err[-500:]
        else:  # on a fast machine, a fit that Lightning stops on its own: its line last, status 1
            assert proc.returncode == 1, (proc.returncode, err[-500:])
            assert lines[-1] == "Detected KeyboardInterrupt, attempting graceful shutdown ...", err[-500:]


def test_sigterm_during_a_fit_is_one_line_and_a_failure_status(tmp_path: Path) -> None:
    """Lightning ends a fit on SIGTERM with a SystemExit of no status (0): `han-train fit && han-model promote`
    would go on as if it had succeeded."""
    import signal

    root, log = tmp_path / "run", tmp_path / "stderr.txt"
    with log.open("w") as stderr:  # a file: a pipe left unread could fill and stall the fit
        proc = subprocess.Popen([sys.executable, "-m", "training.launch", "fit", "--config", SMOKE,
                                 "--trainer.max_epochs", "100000", "--trainer.default_root_dir", str(root),
                                 "--data.cache_dir", str(tmp_path / "cache"), "--export.name", "han-sigterm"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 120
        while not (root / "checkpoints" / "last.ckpt").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    err = log.read_text()
    assert proc.returncode == 143, (proc.returncode, err[-1000:])
    assert err.splitlines()[-1] == "han-train: stopped by SIGTERM before its end; this run registered no model"
    assert "Traceback" not in err and not (root / "model").exists()


def test_a_run_folder_that_cannot_be_made_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", SMOKE, "--trainer.default_root_dir", "/proc/han-run", "--data.cache_dir",
              str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.strip().splitlines()[-1].startswith("han-train: error: ")
    assert "/proc/han-run" in err.strip().splitlines()[-1] and "Traceback" not in err


@pytest.mark.parametrize(("odd", "kind"), [(["pos"], "a list"), ({"a": 1}, "an object")])
def test_a_label_column_of_mixed_kinds_names_the_row(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      odd: object, kind: str) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps({"text": r["text"], "label": odd if k == 5 else r["label"]}) + "\n"
                            for k, r in enumerate(rows(REVIEWS))))
    with pytest.raises(SystemExit):
        main(["fit", "--data.train", str(path), "--data.test", "null", "--trainer.default_root_dir",
              str(tmp_path / "run"), "--data.cache_dir", str(tmp_path / "cache")])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"han-train: error: train ({path}) row 5 holds {kind} where the rows before hold a single label in the "
        "label column 'label': give every row a single label (a string or an integer), or every row a list of "
        "labels (multi-label)")


def test_a_run_killed_after_its_first_checkpoint_resumes_and_finishes(tmp_path: Path) -> None:
    root = tmp_path / "run"
    args = [sys.executable, "-m", "training.cli", "fit", "--config", SMOKE, "--trainer.default_root_dir", str(root),
            "--data.cache_dir", str(tmp_path / "cache"), "--trainer.max_epochs", "400",
            "--trainer.enable_progress_bar", "false"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    import torch

    last = root / "checkpoints" / "last.ckpt"

    def saved_epoch() -> int:
        try:
            return int(torch.load(last, map_location="cpu", weights_only=True)["epoch"])
        except Exception:  # not written yet, or being written
            return -1

    deadline = time.monotonic() + 120
    # Kill it once a few epochs are saved, so that a restart from scratch could not pass below.
    while saved_epoch() < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert last.exists() and not (root / "model").exists()
    killed_at = torch.load(last, map_location="cpu", weights_only=True)["epoch"]
    assert 2 <= killed_at < 399
    done = subprocess.run([*args[:-4], "--trainer.max_epochs", str(killed_at + 3), "--ckpt_path", "last",
                           "--trainer.enable_progress_bar", "false"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Restoring states from the checkpoint path at {last}" in done.stderr + done.stdout
    # The resumed process logged only epochs from the checkpoint on: it did not start again from 0.
    newest_log = max((root / "csv").glob("version_*/metrics.csv"), key=lambda p: p.stat().st_mtime)
    resumed_epochs = {int(r["epoch"]) for r in csv.DictReader(newest_log.open()) if r["epoch"]}
    assert min(resumed_epochs) >= killed_at, resumed_epochs
    assert torch.load(last, map_location="cpu", weights_only=True)["epoch"] > killed_at
    assert SavedModel.load(root / "model").labels == ["neg", "pos"]


def test_a_two_process_ddp_fit_with_fixed_vectors_trains_and_exports(tmp_path: Path) -> None:
    """docs/training.md's command: DDP on this machine's cores. The word vectors take no gradient while
    fixed, which plain DDP refuses as an unused parameter, so the CLI tells DDP to expect it."""
    root = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "training.cli", "fit", "--config", SMOKE, "--trainer.default_root_dir", str(root),
         "--data.cache_dir", str(tmp_path / "cache"), "--trainer.strategy", "ddp", "--trainer.devices", "2",
         "--trainer.max_epochs", "8", "--model.freeze_embeddings", "1", "--trainer.enable_progress_bar", "false",
         "--export.faithfulness", "0"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, capture_output=True,
        text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = SavedModel.load(root / "model")
    assert saved.metadata["metrics"]["test"]["accuracy"] >= 0.9, "the two ranks together fit the training data"


class _Planted:
    """Unpickling this would create a file: what a hostile checkpoint could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("subcommand", ["test", "predict", "fit"])
def test_a_checkpoint_holding_code_is_refused_and_never_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], subcommand: str
) -> None:
    import torch

    marker = tmp_path / "code-ran"
    hostile = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": {}, "payload": _Planted(marker)}, hostile)
    with pytest.raises(SystemExit) as exit_info:
        main([subcommand, "--config", SMOKE, "--trainer.default_root_dir", str(tmp_path / "run"),
              "--data.cache_dir", str(tmp_path / "cache"), "--ckpt_path", str(hostile)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "refusing to unpickle" in err and "Traceback" not in err
    assert not marker.exists(), "the checkpoint's code ran"


def test_export_refuses_a_best_checkpoint_holding_code(tmp_path: Path) -> None:
    import torch

    from training.export import CheckpointError, load_checkpoint

    marker = tmp_path / "code-ran"
    hostile = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": {}, "payload": _Planted(marker)}, hostile)
    with pytest.raises(CheckpointError, match="hostile.ckpt: not a checkpoint of plain tensors"):
        load_checkpoint(hostile)
    assert not marker.exists()


@pytest.mark.parametrize("sentence_values", ["contextual", "own"])
def test_a_warm_started_model_scores_like_the_stored_one_before_any_step(tmp_path: Path, sentence_values: str) -> None:
    stored = fit(tmp_path / "stored", "--model.sentence_values", sentence_values)
    saved = SavedModel.load(stored / "model")
    assert saved.model.config.sentence_values == sentence_values
    assert saved.metadata["metrics"]["test"]["accuracy"] >= 0.9, "the smoke run should fit its own training data"
    texts = [r["text"] for r in rows(REVIEWS)] + ["Words it never saw: zyzzyva quokka. Superb!"]
    expected = Pipeline(saved)(texts)
    # The stored model's sentence_values carry over, like its sizes, whatever this run's default.
    started = fit(tmp_path / "warm", "--model.init_from", str(stored / "model"), "--trainer.max_epochs", "0")
    warm = Pipeline(SavedModel.load(started / "model"))(texts)
    for a, b in zip(expected, warm, strict=True):
        assert a.label == b.label
        assert a.scores == pytest.approx(b.scores, abs=1e-5)


def test_a_warm_start_on_new_labels_keeps_the_encoders_and_gets_a_new_head(tmp_path: Path) -> None:
    import torch

    stored = fit(tmp_path / "stored")
    relabelled = tmp_path / "relabelled.jsonl"
    relabelled.write_text("".join(
        json.dumps({"text": r["text"], "label": {"neg": "bad", "pos": "good"}[r["label"]]}) + "\n"
        for r in rows(REVIEWS)
    ))
    started = fit(tmp_path / "warm", "--model.init_from", str(stored / "model"), "--trainer.max_epochs", "0",
                  data=relabelled)
    old, new = SavedModel.load(stored / "model"), SavedModel.load(started / "model")
    assert new.labels == ["bad", "good"]
    old_state, new_state = old.model.state_dict(), new.model.state_dict()
    for name in old_state:
        if name.startswith(("word_rnn", "sentence_rnn", "word_attention", "sentence_attention")):
            assert torch.equal(old_state[name], new_state[name]), name
    assert not torch.equal(old_state["head.weight"], new_state["head.weight"])
    shared = old.vocab.stoi["superb"]
    assert torch.equal(old_state["embedding.weight"][shared],
                       new_state["embedding.weight"][new.vocab.stoi["superb"]])


def test_a_checkpoint_refuses_other_sentence_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint from before sentence_values existed was trained "contextual", and its head fits an "own"
    network of the same sizes (imdb.yaml now sets "own"): resuming or testing it must stop, not load."""
    import torch

    root = fit(tmp_path, "--export.faithfulness", "0")
    checkpoint = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    del checkpoint["hyper_parameters"]["sentence_values"]  # as an older han-train wrote it
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["test", "--config", SMOKE, "--trainer.default_root_dir", str(root), "--data.cache_dir",
              str(tmp_path / "cache"), "--model.sentence_values", "own", "--ckpt_path", str(old)])
    err = capsys.readouterr().err
    assert "the checkpoint was trained with model.sentence_values=contextual, this run has own" in err
    assert "Traceback" not in err


def test_init_from_an_unknown_model_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        fit(tmp_path, "--model.init_from", "han-nowhere:latest")
    err = capsys.readouterr().err
    assert "model.init_from: no model directory or BentoML model named 'han-nowhere:latest'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "configs",
    [[name] for name in ("imdb", "imdb_quick", "imdb_rating", "20newsgroups", "reuters", "smoke")]
    + [["imdb", "small_data"], ["20newsgroups", "small_data"]],
)
def test_every_shipped_config_resolves(configs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for name in configs for a in ("--config", str(REPO / "data" / "configs" / f"{name}.yaml"))]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "embeddings: word2vec" in printed
    if "small_data" in configs:
        assert "freeze_embeddings: 5" in printed and "max_epochs: 15" in printed and "fraction: 1.0" in printed
    if configs[0] in ("20newsgroups", "reuters"):
        assert "training.callbacks.EMA" in printed and "LearningRateMonitor" in printed  # appended, not replacing
