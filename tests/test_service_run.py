"""``python -m service.run`` (``make run``) when the model is already in the store, and when it is not."""

from __future__ import annotations

import contextlib
import json
import os
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
        process.send_signal(signal.SIGTERM)  # `kill PID` of the wrapper alone, as a service manager may
        process.wait(timeout=60)
        deadline = time.monotonic() + 30  # its server got the signal too: the port closes
        while port_answers(port):
            assert time.monotonic() < deadline, "the server outlived `python -m service.run`"
            time.sleep(0.5)
    finally:
        stop_process_group(process, timeout=30, sig=signal.SIGINT)
        with contextlib.suppress(ProcessLookupError):  # a server that outlived its wrapper: its group still
            os.killpg(process.pid, signal.SIGKILL)


def port_answers(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_run_refuses_a_missing_model_it_cannot_train(tmp_path):
    (tmp_path / "empty-store").mkdir()
    env = base_env(tmp_path / "empty-store")
    env["HAN_MODEL_TAG"] = "no-such-model:latest"
    done = subprocess.run(
        [sys.executable, "-m", "service.run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert done.stderr.strip() == ("error: no BentoML model named 'no-such-model:latest' (train one with "
                                   "`han-train fit`, or see `bentoml models list`)")


def run_fails(env: dict[str, str], *args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "service.run", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert "Traceback" not in done.stderr and "training" not in done.stdout.lower(), done.stdout + done.stderr
    return done.returncode, done.stderr.strip()


def test_run_trains_only_a_store_without_the_default_model_and_names_what_is_missing(request, tmp_path):
    """The first `make run` trains han-imdb; once the store holds han-imdb, a missing version, or a production
    pointer naming a deleted version, is one line and no training; so are a model directory (the service
    serves by tag), a port out of range and a port something already listens on."""
    import socket

    from tests.service_server import register_model

    home = tmp_path / "store"
    model_dir = tiny_model_dir_quickly(request)
    tag = register_model(model_dir, home, name="han-imdb")  # the default name: production points at it
    env = base_env(home)
    env.pop("HAN_MODEL_TAG", None)
    code, err = run_fails({**env, "HAN_MODEL_TAG": "han-imdb:nope"})
    assert code == 1 and err.startswith("error: no BentoML model named 'han-imdb:nope'"), err
    code, err = run_fails(env, "--tag", str(model_dir))
    assert code == 1 and err.startswith(f"error: {model_dir} is a model directory;"), err
    code, err = run_fails(env, "--port", "99999")
    assert code == 2 and "a port is a number from 1 to 65535, not '99999'" in err, err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = run_fails(env, "--port", str(port))
    assert code == 1 and err.startswith(f"error: port {port} on 127.0.0.1 is in use"), err
    deleted = subprocess.run([sys.executable, "-m", "bentoml", "models", "delete", tag, "-y"], env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert deleted.returncode == 0, deleted.stderr
    code, err = run_fails(env)  # han-imdb:production, its version gone
    assert code == 1 and err == (f"error: han-imdb's production pointer names {tag}, which is not in the model "
                                 "store: promote a stored version (`han-model status han-imdb`, "
                                 "`han-model promote han-imdb:VERSION`)"), err


def test_ctrl_c_while_the_first_run_trains_is_one_line(tmp_path):
    """The first `make run` on an empty store starts training; Ctrl+C there (SIGINT to the terminal's
    process group) ends it with han-train's one line and status 130, no traceback from service.run."""
    (tmp_path / "empty-store").mkdir()
    env = base_env(tmp_path / "empty-store")
    env.pop("HAN_MODEL_TAG", None)
    process = subprocess.Popen([sys.executable, "-m", "service.run", "--port", str(free_port())], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = process.stdout.readline()  # "No han-imdb:production model in the model store yet: training ..."
        assert "training the quick IMDB model first" in line, line
        time.sleep(2)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1:] == ["han-train: interrupted"], (out[-2000:], err[-3000:])


def test_a_bentoml_home_that_does_not_exist_is_refused_before_any_training(tmp_path):
    """A mistyped BENTOML_HOME read as an empty store: `make run` started a minutes-long first fit into it."""
    env = base_env(tmp_path / "no-such-store")
    env.pop("HAN_MODEL_TAG", None)
    done = subprocess.run([sys.executable, "-m", "service.run", "--port", str(free_port())], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: BENTOML_HOME={tmp_path / 'no-such-store'}: no such folder; create it, or unset BENTOML_HOME to use "
        "the default store (~/bentoml)"), done.stderr
    assert not (tmp_path / "no-such-store").exists()
