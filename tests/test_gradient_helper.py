"""A serving worker never imports torch: attention runs in numpy, and the gradient-based explanations in a
helper process beside the worker, started on first use and stopped once idle (service/gradients.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from han.pipeline import Pipeline
from tests.service_server import ServiceServer, tiny_model_dir_quickly

TEXTS = ["A wonderful film. I loved every minute of it.", "Dull and far too long. I left early."]


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def processes(server: ServiceServer) -> dict[str, list[int]]:
    """The server's workers and gradient helpers, by pid."""
    kinds: dict[str, list[int]] = {"workers": [], "helpers": []}
    for pid in descendants(server.process.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"_bentoml_impl.worker" in command:
            kinds["workers"].append(pid)
        elif b"spawn_main" in command:
            kinds["helpers"].append(pid)
    return kinds


def has_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.timeout(300)
def test_workers_stay_torch_free_and_the_gradient_helper_answers_then_stops(request: pytest.FixtureRequest) -> None:
    model_dir = tiny_model_dir_quickly(request)
    expected = Pipeline.from_directory(model_dir)(TEXTS, explain="integrated_gradients")
    server = ServiceServer.start(model_dir, env={"HAN_WORKERS": "1", "HAN_GRADIENT_HELPER_IDLE_S": "2"})
    try:
        status, body = server.post_json("/classify", {"documents": TEXTS})  # attention
        assert status == 200 and body["results"][0]["method"] == "attention"
        assert processes(server)["helpers"] == []
        status, body = server.post_json("/classify", {"documents": TEXTS, "explain": "integrated_gradients"})
        assert status == 200, body
        for got, want in zip(body["results"], expected, strict=True):
            assert got["label"] == want.label and got["scores"] == pytest.approx(want.scores, abs=1e-6)
            assert [s["weight"] for s in got["sentences"]] == pytest.approx(
                [s.weight for s in want.sentences], abs=1e-5)
        running = processes(server)
        assert len(running["workers"]) == 1 and len(running["helpers"]) == 1
        assert not has_torch(running["workers"][0]) and has_torch(running["helpers"][0])
        deadline = time.monotonic() + 30
        while processes(server)["helpers"] and time.monotonic() < deadline:
            time.sleep(0.5)
        assert processes(server)["helpers"] == [], "the idle helper did not stop"
        status, body = server.post_json("/classify", {"documents": TEXTS[:1], "explain": "occlusion"})
        assert status == 200 and body["results"][0]["method"] == "occlusion"  # started again
        assert not has_torch(processes(server)["workers"][0])
        assert "Traceback" not in server.log()
    finally:
        server.stop()


def test_a_stopped_helper_is_waited_for_before_the_worker_exits(request: pytest.FixtureRequest) -> None:
    """The worker's shutdown hook waits for every helper told to stop (an idle one, one of a replaced
    version): a pool still stopping when the interpreter exits races Python 3.11's exit hook, which then
    prints an OSError traceback into the log."""
    from service.gradients import GradientProcess, wait_for_stopped_helpers

    helper = GradientProcess(tiny_model_dir_quickly(request))
    results = helper(TEXTS, "occlusion", "raise", [])
    assert [r.method for r in results] == ["occlusion", "occlusion"]
    manager = helper._pool._executor_manager_thread
    helper.stop()
    wait_for_stopped_helpers()
    assert manager is not None and not manager.is_alive()
