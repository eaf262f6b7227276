"""A name's versions in BentoML's model store: each one written whole, and chosen only when whole.

BentoML copies a new version into ``models/NAME/VERSION`` file by file and lists every folder there as
a version, so a fit killed while it registered left a half-written version that the name's next fit
made production, and a cut ``model.yaml`` broke every listing of the store. Here a version is built in
the store's ``tmp`` folder (the same filesystem), with the ``model.yaml`` BentoML writes, and one rename
puts it in ``models/NAME/`` as the last step. A folder there that is not a whole version (an interrupted
registration by an earlier release, a damaged copy) is skipped, with one warning line, wherever this
project chooses a version: first, production or latest.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import socket
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bentoml
import yaml

from han.environment import process_alive
from model_store.production import bentoml_home, sync_folder, write_durably

logger = logging.getLogger("model_store")
STAGING_PREFIX = "han-register-"
MODEL_YAML = "model.yaml"
# han.saved_model's file names (not imported: that module loads spaCy, and `han-model status` must start fast)
MODEL_FILES = ("config.json", "vocab.json", "labels.json", "model.safetensors")
NGRAM_FILE = "ngram_head.safetensors"
JSON_TAILS = ("vocab.json", "profile.json")  # large: checked for a cut end rather than parsed
_warned: set[str] = set()
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: 4 ms where the Python parser took 30


def store_dir() -> Path:
    """``models/``: one folder per name, one per version inside it, and BentoML's ``latest`` file."""
    return bentoml_home() / "models"


class _Registered(Exception):
    """Raised inside ``bentoml.models.create`` once the version is in place, so that BentoML does not copy it
    into the store a second time, file by file."""


def write_version(name: str, labels: dict[str, str], metadata: dict[str, Any], write: Callable[[str], Any]) -> str:
    """Register a new version of ``name`` (``write`` fills its folder); returns ``name:version``. It is
    written in ``tmp/`` with BentoML's ``model.yaml`` and renamed into ``models/NAME/`` as the last step,
    so it appears whole or not at all (a kill leaves only staging, removed by the next registration)."""
    tmp = bentoml_home() / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    sweep(tmp, STAGING_PREFIX)
    staging = tmp / f"{STAGING_PREFIX}{owner_stamp()}"
    staging.mkdir()
    try:
        with bentoml.models.create(name, labels=labels, metadata=metadata) as model:
            version = str(model.tag.version)
            write(str(staging / version))
            model.flush()  # BentoML's model.yaml (in its own temporary folder), as its own save writes it
            shutil.copyfile(Path(model.path) / MODEL_YAML, staging / version / MODEL_YAML)
            target = store_dir() / name / version
            target.parent.mkdir(parents=True, exist_ok=True)
            sync_folder(staging / version, files=True)  # on disk before the rename makes it a version
            os.rename(staging / version, target)  # the last step: before it, the store has no trace of it
            sync_folder(target.parent)
            raise _Registered
    except _Registered:
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    write_durably(target.parent / "latest", version)  # BentoML writes `latest` in place: a kill cut it
    return f"{name}:{version}"


def owner_stamp() -> str:
    """``HOST.PID.RANDOM``: who writes a staging folder, so that only a dead writer's is swept."""
    return f"{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"


def sweep(folder: Path, prefix: str) -> None:
    """Remove the staging folders ``prefix + owner_stamp()`` in ``folder`` left by killed processes of
    this host (a live writer's, or another host's on a shared store, are left alone)."""
    for path in folder.glob(f"{prefix}*") if folder.is_dir() else []:
        host, _, rest = path.name[len(prefix):].rpartition(".")[0].rpartition(".")
        if host == socket.gethostname() and rest.isdigit() and not process_alive(int(rest)):
            shutil.rmtree(path, ignore_errors=True)


def end_version(name: str, last: bool) -> Any | None:
    """The name's first (or ``last``) registered whole version, or None. The versions are ordered by the
    creation time their ``model.yaml`` states, read as text, and opened from that end until one is whole:
    opening every version took 40 ms each, 6.5 s for ``NAME:latest`` in a store of 150 versions."""
    stamped = []
    for path in _folders(name):
        try:
            text = (path / MODEL_YAML).read_text(encoding="utf-8")
            stamp = re.search(r"^creation_time: *'?([^'\n]+)'?$", text, re.MULTILINE)
            when = datetime.fromisoformat(stamp[1].strip()) if stamp else None
            stamped.append((when.replace(tzinfo=when.tzinfo or UTC) if when else None, path))
        except (OSError, ValueError, UnicodeDecodeError):
            stamped.append((None, path))
    known = sorted(((when, f"{name}:{path.name}", path) for when, path in stamped if when is not None),
                   reverse=last)
    for _, _, path in known:
        if (model := _whole(name, path)) is not None:
            return model
    rest = [path for when, path in stamped if when is None]  # no readable time: opened to warn, never whole
    found = sorted(filter(None, (_whole(name, path) for path in rest)), key=lambda m: (m.info.creation_time,
                                                                                       str(m.tag)))
    return (found[-1] if last else found[0]) if found else None


