"""``python -m service.run`` (``make run``) when the model is already in the store, and when it is not."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from service.process import stop_process_group
from tests.service_server import REPO, ServiceServer, base_env, free_port, shared_server, tiny_model_dir_quickly

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> ServiceServer:
    return shared_server(request.config, tiny_model_dir_quickly(request))


def test_run_serves_a_stored_model_without_training(server, tmp_path):
    """The second `make run`: the model is in the store, so it serves it at once and prints the URL."""
    port = free_port()
    env = base_env(server.home / "bentoml")  # the store the shared server's model is in
    env["HAN_MODEL_TAG"] = "han-test:latest"
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "service.run", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while f"Ready: http://localhost:{port}" not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/model", timeout=10) as response:
            assert json.loads(response.read())["tag"] == server.model_tag
        text = log.read_text(errors="replace")
        assert "training" not in text.lower()
    finally:
        stop_process_group(process, timeout=30, sig=signal.SIGINT)


def test_run_refuses_a_missing_model_it_cannot_train(tmp_path):
    env = base_env(tmp_path / "empty-store")
    env["HAN_MODEL_TAG"] = "no-such-model:latest"
    done = subprocess.run(
        [sys.executable, "-m", "service.run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "no model 'no-such-model:latest'" in done.stderr
