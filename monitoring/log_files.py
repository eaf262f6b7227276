"""The inference log's files, read without BentoML: where they are, their records, and the repair of
what a killed worker left (``monitoring.inference_log`` writes them)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from model_store.production import deployment_dir


def log_folder(name: str) -> Path:
    """The inference log of model name ``name`` (every version it served, and shadows)."""
    return deployment_dir(name) / "log"


def _dead(path: Path) -> bool:
    """The file was written by a process of this host that has ended (its name ends in -HOST-PID)."""
    rest, _, pid = path.stem.rpartition("-")
    if not pid.isdigit() or not rest.endswith("-" + socket.gethostname()) or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def repair(folder: Path) -> int:
    """Cut the unfinished last line off the files of this host's ended processes: ``write(2)`` of a line
    longer than a page can stop part-way when the process is killed. Returns the bytes cut."""
    cut = 0
    for path in (folder / "data").glob("*.jsonl") if (folder / "data").is_dir() else []:
        if not _dead(path):
            continue
        with contextlib.suppress(OSError), path.open("rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                continue
            f.seek(size - 1)
            if f.read(1) == b"\n":
                continue
            keep = size
            while keep > 0:  # back to the last newline, a block at a time
                start = max(0, keep - 65536)
                f.seek(start)
                block = f.read(keep - start)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    keep = start + newline + 1
                    break
                keep = start
            f.truncate(keep)
            cut += size - keep
    return cut


def log_files(folder: Path) -> list[Path]:
    """The log's files, oldest first."""
    data = folder / "data"
    return sorted(data.glob("*.jsonl"), key=lambda p: (p.stat().st_mtime, p.name)) if data.is_dir() else []


def read_log(
    folder: Path, since: datetime | None = None, until: datetime | None = None, roles: Iterable[str] | None = None
) -> Iterator[dict[str, Any]]:
    """The log's records in a time window (UTC), file by file. A line that does not parse (written by
    something else) is skipped, not fatal."""
    wanted = None if roles is None else set(roles)
    low = None if since is None else since.astimezone(UTC).isoformat(timespec="milliseconds")[:23]
    high = None if until is None else until.astimezone(UTC).isoformat(timespec="milliseconds")[:23]
    for path in log_files(folder):
        with contextlib.suppress(FileNotFoundError), path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if not line.endswith("\n"):  # being written right now, or cut by a kill: not a line yet
                    break
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                stamp = str(record.get("time", ""))[:23]
                if (low and stamp < low) or (high and stamp >= high):
                    continue
                if wanted is None or record.get("role") in wanted:
                    yield record
