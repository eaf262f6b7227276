"""The BentoML model store as the home of trained models: register a model directory, find one by tag.

The one place that knows the store; training registers into it, serving and han-score read from it.

A stored model is exactly a ``han`` model directory (JSON + safetensors) inside the store's
folder for that tag, so nothing is pickled and any tool can open it with ``SavedModel.load``.
``NAME:production`` (or ``NAME`` alone) is the version the production pointer names
(``model_store.production``): a name's first registered version, then whatever ``han-model promote``
or ``rollback`` put there; never simply the latest, so a new fit is served only once promoted.
A version appears in the store whole or not at all, and a folder there that is not a whole version is
never chosen (``model_store.versions``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_store.production import (
    PRODUCTION,
    follows_pointer,
    locked,
    model_tag_from_env,
    production_tag,
    set_pointer,
    split_tag,
)
from model_store.versions import end_version, find_version, open_version, store_dir, write_version

if TYPE_CHECKING:  # torch and spaCy load only where a model does: han-model status starts in a second
    from han.pipeline import Pipeline
    from han.saved_model import SavedModel

DEFAULT_MODEL_TAG = f"han-imdb:{PRODUCTION}"


class ModelNotFoundError(LookupError):
    """No model directory or BentoML model matches what the user named."""


def default_model_tag() -> str:
    """The tag served and scored by default: ``$HAN_MODEL_TAG`` or the IMDB model."""
    return model_tag_from_env() or DEFAULT_MODEL_TAG


def model_name(name: str) -> str:
    """``name`` as the store keeps it (lowercase, as BentoML does: the production pointer is looked up
    under it, and ``Han-Demo`` once found none and set production back to the first version); ValueError,
    naming ``export.name``, for a version in it or a name BentoML refuses."""
    if ":" in name:
        raise ValueError(f"export.name {name!r}: a model's name, without a version (the store gives each "
                         "fit its own; `han-model promote` makes one production)")
    import re

    if len(name) > 63 or not re.fullmatch(r"[a-z0-9]([-._a-z0-9]*[a-z0-9])?", name.lower()):  # BentoML's rule
        raise ValueError(f"export.name {name!r}: a model's name is at most 63 letters, digits, '-', '_' or '.', "
                         "and starts and ends with a letter or digit")
    return name.lower()


def register(saved: SavedModel, name: str, metadata: dict[str, Any] | None = None) -> str:
    """Save ``saved`` into the BentoML model store under ``name``; returns the new tag ``name:version``."""
    name = model_name(name)
    meta = {**saved.metadata, **(metadata or {})}
    saved.metadata = meta
    labels = {"task": "multi-label" if saved.config.multi_label else "single-label"}
    tag = write_version(name, labels, _json_safe(meta), saved.save)  # whole, or absent if the fit is killed
    if production_tag(name) is None:  # the name's first version: it becomes production (later ones wait for promote)
        with locked(name, wait=True):
            adopt_production(name, registered=tag)
    return tag


def first_version(name: str) -> str | None:
    """The name's first-registered whole version (earliest creation time), or None when it has none."""
    model = end_version(name, last=False)
    return str(model.tag) if model is not None else None


def latest_version(name: str) -> str | None:
    """The name's last-registered whole version (BentoML's ``latest`` file may name a half-written one)."""
    model = end_version(name, last=True)
    return str(model.tag) if model is not None else None


def production_version(name: str) -> str | None:
    """The version ``NAME:production`` names: the pointer's, else (a store from before registration wrote
    the pointer) the first-registered version, never the latest; None when the name has no version."""
    return production_tag(name) or first_version(name)


def adopt_production(name: str, registered: str | None = None) -> str | None:
    """Write the pointer where there is none, at the first-registered version, so that the promotion gate
    compares with it and rollback can reach it. Call under ``locked(name)``; returns the production tag."""
    current = production_tag(name)
    if current is None and (first := first_version(name)) is not None:
        set_pointer(first, "register" if first == registered else "adopt")
        current = first
    return current


def _stored(ref: str) -> Any:
    """The BentoML model a tag names now: ``NAME`` and ``NAME:production`` the production version
    (``production_version``), ``NAME:latest`` the latest whole one. ModelNotFoundError if none, or if the
    version's ``model.yaml`` cannot be read (one line naming its folder)."""
    name, version = split_tag(str(ref))
    name = name.lower()  # as BentoML stores it
    if follows_pointer(ref):
        ref = production_version(name) or f"{name}:latest"
        name, version = split_tag(ref)
    if version == "latest":
        version = split_tag(latest_version(name) or "")[1]
    if version is None or (version := find_version(name, version.lower())) is None:
        raise ModelNotFoundError(f"no BentoML model named {str(ref)!r} (train one with `han-train fit`, or see "
                                 "`bentoml models list`)")
    model, why = open_version(name, version, files=False)  # chosen ones are whole; loading names a missing file
    if model is None:
        raise ModelNotFoundError(f"{store_dir() / name / version}: {why}")
    return model


def resolve_tag(ref: str) -> str:
    """The ``NAME:VERSION`` that a tag names now (``_stored``)."""
    return str(_stored(ref).tag)


def model_path(ref: str | Path) -> Path:
    """Resolve a model directory path or a BentoML tag to a model directory on disk."""
    path = Path(ref)
    if path.is_dir():
        return path
    try:
        return Path(_stored(str(ref)).path)
    except ModelNotFoundError as e:
        found = e.args[0]
        raise ModelNotFoundError(f"no model directory or {found[3:]}" if found.startswith("no ") else found) from None


class ModelOpenError(RuntimeError):
    """What a command names cannot be opened as a model: not found, or a broken model directory."""


def open_model(ref: str | Path | None) -> tuple[Path, SavedModel]:
    """The model directory and model a command names (the default model when ``ref`` is None): what
    han-score and han-label open, each error one line (ModelOpenError)."""
    from han import ModelDirectoryError
    from han.saved_model import SavedModel

    try:
        directory = model_path(ref or default_model_tag())
        return directory, SavedModel.load(directory)
    except (ModelNotFoundError, ModelDirectoryError) as e:
        raise ModelOpenError(str(e)) from None


def load_metadata(ref: str) -> dict[str, Any]:
    """A stored model's metadata (what the fit recorded), without loading its tensors."""
    return dict(_stored(ref).info.metadata)


def load(ref: str | Path) -> SavedModel:
    """Load a model by directory path or BentoML tag."""
    from han.saved_model import SavedModel

    return SavedModel.load(model_path(ref))


def load_checked(ref: str | Path) -> Pipeline:
    """Load a model and classify one document with it: what a service does before it serves a
    version, so that one that cannot serve (corrupt, or a language without a tokenizer) fails here."""
    from han.pipeline import Pipeline

    pipeline = Pipeline(load(ref))
    pipeline(["A short check."], explain=True)
    return pipeline


def _json_safe(value: Any) -> Any:
    """Metadata BentoML accepts: basic types only, so unset (None) entries are left out."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value if v is not None]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
