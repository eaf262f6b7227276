"""Shared fixtures. Tests run offline: no model or data set is ever downloaded."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from han.environment import apply_defaults

apply_defaults()
# Tests never touch the user's model store: every session gets an empty one of its own.
os.environ["BENTOML_HOME"] = tempfile.mkdtemp(prefix="han-test-bentoml-")
# One torch thread: with one per core, small models crawl when another process keeps a core busy.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
SHARED_DATASETS = Path(os.environ.get("HAN_SHARED_DATASETS", REPO.parent / "shared" / "datasets"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small single-label (neg/pos) model trained on the fixture reviews, saved as a model directory,
    with its explanations' faithfulness in the metadata (measured, on its own training reviews, by the
    report code a fit's export uses)."""
    from han import Pipeline
    from tests.tiny_model import read_jsonl, train_tiny_model
    from training.faithfulness_report import faithfulness_report

    saved, _ = train_tiny_model()
    texts = [row["text"] for row in read_jsonl("reviews.jsonl")]
    report = tmp_path_factory.mktemp("tiny-model-report")
    saved.metadata["faithfulness"] = faithfulness_report(Pipeline(saved), texts, 24, 4, report, "tiny model")
    return saved.save(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The real corpora beside the repo; skipped when absent, but a hard failure under CI=true."""
    if not (SHARED_DATASETS / "imdb" / "train.parquet").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the shared datasets are missing at {SHARED_DATASETS}")
        pytest.skip(f"shared datasets not found at {SHARED_DATASETS}")
    return SHARED_DATASETS
