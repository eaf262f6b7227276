"""The trained model as users get it: a SavedModel (the best checkpoint, its decision threshold),
evaluated through the inference pipeline and registered in the model store.

``ExportModel`` runs at the end of ``fit`` and ``test``; before ``predict`` it gives the module
the pipeline of the model as it would be exported, so ``han-train predict`` decides labels with
the same threshold as the service and han-score.
"""

from __future__ import annotations

import copy
import pickle
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

from han.calibration import fit_temperature, probabilities
from han.pipeline import Pipeline
from han.saved_model import SavedModel
from training.baseline import MODEL as BASELINE_MODEL
from training.baseline import Baseline, advice, labelled_training_split, run_baseline, side_by_side
from training.data_profile import build_profile
from training.faithfulness_report import faithfulness_report
from training.ngram_head import choose_head
from training.progress import Step, show_in
from training.report import best_threshold, evaluate, headline, write_report


class _Stopped(Exception):
    """The faithfulness check beside the reports, ended because they failed or were interrupted."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as plain tensors and data (never unpickled beyond that)."""


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A Lightning checkpoint, loaded with ``weights_only=True``: tensors and plain data only, so a
    file from elsewhere that holds code fails here with one line and never runs."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path}: not a checkpoint of plain tensors and data; refusing to unpickle it ({first[:200]})"
        ) from None
    except (OSError, RuntimeError) as e:
        raise CheckpointError(f"{path}: unreadable checkpoint ({str(e).splitlines()[0][:200]})") from None


