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
