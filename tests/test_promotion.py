"""Promotion and rollback with ``han-model``, followed by two running servers that share one model
store, under a steady stream of requests: no request fails, every answer names its version, the
switch is served within 5 s, a version that cannot load never replaces the serving one, and a new fit
is served only once promoted (a name's first version is production from its registration)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from han import SavedModel
from service.process import free_port, start_server, stop_process_group, wait_ready
from tests.service_server import REPO, base_env, register_model
from tests.tiny_model import FIXTURES, train_tiny_model, worse_model

pytestmark = pytest.mark.slow
NAME = "han-promo"
DATA = FIXTURES / "reviews.jsonl"


def han_model(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "registry.cli", *args], cwd=REPO, env=base_env(home),
                          capture_output=True, text=True, timeout=300)


def model_of(url: str) -> str:
    with urllib.request.urlopen(url + "/model", timeout=30) as response:
        return json.loads(response.read())["tag"]


def documents_counted(url: str) -> int:
    """``han_documents_total`` summed over versions, from the server's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    return round(sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("han_documents_total{")))


class Traffic:
    """Requests with explanations from four threads, one after another, to each server in turn, until
    stopped: (the time each was answered, the server, the version it names)."""

    def __init__(self, urls: list[str], clients: int = 4) -> None:
        self.urls, self.answers, self.errors = urls, [], []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self, timeout: float) -> None:
        for thread in self.threads:
            thread.join(timeout)

    def client(self, i: int) -> None:
        body = json.dumps({"documents": ["A fine film. The plot was dull."], "explain": True}).encode()
        while not self.stop.is_set():
            url = self.urls[i % len(self.urls)]
            i += 1
            request = urllib.request.Request(url + "/classify", data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    self.answers.append((time.time(), url, json.loads(response.read())["model"]))
            except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
                self.errors.append(repr(e))

    def switched(self, tag: str, since: float, until: float = float("inf")) -> float:
        """Seconds from ``since`` until every server answered with ``tag`` only (up to ``until``)."""
        window = [(at, url, model) for at, url, model in self.answers if since <= at < until]
        last_other = max((at for at, _, model in window if model != tag), default=since)
        assert all(any(u == url and at > last_other for at, u, _ in window) for url in self.urls), (tag, window[-8:])
        return last_other - since


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory):
    """A model store with three versions of one model, version A (the first registered) in production,
    and two servers (one worker each) that follow it."""
    import torch

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("promotion")
    home = tmp / "bentoml"
    tags = {}
    for key, seed in (("A", 0), ("B", 1)):
        tags[key] = register_model(train_tiny_model(seed=seed)[0].save(tmp / key), home, NAME)
    tags["worse"] = register_model(worse_model(SavedModel.load(tmp / "A")).save(tmp / "worse"), home, NAME)
    status = han_model(home, "status", NAME)  # registered first, so in production without a promotion
    assert f"production is {tags['A']}" in status.stdout, status.stdout + status.stderr

    servers, logs = [], []
    for _ in range(2):
        port, log = free_port(), tmp / f"server-{len(logs)}.log"
        env = base_env(home) | {"HAN_WORKERS": "1"}
        with log.open("wb") as out:
            servers.append((start_server(NAME, port, env=env, log=out), f"http://127.0.0.1:{port}"))
        logs.append(log)
    try:
        for process, url in servers:
            assert wait_ready(url, process, timeout=180), logs[0].read_text()[-3000:]
        yield {"home": home, "tags": tags, "urls": [url for _, url in servers], "logs": logs, "tmp": tmp}
    finally:
        for process, _ in servers:
            stop_process_group(process)


def moved_at(home: Path, tag: str) -> float:
    """When the pointer last moved to ``tag`` (its history, wall-clock seconds)."""
    from datetime import datetime

    history = json.loads((home / "deployments" / NAME / "production.json").read_text())["history"]
    return datetime.fromisoformat(next(e for e in reversed(history) if e["tag"] == tag)["at"]).timestamp()


def wait_for(urls: list[str], tag: str, within: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if all(model_of(url) == tag for url in urls):
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"not every server serves {tag} after {within} s: {[model_of(u) for u in urls]}")


