"""The monitor, export-log and the shadow comparison on a long log: they stream it, holding a few numbers a
document (never the records), with the same figures as a report on the records themselves; export-log says
what the log's size cap took; ``GET /monitor`` says the window it read when it cuts one, and computes one
report at a time per worker; times and reasons in the monitor's lines are the right ones."""

from __future__ import annotations

import argparse
import json
import random
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from monitoring.feedback_store import Feedback, Prediction, open_store
from monitoring.log_files import read_log
from monitoring.report import report, series
from registry import loop_commands
from registry.cli import main

NAME = "han-scale"
LABELS = ["neg", "pos"]
TOPICS = ["arts", "science", "sport"]


def _records(n: int, seed: int = 0, start: datetime | None = None, text: int = 300) -> list[dict[str, Any]]:
    """A production stream with reused ids, a shadow of a tenth of it, a version that is multi-label."""
    rnd = random.Random(seed)
    when = start or datetime(2026, 11, 27, tzinfo=UTC)
    out = []
    for i in range(n):
        stamp = (when + timedelta(milliseconds=250 * i)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        doc, request = f"d{rnd.randrange(n)}" if i % 7 == 0 else f"d{i}", f"q{i // 4}"
        if i % 5 == 0:  # a multi-label version (its config gone: told from its answers)
            scores = {t: round(rnd.random(), 4) for t in TOPICS}
            chosen = [t for t, p in scores.items() if p >= 0.5]
            answer = {"model": f"{NAME}:multi", "label": max(scores, key=scores.__getitem__), "labels": chosen,
                      "scores": scores}
        else:
            top = round(rnd.uniform(0.5, 1.0), 4)
            label = rnd.choice(LABELS)
            answer = {"model": f"{NAME}:v1", "label": label, "labels": [label],
                      "scores": {label: top, ("neg" if label == "pos" else "pos"): round(1 - top, 4)}}
        base = {"time": stamp, "id": doc, "request_id": request, "role": "production",
                "text": f"review {i} " + "x" * text, "words": rnd.randint(5, 400), "oov": round(rnd.random() / 10, 4)}
        out.append(base | answer)
        if i % 10 == 3 and answer["model"].endswith("v1"):
            label = rnd.choice(LABELS)
            out.append(base | {"model": f"{NAME}:v2", "role": "shadow", "label": label, "labels": [label],
                               "scores": {label: 0.9, ("neg" if label == "pos" else "pos"): 0.1}})
    return out


def _truth(records: list[dict[str, Any]], share: float = 0.2, seed: int = 1) -> dict[tuple[str, str], list[str]]:
    rnd = random.Random(seed)
    return {(r["id"], r["request_id"]): ([rnd.choice(LABELS)] if r["model"].endswith("v1") else rnd.sample(TOPICS, 2))
            for r in records if r["role"] == "production" and rnd.random() < share}


def _facts(tag: str) -> tuple[dict[str, Any] | None, list[str], bool] | None:
    """v1 as the store would give it (its profile, labels, task); the others deleted."""
    profile = {"words": list(range(5, 400, 3)), "oov": [i / 1000 for i in range(100)], "predicted": {"neg": 0.5,
               "pos": 0.5}, "confidence": {"top_score": [0.5, 0.8, 1.0], "accuracy": [0.4, 0.7, 0.95]}}
    return (profile, LABELS, False) if tag.endswith(":v1") else None


def _write_log(home: Path, records: list[dict[str, Any]], files: int = 3) -> list[Path]:
    """The records in ``files`` files of one worker, written as the service writes them."""
    data = home / "deployments" / NAME / "log" / "data"
    data.mkdir(parents=True, exist_ok=True)
    size = -(-len(records) // files)
    paths = []
    for k in range(files):
        chunk = records[k * size:(k + 1) * size]
        if not chunk:
            continue
        stamp = chunk[0]["time"].replace("-", "").replace(":", "").replace(".", "")[:-1] + "000"
        path = data / f"{stamp}-elsewhere-{k + 1}.jsonl"
        path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in chunk), encoding="utf-8")
        paths.append(path)
    return paths


