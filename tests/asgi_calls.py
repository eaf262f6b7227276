"""Calling ASGI middleware in-process, for the service's unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` in a thread of its own: pytest-playwright keeps an event loop running in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def call(middleware: Any, path: str = "/classify", client: tuple[str, int] | None = None) -> list[dict[str, Any]]:
    """One HTTP request through an ASGI app, from ``client`` (host, port) if given: the messages it sent."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "client": client}
    await middleware(scope, receive, send)
    return sent


def scripted_app(delay_before: float = 0.0, delay_after: float = 0.0, error: Exception | None = None) -> Any:
    """An ASGI app that answers 200 "ok", waiting before the response starts and before its body, or raises."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(delay_before)
        if error is not None:
            raise error
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(delay_after)
        await send({"type": "http.response.body", "body": b"ok"})

    return app
