"""The inference log's files, read without BentoML: where they are, their records, and the repair of
what a killed worker left (``monitoring.inference_log`` writes them)."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import os
import socket
from collections.abc import Collection, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from model_store.production import deployment_dir

# A file last modified this long before ``since`` holds no record of the window: each record's time is
# taken before its write (the slack covers the clocks of hosts writing to one shared store).
MTIME_SLACK_S = 600.0


def log_folder(name: str) -> Path:
    """The inference log of model name ``name`` (every version it served, and shadows)."""
    return deployment_dir(name) / "log"


def dead_writer(path: Path) -> bool:
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
        if not dead_writer(path):
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
    """The log's files, oldest first. A file deleted between the listing and its ``stat`` (the cap pruning
    it, a worker's rotation) is left out, never an error."""
    return [path for _, path in _stamped(folder)]


def _stamped(folder: Path) -> list[tuple[float, Path]]:
    data = folder / "data"
    found = []
    for path in data.glob("*.jsonl") if data.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):
            found.append((path.stat().st_mtime, path))
    return sorted(found, key=lambda item: (item[0], item[1].name))


def _stamp(when: datetime | None) -> str | None:
    """A bound as the log writes its times (UTC, milliseconds, no zone): such strings sort as the times do."""
    return None if when is None else when.astimezone(UTC).isoformat(timespec="milliseconds")[:23]


def _first_time(path: Path) -> str | None:
    """The time of a file's first whole record (each file is written in time order by one process);
    None for a file with none yet, or gone."""
    with contextlib.suppress(FileNotFoundError), path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if not line.endswith("\n"):
                return None
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    return str(record.get("time", ""))[:23]
    return None


def _records(
    path: Path, low: str | None, high: str | None, wanted: set[str] | None, drop: Collection[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """One file's records in the window, with their time stamps. A line that does not parse (written by
    something else) is skipped; a file deleted before it is opened is empty."""
    with contextlib.suppress(FileNotFoundError), path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if not line.endswith("\n"):  # being written right now, or cut by a kill: not a line yet
                break
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            stamp = str(record.get("time", ""))[:23]
            if low and stamp < low:
                continue
            if high and stamp >= high:
                continue  # not ``break``: two threads of a worker can write a millisecond out of order
            if wanted is None or record.get("role") in wanted:
                for key in drop:
                    record.pop(key, None)
                yield stamp, record


def read_log(
    folder: Path,
    since: datetime | None = None,
    until: datetime | None = None,
    roles: Iterable[str] | None = None,
    *,
    drop: Collection[str] = (),
) -> Iterator[dict[str, Any]]:
    """The log's records in a time window (UTC), in time order across the files: each worker appends to
    its own file in time order, so the files are merged as they are read, never held whole. A file is
    opened only once the merge reaches its first record (a log of many rotated files holds few open at
    once), and one last written before ``since`` is not read at all. ``drop`` names fields a caller does
    not need (``"text"``), not kept in memory. A line that does not parse is skipped, not fatal."""
    wanted = None if roles is None else set(roles)
    low, high = _stamp(since), _stamp(until)
    oldest = None if since is None else since.timestamp() - MTIME_SLACK_S
    pending = []
    for mtime, path in _stamped(folder):
        if oldest is not None and mtime < oldest:
            continue
        first = _first_time(path)
        if first is not None and (high is None or first < high):
            pending.append((first, path.name, path))
    pending.sort(reverse=True)  # the earliest-starting file last: popped first
    heads: list[tuple[str, int, dict[str, Any], Iterator[tuple[str, dict[str, Any]]]]] = []
    order = itertools.count()  # ties in time: first pushed, first out (and records are never compared)
    while heads or pending:
        while pending and (not heads or pending[-1][0] <= heads[0][0]):
            files = _records(pending.pop()[2], low, high, wanted, drop)
            if (head := next(files, None)) is not None:
                heapq.heappush(heads, (head[0], next(order), head[1], files))
        if not heads:
            continue
        _, _, record, files = heads[0]
        if (head := next(files, None)) is not None:
            heapq.heapreplace(heads, (head[0], next(order), head[1], files))
        else:
            heapq.heappop(heads)
        yield record
