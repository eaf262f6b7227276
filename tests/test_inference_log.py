"""The inference log's files, written through bentoml.monitor: whole lines only, even from processes
killed mid-stream, a new file past the size, the oldest files gone past the cap, the text or its hash."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from monitoring.inference_log import InferenceLog, LogSettings, text_hash
from monitoring.log_files import read_log


@dataclass
class Result:
    label: str
    labels: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)


def _write(log: InferenceLog, n: int, text: str = "A fine film.", request: str = "r1") -> None:
    ids = [f"{request}-{i}" for i in range(n)]
    results = [Result("pos", ["pos"], {"neg": 0.1, "pos": 0.9}) for _ in ids]
    log.write(request, "han-x:v1", "production", ids, [text] * n, results, [(3, 1)] * n)


def test_each_document_is_one_line_with_its_columns(tmp_path: Path) -> None:
    log = InferenceLog("han-x", LogSettings(), folder=tmp_path)
    _write(log, 3)
    records = list(read_log(tmp_path))
    assert [r["id"] for r in records] == ["r1-0", "r1-1", "r1-2"]
    first = records[0]
    assert first["request_id"] == "r1" and first["model"] == "han-x:v1" and first["role"] == "production"
    assert first["label"] == "pos" and first["labels"] == ["pos"] and first["scores"] == {"neg": 0.1, "pos": 0.9}
    assert first["words"] == 3 and first["oov"] == round(1 / 3, 4) and first["text"] == "A fine film."
    assert first["time"].endswith("Z")
    schema = json.loads((tmp_path / "schema.json").read_text())
    assert {c["name"] for c in schema["columns"]} >= {"time", "id", "label", "scores", "text"}


def test_without_text_only_its_hash_is_kept(tmp_path: Path) -> None:
    log = InferenceLog("han-y", LogSettings(keep_text=False), folder=tmp_path)
    _write(log, 1, text="secret review")
    (record,) = read_log(tmp_path)
    assert "text" not in record and record["text_sha256"] == text_hash("secret review")
    assert "secret" not in "".join(p.read_text() for p in (tmp_path / "data").iterdir())


def test_files_rotate_and_stay_under_the_cap(tmp_path: Path) -> None:
    settings = LogSettings(file_bytes=4000, cap_bytes=20_000)
    log = InferenceLog("han-z", settings, folder=tmp_path)
    for r in range(60):
        _write(log, 5, text="x" * 100, request=f"r{r}")
        time.sleep(0.002)
    files = sorted((tmp_path / "data").glob("*.jsonl"))
    assert len(files) > 1
    # files older than a minute are pruned first; age them to let the cap act on the next rotation
    for path in files:
        os.utime(path, (time.time() - 120, time.time() - 120))
    for r in range(10):
        _write(log, 5, text="x" * 100, request=f"s{r}")
    total = sum(p.stat().st_size for p in (tmp_path / "data").glob("*.jsonl"))
    assert total <= settings.cap_bytes + settings.file_bytes
    ids = {r["id"] for r in read_log(tmp_path)}
    assert "s9-4" in ids and "r0-0" not in ids  # the newest are kept, the oldest went
    assert all(p.stat().st_size <= settings.file_bytes for p in (tmp_path / "data").glob("*.jsonl"))


def test_a_disabled_log_writes_nothing(tmp_path: Path) -> None:
    _write(InferenceLog("han-w", LogSettings(enabled=False), folder=tmp_path), 2)
    assert list(read_log(tmp_path)) == []


def _writer(folder: str, ready) -> None:  # a process that logs long lines as fast as it can
    log = InferenceLog("han-k", LogSettings(), folder=Path(folder))
    ready.set()
    r = 0
    while True:
        _write(log, 8, text="word " * 3000, request=f"p{os.getpid()}-{r}")
        r += 1


def test_processes_killed_mid_write_leave_only_whole_lines(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    for _ in range(3):
        ready = context.Event()
        process = context.Process(target=_writer, args=(str(tmp_path), ready))
        process.start()
        assert ready.wait(60)
        time.sleep(0.3)
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
    records = list(read_log(tmp_path))  # a reader never sees half a line, repaired or not
    assert len(records) > 10
    InferenceLog("han-k", LogSettings(), folder=tmp_path)  # a restarted worker repairs what a kill left
    lines = [line for p in (tmp_path / "data").glob("*.jsonl") for line in p.read_text().splitlines(keepends=True)]
    assert len(lines) == len(records)
    for line in lines:
        assert line.endswith("\n")
        json.loads(line)


def test_a_restarted_worker_cuts_the_half_line_a_killed_one_left(tmp_path: Path) -> None:
    """The kill above lands mid-line only now and then; here the half line is written by hand: a worker
    that starts cuts it off the file of this host's ended process (a line longer than the 64 KB blocks it
    reads back in), and leaves the file of a process still running as it is."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    data = tmp_path / "data"
    data.mkdir()
    whole = "".join(json.dumps(_at(s, "a")) + "\n" for s in range(3))
    half = '{"time": "2026-11-27T12:00:03.000Z", "id": "a3", "text": "' + "word " * 30000
    killed = data / f"20261127T120000000000-{socket.gethostname()}-{ended.pid}.jsonl"
    killed.write_text(whole + half)
    running = data / f"20261127T120000000001-{socket.gethostname()}-{os.getppid()}.jsonl"
    running.write_text(whole + half[:40])  # a live writer's line may be on its way: not cut
    InferenceLog("han-k", LogSettings(), folder=tmp_path)
    assert killed.read_text() == whole
    assert [json.loads(line) for line in killed.read_text().splitlines()] == [_at(s, "a") for s in range(3)]
    assert running.read_text() == whole + half[:40]


