"""``han-train``: LightningCLI over HANModule and HANDataModule (fit, validate, test, predict).

    han-train fit --config data/configs/imdb.yaml
    han-train fit --data.train my_reviews.csv --data.test my_test.csv        # the recipe: training.recipe
    han-train fit --config data/configs/imdb.yaml --ckpt_path last        # resume a killed run
    han-train test --config data/configs/imdb.yaml --ckpt_path runs/imdb/checkpoints/last.ckpt
"""

from __future__ import annotations

import fcntl
import os
import pickle
import re
import socket
import sys
import time
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, ClassVar, NoReturn

import torch
import yaml
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.cli import LightningArgumentParser, LightningCLI
from pytorch_lightning.utilities.exceptions import MisconfigurationException, SIGTERMException

from han.environment import apply_defaults, ignored_threads, requested_threads
from han.saved_model import ModelDirectoryError
from training import recipe
from training.checkpoint_io import SameFolderCheckpointIO
from training.data import HANDataModule
from training.export import CheckpointError, ExportModel
from training.module import HANModule, check_settings
from training.self_training import PSEUDO_FILE, SelfTraining, pseudo_label, teaching
from training.sources import DataError
from training.warm_start import data_language

_HELD: dict[Path, IO[str]] = {}  # the run folders' lock files while a fit (with self-training: both) runs

# --print_config's flags, as jsonargparse reads them (skip_null is its old name for skip_unset).
PRINT_FLAGS = {"skip_default": "skip_default", "skip_unset": "skip_unset", "skip_null": "skip_unset",
               "comments": "with_comments"}


class HANParser(LightningArgumentParser):
    """A parse error in one line and a hint, not under jsonargparse's 120 lines of usage; an unknown key
    named with the config file that holds it."""

    configs: ClassVar[dict[Path, Any]] = {}  # the run's config files, read (HANCLI.parse_arguments)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse trying one reading of a value catches the ArgumentError
            super().error(message, ex)
        unknown = re.match(r"Subcommand '(\w+)' does not accept option '([\w.]+)'", message)
        files = [str(path) for path, data in self.configs.items() if unknown and (
            _holds(data, unknown[2]) or _holds(data, f"{unknown[1]}.{unknown[2]}"))]
        subcommand = self.prog.replace(" [options]", "").split()[1:] or ([unknown[1]] if unknown else [])
        prog = " ".join(["han-train", *subcommand])  # not the prog's python -m training.cli or __main__.py
        print(f"han-train: error: {''.join(f'{f}: ' for f in files)}{' '.join(message.split())}\n"
              f"  ({prog} --help lists the options)", file=sys.stderr)
        sys.exit(2)


