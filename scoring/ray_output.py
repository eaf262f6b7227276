"""Where ``han-score --engine ray`` writes while it runs: never a folder that looks finished but is not.

On a local path the actors write into ``OUTPUT.incomplete/`` (``output/`` and ``errors/`` in it), and only a
finished job renames them to OUTPUT and ``OUTPUT.errors``: a run interrupted, failed or killed (``kill -9``
too) leaves no OUTPUT, and the next run removes what it left. ``.lock`` in the folder (an ``flock`` held for
the run) tells a dead run's folder from a running one's. On a remote filesystem (``s3://``: no rename of a
folder), the actors write in place and an interrupted or failed run removes what it wrote; only a killed
one leaves it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from pathlib import Path
from typing import Any

from scoring import BatchError


class RayOutput:
    """The folders the actors write (``output``, ``errors``) and, once the job is done, their placing."""

    def __init__(self, output: str, errors: str) -> None:
        self.final = (output, errors)
        self.local = "://" not in output
        self.staging = Path(output.rstrip("/") + ".incomplete") if self.local else None
        if self.staging is not None:
            self.output, self.errors = str(self.staging / "output"), str(self.staging / "errors")
        else:
            self.output, self.errors = output, errors
        self._lock_fd: int | None = None
        self.placed = False

    def open(self) -> None:
        """Take the staging folder (removing a dead run's), and make the output folder (it exists even when no
        row could be scored). In place (remote), an earlier output (--overwrite's) is removed now."""
        if self.staging is None:
            for path in self.final:
                remove(path)
        else:
            try:
                self._take()
            except OSError as e:
                raise BatchError(f"{self.staging}: cannot write ({e.strerror or e})") from None
        fs, folder = filesystem(self.output)
        fs.create_dir(folder, recursive=True)

    def _take(self) -> None:
        assert self.staging is not None
        self.staging.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.staging / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BatchError(f"{self.final[0]}: another han-score run is writing this output right now") from None
        self._lock_fd = fd
        for entry in self.staging.iterdir():  # what a killed run left: never part of this run's output
            if entry.name != ".lock":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()

    def place(self) -> None:
        """The finished job's folders to OUTPUT and OUTPUT.errors (an earlier output, --overwrite's, removed
        first), Ctrl-C held until both are in place; the errors first, so that an OUTPUT is a whole job's."""
        from scoring.workers import ctrl_c_held

        if self.staging is None:
            self.placed = True
            return
        with ctrl_c_held():
            final = self.final[0]
            try:
                for final in reversed(self.final):
                    remove(final)
                for staged, final in reversed(list(zip((self.output, self.errors), self.final, strict=True))):
                    if Path(staged).exists():
                        os.rename(staged, final)
            except OSError as e:
                raise BatchError(f"{final}: cannot put the finished job's folder there ({e.strerror or e})",
                                 code=1) from None
            self.placed = True
            self._release()

    def discard(self) -> str:
        """After an interruption or a failure: remove what this run wrote; what to tell the user."""
        if self.placed:
            return f"the output {self.final[0]} is complete"
        if self.staging is None:
            with contextlib.suppress(OSError):
                for path in self.final:
                    remove(path)
            return f"nothing written (the partial {self.final[0]} is removed)"
        self._release()
        return "nothing written"

    def _release(self) -> None:
        """Remove the staging folder, then let go of its lock."""
        if self._lock_fd is None or self.staging is None:
            return
        for _ in range(100):  # an actor still writing can add a file while the folder is removed: again
            shutil.rmtree(self.staging, ignore_errors=True)
            if not self.staging.exists():
                break
            time.sleep(0.05)
        os.close(self._lock_fd)
        self._lock_fd = None


def filesystem(path: str) -> tuple[Any, str]:
    """The pyarrow filesystem and the path on it, for a local path or a URI such as ``s3://``."""
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(path if "://" in path else os.path.abspath(path))


def exists(path: str) -> bool:
    import pyarrow.fs as pafs

    fs, p = filesystem(path)
    return fs.get_file_info(p).type != pafs.FileType.NotFound


def remove(path: str) -> None:
    import pyarrow.fs as pafs

    fs, p = filesystem(path)
    kind = fs.get_file_info(p).type
    if kind == pafs.FileType.Directory:
        fs.delete_dir(p)
    elif kind == pafs.FileType.File:
        fs.delete_file(p)
