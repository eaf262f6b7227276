"""The README's commands that take under a minute, run as written in a fresh folder.

tests/test_readme.py checks every command statically; this runs the ones a user types first after
``make run``: the curl requests and the Python API against the default model (here the tiny test
model, registered as ``han-imdb`` in a temporary model store), the three han-score lines, the two
own-data fits, and serving with API keys. ``make run``/``make test`` (minutes) are left out, and so is
docs/serving.md's TLS example (tests/test_service_auth.py serves TLS). The only change made to a command is the port:
3000 becomes a free one.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.process import free_port, stop_process_group, wait_ready
from tests.service_server import base_env, register_model

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def blocks(language: str) -> list[tuple[int, str]]:
    """(first line, text) of each fenced block in the README."""
    return [(README.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(rf"^```{language}\n(.*?)^```", README, re.M | re.S)]


def commands() -> list[str]:
    """Every command line of the README's bash blocks, continuation lines joined, comments dropped."""
    out = []
    for _, text in blocks("bash"):
        joined = re.sub(r"\\\n\s*", " ", text)
        out += [line.strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]
    return out


def starting(prefix: str) -> list[str]:
    return [c for c in commands() if c.startswith(prefix)]


def classify_requests() -> list[str]:
    """The curl lines of "Classify" (the keys example's is run by test_serve_with_api_keys)."""
    return [c for c in starting("curl -s localhost:3000") if "Authorization" not in c and "/feedback" not in c]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A user's folder: .venv and data/ of this checkout, reviews to score, and a model store whose
    ``han-imdb`` is the tiny test model."""
    root = tmp_path_factory.mktemp("readme")
    (root / ".venv").symlink_to(REPO / ".venv")
    (root / "data").symlink_to(REPO / "data")
    env = base_env(root / "bentoml")
    env["PATH"] = f"{REPO / '.venv' / 'bin'}:{env['PATH']}"  # as with the environment activated
    register_model(tiny_model_dir, root / "bentoml", name="han-imdb")
    with open(REPO / "data" / "fixtures" / "reviews.csv", encoding="utf-8") as f:
        reviews = [row["body"] for row in csv.DictReader(f)]
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(reviews))), "text": reviews})
    pq.write_table(table, root / "reviews.parquet")
    table.to_pandas().to_csv(root / "reviews.csv", index=False)
    yield root, env


def run(command: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


class Served:
    """``python -m service.run`` as the README starts it, on a free port."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.log = open(cwd / f"server-{self.port}.log", "wb")  # noqa: SIM115  (closed in stop)
        self.process = subprocess.Popen(["bash", "-c", f"{command} --port {self.port}"], cwd=cwd, env=env,
                                        stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        if not wait_ready(f"http://127.0.0.1:{self.port}", self.process, timeout=120):
            self.stop()
            raise RuntimeError((cwd / f"server-{self.port}.log").read_text()[-3000:])

    def stop(self) -> None:
        stop_process_group(self.process)
        self.log.close()


def test_the_readme_has_the_commands_this_test_runs() -> None:
    assert len(classify_requests()) == 4
    assert len(starting(".venv/bin/han-score")) == 3
    # the third and fourth (the way back's, han-label's round) warm-start from production: tests/test_way_back.py
    # and tests/test_label_studio.py run their like
    assert len(starting(".venv/bin/han-train fit")) == 4
    assert len(starting(".venv/bin/han-label")) == 2
    assert len(blocks("python")) == 1


def test_classify_with_curl_and_python(folder: tuple[Path, dict[str, str]]) -> None:
    root, env = folder
    server = Served(".venv/bin/python -m service.run", root, env)
    try:
        out = [json.loads(run(c.replace("localhost:3000", f"localhost:{server.port}"), root, env))
               for c in classify_requests()]
        (feedback,) = starting("curl -s localhost:3000/feedback")  # the way back: review-1 was classified above
        assert json.loads(run(feedback.replace("localhost:3000", f"localhost:{server.port}"), root, env)) == {
            "stored": 1, "unknown": []}
    finally:
        server.stop()
    (monitor,) = starting(".venv/bin/han-model monitor")
    report = run(monitor.split("#")[0], root, env)
    assert "realised accuracy on 1 with feedback" in report, report
    plain, explained, signed, model = out
    assert [r["label"] for r in plain["results"]] and "sentences" not in plain["results"][0]
    assert [r["id"] for r in plain["results"]] == ["review-1", f"{plain['request_id']}-1"]
    assert explained["results"][0]["method"] == "attention" and explained["results"][0]["sentences"]
    assert signed["results"][0]["method"] == "integrated_gradients"
    assert model["tag"].startswith("han-imdb:") and model["labels"] == ["neg", "pos"]
    (_, code), = blocks("python")
    script = code + "\nprint(result.label, pipeline(['Dull.', ''], errors='return')[1].reason)\n"
    (root / "readme_api.py").write_text(script, encoding="utf-8")
    printed = run("python readme_api.py", root, env)
    assert printed.split()[0] in ("neg", "pos") and "empty" in printed


def test_score_a_file(folder: tuple[Path, dict[str, str]]) -> None:
    root, env = folder
    for command in starting(".venv/bin/han-score"):
        run(command, root, env)
    import pyarrow.parquet as pq

    assert pq.read_table(root / "scores.parquet").num_rows == 32
    lines = [json.loads(line) for line in (root / "scores.jsonl").read_text().splitlines()]
    assert [str(row["id"]) for row in lines] == [str(i) for i in range(32)]  # a CSV id is read as text
    explained = [json.loads(line) for line in (root / "explained.jsonl").read_text().splitlines()]
    assert all(len(row["top_words"]) <= 5 and row["top_sentences"] for row in explained)


def test_label_next(folder: tuple[Path, dict[str, str]]) -> None:
    """The round's han-label commands as written; Label Studio's part (tests/test_label_studio.py does it for
    real) is an export of the tasks with their pre-annotations accepted."""
    root, env = folder
    next_, import_ = starting(".venv/bin/han-label")
    run(next_, root, env)
    tasks = json.loads((root / "queue.json").read_text())
    assert len(tasks) == 20 and "<Choices" in (root / "queue.label-config.xml").read_text()
    export = [{"id": k, "data": t["data"], "annotations": [{"result": t["predictions"][0]["result"]}]}
              for k, t in enumerate(tasks)]
    (root / "export.json").write_text(json.dumps(export))
    run(import_, root, env)
    rows = [json.loads(line) for line in (root / "labelled.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [t["data"]["doc_id"] for t in tasks]
    assert [r["label"] for r in rows] == [t["predictions"][0]["result"][0]["value"]["choices"][0] for t in tasks]


@pytest.mark.parametrize("index", [0, 1])
def test_train_on_your_own_data(folder: tuple[Path, dict[str, str]], index: int) -> None:
    root, env = folder
    command = starting(".venv/bin/han-train fit")[index]
    run(command, root, env, timeout=300)
    name = "reviews" if index == 0 else "de_news"
    assert (root / "runs" / name / "model" / "config.json").is_file()
    listed = run("python -m bentoml models list", root, env)
    assert f"han-{name}:" in listed


def test_serve_with_api_keys(folder: tuple[Path, dict[str, str]]) -> None:
    root, env = folder
    make_key, serve, ask = _key_commands()
    run(make_key, root, env)
    server = Served(serve, root, env)
    try:
        answer = json.loads(run(ask.replace("localhost:3000", f"localhost:{server.port}"), root, env))
        refused = run(f"curl -s -o /dev/null -w '%{{http_code}}' localhost:{server.port}/model", root, env)
    finally:
        server.stop()
    assert answer["tag"].startswith("han-imdb:") and refused == "401"


def _key_commands() -> tuple[str, str, str]:
    """The README's keys example: make a key file, serve with it, ask with a key (the TLS lines apart)."""
    lines = [c for c in commands() if "keys.txt" in c and "ssl" not in c and "https" not in c]
    make_key = next(c for c in lines if c.startswith(".venv/bin/python -c"))
    serve = next(c for c in lines if "service.run" in c)
    ask = next(c for c in lines if c.startswith("curl"))
    return make_key, serve, ask

