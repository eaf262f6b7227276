"""Each server's own Prometheus folder.

BentoML keeps one multiprocess folder per ``BENTOML_HOME`` and empties it whenever a server starts
(bentoml#3207: it cannot be set). A second server on the same home, a replica or ``make run`` beside a
bento, wiped the first one's ``/metrics``, which from then on summed the second server's workers'
files. So a worker moves, before any metric exists in it, to a folder of its own server beside
BentoML's: ``prometheus_multiproc_dir.<host>-<pid>-<start>`` of the process that started the workers (the
server's arbiter, with this machine's name), which its sibling workers and a restarted worker find
too. Folders of this machine's servers that have stopped are removed by the next worker that starts.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"
SHARED_NAME = "prometheus_multiproc_dir"  # BentoML's, under $BENTOML_HOME
_HOST = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())  # a home shared by machines or containers


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), None when it is gone or unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # field 22; the command name may hold spaces


def _server_key(pid: int) -> str:
    return f"{_HOST}-{pid}-{_start_time(pid) or 0}"


def _alive(key: str) -> bool:
    """Whether the server of ``key`` runs (one of another machine or container sharing the home: yes)."""
    if not key.startswith(f"{_HOST}-"):
        return True
    pid, _, start = key[len(_HOST) + 1:].partition("-")
    if not pid.isdigit():
        return False
    current = _start_time(int(pid))
    if current is None:  # no /proc: ask the process table
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return start == "0"
    return current == start


def use_server_folder(worker: bool) -> str | None:
    """In a worker of a server on BentoML's shared folder, point ``PROMETHEUS_MULTIPROC_DIR`` at the
    server's own folder (made if new) and return it; otherwise (the arbiter, a process that already
    has its own folder, no multiprocess metrics) change nothing and return None."""
    shared = os.environ.get(ENV)
    if not worker or not shared or Path(shared).name != SHARED_NAME:
        return None
    parent = Path(shared).parent
    folder = parent / f"{SHARED_NAME}.{_server_key(os.getppid())}"
    folder.mkdir(exist_ok=True)
    for other in parent.glob(f"{SHARED_NAME}.*"):
        if other != folder and not _alive(other.name.partition(".")[2]):
            shutil.rmtree(other, ignore_errors=True)
    os.environ[ENV] = str(folder)
    return str(folder)
