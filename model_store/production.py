"""The production pointer: which version of a model name is served, movable and reversible.

A pointer is a small JSON file beside BentoML's model store (``$BENTOML_HOME/deployments/NAME/``),
so every server that shares the store follows it: ``NAME:production`` names the version it points
to. A name's first registered version writes it; promotion and rollback move it under a lock (one
at a time) with an atomic write; its history is what ``rollback`` walks back. Each serving worker
reports what it serves in ``replicas/``, which is how ``han-model promote`` knows that the servers
followed, or why one could not.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PRODUCTION = "production"
MODEL_TAG_ENV = "HAN_MODEL_TAG"
REPLICA_FRESH_SECONDS = 10.0  # a replica that has not reported for this long is taken as stopped


class PromotionError(RuntimeError):
    """A promotion or rollback that cannot be done; the message is one line naming the problem."""


def bentoml_home() -> Path:
    """The model store's folder (BentoML's own default). This module reads model_store's two variables."""
    return Path(os.environ.get("BENTOML_HOME") or Path.home() / "bentoml").expanduser()


def model_tag_from_env() -> str | None:
    """``$HAN_MODEL_TAG``, the model to serve and score, if set."""
    return os.environ.get(MODEL_TAG_ENV, "").strip() or None


def deployment_dir(name: str) -> Path:
    return bentoml_home() / "deployments" / name


def pointer_path(name: str) -> Path:
    return deployment_dir(name) / "production.json"


def split_tag(ref: str) -> tuple[str, str | None]:
    name, _, version = str(ref).partition(":")
    return name, version or None


def follows_pointer(ref: str) -> bool:
    """``NAME`` and ``NAME:production`` follow the pointer; ``NAME:VERSION`` and ``NAME:latest`` do not."""
    _, version = split_tag(ref)
    return version in (None, PRODUCTION) and "/" not in str(ref)