class HANCLI(LightningCLI):
    """Adds the checkpoint and export settings, links the sizes that come from the data, and lets
    training.recipe fill what the config leaves unset before ``--print_config`` or a run reads it."""

    def add_arguments_to_parser(self, parser) -> None:  # type: ignore[no-untyped-def]
        for size in ("vocab_size", "num_labels", "multi_label"):
            parser.link_arguments(f"data.{size}", f"model.{size}", apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({
            "checkpoint.save_last": True,
            "checkpoint.filename": "epoch{epoch}-score{val/score:.4f}",
            "checkpoint.auto_insert_metric_name": False,
            # A fit run again into the same folder replaces last.ckpt (Lightning's default wrote
            # last-v1.ckpt beside it, and `test --ckpt_path .../last.ckpt` read the old run's weights).
            "checkpoint.enable_version_counter": False,
        })
        # Unset (None) until before_instantiate_classes: a warm start's stored model's language, else English.
        parser.set_defaults({"data.language": None})
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

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        # Checkpoints renamed into place (training.checkpoint_io), unless the config names its own plugins.
        if not self._get(self.config_init, "trainer", default={}).get("plugins") and "plugins" not in kwargs:
            kwargs["plugins"] = [SameFolderCheckpointIO()]
        return super().instantiate_trainer(**kwargs)

    def parse_arguments(self, parser, args: list[str] | None) -> None:  # type: ignore[no-untyped-def,override]
        # --print_config[=flags] is held back until the recipe has filled the config (before_instantiate_classes).
        args = sys.argv[1:] if args is None else list(args)
        HANParser.configs = _read_configs(args)
        printing = [a.partition("=")[2] for a in args if a.partition("=")[0] == "--print_config"]
        self.print_flags: dict[str, bool] | None = None
        if printing:
            self.print_flags = {"skip_unset": False}
            for flag in filter(None, printing[-1].split(",")):
                if flag not in PRINT_FLAGS:
                    parser.error(f'Invalid option "{flag}" for --print_config (flags: {", ".join(PRINT_FLAGS)})')
                self.print_flags[PRINT_FLAGS[flag]] = True
        self.config = parser.parse_args([a for a in args if a.partition("=")[0] != "--print_config"])

    def _parse_ckpt_path(self) -> None:
        # Lightning reads the checkpoint's hyperparameters here, before any hook: a file that is no
        # checkpoint must be named now, not met as a traceback from the unpickler.
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        _check_checkpoint(ckpt_path)
        try:
            super()._parse_ckpt_path()
        except pickle.UnpicklingError:
            raise
        except (RuntimeError, KeyError, EOFError, AttributeError, ValueError) as e:
            raise DataError(f"--ckpt_path {ckpt_path}: not a readable checkpoint ({type(e).__name__}: "
                            f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else '-'})") from e
        if subcommand != "fit" and ckpt_path and self.config[subcommand].model.get("init_from"):
            _without_stored_model(self.config[subcommand], ckpt_path)

    def before_fit(self) -> None:
        # Held until the process ends: a second fit into this folder would delete this one's checkpoints.
        # A self-training teacher (RUN/teacher) holds RUN too, until the second fit there has ended (main).
        if self.trainer.is_global_zero:
            root = Path(self.trainer.default_root_dir)
            teacher = root.name == "teacher" and teaching(self.config.fit)
            for folder in (root, root.parent) if teacher else (root,):
                if folder.resolve() not in _HELD:
                    _HELD[folder.resolve()] = _hold_run_folder(folder)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        if self.subcommand != "fit" and not config.get("ckpt_path") and not config.model.get("init_from"):
            # Lightning would run the freshly initialised network and write its guesses over a run's reports
            raise DataError(f"han-train {self.subcommand} needs the model to {self.subcommand}: --ckpt_path "
                            "(runs/NAME/checkpoints/last.ckpt, or a model's checkpoint) or --model.init_from")
        _check_before_data(config)
        config.data.language, taken = data_language(config.data.language, config.model.get("init_from"))
        before = dict(config.clone().items()) if self.print_flags is not None else {}  # to mark what it fills
        lines = [*([taken] if taken else []), *recipe.apply(config, self.subcommand)]
        for line in lines if self.print_flags is None else []:  # else in the printed config's header
            print(line, file=sys.stderr)
        recipe.layout(config, self.subcommand)
        if self.print_flags is None:
            return
        # What the run will use, each setting (section.key) the recipe filled marked.
        filled = {key for key, value in config.items() if before.get(key) != value}
        for line in [*lines, "'# recipe': filled by training/recipe.py"]:
            print(f"# {line}")
        section = ""
        for line in self._parser(self.subcommand).dump(config, **self.print_flags).splitlines():
            section = line.split(":")[0] if line[:1].isalnum() else section
            key = re.match(r"  (\w+):", line)
            print(f"{line}  # recipe" if key and f"{section}.{key[1]}" in filled else line)
        sys.exit(0)


def main(args: list[str] | None = None) -> None:
    """Entry point of ``han-train``; user errors print one line and exit with status 2."""
    apply_defaults()
    if warning := ignored_threads():  # as every command ignores it (OpenMP's own warning names no value)
        print(f"han-train: warning: {warning}", file=sys.stderr)
    # Every usable core unless OMP_NUM_THREADS says otherwise; a fit then follows the free ones (training.threads).
    torch.set_num_threads(requested_threads())
    started = time.monotonic()
    try:
        cli = _run(args)
        if cli.subcommand == "fit" and teaching(cli.config.fit):
            _second_fit(cli, list(sys.argv[1:] if args is None else args), time.monotonic() - started)
    except pickle.UnpicklingError as e:  # Lightning loads --ckpt_path with weights_only=True: code never runs
        print(f"han-train: error: the checkpoint holds more than tensors and plain data; refusing to unpickle it "
              f"({str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__})", file=sys.stderr)
        sys.exit(2)
    except SIGTERMException:  # Lightning's, a SystemExit with no status: a `fit && promote` would carry on
        print("han-train: stopped by SIGTERM before its end; this run registered no model", file=sys.stderr)
        sys.exit(143)
    except KeyboardInterrupt:  # before the trainer runs (Lightning stops a fit on Ctrl-C itself)
        print("han-train: interrupted", file=sys.stderr)
        sys.exit(130)
    except (DataError, CheckpointError, ModelDirectoryError, OSError, ValueError,
            MisconfigurationException) as e:  # OSError: a run or cache folder that cannot be made or written
        print(f"han-train: error: {e}", file=sys.stderr)
        sys.exit(2)
    finally:
        _release_run_folders()