class ExportModel(pl.Callback):
    """At the end of ``fit``: the best checkpoint becomes a model directory, is evaluated, and registered.

    Args:
        name: the BentoML model name; by default ``han-<config file name>``.
        register: register the model in the BentoML model store.
        output_dir: where the model directory and report go; by default ``<default_root_dir>``.
        threshold: multi-label decision threshold; by default the one with the best micro-F1 on
            the validation split (0.05 to 0.95), else 0.5.
        calibrate: fit a temperature on the validation split so that scores are calibrated
            probabilities (the labels chosen stay the same for single-label models).
        faithfulness: documents of the test split (else validation) on which every explanation
            method is measured against a random one (0 skips it); see han.faithfulness.
        faithfulness_tau: of those, how many also get the Kendall tau against leave-one-word-out
            (it runs the model once per word).
        faithfulness_budget: in ``fit``, the check's time at most as a share of the fit's (after
            tokenising), keeping at least 20 documents (what the bootstrap intervals need); the report
            says how many it measured. null: the count alone decides (as in ``test``).
        baseline: also train TF-IDF 1-2 grams + logistic regression on the same labelled training
            documents (seconds) and report it beside the model on the same splits and metrics, so
            every run says whether the HAN is worth its cost (see training.baseline).
        ngram_head: with the baseline: keep it beside the HAN as an n-gram head when
            averaging the two models' probabilities scores better on validation, with the HAN's share
            chosen there (training.ngram_head); every caller's scores are then the average.
        ngram_buckets: hash the baseline's and the head's 1-2 grams into this many buckets
            (training.hashed_ngrams): a table of fixed size whatever the corpus, and a fit that holds
            no vocabulary. 0: scikit-learn's vocabulary of every n-gram in 2 training documents. Unset:
            by the training split's size (training.recipe.ngram_buckets: hashed from 20,000 documents).
        compare_with: a stored model (e.g. ``han-imdb:production``) to compare the new one with on the
            test split (else validation) before it is registered: the figures of ``han-model compare``
            (training.compare), logged and kept in the model's metadata as ``comparison``, where
            ``han-model promote`` finds them. The tag is resolved when the run starts; an unknown one,
            or a model of other labels or the other task, stops the run before it trains.
    """

    def __init__(self, name: str | None = None, register: bool = True, output_dir: str | None = None,
                 threshold: float | None = None, calibrate: bool = True, faithfulness: int = 500,
                 faithfulness_tau: int = 50, baseline: bool = True, faithfulness_budget: float | None = 0.1,
                 ngram_head: bool = True, compare_with: str | None = None, ngram_buckets: int | None = None) -> None:
        if faithfulness < 0 or faithfulness_tau < 0:
            raise ValueError("export.faithfulness and export.faithfulness_tau must be 0 or more")
        if faithfulness_budget is not None and not faithfulness_budget > 0:
            raise ValueError(f"export.faithfulness_budget must be above 0 (null for none), not {faithfulness_budget}")
        if ngram_buckets is not None and ngram_buckets < 0:
            raise ValueError(f"export.ngram_buckets must be 0 (the vocabulary) or more, not {ngram_buckets}")
        if threshold is not None and not 0 < threshold < 1:
            raise ValueError(f"export.threshold must be between 0 and 1 (exclusive), not {threshold}")
        self._compare_ref = compare_with  # as given; compare_with: the version it names now, for the whole run
        if compare_with:  # an unknown tag stops the run now, not after the fit
            from model_store import ModelNotFoundError, resolve_tag

            try:
                compare_with = resolve_tag(compare_with)
            except ModelNotFoundError as e:
                raise ValueError(f"export.compare_with: {e}") from None
        self.compare_with = compare_with
        if name is not None:  # a version in it, or a name the store refuses, stops the run now, not after the fit
            from model_store import model_name

            name = model_name(name)
        self.name = name
        self.register = register
        self.output_dir = output_dir
        self.threshold = threshold
        self.calibrate = calibrate
        self.faithfulness = faithfulness
        self.faithfulness_tau = faithfulness_tau
        self.faithfulness_budget = faithfulness_budget
        self._fit_started: float | None = None  # the faithfulness budget's clock (fit only)
        self.baseline = baseline
        self.ngram_head = ngram_head
        self.ngram_buckets = ngram_buckets
        self._validation_logits: np.ndarray | None = None  # the HAN's, from calibration: the head's choice reuses them
        self.tag: str | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._fit_started = time.monotonic() if stage == "fit" else None
        show_in(trainer.progress_bar_callback)  # the export's bars go where the trainer's are
        if stage == "fit" and self.compare_with and getattr(trainer.datamodule, "label_names", None):
            from model_store import load
            from training.compare import check_labels

            champion = load(self.compare_with)  # other labels or task: one line now, before the fit
            check_labels(trainer.datamodule.label_names, trainer.datamodule.multi_label, champion.labels,
                         bool(champion.config.multi_label), "the new model", self.compare_with)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        show_in(None)

    def _root(self, trainer: pl.Trainer) -> Path:
        return Path(self.output_dir or trainer.default_root_dir)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.interrupted:
            return
        saved = self.saved_model(trainer, pl_module, best=True)
        data = trainer.datamodule
        metrics: dict[str, Any] = {}
        best_score = trainer.checkpoint_callback.best_model_score if trainer.checkpoint_callback else None
        if best_score is not None:  # what the best checkpoint was chosen by: the score, or the loss
            monitor = trainer.checkpoint_callback.monitor
            metrics["validation_loss" if monitor == "val/loss" else "validation_score"] = round(float(best_score), 4)
        splits = [split for split in ("validation", "test") if split in data.splits]
        baseline, fitted = self._baseline(data, splits)
        self._choose_head(saved, data, fitted)
        del fitted  # the head holds what it needs: the fit's table need not live through the reports
        reports, faithfulness = self._measure(saved, data, splits, self._root(trainer) / "report", baseline)
        metrics.update((split, headline(report)) for split, report in reports.items())
        saved.metadata["metrics"] = metrics
        if baseline:
            if ahead := advice(metrics.get("validation", {}), baseline.get("validation", {})):
                rank_zero_info(ahead)
                baseline["advice"] = ahead
            saved.metadata["baseline"] = baseline
        if faithfulness:
            saved.metadata["faithfulness"] = faithfulness
        if self.compare_with and (comparison := self._compare(saved, data)):
            saved.metadata["comparison"] = comparison
        if "validation" in data.splits:  # what the monitor compares served traffic with (training.data_profile)
            texts, targets = _split(data, "validation")
            saved.profile = build_profile(saved, texts, targets, labelled_training_split(data)[1], "validation")
        directory = saved.save(self._root(trainer) / "model")
        rank_zero_info(f"model directory: {directory}")
        if self.register:
            from model_store import register

            self.tag = register(saved, self.name or "han-model")
            rank_zero_info(f"registered in the BentoML model store as {self.tag}")

    def _compare(self, saved: SavedModel, data: Any) -> dict[str, Any] | None:
        """The comparison with ``compare_with`` (None, with a warning, where it cannot run: the fit is kept)."""
        from model_store import load
        from training.compare import CompareError, check_comparable, compare_saved, format_comparison

        split = "test" if "test" in data.splits else "validation"
        try:
            champion = load(self.compare_with)
            check_comparable(saved, champion, "the new model", self.compare_with)
            texts, targets = _split(data, split)
            with Step(f"comparing with {self.compare_with} on {split}", len(texts)) as step:
                result = compare_saved(saved, champion, texts, targets, progress=step.stage)
        except (CompareError, LookupError, ValueError) as e:  # the champion deleted or broken during the fit
            rank_zero_warn(f"no comparison with {self.compare_with}: {e}")
            return None
        result = {"new": "this fit", "old": self._compare_ref, "old_tag": self.compare_with,
                  "data": f"the {split} split", **result}
        rank_zero_info(format_comparison(result))
        return result

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and trainer.state.fn == "test":
            saved = self.saved_model(trainer, pl_module, best=False)
            baseline, fitted = self._baseline(trainer.datamodule, ["test"])
            self._choose_head(saved, trainer.datamodule, fitted)
            self._measure(saved, trainer.datamodule, ["test"], self._root(trainer) / "report", baseline)

    def _baseline(self, data: Any, splits: list[str]) -> tuple[dict[str, Any] | None, Baseline | None]:
        """The baseline's figures and the fitted baseline, or Nones: skipped, or failed (one line; the
        trained model is still saved)."""
        if not self.baseline:
            return None, None
        try:
            return run_baseline(data, splits, self.threshold, self.ngram_buckets)  # None: by the split's size
        except ValueError as e:  # scikit-learn's: an empty vocabulary, a single class in the training split
            rank_zero_info(f"baseline skipped: {e}")
            return None, None

    def _choose_head(self, saved: SavedModel, data: Any, fitted: Baseline | None) -> None:
        """Give ``saved`` the baseline as an n-gram head when averaging scores better on validation (as
        ``fit`` exports it: ``test`` and ``predict`` then measure and predict with the same model); a
        multi-label model then decides at the threshold chosen with the share."""
        if fitted is None or not self.ngram_head or "validation" not in data.splits:
            return
        multi_label = saved.config.multi_label
        texts, targets = _split(data, "validation")
        logits = self._validation_logits
        if logits is None:
            with Step("the HAN on validation", len(texts)) as step:
                _, logits = Pipeline(saved, batch_size=256).with_logits(texts, step.stage)
        han = probabilities(logits, multi_label, saved.temperature)
        try:
            saved.ngrams, saved.metadata["ngram_head"] = choose_head(fitted, han, texts, targets, self.threshold)
        except Exception as e:  # best-effort, like the baseline: the trained HAN is still exported
            rank_zero_info(f"n-gram head skipped: {type(e).__name__}: {e}")
            return
        if saved.ngrams is not None and multi_label and self.threshold is None:
            saved.threshold = saved.metadata["ngram_head"]["threshold"]
            saved.metadata["threshold_from"] = "chosen with the n-gram head's share on the validation split"

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        saved = self.saved_model(trainer, pl_module, best=False)
        if self.baseline and self.ngram_head and "validation" in trainer.datamodule.splits:
            _, fitted = self._baseline(trainer.datamodule, [])
            self._choose_head(saved, trainer.datamodule, fitted)
        pl_module.pipeline = Pipeline(saved, batch_size=256)

    def saved_model(self, trainer: pl.Trainer, pl_module: pl.LightningModule, best: bool) -> SavedModel:
        """The model as exported: the module's network (the best checkpoint's weights if ``best``),
        the data's vocabulary, labels and caps, and, multi-label, the decision threshold."""
        with torch.inference_mode(False):  # under Lightning's test loop: the copy must be usable by autograd
            net = copy.deepcopy(pl_module.net).cpu().eval()
        path = trainer.checkpoint_callback.best_model_path if best and trainer.checkpoint_callback else ""
        if path:
            state = load_checkpoint(path)["state_dict"]
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
        saved = SavedModel(net, data.vocab, list(data.label_names), data.segmenter_config, metadata=metadata)
        self._validation_logits = None
        if self.calibrate and "validation" in data.splits:
            texts, targets = _split(data, "validation")
            with Step("calibrating on validation", len(texts)) as step:
                _, logits = Pipeline(saved, batch_size=256).with_logits(texts, step.stage)
            self._validation_logits = logits
            saved.temperature = fit_temperature(logits, targets, net.config.multi_label)
            saved.metadata["temperature_from"] = "lowest negative log-likelihood on the validation split"
            rank_zero_info(f"calibration temperature: {saved.temperature:.4g}")
        if net.config.multi_label:
            if self.threshold is not None:
                saved.threshold = self.threshold
            else:
                with Step("choosing the threshold on validation", len(data.texts("validation"))):
                    saved.threshold = best_threshold(Pipeline(saved, batch_size=256), *_split(data, "validation"))
                saved.metadata["threshold_from"] = "best micro-F1 on the validation split"
            rank_zero_info(f"multi-label decision threshold: {saved.threshold}")
        return saved

    def _measure(self, saved: SavedModel, data: Any, splits: list[str], root: Path,
                 baseline: dict[str, Any] | None) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
        """Each split's report, and the faithfulness check (None when skipped).

        With several torch threads the check runs in a thread beside the reports, on its own copy of
        the model (its hooks must not reach the reports' forward passes), each with half the threads:
        evaluating is mostly segmenting, which a second torch thread hardly speeds up. Under a time
        budget the check then measures fewer documents than it would after the reports.
        """
        found: dict[str, Any] = {}
        stop = threading.Event()  # set when the reports fail or are interrupted (Ctrl+C): the check ends too

        def check(model: SavedModel) -> None:
            try:
                found["summary"] = self._faithfulness(model, data, root, stop)
            except _Stopped:
                pass
            except BaseException as e:  # raised where the fit runs, after the reports
                found["error"] = e

        thread, threads = None, torch.get_num_threads()
        if self.faithfulness and threads > 1:
            with torch.inference_mode(False):  # under Lightning's test loop: the copy must be usable by autograd
                model = copy.deepcopy(saved, {id(saved.ngrams): saved.ngrams})  # the check reads the HAN only
            thread = threading.Thread(target=check, args=(model,), name="han-faithfulness")
            torch.set_num_threads(threads // 2)
            thread.start()
        try:
            reports = {split: self._report(saved, data, split, root / split, baseline) for split in splits}
        except BaseException:
            stop.set()
            raise
        finally:
            if thread is not None:
                try:
                    thread.join()
                finally:
                    torch.set_num_threads(threads)
        if thread is None:
            check(saved)
        if "error" in found:
            raise found["error"]
        return reports, found.get("summary")

    def _faithfulness(self, saved: SavedModel, data: Any, root: Path,
                      stop: threading.Event | None = None) -> dict[str, Any] | None:
        split = "test" if "test" in data.splits else "validation"
        if not self.faithfulness:
            return None
        title = f"{saved.metadata.get('name') or 'model'}: explanation faithfulness on {split}"
        texts, budget, limit = data.texts(split), None, "no time budget"
        if self.faithfulness_budget is not None and self._fit_started is not None:
            fit_seconds = time.monotonic() - self._fit_started
            budget = self.faithfulness_budget * fit_seconds
            limit = f"budget {budget:.1f} s: {self.faithfulness_budget:.0%} of the fit's {fit_seconds:.0f} s so far"
        with Step(f"faithfulness on {split}", min(self.faithfulness, len(texts)), detail=f", {limit}") as step:

            def progress(documents: int) -> None:
                if stop is not None and stop.is_set():
                    raise _Stopped
                step.update(documents)

            summary = faithfulness_report(Pipeline(saved, batch_size=256), texts, self.faithfulness,
                                          self.faithfulness_tau, root / split, title, budget_seconds=budget,
                                          progress=progress)
            step.count = summary["documents"]
            step.detail = f", stopped by the {summary['stopped_by']} ({limit}; {summary['offered']:,} sampled)"
        rank_zero_info(f"faithfulness on {split} ({summary['documents']} documents): " + "; ".join(
            f"{m} comprehensiveness {v['comprehensiveness_aopc']:.3f} sufficiency {v['sufficiency_aopc']:.3f}"
            + _top_sentence(v) for m, v in summary["methods"].items()))
        return {"split": split, **summary}

    @staticmethod
    def _report(saved: SavedModel, data: Any, split: str, directory: Path,
                baseline: dict[str, Any] | None = None) -> dict[str, Any]:
        with Step(f"evaluating {split}", len(data.texts(split))) as step:
            report = evaluate(Pipeline(saved, batch_size=256), *_split(data, split), progress=step.stage)
        title = f"{saved.metadata.get('name') or 'model'} on {split} ({report['documents']} documents)"
        if baseline:  # into metrics.json and the text report, beside the model's own figures
            report["baseline"] = {"model": BASELINE_MODEL, **baseline[split]}
            report["text"] += "\nbaseline, " + BASELINE_MODEL + ": " + ", ".join(
                f"{key} {value:.3f}" for key, value in baseline[split].items()) + "\n"
        write_report(report, directory, title)
        rank_zero_info(f"\n{title}\n{report['text']}\nreport written to {directory}")
        if baseline:
            rank_zero_info(side_by_side(split, headline(report), baseline[split]))
        return report


def _split(data: Any, split: str) -> tuple[list[str], np.ndarray]:
    """A split's texts and targets (class indices, or a 0/1 matrix for multi-label data)."""
    return data.texts(split), data.splits[split].targets.numpy()


def _top_sentence(measured: dict[str, Any]) -> str:
    """The log's 'top sentence 7.14x random [6.41, 8.02]': the ratio, with its interval where there is one."""
    ratio = measured.get("x_random", {}).get("top1_sentence_drop")
    if not ratio or ratio["ratio"] is None:
        return ""
    interval = "" if ratio["interval"] is None else " [{}, {}]".format(*ratio["interval"])
    return f" top sentence {ratio['ratio']}x random{interval}"
