"""Who may call the service: API keys, checked before anything else reads the request.

Keys come from ``$HAN_API_KEYS_FILE`` (one a line, ``#`` comments; read again when it changes, so a
key rotates without a restart) or ``$HAN_API_KEYS`` (comma-separated), never the command line, where
``ps`` shows them. A key may be followed by the scopes it is limited to (``KEY classify``): a key
handed to a client app classifies but cannot write feedback (``SCOPES``); a key without scopes may do
everything. A request sends ``Authorization: Bearer KEY``; keys are compared in constant time (their
SHA-256, so no length leaks) and never logged. Open without a key: the probes, the page and the
API docs (no data), and ``/metrics`` with ``HAN_METRICS_OPEN=1``. Bound beyond loopback without keys,
the service refuses to start unless anonymous access is asked for.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse

from service.settings import ANONYMOUS_ENV, KEYS_ENV, KEYS_FILE_ENV, Settings

OPEN_PATHS = frozenset({"/", "/dashboard", "/livez", "/readyz", "/healthz", "/docs", "/docs.json", "/favicon.ico"})
# BentoML's /docs page loads its scripts and styles from here (no data; a browser sends no key for them)
OPEN_PREFIX = "/static_content/"
# What each scope allows; a path not listed needs a key without scopes.
SCOPES = {"classify": frozenset({"/classify", "/model"}), "feedback": frozenset({"/feedback"}),
          "monitor": frozenset({"/monitor", "/metrics"})}
Key = tuple[bytes, frozenset[str] | None]  # a key and its scopes (None: all)
REALM = 'Bearer realm="han"'

Scope = MutableMapping[str, Any]
App = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class KeysError(ValueError):
    """The keys' file cannot be read, or it or the variable holds no key."""


def load_keys(settings: Settings) -> list[bytes]:
    """The configured keys (empty: none configured); the file wins over the variable."""
    return [key for key, _ in load_scoped_keys(settings)]


def load_scoped_keys(settings: Settings) -> list[Key]:
    """The configured keys with their scopes (``KEY [SCOPE ...]``; none: every scope)."""
    if path := settings.keys_file:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise KeysError(f"{KEYS_FILE_ENV}={path}: cannot read the keys ({e.__class__.__name__})") from None
        keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        where = f"{KEYS_FILE_ENV}={path}"
        if not keys:
            raise KeysError(f"{KEYS_FILE_ENV}={path}: the file holds no key (one key per line)")
    elif settings.keys:
        keys = [key.strip() for key in settings.keys.split(",") if key.strip()]
        where = KEYS_ENV
        if not keys:  # set but blank between its commas: refused as an empty keys file is, never "no key check"
            raise KeysError(f"{KEYS_ENV} holds no key (comma-separated keys; unset it to serve without keys)")
    else:
        return []
    out: list[Key] = []
    for entry in keys:
        key, *scopes = entry.split()
        if len(key) < 16 or not (key.isascii() and key.isprintable()):  # a header carries printable ASCII
            raise KeysError(f"an API key must be at least 16 printable ASCII characters without spaces (one of "
                            f"{len(keys)} is not); make one with: python -c 'import secrets; "
                            "print(secrets.token_urlsafe(32))'")
        if unknown := [scope for scope in scopes if scope not in SCOPES]:
            raise KeysError(f"{where}: unknown scope {unknown[0]!r} after a key; the scopes are "
                            f"{', '.join(SCOPES)} (none: all of them)")
        out.append((key.encode("utf-8"), frozenset(scopes) if scopes else None))
    return out


def bound_host(argv: list[str], settings: Settings) -> str:
    """The address ``bentoml serve`` was asked to bind: its ``--host``, else ``$BENTOML_HOST``, else
    loopback. BentoML 1.4 passes ``--host`` to the server without recording it anywhere public, so
    the serving process's own arguments are read (once, before the workers start)."""
    for i, arg in enumerate(argv):
        if arg == "--host" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--host="):
            return arg.removeprefix("--host=")
    return settings.host


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(host: str, keys: list[bytes], allow_anonymous: bool) -> str | None:
    """Why serving on ``host`` with these keys must not start (one line), or None."""
    if is_loopback(host) or keys or allow_anonymous:
        return None
    return (f"--host {host} exposes the service beyond this machine and no API key is set: set {KEYS_FILE_ENV} "
            f"(a file, one key per line) or {KEYS_ENV}, or pass --allow-anonymous ({ANONYMOUS_ENV}=1 for bentoml "
            "serve) to serve without keys")