def _run(args: list[str] | None) -> HANCLI:
    started = time.time()
    try:
        cli = HANCLI(HANModule, HANDataModule, args=args, save_config_kwargs={"overwrite": True},
                     auto_configure_optimizers=False, parser_class=HANParser)
    except BaseException:
        _release_run_folders()
        raise
    if not (cli.subcommand == "fit" and teaching(cli.config.fit) and not cli.trainer.interrupted):
        _release_run_folders()  # else held through the second fit (main): RUN is the teacher's run's too
    config = cli.config.get(cli.subcommand) if cli.subcommand else None
    if cli.subcommand == "fit" and not config.get("ckpt_path") and cli.trainer.is_global_zero and \
            not cli.trainer.interrupted and config.checkpoint.dirpath:
        _drop_earlier_checkpoints(Path(config.checkpoint.dirpath), started)
    return cli


def _read_configs(args: list[str]) -> dict[Path, Any]:
    """The config files ``args`` name (``--config``/``-c`` FILE, ``--config=FILE``), read; a DataError
    naming the file for one that is no YAML (jsonargparse's says ``"<unicode string>"``)."""
    configs = {}
    for i, arg in enumerate(args):
        value = args[i + 1] if arg in ("--config", "-c") and i + 1 < len(args) else \
            arg.partition("=")[2] if arg.startswith(("--config=", "-c=")) else ""
        path = Path(value)
        if not value or not path.is_file():
            continue  # inline YAML, or no such file: jsonargparse says so
        try:
            configs[path] = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue  # jsonargparse names it
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise DataError(f"{path}{where}: not valid YAML: {e.problem}"
                            f"{f' ({e.context})' if e.context else ''}") from None
        except yaml.YAMLError as e:
            raise DataError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    return configs


def _holds(data: Any, key: str) -> bool:
    """Whether a config read from YAML sets the dotted ``key`` (``model.lr``)."""
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def _check_before_data(config: Any) -> None:
    """The model's settings and the run's folders, checked before the recipe reads the data (minutes on a
    large corpus, where torch's own errors named no option, and a size of 0 trained a model that explains
    nothing)."""
    try:
        check_settings(**dict(config.model.items()))
    except ValueError as e:
        raise DataError(str(e)) from None
    for option, folder in (("--trainer.default_root_dir", config.trainer.default_root_dir),
                           ("--data.cache_dir", config.data.cache_dir)):
        if folder is not None:
            _check_folder(option, Path(str(folder)))


