"""The output of a han-score job while it runs: chunks committed atomically, merged at the end.

While a job runs, its output lives in ``OUTPUT.parts/``:

    manifest.json          the commit record: job settings, committed parts, next input row, counts
    part-000000.<ext>      scored rows of chunk 0 (Parquet, JSON Lines or CSV without header)
    errors-000000.jsonl    rows of chunk 0 that could not be scored (only when there are some)

A chunk is committed by writing its files under temporary names, fsync-ing and renaming them
(``os.replace``), then replacing ``manifest.json`` the same way: the manifest is the single
commit point. A run killed at any moment leaves at worst files the manifest does not list;
``--resume`` deletes those and carries on from the manifest's ``next_row``. When every row is
committed, the parts are merged into ``OUTPUT`` and ``OUTPUT.errors.jsonl`` (again through a
temporary file and ``os.replace``), the manifest is marked ``merged``, and the folder is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from scoring.formats import Chunk, OutputError, OutputFormat, concatenate, errors_path, json_line

MANIFEST_FORMAT = "han-score-manifest/1"


def parts_dir(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def cannot_write(path: Path | str, e: OSError) -> OutputError:
    """One line naming the file and the system's reason (a full disk's write names no file itself)."""
    return OutputError(f"{path}: cannot write ({os.strerror(e.errno) if e.errno else e.strerror or e})")


def recorded_job(output: Path) -> dict[str, Any] | None:
    """The settings a partial run at OUTPUT was started with, read without a lock; None if none can be read."""
    try:
        manifest = json.loads((parts_dir(output) / "manifest.json").read_text(encoding="utf-8"))
        return manifest["job"] if manifest.get("format") == MANIFEST_FORMAT else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def lock_path(output: Path | str) -> Path:
    """``OUTPUT.lock``: the one lock of an output, whichever engine writes it."""
    out = Path(str(output).rstrip("/"))
    return out.with_name(out.name + ".lock")


class OutputLock:
    """``OUTPUT.lock``, held by every han-score run writing OUTPUT for as long as it may write there, whichever
    its engine: each engine's own folder (``OUTPUT.parts``, ``OUTPUT.incomplete``) is unknown to the other, and a
    Ray job once replaced a local job's output finished meanwhile. An ``flock`` (free again when its holder dies,
    even by kill -9); the holder removes the file when it lets go."""

    def __init__(self, output: Path | str) -> None:
        self.output = output
        self.path = lock_path(output)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def take(self) -> None:
        """Hold the lock (already held: nothing to do), or one line saying another run holds it."""
        while self._fd is None:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            except OSError as e:
                raise cannot_write(self.path, e) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise OutputError(f"{self.output}: another han-score run is writing this output right now "
                                  f"({self.path} is held)") from None
            try:  # the file its last holder removed on letting go is no lock: take the path's file again
                same = os.path.samestat(os.stat(self.path), os.fstat(fd))
            except OSError:
                same = False
            if same:
                self._fd = fd
            else:
                os.close(fd)

    def release(self) -> None:
        """Remove the file, then let go (a run waiting on the removed file takes the path's new one)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None


class PartialOutput:
    """``OUTPUT.parts/``: committed chunks of a job and the manifest that records them."""

    def __init__(self, output: Path, fmt: OutputFormat) -> None:
        self.output = output
        self.errors_path = Path(errors_path(str(output)))
        self.dir = parts_dir(output)
        self.manifest_path = self.dir / "manifest.json"
        self.fmt = fmt
        self.manifest: dict[str, Any] = {}
        self._lock_fd: int | None = None
        self.output_lock = OutputLock(output)

    # -- opening

    def lock(self) -> None:
        """Hold an exclusive lock on the folder for this process's life (released even by kill -9)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as e:
            raise cannot_write(self.dir / ".lock", e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"{self.output}: another han-score run is writing this output right now") from None
        self._lock_fd = fd

    @property
    def locked(self) -> bool:
        return self._lock_fd is not None

    def unlock(self) -> None:
        """Let go of the folder's lock, then of ``OUTPUT.lock``."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.output_lock.release()

    def read_manifest(self) -> dict[str, Any] | None:
        """The committed manifest, or None if the folder has none (nothing was committed)."""
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise OutputError(f"{self.manifest_path}: unreadable manifest ({e}); use --overwrite to start over") from e
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise OutputError(f"{self.manifest_path}: not a han-score manifest; use --overwrite to start over")
        return manifest

    def start(self, job: dict[str, Any]) -> None:
        """Begin a new job here: drop whatever the folder holds and commit an empty manifest."""
        self._remove_files(keep=set())
        self.manifest = {
            "format": MANIFEST_FORMAT,
            "job": job,
            "state": "running",
            "next_row": 0,
            "parts": [],
            "counts": {"read": 0, "scored": 0, "failed": 0, "labels": {}},
            "elapsed_s": 0.0,
            "runs": 0,
        }
        self._write_manifest()

    def resume(self, manifest: dict[str, Any]) -> None:
        """Continue the job of ``manifest``: delete files it does not list (uncommitted leftovers)."""
        self.manifest = manifest
        if manifest["state"] == "merged":  # killed while cleaning up: finish() only has to remove the folder
            return
        keep = {"manifest.json"}
        for part in manifest["parts"]:
            keep.add(part["file"])
            if part.get("errors_file"):
                keep.add(part["errors_file"])
        missing = [name for name in sorted(keep) if not (self.dir / name).is_file()]
        if missing:
            raise OutputError(f"{self.dir}: committed files are missing ({', '.join(missing)}); use --overwrite")
        self._remove_files(keep)

    # -- committing

    @property
    def next_row(self) -> int:
        return int(self.manifest["next_row"])

    def commit(self, chunk: Chunk, next_row: int, elapsed_s: float) -> None:
        """Make ``chunk`` durable, then record it (and that input rows < next_row are done) in the manifest."""
        index = len(self.manifest["parts"])
        name = f"part-{index:06d}{self.fmt.suffix}"
        _atomic_write(self.dir / name, lambda f: self.fmt.write_part(chunk, f))
        part: dict[str, Any] = {"file": name, "rows": chunk.scored, "errors": len(chunk.errors)}
        if chunk.errors:
            part["errors_file"] = f"errors-{index:06d}.jsonl"
            data = "".join(json_line(e) for e in chunk.errors).encode("utf-8")
            _atomic_write(self.dir / part["errors_file"], lambda f: f.write(data))
        counts = self.manifest["counts"]
        counts["read"] += chunk.size
        counts["scored"] += chunk.scored
        counts["failed"] += len(chunk.errors)
        labels = Counter(counts["labels"])
        labels.update(chunk.label_counts)
        counts["labels"] = dict(sorted(labels.items()))
        self.manifest["parts"].append(part)
        self.manifest["next_row"] = next_row
        self.manifest["elapsed_s"] = elapsed_s
        self._write_manifest()

    def record_elapsed(self, elapsed_s: float, runs: int) -> None:
        self.manifest["elapsed_s"] = elapsed_s
        self.manifest["runs"] = runs
        self._write_manifest()

    def finish(self) -> None:
        """Merge the committed parts into OUTPUT and OUTPUT.errors.jsonl, then remove the folder."""
        if self.manifest["state"] != "merged":
            parts = [self.dir / p["file"] for p in self.manifest["parts"]]
            errors = [self.dir / p["errors_file"] for p in self.manifest["parts"] if p.get("errors_file")]
            merged = self.dir / ("merged" + self.fmt.suffix)
            _atomic_write(merged, lambda f: self.fmt.merge(parts, f))
            merged_errors = self.dir / "merged.errors.jsonl"
            _atomic_write(merged_errors, lambda f: concatenate(errors, f))
            os.replace(merged, self.output)
            os.replace(merged_errors, self.errors_path)
            _fsync_dir(self.output.parent)
            self.manifest["state"] = "merged"
            self._write_manifest()
        self.remove()

    def remove(self) -> None:
        """Delete the folder (the manifest last, so a kill midway leaves a folder --resume understands)."""
        if not self.dir.exists():
            return
        self._remove_files(keep={"manifest.json", ".lock"})
        with contextlib.suppress(FileNotFoundError):
            self.manifest_path.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.dir / ".lock").unlink()
        with contextlib.suppress(OSError):
            self.dir.rmdir()
        self.unlock()

    # -- helpers

    def _write_manifest(self) -> None:
        data = json.dumps(self.manifest, indent=1, ensure_ascii=False, default=str).encode("utf-8")
        _atomic_write(self.manifest_path, lambda f: f.write(data))
        _fsync_dir(self.dir)

    def _remove_files(self, keep: set[str]) -> None:
        for entry in self.dir.iterdir():
            if entry.name in keep or entry.name == ".lock":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """``path`` whole or unchanged; a failed write (a full disk) leaves no temporary file and is one line."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise cannot_write(path, e) from None


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
