"""The BentoML model store as the home of trained models: register a model directory, find one by tag.

The one place that knows the store; training registers into it, serving and han-score read from it.

A stored model is exactly a ``han`` model directory (JSON + safetensors) inside the store's
folder for that tag, so nothing is pickled and any tool can open it with ``SavedModel.load``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import bentoml
from bentoml.exceptions import BentoMLException, NotFound

from han.saved_model import SavedModel

DEFAULT_MODEL_TAG = "han-imdb:latest"
MODEL_TAG_ENV = "HAN_MODEL_TAG"


class ModelNotFoundError(LookupError):
    """No model directory or BentoML model matches what the user named."""


def default_model_tag() -> str:
    """The tag served and scored by default: ``$HAN_MODEL_TAG`` or the IMDB model."""
    return os.environ.get(MODEL_TAG_ENV) or DEFAULT_MODEL_TAG


def register(saved: SavedModel, name: str, metadata: dict[str, Any] | None = None) -> str:
    """Save ``saved`` into the BentoML model store under ``name``; returns the new tag ``name:version``."""
    meta = {**saved.metadata, **(metadata or {})}
    saved.metadata = meta
    labels = {"task": "multi-label" if saved.model.config.multi_label else "single-label"}
    with bentoml.models.create(name, labels=labels, metadata=_json_safe(meta)) as model:
        saved.save(model.path)
    return str(model.tag)


def model_path(ref: str | Path) -> Path:
    """Resolve a model directory path or a BentoML tag to a model directory on disk."""
    path = Path(ref)
    if path.is_dir():
        return path
    try:
        return Path(bentoml.models.get(str(ref)).path)
    except (NotFound, BentoMLException, ValueError) as e:
        raise ModelNotFoundError(
            f"no model directory or BentoML model named {str(ref)!r} "
            "(train one with `han-train fit`, or see `bentoml models list`)"
        ) from e


def load(ref: str | Path) -> SavedModel:
    """Load a model by directory path or BentoML tag."""
    return SavedModel.load(model_path(ref))


def _json_safe(value: Any) -> Any:
    """Metadata BentoML accepts: basic types only, so unset (None) entries are left out."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value if v is not None]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
