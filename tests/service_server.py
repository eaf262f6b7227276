"""A real ``bentoml serve`` of the service, on a free loopback port, for the service's tests.

The model store is a temporary ``BENTOML_HOME`` into which the tiny test model is registered
(in a subprocess, so this process's BentoML configuration is left alone). One server is
shared by every test module of a pytest session (``shared_server``) and stopped at its end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from han.environment import apply_defaults
from service.process import free_port, start_server, stop_process_group, wait_ready
from tests.server_lifetime import ready_or_stopped, shared

REPO = Path(__file__).resolve().parent.parent
TEST_MODEL_NAME = "han-test"

_REGISTER = """
import sys
import han
from model_store import register
print(register(han.SavedModel.load(sys.argv[1]), sys.argv[2]))
"""


def base_env(bentoml_home: Path) -> dict[str, str]:
    env = apply_defaults(dict(os.environ))
    env.update(BENTOML_HOME=str(bentoml_home), PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def register_model(model_dir: Path, bentoml_home: Path, name: str = TEST_MODEL_NAME) -> str:
    """Register a model directory in the store at ``bentoml_home``; returns its tag."""
    done = subprocess.run(
        [sys.executable, "-c", _REGISTER, str(model_dir), name],
        env=base_env(bentoml_home),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"registering the test model failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


@dataclass
class ServiceServer:
    """A running ``bentoml serve service.service:HANClassifier``."""

    url: str
    process: subprocess.Popen[bytes]
    home: Path
    log_path: Path
    model_tag: str
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, model_dir: Path, timeout: float = 120, env: dict[str, str] | None = None) -> ServiceServer:
        home = Path(tempfile.mkdtemp(prefix="han-service-test-"))
        tag = register_model(model_dir, home / "bentoml")
        port = free_port()
        log_path = home / "server.log"
        server_env = base_env(home / "bentoml")
        server_env.update(env or {})
        with open(log_path, "wb") as log:
            process = start_server(f"{TEST_MODEL_NAME}:latest", port, env=server_env, log=log)
        server = cls(f"http://127.0.0.1:{port}", process, home, log_path, tag)
        return ready_or_stopped(server, lambda: server.wait_ready(timeout))

    def wait_ready(self, timeout: float) -> None:
        if wait_ready(self.url, self.process, timeout):
            return
        if self.process.poll() is not None:
            raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log()[-4000:]}")
        raise TimeoutError(f"the server was not ready after {timeout} s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        stop_process_group(self.process, timeout=20)
        shutil.rmtree(self.home, ignore_errors=True)

    # -- small HTTP client (standard library only) ---------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> tuple[int, dict[str, str], bytes]:
        """Send one request; returns (status, headers, body) for any status."""
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def post_json(self, path: str, payload: Any, timeout: float = 60) -> tuple[int, Any]:
        status, _, body = self.request(
            "POST", path, json.dumps(payload).encode(), {"Content-Type": "application/json"}, timeout
        )
        return status, json.loads(body)

    def get_json(self, path: str) -> tuple[int, Any]:
        status, _, body = self.request("GET", path)
        return status, json.loads(body)


def tiny_model_dir_quickly(request: pytest.FixtureRequest) -> Path:
    """conftest's ``tiny_model_dir``, trained with one torch thread.

    With torch's default of one thread per core, the 60 training steps take 2 s on an idle
    2-core machine but minutes when other processes keep the cores busy (its threads spin
    waiting for each other); one thread takes about 2 s either way.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return request.getfixturevalue("tiny_model_dir")
    finally:
        torch.set_num_threads(threads)


def shared_server(config: pytest.Config, model_dir: Path) -> ServiceServer:
    """The session's one server (started on first use, stopped when the session ends)."""
    return shared(config, "service", lambda: ServiceServer.start(model_dir))
