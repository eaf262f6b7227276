"""Where ``han-score --engine ray`` writes while it runs: never a folder that looks finished but is not.

On a local path the actors write into ``OUTPUT.incomplete/`` (``output/`` and ``errors/`` in it), and only a
finished job renames them to OUTPUT and ``OUTPUT.errors``: a run interrupted, failed or killed (``kill -9``
too) leaves no OUTPUT, and the next run removes what it left. ``.lock`` in the folder (an ``flock`` held for
the run) tells a dead run's folder from a running one's. ``OUTPUT.lock`` (``scoring.partial.OutputLock``), which
the local engine takes too, is held from before OUTPUT is looked at until the job's folders are in place: a local
job and a Ray job on one OUTPUT cannot both write it, and neither replaces the other's. The placing replaces only
what was at OUTPUT when the job began, with ``--overwrite``: anything else found there then is left as it is,
and this job's folders are kept beside it (``OUTPUT.unplaced-*``). On a remote filesystem (``s3://``: no rename of
a folder, no lock), the actors write in place and an interrupted or failed run removes what it wrote; only a
killed one leaves it.
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
from scoring.formats import OutputError
from scoring.partial import OutputLock


class RayOutput:
    """The folders the actors write (``output``, ``errors``) and, once the job is done, their placing."""

    def __init__(self, output: str, errors: str, overwrite: bool = False) -> None:
        self.final = (output, errors)
        self.overwrite = overwrite
        self.local = "://" not in output
        self.staging = Path(output.rstrip("/") + ".incomplete") if self.local else None
        if self.staging is not None:
            self.output, self.errors = str(self.staging / "output"), str(self.staging / "errors")
        else:
            self.output, self.errors = output, errors
        self.output_lock = OutputLock(output) if self.local else None
        self.found: set[str] = set()  # what was at OUTPUT and OUTPUT.errors when the job began
        self._lock_fd: int | None = None
        self.placed = False
        self.kept: Path | None = None  # where this job's folders are, when they could not be put in place

    def open(self) -> None:
        """Take OUTPUT.lock and the staging folder (removing a dead run's), and make the output folder (it exists
        even when no row could be scored); an output found then, without --overwrite, is refused (it may have
        been finished since the check before Ray started). In place (remote), an earlier output (--overwrite's)
        is removed now."""
        if self.staging is None:
            for path in self.final:
                remove(path)
        else:
            try:
                self._take()
            except OSError as e:
                self._release()
                raise BatchError(f"{self.staging}: cannot write ({e.strerror or e})") from None
            except BaseException:
                self._release()
                raise
        fs, folder = filesystem(self.output)
        fs.create_dir(folder, recursive=True)

    def _take(self) -> None:
        assert self.staging is not None and self.output_lock is not None
        self.staging.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.output_lock.take()
        except OutputError as e:
            raise BatchError(str(e)) from None
        self.found = {path for path in self.final if exists(path)}
        if self.found and not self.overwrite:
            raise BatchError(f"{self.final[0]} already exists (written since this job started); pass --overwrite "
                             "to replace it")
        self.staging.mkdir(exist_ok=True)
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
                appeared = [path for path in self.final if exists(path) and path not in self.found]
                if appeared:
                    self._keep(appeared[0])
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

    def _keep(self, appeared: str) -> None:
        """Something this job did not find at its start is at OUTPUT now (written by another program): left as
        it is, and this job's folders moved beside it, where no later run removes them."""
        import tempfile

        assert self.staging is not None
        kept = Path(tempfile.mkdtemp(prefix=Path(self.final[0].rstrip("/")).name + ".unplaced-",
                                     dir=self.staging.parent))
        for staged in (self.output, self.errors):
            if Path(staged).exists():
                os.rename(staged, kept / Path(staged).name)
        self.kept = kept
        raise BatchError(f"{appeared} appeared while this job ran (written by another program): not replaced",
                         code=1)

    def discard(self) -> str:
        """After an interruption or a failure: remove what this run wrote; what to tell the user."""
        if self.placed:
            return f"the output {self.final[0]} is complete"
        if self.kept is not None:
            self._release()
            return f"this job's rows are kept in {self.kept} (output/ and errors/)"
        if self.staging is None:
            with contextlib.suppress(OSError):
                for path in self.final:
                    remove(path)
            return f"nothing written (the partial {self.final[0]} is removed)"
        self._release()
        return "nothing written"

    def _release(self) -> None:
        """Remove the staging folder, then let go of its lock, then of OUTPUT.lock."""
        if self._lock_fd is not None and self.staging is not None:
            for _ in range(100):  # an actor still writing can add a file while the folder is removed: again
                shutil.rmtree(self.staging, ignore_errors=True)
                if not self.staging.exists():
                    break
                time.sleep(0.05)
            os.close(self._lock_fd)
            self._lock_fd = None
        if self.output_lock is not None:
            self.output_lock.release()


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
