"""Callbacks: training throughput per epoch, and ``han-train predict``'s output file.

Lightning's ``ThroughputMonitor`` logs windowed per-step rates; what the benchmarks and the epoch
log line need is each epoch's totals (seconds, documents/s, words/s), so ``Throughput`` stays.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter, EMAWeightAveraging
from pytorch_lightning.utilities import rank_zero_info

from training.report import write_predictions


class Throughput(pl.Callback):
    """Logs training documents/s, words/s and seconds per epoch."""

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()
        self._docs = 0
        self._words = 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        inputs, _ = batch
        self._docs += int(inputs.document_lengths.shape[0])
        self._words += int(inputs.sentence_lengths.sum())

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        seconds = time.perf_counter() - self._start
        figures = {"epoch_seconds": seconds, "docs_per_s": self._docs / seconds, "words_per_s": self._words / seconds}
        pl_module.log_dict({f"train/{k}": v for k, v in figures.items()}, rank_zero_only=True)
        rank_zero_info(
            f"epoch {trainer.current_epoch}: {seconds:.1f} s, {figures['docs_per_s']:.0f} docs/s, "
            f"{figures['words_per_s']:.0f} words/s"
        )


class PredictionWriter(BasePredictionWriter):
    """``han-train predict`` writes ``<default_root_dir>/predictions/<split>.jsonl``: one line per
    document of the predict split (test, else validation), in input order, with its label(s) and
    the score of every label, as the inference pipeline gives them."""

    def __init__(self) -> None:
        super().__init__(write_interval="epoch")

    def write_on_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, predictions: Any,
                           batch_indices: Any) -> None:
        if not trainer.is_global_zero or not predictions:
            return
        results = [result for batch in predictions for result in batch]
        data = trainer.datamodule
        split = data.predict_split
        rows = data.rows(split)
        path = Path(trainer.default_root_dir) / "predictions" / f"{split}.jsonl"
        write_predictions(path, results, rows)
        rank_zero_info(f"{len(results)} predictions written to {path}")
        if split == "test" and (skipped := sorted(set(range(rows[-1] + 1)) - set(rows)) if rows else []):
            more = f" and {len(skipped) - 10:,} more" if len(skipped) > 10 else ""
            shown = ", ".join(map(str, skipped[:10])) + more
            rank_zero_info(f"test: row(s) {shown} have no word and were left out (a line's row is its file's, from 0)")


@torch.no_grad()
def _warm_ema(average: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor, decay: float) -> torch.Tensor:
    rate = min(decay, (1.0 + float(num_averaged)) / (10.0 + float(num_averaged)))
    return rate * average + (1.0 - rate) * current


class EMA(EMAWeightAveraging):
    """Lightning's EMA of the weights with a warm-up: after n updates the decay is
    min(decay, (1 + n) / (10 + n)), as TensorFlow's ExponentialMovingAverage does with num_updates.

    Plain EMA starts from the first weights and forgets them at ``decay`` per step, so a run shorter
    than about 1 / (1 - decay) steps (a config made for a large corpus, retrained on a few thousand
    documents) exports mostly its untrained start.
    """

    def __init__(self, decay: float = 0.999, **kwargs: Any) -> None:
        super().__init__(decay=decay, **kwargs)
        self._kwargs["avg_fn"] = partial(_warm_ema, decay=decay)
