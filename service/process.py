"""One way to start, wait for and stop a ``bentoml serve`` of the service: ``make run``, the tests and
the serving benchmark all use it (none of them imports the service itself)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from han.environment import apply_defaults
from model_store.production import MODEL_TAG_ENV
from service.settings import KEYS_FILE_ENV

REPO = Path(__file__).resolve().parent.parent
SERVICE = "service.service:HANClassifier"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    tag: str,
    port: int,
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
    log: IO[bytes] | None = None,
    service: str = SERVICE,
    own_session: bool = True,
    repo: Path = REPO,
    args: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """``bentoml serve`` of ``service`` for model ``tag``, from the checkout ``repo`` (another one to
    compare versions). With ``own_session`` it gets a process group of its own, so that
    ``stop_process_group`` ends its workers too."""
    server_env = apply_defaults({**os.environ, **(env or {})})
    server_env[MODEL_TAG_ENV] = tag
    if keys := server_env.get(KEYS_FILE_ENV, "").strip():  # relative to the caller, not to ``repo``
        server_env[KEYS_FILE_ENV] = str(Path(keys).resolve())
    server_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), server_env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "bentoml", "serve", service, "--host", host, "--port", str(port), *args]
    return subprocess.Popen(
        command, cwd=repo, env=server_env, stdout=log, stderr=subprocess.STDOUT if log else None,
        start_new_session=own_session,
    )


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 300,
               context: ssl.SSLContext | None = None) -> bool:
    """Poll ``url``/readyz until it answers 200 (True), the process exits or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2, context=context) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    return False


def stop_process_group(process: subprocess.Popen, timeout: float = 20, sig: int = signal.SIGTERM) -> None:
    """Signal a process started with its own session and its children; SIGKILL them all if it has not
    exited after ``timeout`` seconds."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