def startup_keys(host: str, settings: Settings) -> list[bytes]:
    """The keys to serve ``host`` with; KeysError (one line) when they are unreadable, or when the service
    would be reachable from other machines without any and anonymous access was not asked for."""
    keys = load_keys(settings)
    if problem := exposure_problem(host, keys, settings.allow_anonymous):
        raise KeysError(problem)
    return keys


class KeysFile:
    """The keys of ``$HAN_API_KEYS_FILE``, read again when the file changes (its size, time or inode),
    looked at no more than once every ``every`` seconds. A file that cannot be read or holds no key
    is logged and the keys read before stay: a rotation half-written never locks every caller out."""

    def __init__(self, path: str | None, keys: list[Key], every: float = 1.0) -> None:
        self.path, self.every = path, every  # no path: the keys stay as given
        self.digests = [(hashlib.sha256(key).digest(), scopes) for key, scopes in keys]
        self._stamp, self._checked = self._stat(), time.monotonic()

    def _stat(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def current(self) -> list[tuple[bytes, frozenset[str] | None]]:
        if self.path is not None and time.monotonic() - self._checked >= self.every:
            self._checked = time.monotonic()
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    keys = load_scoped_keys(Settings(keys_file=self.path))
                except KeysError as e:
                    logging.getLogger("han.service").error("%s; the keys read before stay in use", e)
                else:
                    self.digests = [(hashlib.sha256(key).digest(), scopes) for key, scopes in keys]
                    logging.getLogger("han.service").info("API keys read again from %s: %d key(s)", self.path,
                                                          len(keys))
        return self.digests


class ApiKeyGuard:
    """ASGI middleware: a request to a guarded path needs ``Authorization: Bearer <one of the keys>``.
    Keys read from a file follow it (``KeysFile``)."""

    def __init__(self, app: App, settings: Settings) -> None:
        self.app = app
        keys = load_scoped_keys(settings)
        self.keys = KeysFile(settings.keys_file if keys else None, keys)  # no keys at start: none ever (loopback)
        self.open = OPEN_PATHS | ({"/metrics"} if settings.metrics_open else set())
        self._following: asyncio.Task[None] | None = None

    async def _follow(self) -> None:
        """Look at the keys' file every ``every`` seconds without waiting for a request: a worker that
        looked only when one reached it could miss a rotation (the kernel may hand every connection to the
        other worker for a while) and, were the file then left broken, keep a revoked key."""
        while True:
            await asyncio.sleep(self.keys.every)
            self.keys.current()

    @property
    def digests(self) -> list[tuple[bytes, frozenset[str] | None]]:
        return self.keys.current()

    def allowed(self, authorization: bytes | None) -> bool:
        return self.scopes(authorization) is not False

    def scopes(self, authorization: bytes | None) -> frozenset[str] | bool | None:
        """The matching key's scopes (None: all), or False when no key matches."""
        scheme, _, token = (authorization or b"").partition(b" ")
        digest = hashlib.sha256(token.strip()).digest()
        found: frozenset[str] | bool | None = False
        for known, scopes in self.digests:  # every key compared, so the time says nothing about which matched
            if hmac.compare_digest(digest, known):
                found = scopes
        return found if scheme.lower() == b"bearer" else False

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if self._following is None and self.keys.path is not None:  # the first call (the worker's lifespan)
            self._following = asyncio.get_running_loop().create_task(self._follow())
        if (scope["type"] != "http" or not self.digests or scope["path"] in self.open
                or (scope["path"].startswith(OPEN_PREFIX) and ".." not in scope["path"])):
            await self.app(scope, receive, send)
            return
        authorization = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), None)
        scopes = self.scopes(authorization)
        if scopes is None or (scopes and any(scope["path"] in SCOPES[s] for s in scopes)):
            await self.app(scope, receive, send)
            return
        if scopes:  # a valid key, limited to other scopes
            message = (f"this API key may not use {scope['path']} (it is limited to: {', '.join(sorted(scopes))})")
            await JSONResponse({"error": message}, status_code=403)(scope, receive, send)
            return
        if authorization is None:
            message, challenge = "this service needs an API key: send Authorization: Bearer <key>", REALM
        else:
            message, challenge = "the API key is not valid", REALM + ', error="invalid_token"'
        response = JSONResponse({"error": message}, status_code=401, headers={"WWW-Authenticate": challenge})
        await response(scope, receive, send)
