"""Shared fixtures. Tests run offline: no model or data set is ever downloaded."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from han.environment import apply_defaults

apply_defaults()
# Tests never touch the user's model store: every session gets an empty one of its own.
os.environ["BENTOML_HOME"] = tempfile.mkdtemp(prefix="han-test-bentoml-")
# One torch thread: with one per core, small models crawl when another process keeps a core busy (the
# suite's other test process). The commands the tests start (fits, scoring) inherit it: a fit otherwise
# starts on every core and gives one back only after its first seconds (training.threads).
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
SHARED_DATASETS = Path(os.environ.get("HAN_SHARED_DATASETS", REPO.parent / "shared" / "datasets"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small single-label (neg/pos) model trained on the fixture reviews, saved as a model directory,
    with its explanations' faithfulness in the metadata (measured, on its own training reviews, by the
    report code a fit's export uses), and its test figures beside the TF-IDF baseline's as a fit
    records them: the baseline learns from the even-numbered reviews, and both are scored on the
    odd-numbered ones (which the tiny model also trained on: a stand-in for a held-out split)."""
    import numpy as np

    from han import Pipeline
    from tests.tiny_model import read_jsonl, train_tiny_model
    from training.baseline import MODEL, train_baseline
    from training.faithfulness_report import faithfulness_report
    from training.report import evaluate, headline

    saved, _ = train_tiny_model()
    rows = read_jsonl("reviews.jsonl")
    texts = [row["text"] for row in rows]
    report = tmp_path_factory.mktemp("tiny-model-report")
    saved.metadata["faithfulness"] = faithfulness_report(Pipeline(saved), texts, 24, 4, report, "tiny model")
    targets = np.array([saved.labels.index(row["label"]) for row in rows])
    held_out = (texts[1::2], targets[1::2])
    saved.metadata["metrics"] = {"test": headline(evaluate(Pipeline(saved), *held_out))}
    baseline = train_baseline(texts[::2], targets[::2], multi_label=False)
    saved.metadata["baseline"] = {"model": MODEL, "training_documents": len(texts[::2]),
                                  "test": baseline.scores(*held_out)}
    return saved.save(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The real corpora beside the repo; skipped when absent, but a hard failure under CI=true."""
    if not (SHARED_DATASETS / "imdb" / "train.parquet").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the shared datasets are missing at {SHARED_DATASETS}")
        pytest.skip(f"shared datasets not found at {SHARED_DATASETS}")
    return SHARED_DATASETS


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict) -> dict:
    """pytest-playwright launches the Debian Chromium; it never downloads a browser of its own."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but Chromium is missing (apt-get install chromium)")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    return {**browser_type_launch_args, "executable_path": path, "args": ["--no-sandbox"]}


@pytest.fixture()
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder on a 256 KiB tmpfs filled to the last byte: writes there fail with ENOSPC, as on a full disk."""
    folder = tmp_path / "full"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.decode().strip()}")
    try:
        with open(folder / "fill", "wb") as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        with pytest.raises(OSError) as full, open(folder / "probe", "wb") as f:
            f.write(b"x")
            f.flush()
        assert full.value.errno == errno.ENOSPC
        (folder / "probe").unlink()
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