def _store_feedback(home: Path, records: list[dict[str, Any]], truth: dict[tuple[str, str], list[str]]) -> None:
    """Each judged answer recorded as the service records it, then its feedback (ids reused: the last judged)."""
    judged = [r for r in records if (r["id"], r["request_id"]) in truth]
    with open_store(None, home / "deployments" / NAME / "feedback.sqlite3") as store:
        for r in records:
            if r["role"] == "production":
                store.record_predictions(r["request_id"], r["model"], [Prediction(r["id"], r["labels"])], r["role"])
            if r in judged:
                store.add_feedback([Feedback(r["id"], truth[r["id"], r["request_id"]])])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path / "bentoml"))
    monkeypatch.delenv(loop_commands.FEEDBACK_STORE_ENV, raising=False)
    return tmp_path / "bentoml"


def _peak(run: Callable[[], Any]) -> tuple[Any, int]:
    """What ``run`` returns, and the most memory Python held during it (after a first run: imports are paid)."""
    run()
    tracemalloc.start()
    try:
        result = run()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_streamed_figures_are_the_records_figures(home: Path) -> None:
    """Window (a few numbers a document) against report/series on the records: the same JSON, a deleted
    multi-label version included; cut to the newest documents, the same as a report on those alone."""
    from monitoring.estimates import Window

    records = _records(3000)
    truth = _truth(records)
    _write_log(home, records)
    read = [{k: v for k, v in r.items() if k != "text"} for r in read_log(home / "deployments" / NAME / "log")]
    models = {tag: facts for tag in {r["model"] for r in read} if (facts := _facts(tag)) is not None}
    expected = report(read, truth, models)
    for entry in expected:
        rows = [r for r in read if r["model"] == entry["model"] and r["role"] == entry["role"]]
        profile, labels, multi = models.get(entry["model"]) or (None, sorted(rows[0]["scores"]),
                                                               entry["model"].endswith("multi"))
        entry["series"] = series(rows, truth, profile, labels, multi)
    streamed = Window(truth, _facts).add_all(read).reports(with_series=True)
    assert json.dumps(streamed) == json.dumps(expected)
    assert [(e["model"], e["role"], e["estimate_from"]) for e in streamed] == [
        (f"{NAME}:multi", "production", "scores"), (f"{NAME}:v1", "production", "profile"),
        (f"{NAME}:v2", "shadow", "scores")]
    cut = Window(truth, _facts, keep=700).add_all(read)
    assert cut.cut and cut.kept == 700 and cut.read == len(read) and cut.first_time() == read[-700]["time"]
    assert json.dumps(cut.reports()) == json.dumps(report(read[-700:], truth, models))