def _check_folder(option: str, folder: Path) -> None:
    """A DataError naming ``option`` unless ``folder`` is a folder that can be written or made. Made here to
    know (no permission bit tells that of /proc/x), then removed: a run stopped later leaves nothing."""
    if folder.exists() and not folder.is_dir():
        raise DataError(f"{option} {folder}: a file, not a folder")
    missing = [path for path in [folder, *folder.parents] if not path.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"{option} {folder}: cannot be made ({e.strerror or e})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DataError(f"{option} {folder}: cannot be written (no permission)")
    for path in missing:  # deepest first
        try:
            path.rmdir()
        except OSError:
            break  # another process is writing in it


def _release_run_folders() -> None:
    """The run folders' locks end with the run, also in a process that fits again (tests, self-training)."""
    while _HELD:
        _HELD.popitem()[1].close()


def _hold_run_folder(folder: Path) -> IO[str]:
    """An exclusive lock on ``folder/.fit.lock`` for this fit, or a DataError naming the fit that holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / ".fit.lock").open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise DataError(f"{folder}: another han-train fit ({holder}) is writing this run folder; wait for it to "
                        "end, or give this fit another --trainer.default_root_dir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    return handle


def _drop_earlier_checkpoints(folder: Path, started: float) -> None:
    """A fit from scratch that ended replaces the checkpoints an earlier run left in its folder: beside the new
    best, an old ``epoch3-score0.9100.ckpt`` read as the best of this run. Only the names a fit writes; a fit
    resumed (``--ckpt_path``) or interrupted keeps them all."""
    for path in folder.glob("*.ckpt"):
        if (path.name == "last.ckpt" or re.fullmatch(r"epoch\d+-score.*\.ckpt", path.name)) and \
                path.stat().st_mtime < started:
            path.unlink(missing_ok=True)


def _second_fit(teacher: HANCLI, args: list[str], spent: float) -> None:
    """Self-training: the teacher's labels for the unlabelled text, then the fit that is exported, in
    what is left of ``trainer.max_time`` (the budget is the whole run's)."""
    config = teacher.config.fit
    teacher_root = Path(config.trainer.default_root_dir)
    if teacher.trainer.interrupted:
        return
    started = time.monotonic()
    pseudo = teacher_root.parent / PSEUDO_FILE
    counts = pseudo_label(teacher_root / "model", config, pseudo)
    print(f"self-training: the first model labelled {counts['chosen']:,} of {counts['unlabeled']:,} unlabelled "
          f"documents for the second fit (lowest confidence kept {counts['min_confidence'] or 0:.3f}) -> {pseudo}",
          file=sys.stderr)
    budget = []
    if (total := _seconds(config.trainer.max_time)) is not None:
        left = max(60, int(total - spent - (time.monotonic() - started)))
        clock = f"{left // 86400:02d}:{left // 3600 % 24:02d}:{left // 60 % 60:02d}:{left % 60:02d}"
        budget = ["--trainer.max_time", clock]
        print(f"self-training: the second fit has {left} s of trainer.max_time left", file=sys.stderr)
    _run([*args, "--data.pseudo_labelled", str(pseudo), "--trainer.default_root_dir", str(teacher_root.parent),
          *budget])


def _seconds(max_time: Any) -> float | None:
    """``trainer.max_time`` (Lightning's "DD:HH:MM:SS", a dict of timedelta's arguments, or a timedelta) in seconds."""
    if max_time is None:
        return None
    if isinstance(max_time, str):
        days, hours, minutes, seconds = map(int, max_time.split(":"))
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds).total_seconds()
    return (max_time if isinstance(max_time, timedelta) else timedelta(**dict(max_time))).total_seconds()


def _without_stored_model(config: Any, ckpt_path: Any) -> None:
    """test/validate/predict a warm-started fit's checkpoint without the model it started from (deleted, or
    ``NAME:production`` now naming another): the checkpoint's weights replace everything that model gave, and
    it records the sizes and language the model brought. A checkpoint from before that record keeps needing it."""
    if str(ckpt_path) in ("last", "best", "hpc", "registry"):
        return
    architecture = torch.load(ckpt_path, weights_only=True, map_location="cpu").get("han_architecture")
    if not architecture:
        return
    language = architecture.pop("language", None)
    for name, value in architecture.items():
        config.model[name] = value
    if config.data.get("language") is None and language:
        config.data.language = language
    config.model.init_from = None


def _check_checkpoint(ckpt_path: Any) -> None:
    """A ``--ckpt_path`` file that is not a PyTorch checkpoint (a zip archive) named as such, where Lightning
    would fail in the unpickler and seem to say the file holds code."""
    if not ckpt_path or str(ckpt_path) in ("last", "best", "hpc", "registry"):
        return
    path = Path(str(ckpt_path))
    if not path.exists():
        raise DataError(f"--ckpt_path {path}: no such file")
    if path.is_dir():
        raise DataError(f"--ckpt_path {path}: a folder, not a checkpoint file (runs/NAME/checkpoints/last.ckpt)")
    if not zipfile.is_zipfile(path):
        raise DataError(f"--ckpt_path {path}: not a PyTorch checkpoint (a .ckpt file a fit wrote)")


if __name__ == "__main__":
    main()

