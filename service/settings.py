"""Every environment variable the service reads, read here once (docs/operations.md lists them all).

A bad value is a ``ValueError`` naming the variable and what it takes; the service turns it into
one line before any worker starts.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def whole_number(environ: Mapping[str, str], name: str, default: int, unit: str, takes: str, minimum: int = 0,
                 maximum: int | None = None) -> int:
    """``environ[name]`` as a whole number of ``unit`` (``minimum`` to ``maximum``), else ``default``."""
    value = environ.get(name, "").strip()
    if not value:
        return default
    if not (value.isascii() and value.isdigit()) or int(value) < minimum:
        raise ValueError(f"{name} must be a whole number of {unit} ({takes}), not {value[:40]!r}")
    if maximum is not None and int(value) > maximum:
        raise ValueError(f"{name} must be at most {maximum} {unit}, not {value[:40]!r}")
    return int(value)


WORKERS_ENV, BATCH_WAIT_ENV = "HAN_WORKERS", "HAN_BATCH_WAIT_MS"
REQUESTS_PER_CONNECTION_ENV = "HAN_REQUESTS_PER_CONNECTION"
KEYS_FILE_ENV, KEYS_ENV, ANONYMOUS_ENV = "HAN_API_KEYS_FILE", "HAN_API_KEYS", "HAN_ALLOW_ANONYMOUS"
LOG_ENV, LOG_TEXT_ENV, LOG_FILE_ENV, LOG_CAP_ENV = "HAN_LOG", "HAN_LOG_TEXT", "HAN_LOG_FILE_MB", "HAN_LOG_MAX_MB"
FEEDBACK_STORE_ENV, RETENTION_ENV = "HAN_FEEDBACK_STORE", "HAN_FEEDBACK_RETENTION_DAYS"
GRADIENT_IDLE_ENV = "HAN_GRADIENT_HELPER_IDLE_S"


MAX_RETENTION_DAYS = 36_500
# Each worker loads its own model: far past the cores, more only costs memory (a typo could ask for billions).
MAX_WORKERS = max(64, 4 * (os.cpu_count() or 1))
# "postgresql:/u:pw@host/db" (a slash missing) would otherwise be a SQLite file named after the URL, password and all.
_MISTYPED_URL = re.compile(r"^(postgresql|postgres|sqlite):(?!//)", re.IGNORECASE)


def hide_password(value: str) -> str:
    """``value`` with the password of a mistyped URL (``scheme:/user:password@host``) hidden."""
    if not _MISTYPED_URL.match(value) or "@" not in value:
        return value
    scheme, _, rest = value.partition(":")
    userinfo, _, host = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}:{user}{':***' if colon else ''}@{host}"


def sqlite_problem(path: Path) -> str | None:
    """Why the SQLite file at ``path`` cannot be opened or created (None: it can), checked at start: the store
    would otherwise answer every /feedback with 503 behind a server that says it is ready."""
    if path.is_dir():
        return "it is a folder, not a file"
    if path.exists():
        return None if os.access(path, os.R_OK | os.W_OK) else "the file cannot be written"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the store creates the missing folders
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:  # a real file, as the store will make one: os.access says yes to root in /proc or on a read-only disk
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".han-store-check-"):
            pass
    except OSError as e:
        return f"cannot create a file in {folder} ({e.strerror or e.__class__.__name__})"
    return None


def store_setting(environ: Mapping[str, str]) -> str | None:
    """``HAN_FEEDBACK_STORE``: a file path, ``sqlite:///path`` or a PostgreSQL URL; any other scheme is refused
    here, at start, rather than answering 503 for good."""
    value = environ.get(FEEDBACK_STORE_ENV, "").strip() or None
    scheme, marker, rest = (value or "").partition("://")
    known = scheme.lower() in ("postgresql", "postgres") or (scheme.lower() == "sqlite" and rest)
    if (marker and not known) or _MISTYPED_URL.match(value or ""):
        from monitoring.feedback_store import redact

        raise ValueError(f"{FEEDBACK_STORE_ENV} must be a file path, sqlite:///path or "
                         f"postgresql://user:password@host:port/db, not {hide_password(redact(value or ''))!r}")
    path = rest if marker else value  # a SQLite file, checked now; a PostgreSQL server may come up after the service
    problem = path and (not marker or scheme.lower() == "sqlite") and path != ":memory:" and sqlite_problem(
        Path(path).expanduser())
    if problem:
        raise ValueError(f"{FEEDBACK_STORE_ENV}={value}: the feedback store cannot be opened there: {problem}")
    return value


def switch(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """``environ[name]`` as on (1, true, yes, on) or off (0, false, no, off), else ``default``."""
    value = environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 1 (on) or 0 (off), not {value!r}")


@dataclass(frozen=True)
class Settings:
    workers: int = 2  # processes, each with its own model and batcher
    batch_wait: float = 0.010  # seconds a model call waits, at most, for the callers just answered (0: never)
    requests_per_connection: int = 32  # on average, before a keep-alive connection is ended (0: never)
    access_log: bool = False  # HAN_ACCESS_LOG=1: log every request
    keys_file: str | None = None  # API keys, one a line (read again when the file changes)
    keys: str | None = None  # API keys, comma-separated (read at start)
    allow_anonymous: bool = False  # serve beyond loopback without keys
    metrics_open: bool = False  # HAN_METRICS_OPEN=1: /metrics without a key
    host: str = "127.0.0.1"  # BENTOML_HOST: the address bound when ``bentoml serve`` is given no --host
    log: bool = True  # HAN_LOG=0: no inference log
    log_text: bool = True  # HAN_LOG_TEXT=0: the log keeps a SHA-256 of each document instead of its text
    log_file_mb: int = 64  # a new log file past this size
    log_max_mb: int = 2048  # the log's disk cap: the oldest files go past it
    feedback_store: str | None = None  # a SQLite file or postgresql:// URL (default: beside the production pointer)
    feedback_retention_days: int = 90  # answers without feedback are forgotten by the store after this
    gradient_idle: int = 60  # seconds unused before a worker's gradient-explanation helper stops (service.gradients)

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """The settings in ``environ``; ValueError (naming the variable) on a bad value."""
        return cls(
            workers=whole_number(environ, WORKERS_ENV, cls.workers, "processes", "at least 1", minimum=1,
                                 maximum=MAX_WORKERS),
            batch_wait=whole_number(environ, BATCH_WAIT_ENV, round(cls.batch_wait * 1000), "milliseconds",
                                    "0: never wait") / 1000,
            requests_per_connection=whole_number(environ, REQUESTS_PER_CONNECTION_ENV, cls.requests_per_connection,
                                                 "requests", "0: never end a connection"),
            access_log=switch(environ, "HAN_ACCESS_LOG", cls.access_log),
            keys_file=environ.get(KEYS_FILE_ENV, "").strip() or None,
            keys=environ.get(KEYS_ENV, "").strip() or None,
            allow_anonymous=switch(environ, ANONYMOUS_ENV, cls.allow_anonymous),
            metrics_open=switch(environ, "HAN_METRICS_OPEN", cls.metrics_open),
            host=environ.get("BENTOML_HOST") or cls.host,
            log=switch(environ, LOG_ENV, cls.log),
            log_text=switch(environ, LOG_TEXT_ENV, cls.log_text),
            log_file_mb=whole_number(environ, LOG_FILE_ENV, cls.log_file_mb, "megabytes", "at least 1", minimum=1),
            log_max_mb=whole_number(environ, LOG_CAP_ENV, cls.log_max_mb, "megabytes", "at least 1", minimum=1),
            feedback_store=store_setting(environ),
            feedback_retention_days=whole_number(environ, RETENTION_ENV, cls.feedback_retention_days, "days",
                                                 "at least 1", minimum=1),
            gradient_idle=whole_number(environ, GRADIENT_IDLE_ENV, cls.gradient_idle, "seconds", "at least 1",
                                       minimum=1),
        ).checked()

    def checked(self) -> Settings:
        """Settings that make sense together: a log file is at most a quarter of the log's cap, so that the
        cap holds with a file open in each of a few workers."""
        if self.feedback_retention_days > MAX_RETENTION_DAYS:  # a date that far back does not exist
            raise ValueError(f"{RETENTION_ENV} must be at most {MAX_RETENTION_DAYS} days (a hundred years), not "
                             f"{self.feedback_retention_days}")
        if self.log_file_mb * 4 > self.log_max_mb:
            raise ValueError(f"{LOG_FILE_ENV}={self.log_file_mb} must be at most a quarter of {LOG_CAP_ENV}="
                             f"{self.log_max_mb} (the megabytes of one log file, against the whole log's cap)")
        return self


def absolute_store(value: str) -> str | None:
    """A ``HAN_FEEDBACK_STORE`` file path named relative to the current folder, made absolute (None: nothing
    to change): ``service.run`` starts the server in the checkout, which read it relative to there while the
    start-up check and ``han-model`` read it relative to the user's folder."""
    value = value.strip()
    if not value or "://" in value or Path(value).expanduser().is_absolute():
        return None
    return str(Path(value).expanduser().resolve())
