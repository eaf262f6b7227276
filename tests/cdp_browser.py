"""A headless Chromium driven over the Chrome DevTools Protocol, for the web page's tests.

No browser driver or extra package: Chromium is started with ``--remote-debugging-port=0``,
its DevTools websocket is read from ``DevToolsActivePort`` and spoken to with aiohttp (a
BentoML dependency). Only the handful of commands the tests need are wrapped.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from service.run import stop_process_group

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
)


def find_chromium() -> str | None:
    """The Chromium executable: ``$CHROMIUM`` or the first of the usual names on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """One Chromium process and one page (tab), driven through CDP."""

    def __init__(self, executable: str, width: int = 1200, height: int = 900) -> None:
        self.executable = executable
        self.width, self.height = width, height
        self.profile = tempfile.mkdtemp(prefix="han-chromium-")
        self.process: subprocess.Popen[bytes] | None = None
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def __aenter__(self) -> Browser:
        log = open(Path(self.profile) / "chromium.log", "wb")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [
                self.executable,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
                f"--window-size={self.width},{self.height}",
                "about:blank",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        port = await self._devtools_port()
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        if self.process is not None:
            stop_process_group(self.process, timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    async def _devtools_port(self, timeout: float = 30) -> int:
        marker = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise CDPError(f"Chromium exited with {self.process.returncode}: {self.log_tail()}")
            if marker.is_file() and (lines := marker.read_text().splitlines()):
                return int(lines[0])
            await asyncio.sleep(0.05)
        raise CDPError(f"Chromium did not open its DevTools port in {timeout} s: {self.log_tail()}")

    def log_tail(self) -> str:
        path = Path(self.profile) / "chromium.log"
        return path.read_text(errors="replace")[-2000:] if path.is_file() else ""

    async def send(self, method: str, timeout: float = 30, **params: Any) -> dict[str, Any]:
        """Send one CDP command and return its result (events that arrive meanwhile are kept)."""
        assert self.ws is not None
        message_id = next(self.ids)
        await self.ws.send_str(json.dumps({"id": message_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = await self.ws.receive(timeout=max(0.01, deadline - time.monotonic()))
            if message.type != aiohttp.WSMsgType.TEXT:
                raise CDPError(f"DevTools connection closed during {method}: {message.type}")
            data = json.loads(message.data)
            if data.get("id") == message_id:
                if "error" in data:
                    raise CDPError(f"{method}: {data['error']}")
                return data.get("result", {})
            self.events.append(data)

    async def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        assert self.ws is not None
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            message = await self.ws.receive(timeout=max(0.01, deadline - time.monotonic()))
            if message.type != aiohttp.WSMsgType.TEXT:
                raise CDPError(f"DevTools connection closed while waiting for {method}")
            self.events.append(json.loads(message.data))

    async def goto(self, url: str) -> None:
        self.events.clear()
        result = await self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise CDPError(f"navigating to {url}: {result['errorText']}")
        await self.wait_event("Page.loadEventFired")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise CDPError(f"JavaScript error: {details.get('exception', {}).get('description') or details}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """Poll a JavaScript expression until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := await self.evaluate(expression):
                return value
            await asyncio.sleep(0.05)
        raise CDPError(f"timed out after {timeout} s waiting for: {expression}")

    async def type_into(self, selector: str, text: str) -> None:
        """Focus an element and type ``text`` as keyboard input (``Input.insertText``)."""
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.send("Input.insertText", text=text)

    async def click(self, selector: str) -> None:
        """A real mouse click (press and release) in the middle of the element."""
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    async def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """Save a PNG of the page (the whole page, not just the viewport, by default)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = await self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
            params["captureBeyondViewport"] = True
        result = await self.send("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(result["data"]))
        return path
