"""``han-train``: LightningCLI over HANClassifier and HANDataModule (fit, validate, test, predict).

    han-train fit --config data/configs/imdb.yaml
    han-train fit --data.train my_reviews.csv --data.test my_test.csv        # the recipe: training.recipe
    han-train fit --config data/configs/imdb.yaml --ckpt_path last        # resume a killed run
    han-train test --config data/configs/imdb.yaml --ckpt_path runs/imdb/checkpoints/last.ckpt
"""

from __future__ import annotations

import pickle
import re
import sys
from pathlib import Path

import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from han.environment import apply_defaults, requested_threads
from han.saved_model import ModelDirectoryError
from training import recipe
from training.data import HANDataModule
from training.export import CheckpointError, ExportModel
from training.module import HANClassifier
from training.self_training import PSEUDO_FILE, SelfTraining, pseudo_label, teaching
from training.sources import DataError

PLAIN_DDP = ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")  # Lightning names each with _find_unused_parameters_true


class HANCLI(LightningCLI):
    """Adds the checkpoint and export settings, links the sizes that come from the data, and fills
    in run-specific defaults."""

    def add_arguments_to_parser(self, parser) -> None:  # type: ignore[no-untyped-def]
        for size in ("vocab_size", "num_labels", "multi_label"):
            parser.link_arguments(f"data.{size}", f"model.{size}", apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({
            "checkpoint.monitor": None,  # by the schedule: training.recipe
            "checkpoint.save_last": True,
            "checkpoint.filename": "epoch{epoch}-score{val/score:.4f}",
            "checkpoint.auto_insert_metric_name": False,
        })
        parser.add_lightning_class_args(ExportModel, "export")
        parser.add_class_arguments(SelfTraining, "self_training")
        parser.set_defaults({
            "trainer.use_distributed_sampler": False,
            "trainer.callbacks": [
                {"class_path": "pytorch_lightning.callbacks.RichProgressBar"},
                {"class_path": "pytorch_lightning.callbacks.LearningRateMonitor",
                 "init_args": {"logging_interval": "epoch"}},
                {"class_path": "training.callbacks.Throughput"},
                {"class_path": "training.callbacks.PredictionWriter"},
            ],
        })

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        configs = config.get("config") or []
        run_name = Path(str(configs[-1])).stem if configs else _data_name(str(config.data.train))
        for line in recipe.apply(config, self.subcommand):
            print(line, file=sys.stderr)
        if config.trainer.strategy in PLAIN_DDP and config.model.freeze_embeddings != 0:  # None: the default, 1
            # The fixed word vectors take no gradient, which plain DDP refuses as an unused parameter;
            # once released they must still be averaged across ranks, so they stay in DDP's reducer.
            config.trainer.strategy += "_find_unused_parameters_true"
        root = Path(config.trainer.default_root_dir or Path("runs") / run_name)
        if self.subcommand == "fit" and teaching(config):
            if config.data.multi_label:
                raise DataError("self-training (self_training.fraction above 0) is for single-label data")
            # The first of two fits: its model only labels the unlabelled text (see main).
            root = root / "teacher"
            config.checkpoint.dirpath = None
            config.export.register, config.export.faithfulness, config.export.baseline = False, 0, False
        config.trainer.default_root_dir = str(root)
        if config.checkpoint.dirpath is None:
            config.checkpoint.dirpath = str(root / "checkpoints")
        if config.export.name is None:
            config.export.name = f"han-{run_name}"
        if config.trainer.enable_progress_bar is False:
            config.trainer.callbacks = [
                c for c in config.trainer.callbacks or [] if not str(c.get("class_path", "")).endswith("ProgressBar")
            ]
        if config.trainer.logger in (None, True):
            config.trainer.logger = [
                {"class_path": "pytorch_lightning.loggers.CSVLogger",
                 "init_args": {"save_dir": str(root), "name": "csv"}},
                {"class_path": "pytorch_lightning.loggers.TensorBoardLogger",
                 "init_args": {"save_dir": str(root), "name": "tensorboard"}},
            ]


def _data_name(source: str) -> str:
    """A run without a config is named after its training data (runs/my_reviews, han-my_reviews): the
    file's stem, or its folder's name where the stem says nothing (train.parquet), in the characters a
    BentoML tag allows."""
    path = Path(source.split(":")[0])
    name = path.parent.name if path.stem.lower() in {"train", "training", "data", "dataset"} else path.stem
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.") or "han"


def main(args: list[str] | None = None) -> None:
    """Entry point of ``han-train``; user errors print one line and exit with status 2."""
    apply_defaults()
    # The cores this process may use unless OMP_NUM_THREADS says otherwise (torch's own default can be
    # fewer); while training, the count then follows the cores other processes leave free (training.threads).
    torch.set_num_threads(requested_threads())
    try:
        cli = _run(args)
        if cli.subcommand == "fit" and teaching(cli.config.fit):
            _second_fit(cli, list(sys.argv[1:] if args is None else args))
    except pickle.UnpicklingError as e:  # Lightning loads --ckpt_path with weights_only=True: code never runs
        print(f"han-train: error: the checkpoint holds more than tensors and plain data; refusing to unpickle it "
              f"({str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__})", file=sys.stderr)
        sys.exit(2)
    except (DataError, CheckpointError, ModelDirectoryError, FileNotFoundError, ValueError,
            MisconfigurationException) as e:
        print(f"han-train: error: {e}", file=sys.stderr)
        sys.exit(2)


def _run(args: list[str] | None) -> HANCLI:
    return HANCLI(HANClassifier, HANDataModule, args=args, save_config_kwargs={"overwrite": True},
                  auto_configure_optimizers=False)


def _second_fit(teacher: HANCLI, args: list[str]) -> None:
    """Self-training: the teacher's labels for the unlabelled text, then the fit that is exported."""
    config = teacher.config.fit
    teacher_root = Path(config.trainer.default_root_dir)
    if teacher.trainer.interrupted:
        return
    pseudo = teacher_root.parent / PSEUDO_FILE
    counts = pseudo_label(teacher_root / "model", config, pseudo)
    print(f"self-training: the first model labelled {counts['chosen']:,} of {counts['unlabeled']:,} unlabelled "
          f"documents for the second fit (lowest confidence kept {counts['min_confidence'] or 0:.3f}) -> {pseudo}",
          file=sys.stderr)
    _run([*args, "--data.pseudo_labelled", str(pseudo), "--trainer.default_root_dir", str(teacher_root.parent)])


if __name__ == "__main__":
    main()
