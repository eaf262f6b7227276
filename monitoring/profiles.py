"""What the monitor needs of a model version, read from its directory without loading its tensors."""

from __future__ import annotations

import json
from typing import Any


def model_facts(tag: str) -> tuple[dict[str, Any] | None, list[str], bool] | None:
    """A version's training profile, labels and task, read from its directory (no tensors loaded)."""
    from han.saved_model import ModelDirectoryError, read_profile
    from model_store import ModelNotFoundError, model_path

    try:
        directory = model_path(tag)
        labels = json.loads((directory / "labels.json").read_text(encoding="utf-8"))
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        return read_profile(directory), labels, bool(config["model"].get("multi_label"))
    except (ModelNotFoundError, ModelDirectoryError, OSError, ValueError, KeyError):
        return None


def why_no_profile(tag: str) -> str:
    """Why the monitor has no training profile of a version, for the user: a version deleted from the store
    since it served is not the same as one trained without a profile."""
    from model_store import ModelNotFoundError, model_path

    try:
        directory = model_path(tag)
    except ModelNotFoundError:
        return f"{tag} is no longer in the model store, so its training profile cannot be read"
    except (OSError, ValueError) as e:
        return f"{tag}'s model directory cannot be read ({e})"
    if not (directory / "labels.json").is_file() or not (directory / "config.json").is_file():
        return f"{tag}'s model directory {directory} is incomplete (no labels.json or config.json)"
    return "the model directory has no training profile"
