"""The response deadline: a request whose response has not started within the service's
``traffic.timeout`` gets a 504, as with BentoML's own ``TimeoutMiddleware``, which this replaces.

BentoML 1.4's middleware schedules each request's timer with ``loop.call_later`` and never cancels
it, so every request leaves a timer, a future and a context in the worker for the whole timeout;
under load they pinned the worker's memory. BentoML has no public hook for
its timeout, so this is the one module that reaches into ``bentoml._internal``: only on the release
it was written for, and tests/test_service_units.py fails once BentoML's own stops leaking.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import bentoml
from bentoml._internal.server.base_app import BaseAppFactory
from bentoml._internal.server.http import traffic

from service.guard import Message, Receive, Scope, Send, error_response

App = Callable[[Scope, Receive, Send], Awaitable[None]]
WRITTEN_FOR = "1.4."  # the BentoML releases whose TimeoutMiddleware this replaces


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


class _Probe(BaseAppFactory):
    name = "probe"


def use_response_deadline() -> bool:
    """Make BentoML build its HTTP apps with ResponseDeadline in place of its TimeoutMiddleware (it
    looks the class up in ``traffic`` whenever an app lists its middlewares); whether it did. Another
    BentoML release, or one that looks it up elsewhere, keeps its own, with a warning."""
    if bentoml.__version__.startswith(WRITTEN_FOR):
        traffic.TimeoutMiddleware = ResponseDeadline  # type: ignore[misc,assignment]
        if [m.cls for m in _Probe(timeout=1).middlewares] == [ResponseDeadline]:
            return True
        traffic.TimeoutMiddleware = BentoTimeoutMiddleware  # type: ignore[misc]
    logging.getLogger("han.service").warning(
        "BentoML %s keeps its own response timeout (service/deadline.py was written for %sx)",
        bentoml.__version__, WRITTEN_FOR)
    return False
