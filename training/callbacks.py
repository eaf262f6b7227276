"""Callbacks: throughput measurement, and export of the best model (model directory, report, BentoML store)."""

from __future__ import annotations

import copy
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from han.predict import Predictor
from pytorch_lightning.callbacks import BasePredictionWriter
from pytorch_lightning.utilities import rank_zero_info

from han.saved_model import SavedModel
from training.report import best_threshold, evaluate, headline, write_report


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


class ExportModel(pl.Callback):
    """At the end of ``fit``: the best checkpoint becomes a model directory, is evaluated, and registered.

    Args:
        name: the BentoML model name; by default ``han-<config file name>``.
        register: register the model in the BentoML model store.
        output_dir: where the model directory and report go; by default ``<default_root_dir>``.
        threshold: multi-label decision threshold; by default the one with the best micro-F1 on
            the validation split (0.05 to 0.95), else 0.5.
    """

    def __init__(self, name: str | None = None, register: bool = True, output_dir: str | None = None,
                 threshold: float | None = None) -> None:
        if threshold is not None and not 0 < threshold < 1:
            raise ValueError(f"export.threshold must be between 0 and 1 (exclusive), not {threshold}")
        self.name = name
        self.register = register
        self.output_dir = output_dir
        self.threshold = threshold
        self.tag: str | None = None

    def _root(self, trainer: pl.Trainer) -> Path:
        return Path(self.output_dir or trainer.default_root_dir)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.interrupted:
            return
        saved = self._saved_model(trainer, pl_module, best=True)
        data = trainer.datamodule
        metrics: dict[str, Any] = {}
        best_score = trainer.checkpoint_callback.best_model_score if trainer.checkpoint_callback else None
        if best_score is not None:
            metrics["validation_score"] = round(float(best_score), 4)
        if saved.model.config.multi_label:
            saved.threshold = self.threshold or self._tuned_threshold(saved, data)
            rank_zero_info(f"multi-label decision threshold: {saved.threshold}")
        for split in ("validation", "test"):
            if split in data.splits:
                report = self._report(saved, data, split, self._root(trainer) / "report" / split)
                metrics[split] = headline(report)
        saved.metadata["metrics"] = metrics
        directory = saved.save(self._root(trainer) / "model")
        rank_zero_info(f"model directory: {directory}")
        if self.register:
            from model_store import register

            self.tag = register(saved, self.name or "han-model")
            rank_zero_info(f"registered in the BentoML model store as {self.tag}")

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and trainer.state.fn == "test":
            saved = self._saved_model(trainer, pl_module, best=False)
            self._report(saved, trainer.datamodule, "test", self._root(trainer) / "report" / "test")

    def _saved_model(self, trainer: pl.Trainer, pl_module: pl.LightningModule, best: bool) -> SavedModel:
        net = copy.deepcopy(pl_module.net).cpu().eval()
        path = trainer.checkpoint_callback.best_model_path if best and trainer.checkpoint_callback else ""
        if path:
            state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
            net.load_state_dict({k.removeprefix("net."): v for k, v in state.items() if k.startswith("net.")})
        data = trainer.datamodule
        metadata = {
            "name": self.name,
            "trained_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "train_data": data.hparams.train,
            "test_data": data.hparams.test,
            "epochs": trainer.current_epoch,
            "checkpoint": path or None,
            "hyperparameters": dict(pl_module.hparams),
        }
        return SavedModel(net, data.vocab, list(data.label_names), data.segmenter_config, metadata=metadata)

    @staticmethod
    def _tuned_threshold(saved: SavedModel, data: Any) -> float:
        encoded = data.splits["validation"]
        threshold = best_threshold(Predictor(saved, batch_size=256), encoded.documents, encoded.targets.numpy())
        saved.metadata["threshold_from"] = "best micro-F1 on the validation split"
        return threshold

    @staticmethod
    def _report(saved: SavedModel, data: Any, split: str, directory: Path) -> dict[str, Any]:
        encoded = data.splits[split]
        report = evaluate(Predictor(saved, batch_size=256), encoded.documents, encoded.targets.numpy())
        title = f"{saved.metadata.get('name') or 'model'} on {split} ({report['documents']} documents)"
        write_report(report, directory, title)
        rank_zero_info(f"\n{title}\n{report['text']}\nreport written to {directory}")
        return report


class PredictionWriter(BasePredictionWriter):
    """``han-train predict`` writes ``<default_root_dir>/predictions/<split>.jsonl``: one line per
    document of the predict split (test, else validation), in input order, with its label(s) and
    the score of every label."""

    def __init__(self) -> None:
        super().__init__(write_interval="epoch")

    def write_on_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, predictions: Any,
                           batch_indices: Any) -> None:
        if not trainer.is_global_zero or not predictions:
            return
        data = trainer.datamodule
        split, labels = data.predict_split, list(data.label_names)
        probs = torch.cat(list(predictions)).tolist()
        path = Path(trainer.default_root_dir) / "predictions" / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as out:
            for row, scores in enumerate(probs):
                top = labels[max(range(len(scores)), key=scores.__getitem__)]
                over = [label for label, p in zip(labels, scores, strict=True) if p >= 0.5]
                chosen = over if data.multi_label else [top]
                record = {"row": row, "label": top, "labels": chosen,
                          "scores": {label: round(p, 6) for label, p in zip(labels, scores, strict=True)}}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
        rank_zero_info(f"{len(probs)} predictions written to {path}")