def read_pointer(name: str) -> dict[str, Any] | None:
    """The pointer's record (``tag``, ``history``), or None when there is none (a name with no version,
    or one registered before registration wrote it: ``model_store.production_version``)."""
    try:
        record = json.loads(pointer_path(name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise PromotionError(f"{pointer_path(name)}: the production pointer cannot be read ({e})") from None
    return record if isinstance(record, dict) and isinstance(record.get("tag"), str) else None


def production_tag(name: str) -> str | None:
    record = read_pointer(name)
    return None if record is None else record["tag"]


def pointer_stamp(name: str) -> tuple[int, int] | None:
    """A cheap change check for a watcher: the pointer file's (mtime_ns, inode), or None."""
    try:
        st = pointer_path(name).stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ino


def write_json(path: Path, value: Any, durable: bool = True) -> None:
    """Atomically: a reader sees the old file or the new one, never half of one. ``durable=False``: no
    fsync (a worker's report, rewritten every few seconds from the serving process)."""
    write_durably(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n", durable)


def write_durably(path: Path, text: str, durable: bool = True) -> None:
    """``text`` into a file beside ``path``, on disk before it is renamed over ``path``: after a power
    cut the file is the old one or the new one, never empty (a rename can reach the disk before data)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        sync_folder(path.parent)


def sync_folder(folder: Path, files: bool = False) -> None:
    """fsync a folder's entry list (a rename in it), and with ``files`` every file below it first."""
    for path in sorted(folder.rglob("*")) if files else []:
        if path.is_file() and not path.is_symlink():
            handle = os.open(path, os.O_RDONLY)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


@contextlib.contextmanager
def locked(name: str, wait: bool = False) -> Iterator[None]:
    """Held for a whole promotion or rollback; a second one at the same time fails at once. ``wait``:
    block instead (registration, which must not fail a finished fit because a promotion runs)."""
    path = deployment_dir(name) / "promote.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise PromotionError(f"another promotion or rollback of {name} is under way ({holder}); "
                                 "try again when it has finished") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def set_pointer(tag: str, action: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """Point ``NAME:production`` at ``tag`` (call under ``locked``); the previous tag goes on the history."""
    name, _ = split_tag(tag)
    record = read_pointer(name) or {"name": name, "tag": None, "history": []}
    entry = {"tag": tag, "action": action, "at": _now(), "previous": record["tag"], **(details or {})}
    record = {"name": name, "tag": tag, "history": [*record.get("history", []), entry]}
    write_json(pointer_path(name), record)
    return record


def record_decision(name: str, decision: dict[str, Any]) -> None:
    """One line of ``decisions.jsonl`` for each promotion asked for: promoted, refused or forced, with
    the comparison it rested on (BentoML has no public way to add to a registered model's metadata)."""
    path = deployment_dir(name) / "decisions.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"at": _now(), **decision}, ensure_ascii=False) + "\n")


def restore_pointer(record: dict[str, Any] | None, name: str) -> None:
    """Put back a pointer record read before a change (None: there was none)."""
    if record is None:
        pointer_path(name).unlink(missing_ok=True)
    else:
        write_json(pointer_path(name), record)


def rollback_target(name: str) -> str:
    """The version in production before the current one (the history walked back past rollbacks)."""
    record = read_pointer(name)
    if record is None:
        raise PromotionError(f"{name} has no production version: there is nothing to roll back")
    current, stack = record["tag"], []
    for entry in record.get("history", []):  # replay: a registration or promotion pushes, a rollback pops
        if entry.get("action") == "rollback":
            if stack:
                stack.pop()
        else:
            stack.append(entry["tag"])
    earlier = [tag for tag in stack[:-1] if tag != current]
    stored = [tag for tag in earlier if (bentoml_home() / "models" / name / tag.partition(":")[2]).is_dir()]
    gone = sorted(set(earlier) - set(stored), key=earlier.index)
    if not stored:
        raise PromotionError(f"{name} has no earlier production version to roll back to (it serves {current})"
                             + (f"; {', '.join(gone)} no longer in the model store" if gone else ""))
    if gone and earlier[-1] != stored[-1]:
        print(f"{', '.join(t for t in gone if earlier.index(t) > earlier.index(stored[-1]))}: no longer in the "
              f"model store (deleted), passed over", file=sys.stderr)
    return stored[-1]


# -- what each serving worker reports ---------------------------------------------------------------------


def replica_path(name: str, replica: str) -> Path:
    return deployment_dir(name) / "replicas" / f"{replica}.json"


def replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def report_replica(name: str, serving: str, failed: dict[str, Any] | None, loading: str | None = None,
                   pointer: tuple[int, int] | None = None, shadow: dict[str, Any] | None = None,
                   pinned: bool = False) -> None:
    """A worker's report: the version it serves, the one it is loading, the promoted version it could not
    load (with why), the pointer (its stamp) these answer, and its shadow (monitoring.shadow), if any.
    ``pinned``: a worker started on one version (a tag), which runs the name's shadow but never follows a
    promotion, so that promote does not wait for it."""
    write_json(replica_path(name, replica_id()),
               {"serving": serving, "loading": loading, "failed": failed, "pointer": pointer, "shadow": shadow,
                "pinned": pinned, "pid": os.getpid(), "host": socket.gethostname(), "seen": time.time()},
               durable=False)


def forget_replica(name: str) -> None:
    replica_path(name, replica_id()).unlink(missing_ok=True)


def live_replicas(name: str, fresh: float = REPLICA_FRESH_SECONDS,
                  following: bool = False) -> dict[str, dict[str, Any]]:
    """The replicas that reported within ``fresh`` seconds (others stopped: their files are removed);
    ``following``: only those that follow the pointer (not pinned to a version)."""
    folder, out = deployment_dir(name) / "replicas", {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # being replaced right now; read at the next poll
        age = time.time() - float(report.get("seen", 0))
        if abs(age) <= fresh:  # a report from the future (the clock stepped back) is not taken as a live one's
            if not (following and report.get("pinned")):
                out[path.stem] = report
        elif age > 10 * fresh:
            path.unlink(missing_ok=True)
    return out


def note_feedback_store(name: str, where: str | None) -> None:
    """What a starting service records its answers and feedback in, when it is not the default SQLite
    file (``where``: the redacted URL; None removes the note), so that ``han-model monitor`` run in a
    shell without ``HAN_FEEDBACK_STORE`` says where to look instead of reporting no feedback."""
    path = deployment_dir(name) / "feedback-store.json"
    if where is None:
        path.unlink(missing_ok=True)
    else:
        write_json(path, {"store": where, "pid": os.getpid(), "host": socket.gethostname(), "at": time.time()})


def noted_feedback_store(name: str) -> tuple[str, Path] | None:
    """The store a service noted (redacted), and the note's path; None without one."""
    path = deployment_dir(name) / "feedback-store.json"
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["store"]), path
    except (OSError, ValueError, KeyError, TypeError):
        return None
