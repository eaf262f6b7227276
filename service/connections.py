"""Keep-alive connections spread over the worker processes: each one ends after some requests.

BentoML's workers share one listening socket and the worker that wakes first accepts every waiting
connection (BentoML issue 5426), so a client pool that connects at once can land whole on one worker
for as long as it keeps its connections. A connection therefore ends (``Connection: close``) after a
number of requests drawn for it, so that its client reconnects to whichever worker is free, and a pool
opened at once does not reconnect at once. nginx's ``keepalive_requests`` does the same.
"""

from __future__ import annotations

import random

from service.guard import Message, Receive, Scope, Send
from service.settings import Settings

TRACKED = 4096  # connections remembered per worker (the least recently active forgotten first)


class SpreadConnections:
    """ASGI middleware: ``Connection: close`` on a connection's last response, after 1 to
    2 x ``requests`` - 1 requests (uniformly drawn when the connection is first seen)."""

    def __init__(self, app: object, requests: int = Settings.requests_per_connection,
                 rng: random.Random | None = None) -> None:
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