def test_a_worse_retrain_is_not_served_until_promoted_and_is_refused(deployment: dict) -> None:
    """The user's story: a retrain registered while A serves is not served, nor after a restart; its
    promotion is compared with A and refused as worse; forced, then rolled back, A serves again."""
    home, tags, urls, tmp = deployment["home"], deployment["tags"], deployment["urls"], deployment["tmp"]
    retrain = register_model(worse_model(SavedModel.load(tmp / "A")).save(tmp / "retrain"), home, NAME)
    time.sleep(2)  # four looks at the pointer
    assert [model_of(url) for url in urls] == [tags["A"], tags["A"]]
    assert f"production is {tags['A']}" in han_model(home, "status", NAME).stdout
    restart = subprocess.run([sys.executable, "-c", "from service.service import served_model; print(*served_model())"],
                             cwd=REPO, env=base_env(home) | {"HAN_MODEL_TAG": NAME}, capture_output=True, text=True,
                             timeout=300)  # what a restarted server would serve
    assert restart.stdout.strip().splitlines()[-1] == f"{tags['A']} {NAME}", restart.stderr[-2000:]
    refused = han_model(home, "promote", retrain, "--data", str(DATA))
    assert refused.returncode == 1 and f"worse than {tags['A']}" in refused.stderr, refused.stderr
    assert [model_of(url) for url in urls] == [tags["A"], tags["A"]]
    forced = han_model(home, "promote", retrain, "--force")
    assert forced.returncode == 0 and f"(was {tags['A']})" in forced.stdout, forced.stderr
    wait_for(urls, retrain, 5)
    rolled = han_model(home, "rollback", NAME)
    assert rolled.returncode == 0 and f"rolled back to {tags['A']}" in rolled.stdout, rolled.stderr
    wait_for(urls, tags["A"], 5)


def test_both_servers_follow_a_promotion_and_a_rollback_under_load(deployment: dict) -> None:
    home, tags, urls = deployment["home"], deployment["tags"], deployment["urls"]
    assert [model_of(url) for url in urls] == [tags["A"], tags["A"]]
    refused = han_model(home, "promote", tags["B"])  # not compared with the version in production
    assert refused.returncode == 1 and "has not been compared with" in refused.stderr
    traffic = Traffic(urls)
    traffic.start()
    try:
        time.sleep(1)
        promoted = han_model(home, "promote", tags["B"], "--data", str(DATA))  # compares, then promotes
        assert promoted.returncode == 0, promoted.stderr
        assert "2 service worker(s) serve it" in promoted.stdout and "accuracy" in promoted.stdout
        # 32 fixture reviews: promoted, with a warning that so few cannot tell a worse model from an equal one
        assert (f"warning: the comparison with {tags['A']} rests on 32 document(s)" in promoted.stderr
                and "too few to tell a worse model" in promoted.stderr), promoted.stderr
        time.sleep(2)
        rolled = han_model(home, "rollback", NAME)
        assert rolled.returncode == 0, rolled.stderr
        assert f"rolled back to {tags['A']}" in rolled.stdout
        time.sleep(2)
    finally:
        traffic.stop.set()
        traffic.join(60)
    assert traffic.errors == []
    # From the pointer's move until every answer, from both servers, names the new version: under 5 s.
    assert traffic.switched(tags["B"], moved_at(home, tags["B"]), until=moved_at(home, tags["A"])) < 5
    assert traffic.switched(tags["A"], moved_at(home, tags["A"])) < 5
    versions = [model for _, _, model in traffic.answers]
    assert set(versions) == {tags["A"], tags["B"]} and len(versions) > 20
    with urllib.request.urlopen(urls[0] + "/metrics", timeout=30) as response:
        metrics = response.read().decode()
    for tag in (tags["A"], tags["B"]):
        assert f'han_documents_total{{model="{tag}"}}' in metrics
    # Each server's /metrics counts its own answers, not the other's (BentoML's folder is the home's),
    # and a third server started on the same home wipes neither count.
    answered = {url: sum(u == url for _, u, _ in traffic.answers) for url in urls}
    assert [documents_counted(url) for url in urls] == [answered[url] for url in urls]
    port, log = free_port(), deployment["tmp"] / "server-third.log"
    with log.open("wb") as out:
        third = start_server(NAME, port, env=base_env(home) | {"HAN_WORKERS": "1"}, log=out)
    try:
        assert wait_ready(f"http://127.0.0.1:{port}", third, timeout=180), log.read_text()[-3000:]
        assert [documents_counted(url) for url in urls] == [answered[url] for url in urls]
        assert documents_counted(f"http://127.0.0.1:{port}") == 0
    finally:
        stop_process_group(third)
    status = han_model(home, "status", NAME)
    assert f"production is {tags['A']}" in status.stdout and status.stdout.count("service ") == 2
    for log in deployment["logs"]:
        assert "Traceback" not in log.read_text()