def _log_file(folder: Path, name: str, records: list[dict], mtime: float) -> Path:
    path = folder / "data" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.utime(path, (mtime, mtime))
    return path


def _at(second: int, worker: str, role: str = "production") -> dict:
    return {"time": f"2026-11-27T12:00:{second:02d}.000Z", "id": f"{worker}{second}", "role": role,
            "model": "m:1", "text": "x" * 10}


def test_two_workers_files_are_read_in_time_order(tmp_path: Path) -> None:
    now = time.time()
    # worker a wrote the even seconds and b the odd ones; a's file was modified last, b's first line is later
    _log_file(tmp_path, "a", [_at(s, "a") for s in range(0, 20, 2)], now)
    _log_file(tmp_path, "b", [_at(s, "b") for s in range(1, 20, 2)], now - 5)
    _log_file(tmp_path, "c", [_at(s, "c") for s in range(40, 45)], now - 1)  # a later file, rotated
    (tmp_path / "data" / "d.jsonl").write_text('{"time": "2026-11-27T12:00:03.0')  # half a line: nothing yet
    times = [r["time"] for r in read_log(tmp_path)]
    assert times == sorted(times) and len(times) == 25
    from datetime import UTC, datetime

    window = list(read_log(tmp_path, datetime(2026, 11, 27, 12, 0, 5, tzinfo=UTC),
                           datetime(2026, 11, 27, 12, 0, 41, tzinfo=UTC), roles=["production"], drop=("text",)))
    assert [r["id"] for r in window] == [f"{'ab'[s % 2]}{s}" for s in range(5, 20)] + ["c40"]
    assert all("text" not in r for r in window)


def test_a_file_gone_between_listing_and_reading_is_skipped(tmp_path: Path, monkeypatch) -> None:
    from monitoring import log_files

    _log_file(tmp_path, "a", [_at(1, "a")], time.time())
    listed = Path.glob
    monkeypatch.setattr(Path, "glob", lambda self, pattern: [*listed(self, pattern), self / "pruned.jsonl"])
    assert log_files.log_files(tmp_path) == [tmp_path / "data" / "a.jsonl"]
    assert [r["id"] for r in read_log(tmp_path)] == ["a1"]


def test_a_full_disk_loses_lines_it_counts_and_never_glues_the_next_line_to_a_cut_one(full_disk: Path) -> None:
    """A full disk must not fail a request: the lines it cannot take are counted (the service's
    han_inference_log_lost_total), and a line cut short by it is ended before the next one, which a reader
    would otherwise skip with it."""
    from monitoring.inference_log import take_lost

    fill = full_disk / "fill"
    os.truncate(fill, fill.stat().st_size - 6 * 4096)  # room for the schema and a few lines
    folder = full_disk / "log"
    log = InferenceLog("han-x", LogSettings(), folder=folder)
    take_lost()
    for k in range(60):  # about 1.1 kB a line: the disk fills part-way through one
        _write(log, 1, text="word " * 200, request=f"r{k}")
    lost = take_lost()
    kept = [r["request_id"] for r in read_log(folder)]
    assert lost > 0 and len(kept) + lost == 60 and kept == [f"r{k}" for k in range(len(kept))]
    ends = [path.read_bytes()[-1:] for path in (folder / "data").glob("*.jsonl")]
    assert len(ends) == 1 and ends[0] != b"\n", "the disk filled part-way through a line"
    fill.unlink()  # space again: the next line is whole and read
    _write(log, 1, text="after", request="after")
    assert take_lost() == 0
    assert [r["request_id"] for r in read_log(folder)] == [*kept, "after"]
