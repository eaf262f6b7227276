"""The response deadline: a request whose response has not started within the service's
``traffic.timeout`` gets a 504, as with BentoML's own ``TimeoutMiddleware``, which this replaces.

BentoML 1.4's middleware schedules each request's timer with ``loop.call_later`` and never cancels
it: every request leaves a timer, a future, a context and a bound method in the event loop for the
whole timeout (120 s here) after its response. At 50 clients a worker held about 100,000 such
objects after a soak, and they pinned Python's memory arenas among the requests' garbage
(docs/experiments.md, 2026-11-26). Here the deadline is an ``asyncio.timeout`` that the first
message of the response cancels, and the request runs in its own task rather than a new one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from bentoml._internal.server.http import traffic

from service.guard import Message, Receive, Scope, Send, error_response

App = Callable[[Scope, Receive, Send], Awaitable[None]]


class ResponseDeadline:
    """ASGI middleware: 504 when the response has not started within ``timeout`` seconds."""

    def __init__(self, app: App, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        deadline = asyncio.timeout(self.timeout)

        async def send_started(message: Message) -> None:
            if deadline.when() is not None:  # the response's first message: its timer is cancelled
                deadline.reschedule(None)
            await send(message)

        try:
            async with deadline:
                await self.app(scope, receive, send_started)
        except TimeoutError:
            if not deadline.expired():  # a TimeoutError of the app's own
                raise
            await error_response(504, f"Not able to process the request in {self.timeout:g} seconds")(
                scope, receive, send
            )


BentoTimeoutMiddleware = traffic.TimeoutMiddleware  # what use_response_deadline replaces


def use_response_deadline() -> None:
    """Make BentoML build its HTTP app with ResponseDeadline in place of its TimeoutMiddleware (it
    imports the class from ``traffic`` each time it lists the middlewares, when a worker starts)."""
    traffic.TimeoutMiddleware = ResponseDeadline  # type: ignore[misc,assignment]