def test_monitor_holds_numbers_not_records(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = _records(10_000)
    _write_log(home, records)
    args = argparse.Namespace(name=NAME, since=None, until=None, json=None, store=None)
    _, peak = _peak(lambda: loop_commands.monitor(args))
    served = sum(1 for r in records if r["model"].endswith("v1"))
    assert f"{NAME}:v1 (production): {served:,} documents" in capsys.readouterr().out
    print(f"{peak / len(records):.0f} bytes a document")
    assert peak < 400 * len(records), f"{peak / len(records):.0f} bytes a document"


def test_export_log_holds_numbers_not_rows(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [r for r in _records(10_000, text=1000) if not r["model"].endswith("multi")]
    _write_log(home, records)
    out = tmp_path / "all.jsonl"
    args = argparse.Namespace(name=NAME, out=str(out), since=None, until=None, store=None, overwrite=True,
                              labelled_only=False, role="production")
    _, peak = _peak(lambda: loop_commands.export_log(args))
    ids = {r["id"] for r in records if r["role"] == "production"}
    assert f"wrote {len(ids):,} documents" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == len(ids)
    print(f"{peak / len(records):.0f} bytes a document")
    assert peak < 400 * len(records), f"{peak / len(records):.0f} bytes a document"


def test_the_shadow_pairs_are_compact_and_the_same(home: Path) -> None:
    """ShadowPairs against the pairing of the records themselves (the last answer of a request and id, in
    the order the keys first came) through compare_pairs: the same comparison, in a fraction of the memory."""
    from registry.shadow_commands import ShadowPairs, _comparison, compare_pairs

    records = [r for r in _records(10_000) if not r["model"].endswith("multi")]
    truth = _truth(records, share=0.3)
    _write_log(home, records)
    folder = home / "deployments" / NAME / "log"

    def by_records() -> dict[str, Any]:
        production: dict[tuple[str, str], dict[str, Any]] = {}
        shadowed: dict[tuple[str, str], dict[str, Any]] = {}
        for r in read_log(folder, drop=("text",)):
            key = (str(r["request_id"]), str(r["id"]))
            answer = {"id": r["id"], "request_id": key[0], "model": r["model"], "labels": r["labels"]}
            (shadowed if r["role"] == "shadow" else production)[key] = answer
        pairs = [(p, s) for key, s in shadowed.items() if (p := production.get(key))]
        return compare_pairs(pairs, truth, f"{NAME}:v2", f"{NAME}:v1")

    def streamed() -> dict[str, Any]:
        pairs = ShadowPairs(f"{NAME}:v2", f"{NAME}:v1", truth)
        for r in read_log(folder, drop=("text",)):
            pairs.add(r)
        paired, agree, others, judged = pairs.match()
        assert others == []
        return _comparison(paired, agree, judged, [f"{NAME}:v1"], f"{NAME}:v2", f"{NAME}:v1")

    expected, held = _peak(by_records)
    result, peak = _peak(streamed)
    assert result == expected and result["labelled"] > 100
    print(f"shadow pairs: {peak / len(records):.0f} bytes a document (the records: {held / len(records):.0f})")
    assert peak < 200 * len(records) and peak < held / 3, (peak, held)


def test_export_log_counts_labelled_documents_whose_lines_the_cap_deleted(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [r for r in _records(300) if not r["model"].endswith("multi") and r["role"] == "production"]
    records = list({r["id"]: r for r in records}.values())  # one answer an id
    truth = {(r["id"], r["request_id"]): [r["label"]] for r in records}
    first, *_ = _write_log(home, records)
    _store_feedback(home, records, truth)
    pruned = sum(1 for _ in first.open())
    first.unlink()  # as the size cap deletes the oldest file
    out = tmp_path / "labelled.jsonl"
    assert main(["export-log", NAME, str(out), "--labelled-only"]) == 0
    printed = capsys.readouterr()
    assert f"wrote {len(records) - pruned:,} documents ({len(records) - pruned:,} with feedback)" in printed.out
    assert f"left out {pruned:,} documents with feedback whose log lines are gone" in printed.err


def test_monitor_says_the_window_in_utc(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_log(home, [r for r in _records(50) if r["model"].endswith("v1")])
    assert main(["monitor", NAME, "--since", "2026-11-28T00:00:00+09:00"]) == 0
    assert "no logged request since 2026-11-27 15:00 UTC" in capsys.readouterr().out


def test_monitor_says_a_version_is_gone_from_the_store(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_log(home, [r for r in _records(50) if r["model"].endswith("v1")])
    assert main(["monitor", NAME]) == 0  # v1 served, then deleted from the store
    out = capsys.readouterr().out
    assert f"{NAME}:v1 is no longer in the model store, so its training profile cannot be read" in out
    assert "no training profile" not in out


def test_the_page_says_the_window_it_read(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from service import monitor_page

    start = datetime.now(UTC) - timedelta(hours=2)
    records = [r for r in _records(900, start=start) if r["model"].endswith("v1")]
    _write_log(home, records, files=6)
    store = home / "deployments" / NAME / "feedback.sqlite3"
    monkeypatch.setattr(monitor_page, "MAX_RECORDS", 200)
    got = monitor_page.monitor_report(NAME, None, store, timedelta(hours=3))
    assert got["cut"] is True and got["documents_read"] == 200 and got["first_document"] == records[-200]["time"]
    assert got["since"] == records[-200]["time"] and "cut to the window's newest 200 documents" in got["note"]
    assert sum(v["documents"] for v in got["versions"]) == 200
    whole = monitor_page.monitor_report(NAME, None, store, timedelta(days=1), keep=5000)
    assert whole["cut"] is False and whole["documents_read"] == len(records) and "note" not in whole


def test_the_page_computes_one_report_at_a_time_in_a_worker(home: Path) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from service import monitor_page

    _write_log(home, [r for r in _records(100, start=datetime.now(UTC) - timedelta(hours=1))])
    store = home / "deployments" / NAME / "feedback.sqlite3"

    async def endpoint(request: Request) -> Response:
        return await monitor_page.monitor_endpoint(request, NAME, None, store)

    app = Starlette(routes=[Route("/monitor", endpoint)])
    with TestClient(app) as client:
        assert client.get("/monitor?since=3h").status_code == 200
        with monitor_page._busy:  # another report under way in this worker
            busy = client.get("/monitor?since=3h")
        assert busy.status_code == 429 and "already computing" in busy.json()["error"]
        assert busy.headers["Retry-After"]
        assert client.get("/monitor?since=3h").status_code == 200
