"""Starlette's own refusals in the API's shape: an unknown path (404) and a method a route does not take
(405) come from the router as plain text; every other refusal is ``{"error": "..."}``, and so are these."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class JsonRefusals:
    """ASGI middleware: a plain-text 404 or 405 becomes ``{"error": ...}`` naming the path (and the methods
    it takes); any other response passes through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "HEAD":
            await self.app(scope, receive, send)
            return
        held: Message | None = None

        async def reply(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] in (404, 405):
                headers = {k.lower(): v for k, v in message.get("headers", [])}
                if headers.get(b"content-type", b"").startswith(b"text/plain"):
                    held = message
                    return
            if held is None:
                await send(message)
                return
            if message.get("more_body", False):
                return  # the router's one-line body: its own text is replaced below
            start, held = held, None
            headers = {k.lower(): v for k, v in start.get("headers", [])}
            path, method = scope["path"], scope["method"]
            if start["status"] == 405:
                allowed = headers.get(b"allow", b"").decode("latin-1")
                error = f"{method} is not allowed on {path}" + (f" (it takes {allowed})" if allowed else "")
            else:
                error = f"no such path: {path} (the API is described at /docs)"
            body = json.dumps({"error": error}).encode()
            dropped = (b"content-type", b"content-length")
            kept = [(k, v) for k, v in start.get("headers", []) if k.lower() not in dropped]
            await send({**start, "headers": [*kept, (b"content-type", b"application/json"),
                                             (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reply)
