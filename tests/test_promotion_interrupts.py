"""``han-model promote`` and ``rollback`` interrupted (Ctrl-C, SIGTERM) while a real service follows the
pointer: the pointer goes back, one line says so, the exit status is 130 or 143, and ``decisions.jsonl``
never says "promoted" for a move that did not happen. And ``compare --json`` on a disk that refuses the
write leaves the file as it was, never empty or half."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from service.process import free_port, start_server, stop_process_group, wait_ready
from tests.service_server import REPO, base_env, register_model
from tests.tiny_model import FIXTURES, train_tiny_model, worse_model

pytestmark = pytest.mark.slow
NAME = "han-stop"


def han_model(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "registry.cli", *args], cwd=REPO, env=base_env(home),
                          capture_output=True, text=True, timeout=300)


def interrupted(home: Path, signum: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``han-model ARGS``, sent ``signum`` as soon as it has moved the pointer: before the service, which
    looks twice a second and then loads the version for about a second, can follow or refuse it."""
    pointer = home / "deployments" / NAME / "production.json"
    stamp = pointer.stat().st_mtime_ns
    process = subprocess.Popen([sys.executable, "-m", "registry.cli", *args], cwd=REPO, env=base_env(home),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_signals_as_in_a_terminal)
    try:
        while process.poll() is None and pointer.stat().st_mtime_ns == stamp:
            time.sleep(0.002)
        assert process.poll() is None, process.communicate()  # it moved the pointer and still waits
        os.kill(process.pid, signum)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _signals_as_in_a_terminal() -> None:
    """A command typed in a shell gets SIGINT; one started by a process that ignores it (a test runner's
    worker) inherits the ignoring, and han-model honours that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def production(home: Path) -> str:
    return json.loads((home / "deployments" / NAME / "production.json").read_text())["tag"]


def decisions(home: Path, tag: str) -> list[str]:
    path = home / "deployments" / NAME / "decisions.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [d["decision"] for d in map(json.loads, lines) if d["tag"] == tag]


def unloadable(tag: str, home: Path) -> str:
    """``tag``, made a version that cannot load: a language without a spaCy tokenizer."""
    config = home / "models" / NAME / tag.split(":")[1] / "config.json"
    settings = json.loads(config.read_text())
    settings["segmenter"]["language"] = "tlh"
    config.write_text(json.dumps(settings))
    return tag


def served(url: str) -> str:
    with urllib.request.urlopen(url + "/model", timeout=30) as response:
        return json.loads(response.read())["tag"]


def test_an_interrupted_promote_or_rollback_puts_the_pointer_back(tmp_path: Path) -> None:
    """One server follows the pointer. A promote of a version it cannot load, stopped by Ctrl-C just after
    the pointer moved, left production on that version (and a restarted service failing); now production
    stays where it was, and the record holds no "promoted" for it."""
    home = tmp_path / "bentoml"
    first = register_model(train_tiny_model(seed=0)[0].save(tmp_path / "first"), home, NAME)
    good = register_model(train_tiny_model(seed=1)[0].save(tmp_path / "good"), home, NAME)
    broken = unloadable(register_model(train_tiny_model(seed=2)[0].save(tmp_path / "broken"), home, NAME), home)
    port, log = free_port(), tmp_path / "server.log"
    with log.open("wb") as out:
        server = start_server(NAME, port, env=base_env(home) | {"HAN_WORKERS": "1"}, log=out)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(url, server, timeout=180), log.read_text()[-3000:]
        for signum, tag, status in ((signal.SIGINT, broken, 130), (signal.SIGTERM, good, 143)):
            stopped = interrupted(home, signum, "promote", tag, "--force")
            assert production(home) == first and f"production is {first}" in han_model(home, "status", NAME).stdout
            assert stopped.returncode == status, (stopped.returncode, stopped.stdout, stopped.stderr)
            assert stopped.stderr.count("\n") == 1 and "Traceback" not in stopped.stderr, stopped.stderr
            assert f"interrupted ({signum.name}): production stays on {first}" in stopped.stderr, stopped.stderr
            assert decisions(home, tag) == ["put back: interrupted"]
        time.sleep(1)  # the service looked at the pointer again
        assert served(url) == first

        # Not interrupted, the version that cannot load is put back by the service's report: on the record
        # as put back, not as promoted first.
        refused = han_model(home, "promote", broken, "--force")
        assert refused.returncode == 1 and "does not load in the service" in refused.stderr, refused.stderr
        assert decisions(home, broken) == ["put back: interrupted", f"put back: it does not load in {_one(home)}"]
        promoted = han_model(home, "promote", good, "--force")
        assert promoted.returncode == 0 and "1 service worker(s) serve it" in promoted.stdout, promoted.stderr
        assert decisions(home, good) == ["put back: interrupted", "promoted"]

        back = interrupted(home, signal.SIGINT, "rollback", NAME)  # rollback moves the pointer the same way
        assert back.returncode == 130 and f"production stays on {good}" in back.stderr, back.stderr
        assert production(home) == good and served(url) == good
    finally:
        stop_process_group(server)


def _one(home: Path) -> str:
    """The one service worker's report key."""
    (path,) = (home / "deployments" / NAME / "replicas").glob("*.json")
    return path.stem


def test_with_nothing_serving_a_version_that_does_not_load_is_not_recorded_as_promoted(tmp_path: Path) -> None:
    home = tmp_path / "bentoml"
    first = register_model(train_tiny_model(seed=0)[0].save(tmp_path / "first"), home, NAME)
    broken = unloadable(register_model(tmp_path / "first", home, NAME), home)
    refused = han_model(home, "promote", broken, "--force")
    assert refused.returncode == 1 and f"production stays on {first}" in refused.stderr, refused.stderr
    assert decisions(home, broken) == ["not moved: it does not load"]


def _file_size_limit(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_compare_json_that_cannot_be_written_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """A write that fails part way (a file size limit: the same failing ``write`` as a full disk, without
    root to mount a small tmpfs) gives one line and leaves the file as it was: before, it was emptied (or
    left empty when new)."""
    saved = train_tiny_model(seed=0)[0]
    new, old = saved.save(tmp_path / "new"), worse_model(saved).save(tmp_path / "old")
    target = tmp_path / "out" / "c.json"
    target.parent.mkdir()
    command = [sys.executable, "-m", "registry.cli", "compare", str(new), str(old), "--data",
               str(FIXTURES / "reviews.jsonl"), "--json", str(target)]
    target.write_text("{}\n")  # a comparison kept from before: left as it was, not emptied or cut
    done = subprocess.run(command, cwd=REPO, env=base_env(tmp_path / "bentoml"), capture_output=True, text=True,
                          timeout=300, preexec_fn=lambda: _file_size_limit(200))
    assert target.read_text() == "{}\n" and list(target.parent.iterdir()) == [target]
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and f"{target}: not written" in done.stderr, done.stderr
