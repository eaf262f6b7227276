"""What the test servers do the same way: a started server (the service, PostgreSQL, Label Studio) is
stopped if it never gets ready, and one service and one PostgreSQL serve a whole pytest session."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Protocol, TypeVar

import pytest


class Server(Protocol):
    process: subprocess.Popen[bytes]

    def stop(self) -> None: ...


S = TypeVar("S", bound=Server)

_shared: dict[str, Server] = {}


def ready_or_stopped(server: S, wait: Callable[[], None]) -> S:
    """``server`` once ``wait`` returns; stopped (its process and files gone) if ``wait`` raises."""
    try:
        wait()
    except BaseException:
        server.stop()
        raise
    return server


def shared(config: pytest.Config, kind: str, start: Callable[[], S]) -> S:
    """The session's one server of ``kind``: started on first use (again if it died), stopped when the
    session ends."""
    server = _shared.get(kind)
    if server is None or server.process.poll() is not None:
        server = _shared[kind] = start()
        config.add_cleanup(lambda: _stop(kind))
    return server  # type: ignore[return-value]


def _stop(kind: str) -> None:
    server = _shared.pop(kind, None)
    if server is not None:
        server.stop()
