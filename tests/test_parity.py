"""The four callers of the inference pipeline agree: the service, han-score, the evaluation report and
``han-train predict`` give every document the same labels and scores, on a multi-label model whose
decision threshold and temperature were tuned at export (neither is the default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from han import SavedModel
from scoring.cli import main as han_score
from tests.conftest import REPO
from tests.service_server import ServiceServer
from training.cli import main as han_train

pytestmark = pytest.mark.slow

SMOKE = str(REPO / "data" / "configs" / "smoke.yaml")
TOPICS = REPO / "data" / "fixtures" / "topics.jsonl"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def test_service_han_score_report_and_predict_agree_on_a_multi_label_model(tmp_path: Path) -> None:
    root = tmp_path / "run"
    common = [
        "--config",
        SMOKE,
        "--trainer.default_root_dir",
        str(root),
        "--data.cache_dir",
        str(tmp_path / "cache"),
        "--data.label_column",
        "labels",
        "--data.multi_label",
        "true",
        *(f"--data.{split}={TOPICS}" for split in ("train", "validation", "test")),
    ]
    han_train(["fit", *common, "--trainer.max_epochs", "4"])  # short: the threshold matters
    saved = SavedModel.load(root / "model")
    assert saved.threshold != 0.5 and saved.temperature != 1.0, "tuned at export, so a caller ignoring them shows"
    texts = [row["text"] for row in lines(TOPICS)]

    # 1. The evaluation report at the end of fit.
    report = lines(root / "report" / "test" / "predictions.jsonl")
    # 2. han-train predict, on the checkpoint that was exported.
    han_train(["predict", *common, "--ckpt_path", saved.metadata["checkpoint"]])
    predicted = lines(root / "predictions" / "test.jsonl")
    # 3. han-score.
    output = tmp_path / "scores.jsonl"
    assert han_score([str(TOPICS), str(output), "--model", str(root / "model"), "--quiet", "--workers", "1"]) == 0
    scored = [
        {"label": r["label"], "labels": r["labels"], "scores": {label: r[f"score_{label}"] for label in saved.labels}}
        for r in lines(output)
    ]
    # 4. The service.
    server = ServiceServer.start(root / "model")
    try:
        status, body = server.post_json("/classify", {"documents": texts, "explain": False})
    finally:
        server.stop()
    assert status == 200, body
    served = body["results"]

    assert len(report) == len(predicted) == len(scored) == len(served) == len(texts)
    at_half = [[label for label, p in r["scores"].items() if p >= 0.5] for r in served]
    assert at_half != [r["labels"] for r in served], "some document's labels depend on the tuned threshold"
    for caller, results in (("han-train predict", predicted), ("han-score", scored), ("service", served)):
        for row, (got, expected) in enumerate(zip(results, report, strict=True)):
            where = f"{caller}, document {row}"
            assert (got["label"], got["labels"]) == (expected["label"], expected["labels"]), where
            assert got["scores"] == pytest.approx(expected["scores"], abs=1e-6), where