def _folders(name: str) -> list[Path]:
    folder = store_dir() / name
    return [path for path in sorted(folder.iterdir()) if path.is_dir()] if folder.is_dir() else []


def _whole(name: str, path: Path) -> Any | None:
    """The version at ``path`` if whole; else None, with one warning line the first time."""
    model, why = open_version(name, path.name)
    if model is None and path.as_posix() not in _warned:
        _warned.add(path.as_posix())
        logger.warning(_skipped(path, why))
    return model


def _skipped(path: Path, why: str) -> str:
    return (f"skipped {path}: {why} (not a whole version: an interrupted registration or a damaged copy; no "
            f"command here uses it, and `rm -r {path}` clears it)")


def open_version(name: str, version: str, files: bool = True) -> tuple[Any, str]:
    """The BentoML model ``name:version`` if its folder is whole, else None and why not, in words.
    ``files=False``: its ``model.yaml`` only (a version named outright: loading it names a missing file)."""
    path = store_dir() / name / version
    if not (valid(name) and valid(version) and path.is_dir()):
        return None, f"no version {name}:{version} in the model store"
    # checked here first: BentoML logs a cut model.yaml's parse error over many lines before it raises
    if why := fault(path, version, files):
        return None, why
    try:
        return bentoml.Model.from_path(str(path)), ""  # the store BENTOML_HOME names, as the pointer's
    except Exception as e:  # what its attrs parsing raises
        return None, f"not a whole model version: no readable {MODEL_YAML} ({_first_line(e)}); an interrupted " \
                     "registration? Remove the folder"


def fault(path: Path, version: str, files: bool = True) -> str | None:
    """Why the folder ``path`` is not a whole version (None: it is), without BentoML: its ``model.yaml``
    (a few ms with libyaml) and, with ``files``, the model's files."""
    try:
        info = yaml.load((path / MODEL_YAML).read_text(encoding="utf-8"), Loader=_YAML_LOADER)
        if not isinstance(info, dict) or str(info.get("version")) != version:
            raise ValueError(f"it names version {info.get('version') if isinstance(info, dict) else None!r}")
    except Exception as e:  # a cut model.yaml raises whatever its YAML parsing raises
        return f"not a whole model version: no readable {MODEL_YAML} ({_first_line(e)}); an interrupted " \
               "registration? Remove the folder"
    if files and (why := missing_part(path)):
        return f"not a whole model version ({why}); an interrupted registration? Remove the folder"
    return None


def warn_damaged(name: str) -> None:
    """One warning line for each folder of ``name`` that is not a whole version (``han-model status``: choosing
    a version opens only as many as it needs, and `bentoml models list` fails on such a folder)."""
    for path in _folders(name):
        if (why := fault(path, path.name)) and path.as_posix() not in _warned:
            _warned.add(path.as_posix())
            logger.warning(_skipped(path, why))


def valid(part: str) -> bool:
    """Whether ``part`` can be a name or version in the store (BentoML's rule; never a path)."""
    return re.fullmatch(r"[a-z0-9]([-._a-z0-9]*[a-z0-9])?", part) is not None


def find_version(name: str, version: str) -> str | None:
    """The version ``version`` names: itself, or the one stored version it begins (as BentoML finds them)."""
    folder = store_dir() / name
    if not (valid(name) and valid(version) and folder.is_dir()):
        return None
    if (folder / version).is_dir():
        return version
    found = [p.name for p in folder.iterdir() if p.is_dir() and p.name.startswith(version)]
    return found[0] if len(found) == 1 else None


def missing_part(path: Path) -> str | None:
    """What a model directory lacks to be whole (None: nothing): a file missing, cut or unreadable."""
    for file in MODEL_FILES:
        if not (path / file).is_file():
            return f"{file} missing"
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        json.loads((path / "labels.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"config.json or labels.json unreadable ({_first_line(e)})"
    tensors = ["model.safetensors"] + ([NGRAM_FILE] if isinstance(config, dict) and config.get("ngram_head") else [])
    for file in tensors:
        if not _whole_safetensors(path / file):
            return f"{file} missing or cut"
    for file in JSON_TAILS:
        if (path / file).exists() and not _ends_json(path / file):
            return f"{file} cut"
    return None


def _whole_safetensors(path: Path) -> bool:
    """Whether the file is as long as its header says (a cut copy is shorter)."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > path.stat().st_size - 8:  # not a safetensors file (a Git LFS pointer): no read of its "size"
                return False
            header = json.loads(f.read(size))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return path.stat().st_size == 8 + size + end
    except (OSError, ValueError, struct.error, KeyError, TypeError, IndexError):
        return False


def _ends_json(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 64))
            return f.read().rstrip()[-1:] in (b"}", b"]")
    except OSError:
        return False


def _first_line(e: BaseException) -> str:
    return (f"{e.__class__.__name__}: {e}".strip().splitlines() or [""])[0]
