"""Checkpoints written beside their final name and renamed in, so a full disk or a kill never leaves half a
checkpoint under ``last.ckpt``.

Lightning's own write goes through an fsspec transaction whose temporary file lies in the system's temp
folder: on another filesystem its commit is a copy into the final name, which a full disk cuts short (the
previous ``last.ckpt`` is gone and the new one truncated). Remote paths (``s3://``...) keep Lightning's write.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning.plugins import TorchCheckpointIO


class SameFolderCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into a hidden file in the checkpoint's folder, flushed to disk, then ``os.replace``."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
        try:
            with os.fdopen(handle, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
        except BaseException as e:
            Path(temp).unlink(missing_ok=True)
            if isinstance(e, OSError):  # han-train prints it as one line naming the file
                raise OSError(f"cannot write the checkpoint {target} ({e.strerror or e}); "
                              f"the one there before is kept") from e
            raise
