"""A model directory: ``config.json``, ``vocab.json``, ``labels.json``, ``model.safetensors`` and,
when the fit kept an n-gram head beside the HAN (han.ngrams), ``ngram_head.safetensors``.

Plain tensors and JSON only; nothing is pickled, so loading a model runs no code from it. A loaded model
holds its weights as numpy arrays (what ``han.numpy_forward`` runs); the torch network is built from them
on first use of ``SavedModel.model`` (training, the gradient-based explanations), so a process that only
classifies never imports torch.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import socket
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from han.config import HANConfig
from han.environment import process_alive
from han.ngrams import NgramHead
from han.numpy_forward import check_weights
from han.segment import LanguageError, SegmenterConfig, check_language
from han.vocab import Vocabulary

if TYPE_CHECKING:
    from han.model import HAN

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
LABELS_FILE = "labels.json"
WEIGHTS_FILE = "model.safetensors"
PROFILE_FILE = "profile.json"  # the training data's profile (training.data_profile): what the monitor compares with
FORMAT_VERSION = 1


class ModelDirectoryError(ValueError):
    """A model directory that is missing a file or has a file that cannot be read."""


class SavedModel:
    """A loaded (or about to be saved) model with everything the predictor needs: the network (a torch
    ``HAN``, or for a loaded model its config and weights, the ``HAN`` built on first use), the vocabulary,
    the labels, the segmenter's settings, the multi-label ``threshold``, the calibration ``temperature``
    (han.calibration), free-form ``metadata``, the n-gram head where the fit kept one (han.ngrams), and the
    training data's ``profile`` where the fit recorded one (what the monitor compares with)."""

    def __init__(
        self, model: HAN | None, vocab: Vocabulary, labels: list[str], segmenter: SegmenterConfig | None = None,
        threshold: float = 0.5, temperature: float = 1.0, metadata: dict[str, Any] | None = None,
        ngrams: NgramHead | None = None, profile: dict[str, Any] | None = None, *,
        config: HANConfig | None = None, weights: dict[str, np.ndarray] | None = None,
    ) -> None:
        if model is None and (config is None or weights is None):
            raise ValueError("a SavedModel needs a model, or its config and weights")
        self._model = model
        self._config = config
        self._weights = weights
        self.vocab = vocab
        self.labels = labels
        self.segmenter = segmenter if segmenter is not None else SegmenterConfig()
        self.threshold = threshold
        self.temperature = temperature
        self.metadata = metadata if metadata is not None else {}
        self.ngrams = ngrams
        self.profile = profile

    @property
    def config(self) -> HANConfig:
        return self._model.config if self._model is not None else self._config  # type: ignore[return-value]

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """The network's weights by their state-dict names (the torch model's own memory when it exists)."""
        if self._model is not None:
            return {k: v.detach().cpu().numpy() for k, v in self._model.state_dict().items()}
        return self._weights  # type: ignore[return-value]

    @property
    def model(self) -> HAN:
        """The torch network, in evaluation mode; built from the weights on first use (torch imported then)."""
        if self._model is None:
            import torch

            from han.model import HAN

            model = HAN(self.config)
            model.load_state_dict({k: torch.tensor(v) for k, v in self.weights.items()})
            self._model, self._weights = model.eval(), None
        return self._model

    def save(self, directory: str | Path) -> Path:
        """Write the model directory and return its path. It is written whole beside ``directory`` and
        swapped in with one rename (the old one removed after), so that a reader, or a fit killed while it
        exports, finds the old model or the new one: never a mix of two fits, nor a file of the old one."""
        directory = Path(directory)
        target = directory.resolve() if directory.is_symlink() else directory
        if target.exists() and not target.is_dir():
            raise FileExistsError(f"{target}: exists and is not a model directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        _sweep(target)
        staging = target.parent / f".{target.name}.saving-{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
        staging.mkdir()
        try:
            self._write(staging)
            _swap_in(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # after the swap: the old model
        return directory

    def _write(self, directory: Path) -> None:
        config = {
            "format_version": FORMAT_VERSION,
            "model": self.config.to_dict(),
            "segmenter": self.segmenter.to_dict(),
            "threshold": self.threshold,
            "temperature": self.temperature,
            "metadata": self.metadata,
        }
        if self.ngrams is not None:
            config["ngram_head"] = {"han_share": self.ngrams.han_share, "ngrams": self.ngrams.size,
                                    "multi_label": self.ngrams.multi_label}
            if self.ngrams.buckets:
                config["ngram_head"]["buckets"] = self.ngrams.buckets
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
        self.vocab.save(directory / VOCAB_FILE)
        (directory / LABELS_FILE).write_text(json.dumps(self.labels, ensure_ascii=False), encoding="utf-8")
        tensors = {k: np.ascontiguousarray(v) for k, v in self.weights.items()}
        save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
        if self.ngrams is not None:
            self.ngrams.save(directory)
        if self.profile is not None:
            (directory / PROFILE_FILE).write_text(json.dumps(self.profile, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path) -> SavedModel:
        """Load a model directory; a missing or corrupt file raises ModelDirectoryError naming it."""
        directory = Path(directory)
        if not directory.is_dir():
            raise ModelDirectoryError(f"{directory}: not a model directory (it does not exist or is not a folder)")
        config = _read_json(directory / CONFIG_FILE)
        labels = _read_json(directory / LABELS_FILE)
        try:
            model_config = HANConfig.from_dict(config["model"])
            segmenter = SegmenterConfig(**config.get("segmenter", {}))
            threshold = float(config.get("threshold", 0.5))
            temperature = float(config.get("temperature", 1.0))  # models saved before calibration: 1
            if not 0 < temperature < float("inf"):
                raise ValueError(f"temperature must be positive and finite, not {temperature}")
            if not 0 < threshold < 1:
                raise ValueError(f"threshold must be between 0 and 1, not {threshold}")
            for cap in ("max_sentences", "max_words", "max_chars"):  # a document's caps: every call divides by them
                value = getattr(segmenter, cap)
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise ValueError(f"segmenter.{cap} must be a whole number of at least 1, not {value!r}")
        except (KeyError, TypeError, ValueError) as e:
            raise ModelDirectoryError(f"{directory / CONFIG_FILE}: invalid model config ({e})") from e
        try:  # a tokenizer package missing: one line, before any document
            check_language(segmenter.language)
        except LanguageError as e:
            raise ModelDirectoryError(f"{directory}: {e}") from None
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
            raise ModelDirectoryError(f"{directory / LABELS_FILE}: expected a non-empty JSON list of label names")
        # in Unicode's composed form, as fits read them since 2026-11-29: a model saved before with "é" as "e" and
        # an accent answers, compares and warm-starts with the labels a retrain on the same file reads
        labels = [unicodedata.normalize("NFC", x) for x in labels]
        if len(set(labels)) != len(labels):  # scores are a dict by label: a repeated one would hide another
            raise ModelDirectoryError(f"{directory / LABELS_FILE}: a label is named twice")
        if len(labels) != model_config.num_labels:
            raise ModelDirectoryError(
                f"{directory / LABELS_FILE}: {len(labels)} labels but the model has {model_config.num_labels} outputs"
            )
        vocab_path = directory / VOCAB_FILE
        _require(vocab_path)
        try:
            vocab = Vocabulary.load(vocab_path)
        except (ValueError, UnicodeDecodeError) as e:
            raise ModelDirectoryError(f"{vocab_path}: unreadable vocabulary ({e})") from e
        if len(vocab) != model_config.vocab_size:
            raise ModelDirectoryError(
                f"{vocab_path}: {len(vocab)} tokens but the model expects {model_config.vocab_size}"
            )
        weights_path = directory / WEIGHTS_FILE
        _require(weights_path)
        try:
            weights = load_file(str(weights_path))
            check_weights(model_config, weights)
        except (SafetensorError, ValueError, TypeError, OSError) as e:  # TypeError: a dtype numpy lacks (bf16)
            raise ModelDirectoryError(f"{weights_path}: unreadable or mismatched weights ({e})") from e
        ngrams = _ngram_head(directory, config.get("ngram_head"), len(labels), model_config.multi_label)
        return cls(None, vocab, labels, segmenter, threshold, temperature, config.get("metadata", {}), ngrams,
                   read_profile(directory), config=model_config, weights=weights)


def _swap_in(new: Path, target: Path) -> None:
    """Put the folder ``new`` at ``target`` in one rename; an existing ``target`` is exchanged with it
    (Linux renameat2), so ``new`` then holds the old one. Where the exchange is not supported, two
    renames, the old one kept aside until the new one is in place (``_sweep`` puts it back if killed)."""
    if not target.exists():
        os.rename(new, target)
        return
    if _exchange(new, target):
        return
    aside = new.with_name(new.name.replace(".saving-", ".old-", 1))
    os.rename(target, aside)
    os.rename(new, target)
    shutil.rmtree(aside, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _sweep(target: Path) -> None:
    """Remove what killed saves of this host left beside ``target``; a model kept aside by a save killed
    between its two renames (no exchange) goes back to ``target`` if nothing replaced it."""
    for path in sorted(p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.")):
        kind, _, owner = path.name[len(target.name) + 2:].partition("-")
        host, _, pid = owner.rpartition(".")[0].rpartition(".")
        mine = host == socket.gethostname() and pid.isdigit()
        if kind not in ("saving", "old") or not mine or process_alive(int(pid)):
            continue
        if kind == "old" and not target.exists():
            os.rename(path, target)
        else:
            shutil.rmtree(path, ignore_errors=True)


def read_profile(directory: str | Path) -> dict[str, Any] | None:
    """The training data's profile kept with the model (None for a model saved without one)."""
    path = Path(directory) / PROFILE_FILE
    if not path.is_file():
        return None
    profile = _read_json(path)
    if not isinstance(profile, dict):
        raise ModelDirectoryError(f"{path}: expected a JSON object")
    return profile


def _ngram_head(directory: Path, entry: Any, labels: int, multi_label: bool) -> NgramHead | None:
    """The n-gram head the config names, or None; a missing or mismatched file raises ModelDirectoryError."""
    if entry is None:
        return None
    path = directory / NgramHead.FILE
    _require(path)
    try:
        head = NgramHead.load(directory, float(entry["han_share"]), multi_label)
    except (SafetensorError, KeyError, TypeError, ValueError, IndexError, OSError) as e:
        raise ModelDirectoryError(f"{path}: unreadable n-gram head ({e})") from e
    if head.coef.shape[0] != labels:
        raise ModelDirectoryError(f"{path}: {head.coef.shape[0]} labels but the model has {labels}")
    return head


def _require(path: Path) -> None:
    if not path.is_file():
        raise ModelDirectoryError(f"{path}: missing from the model directory")


def _read_json(path: Path) -> Any:
    _require(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelDirectoryError(f"{path}: not valid JSON ({e})") from e