def test_a_worse_challenger_is_refused_unless_forced(deployment: dict) -> None:
    home, tags, urls = deployment["home"], deployment["tags"], deployment["urls"]
    compared = han_model(home, "compare", tags["worse"], f"{NAME}:production", "--data", str(DATA))
    assert compared.returncode == 0, compared.stderr
    refused = han_model(home, "promote", tags["worse"])
    assert refused.returncode == 1 and refused.stderr.startswith("error: refused:")
    assert "worse than" in refused.stderr and "Traceback" not in refused.stderr
    assert [model_of(url) for url in urls] == [tags["A"], tags["A"]]
    # a smaller comparison afterwards ("no clear difference" on 3 documents), made by promote itself, is
    # printed but not stored, and does not lift the refusal (it promoted, before)
    small = han_model(home, "promote", tags["worse"], "--data", str(DATA), "--limit", "3")
    assert small.returncode == 1 and small.stderr.startswith("error: refused:"), small.stdout + small.stderr
    assert "the gate keeps the refusal on" in small.stdout and [model_of(url) for url in urls] == [tags["A"]] * 2
    again = han_model(home, "promote", tags["worse"])  # the stored refusal is still the larger one
    assert again.returncode == 1 and again.stderr.startswith("error: refused:"), again.stdout + again.stderr
    forced = han_model(home, "promote", tags["worse"], "--force")
    assert forced.returncode == 0, forced.stderr
    wait_for(urls, tags["worse"], 5)
    assert han_model(home, "rollback", NAME).returncode == 0
    wait_for(urls, tags["A"], 5)
    history = json.loads((home / "deployments" / NAME / "production.json").read_text())["history"]
    forced_entry = next(entry for entry in history if entry["tag"] == tags["worse"])
    assert forced_entry["forced"] and forced_entry["comparison"]["verdict"] == "worse"
    lines = (home / "deployments" / NAME / "decisions.jsonl").read_text().splitlines()
    decisions = [json.loads(line) for line in lines]
    assert [d["decision"] for d in decisions if d["tag"] == tags["worse"]] == ["refused"] * 3 + ["promoted"]


def test_the_api_document_lists_the_labels_of_the_version_served(deployment: dict) -> None:
    home, tags, urls, tmp = deployment["home"], deployment["tags"], deployment["urls"], deployment["tmp"]
    relabelled = SavedModel.load(tmp / "A")
    relabelled.labels = ["bad", "good"]
    tag = register_model(relabelled.save(tmp / "relabelled"), home, NAME)

    def documented(url: str) -> list[str]:
        with urllib.request.urlopen(url + "/docs.json", timeout=30) as response:
            item = json.loads(response.read())["components"]["schemas"]["FeedbackItem"]
        return item["properties"]["label"]["enum"]

    assert documented(urls[0]) == ["neg", "pos"]
    assert han_model(home, "promote", tag, "--force").returncode == 0
    wait_for(urls, tag, 5)
    assert [documented(url) for url in urls] == [["bad", "good"], ["bad", "good"]]
    assert han_model(home, "rollback", NAME).returncode == 0
    wait_for(urls, tags["A"], 5)
    assert documented(urls[0]) == ["neg", "pos"]


def test_a_version_that_cannot_load_leaves_the_serving_one(deployment: dict, monkeypatch) -> None:
    home, tags, urls, tmp = deployment["home"], deployment["tags"], deployment["urls"], deployment["tmp"]
    broken = register_model(train_tiny_model(seed=2)[0].save(tmp / "broken"), home, NAME)
    weights = home / "models" / NAME / broken.split(":")[1] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a corrupt model directory
    refused = han_model(home, "promote", broken, "--force")
    assert refused.returncode == 1 and "does not load" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and f"production stays on {tags['A']}" in refused.stderr
    klingon = register_model(train_tiny_model(seed=4)[0].save(tmp / "klingon"), home, NAME)
    config = home / "models" / NAME / klingon.split(":")[1] / "config.json"
    settings = json.loads(config.read_text())
    settings["segmenter"]["language"] = "tlh"  # a language without a spaCy tokenizer
    config.write_text(json.dumps(settings))
    refused = han_model(home, "promote", klingon, "--force")
    assert refused.returncode == 1 and "does not load" in refused.stderr and "tlh" in refused.stderr, refused.stderr
    assert [model_of(url) for url in urls] == [tags["A"], tags["A"]]

    # The same version put in production behind han-model's back: the servers refuse it, say why, serve on.
    monkeypatch.setenv("BENTOML_HOME", str(home))
    from model_store.production import read_pointer, restore_pointer, set_pointer

    before = read_pointer(NAME)
    sizes = [log.stat().st_size for log in deployment["logs"]]
    set_pointer(broken, "promote")
    try:
        time.sleep(3)
        assert [model_of(url) for url in urls] == [tags["A"], tags["A"]]
        for log, size in zip(deployment["logs"], sizes, strict=True):
            assert f"cannot serve {broken}" in log.read_bytes()[size:].decode()
    finally:
        restore_pointer(before, NAME)


