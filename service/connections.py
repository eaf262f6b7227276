"""Keep-alive connections spread over the worker processes: each one ends after some requests.

BentoML's workers share one listening socket, and the worker that wakes first accepts every
connection waiting (asyncio accepts in a loop; BentoML issue 5426), so a client pool that connects
at once can land whole on one worker while the other idles, for as long as the pool keeps its
connections (measured: splits from 16/16 to 32/0 of 32 connections, docs/experiments.md). A
connection ends with ``Connection: close`` after a number of requests drawn for it, on average
``REQUESTS_PER_CONNECTION``; the client reconnects, and the worker that is free first accepts.
The number is drawn per connection, so that a pool opened at once does not reconnect at once (then
one worker would take them all again). nginx, too, ends a keep-alive connection after a number of
requests (``keepalive_requests``).
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping

from service.guard import Message, Receive, Scope, Send
from service.settings import whole_number

REQUESTS_PER_CONNECTION_ENV = "HAN_REQUESTS_PER_CONNECTION"
REQUESTS_PER_CONNECTION = 32  # on average, unless the environment says otherwise (0: never end one)
TRACKED = 4096  # connections remembered per worker (the least recently active forgotten first)


def requests_per_connection(environ: Mapping[str, str] = os.environ) -> int:
    """``$HAN_REQUESTS_PER_CONNECTION`` (a whole number, 0 to turn the ending off), else the default."""
    return whole_number(environ, REQUESTS_PER_CONNECTION_ENV, REQUESTS_PER_CONNECTION, "requests",
                        "0: never end a connection")


class SpreadConnections:
    """ASGI middleware: ``Connection: close`` on a connection's last response, after 1 to
    2 x ``requests`` - 1 requests (uniformly drawn when the connection is first seen)."""

    def __init__(self, app: object, requests: int = REQUESTS_PER_CONNECTION, rng: random.Random | None = None) -> None:
        self.app = app
        self.requests = requests
        self.rng = rng or random.Random()
        self._left: dict[tuple[str, int], int] = {}  # (client host, port) -> requests left; least recent first

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] != "http" or not client or self.requests <= 0:
            return await self.app(scope, receive, send)  # type: ignore[operator]
        key = (client[0], client[1])
        left = self._left.pop(key, None)
        if left is None:
            left = self.rng.randint(1, 2 * self.requests - 1)
        if left > 1:
            self._left[key] = left - 1  # re-inserted, so the most recent comes last
            if len(self._left) > TRACKED:
                del self._left[next(iter(self._left))]
            return await self.app(scope, receive, send)  # type: ignore[operator]

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)  # type: ignore[operator]