def test_bad_requests_get_one_line(deployment: dict, monkeypatch) -> None:
    home, tags = deployment["home"], deployment["tags"]
    unknown = han_model(home, "promote", f"{NAME}:nosuchversion")
    assert unknown.returncode == 1 and "no BentoML model named" in unknown.stderr
    monkeypatch.setenv("BENTOML_HOME", str(home))
    from model_store.production import locked

    with locked(NAME):  # another promotion under way
        busy = han_model(home, "promote", tags["B"], "--force")
    assert busy.returncode == 1 and "another promotion or rollback of han-promo is under way" in busy.stderr
    nothing = han_model(home, "status", "han-nosuch")  # a mistyped name is an error, not a status
    assert nothing.returncode == 1 and "han-nosuch: no version in the model store" in nothing.stderr
    for done in (unknown, busy, nothing):
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    pointer = (home / "deployments" / NAME / "production.json").read_text()
    for command in (["rollback", ""], ["status", ""], ["promote", ":v1"]):  # no name: refused, nothing moved
        empty = han_model(home, *command)
        assert empty.returncode == 2 and "names no model" in empty.stderr.strip().splitlines()[-1], empty.stderr
    assert (home / "deployments" / NAME / "production.json").read_text() == pointer


def test_with_nothing_serving_a_version_that_cannot_load_is_not_promoted(deployment: dict) -> None:
    """No service follows this name: han-model loads the version itself, before the pointer moves."""
    home, tmp = deployment["home"], deployment["tmp"]
    first = register_model(train_tiny_model(seed=5)[0].save(tmp / "lonely"), home, "han-lonely")
    tag = register_model(tmp / "lonely", home, "han-lonely")
    weights = home / "models" / "han-lonely" / tag.split(":")[1] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    refused = han_model(home, "promote", tag, "--force")
    assert refused.returncode == 1 and "does not load" in refused.stderr
    assert f"production stays on {first}" in refused.stderr
    assert json.loads((home / "deployments" / "han-lonely" / "production.json").read_text())["tag"] == first
    assert "Traceback" not in refused.stderr


def test_rollback_walks_the_history_back(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path))
    from model_store.production import PromotionError, rollback_target, set_pointer

    for version in ("v1", "v2", "v3", "v4"):  # in the store (rollback passes over deleted versions)
        (tmp_path / "models" / "han-x" / version).mkdir(parents=True)
    for version in ("v1", "v2", "v3"):
        set_pointer(f"han-x:{version}", "promote")
    for expected in ("v2", "v1"):
        target = rollback_target("han-x")
        assert target == f"han-x:{expected}"
        set_pointer(target, "rollback")
    with pytest.raises(PromotionError, match="no earlier production version"):
        rollback_target("han-x")
    set_pointer("han-x:v4", "promote")
    assert rollback_target("han-x") == "han-x:v1"


def test_a_store_from_before_the_pointer_serves_its_first_version(tmp_path: Path) -> None:
    """Versions registered before registration wrote the pointer: production is the first-registered one
    (not the latest), the first promotion is compared with it and records it, and rollback reaches it."""
    home, name = tmp_path / "bentoml", "han-old"
    first = register_model(train_tiny_model(seed=0)[0].save(tmp_path / "first"), home, name)
    later = register_model(worse_model(SavedModel.load(tmp_path / "first")).save(tmp_path / "later"), home, name)
    pointer = home / "deployments" / name / "production.json"
    assert json.loads(pointer.read_text())["tag"] == first
    pointer.unlink()  # as a store made by an earlier version of the project

    def history() -> list[tuple[str, str]]:
        return [(entry["action"], entry["tag"]) for entry in json.loads(pointer.read_text())["history"]]

    shown = han_model(home, "status", name).stdout
    assert f"production is {first}" in shown
    # the upgrade changed what such a store serves (the latest, before): said, with the way back to it
    assert f"Releases before the pointer served the latest, {later}" in shown, shown
    refused = han_model(home, "promote", later, "--data", str(DATA))
    assert refused.returncode == 1 and f"worse than {first}" in refused.stderr, refused.stderr
    assert history() == [("adopt", first)]
    forced = han_model(home, "promote", later, "--force")
    assert forced.returncode == 0 and f"(was {first})" in forced.stdout, forced.stderr
    assert "no running service follows" in forced.stdout
    rolled = han_model(home, "rollback", name)
    assert rolled.returncode == 0 and f"rolled back to {first}" in rolled.stdout, rolled.stderr
    assert history() == [("adopt", first), ("promote", later), ("rollback", first)]

    pointer.unlink()  # and a new fit registered into such a store is not production either
    again = register_model(tmp_path / "later", home, name)
    assert history() == [("adopt", first)]
    # forced with no comparison at all: on the record as well
    assert han_model(home, "promote", again, "--force").returncode == 0
    decisions = (home / "deployments" / name / "decisions.jsonl").read_text().splitlines()
    assert json.loads(decisions[-1]) | {"at": None} == {"at": None, "tag": again, "production": first, "forced": True,
                                                       "comparison": None, "decision": "promoted"}
