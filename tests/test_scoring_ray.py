"""han-score --engine ray on a real local Ray (2 CPUs, loopback): exactly-once output, parity with the
local engine, a kill -9 of a scoring actor mid-job, and one-line errors."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

try:
    import ray
except ImportError as missing:  # skipped where ray is not installed, but a hard failure under CI=true
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but ray cannot be imported ({missing}): pip install -e '.[ray]'", pytrace=False)
    pytest.skip(f"ray is not installed ({missing})", allow_module_level=True)

from scoring.cli import main

# A local Ray cluster in this process and in each job's: apart from `make test` (`make test-ray`, which .ci/run runs)
pytestmark = pytest.mark.ray
TEXTS = ["A wonderful film. I loved it.", "Dull and far too long.", "Great acting, weak plot.", "Terrible. Avoid."]


@pytest.fixture(scope="module")
def local_ray():
    from scoring.ray_engine import init_ray

    init_ray(None, 2, quiet=True)
    yield
    ray.shutdown()


def _input(path: Path, n: int) -> Path:
    """n rows with ids 0..n-1; every 97th text is missing or empty (bad rows mixed in)."""
    texts: list[str | None] = []
    for i in range(n):
        if i % 97 == 5:
            texts.append(None if i % 2 else "   ")
        else:
            texts.append(f"{TEXTS[i % len(TEXTS)]} Review number {i}.")
    pq.write_table(pa.table({"doc_id": list(range(n)), "text": texts}), path, row_group_size=500)
    return path


def _read_folder(path: Path, fmt: str = "parquet") -> pa.Table:
    import pyarrow.dataset as pds

    # use_threads=False: on one CPU, Arrow's one-thread pool in this process (which Ray Data used) once never
    # finished a threaded scan, and a wait in C is out of pytest-timeout's reach.
    if not path.exists():
        return pa.table({"id": pa.array([], pa.int64())})
    return pds.dataset(path, format=fmt).to_table(use_threads=False)


@pytest.mark.parametrize("where", ["auto", "port"])
def test_an_address_with_no_ray_is_one_line(tmp_path: Path, tiny_model_dir: Path, where: str) -> None:
    """(First in the module: ``auto`` finds any Ray on the machine, and the module's own starts below.)
    ``--address auto`` where no Ray runs (its temp folder, which names the running cluster, is a new
    one): one line and status 2, where it was a ConnectionError traceback and status 1; a HOST:PORT that
    nothing answers, the same at once (Ray tried it for minutes)."""
    import psutil

    from service.process import free_port

    if where == "auto" and any(p.info["name"] == "gcs_server" for p in psutil.process_iter(["name"])):
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but a Ray runs on this machine: --address auto would join it; stop it "
                        "(ray stop) for the test", pytrace=False)
        pytest.skip("a Ray runs on this machine: --address auto would join it")
    address = "auto" if where == "auto" else f"127.0.0.1:{free_port()}"
    src = _input(tmp_path / "in.parquet", 3)
    done = subprocess.run([sys.executable, "-m", "scoring", str(src), str(tmp_path / "out.jsonl"), "--engine", "ray",
                           "--address", address, "--model", str(tiny_model_dir)], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # this
                          | {"RAY_TMPDIR": str(tmp_path / "ray")})  # module's Ray, if up, is found by neither
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"han-score: error: --address {address}: " + (
        "Could not find any running Ray instance" if where == "auto" else "no Ray answers there (Connection refused)"))
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_every_row_once_and_same_as_local_engine(tmp_path: Path, tiny_model_dir: Path, local_ray: None) -> None:
    n = 3000
    src = _input(tmp_path / "in.parquet", n)
    ray_out = tmp_path / "ray.parquet"
    rc = main([str(src), str(ray_out), "--engine", "ray", "--model", str(tiny_model_dir), "--id-column", "doc_id",
               "--concurrency", "2", "--window", "200", "--quiet"])
    assert rc == 0
    good = _read_folder(ray_out)
    bad = _read_folder(Path(str(ray_out) + ".errors"), "json")
    ids = good.column("id").to_pylist() + bad.column("id").to_pylist()
    assert sorted(ids) == list(range(n))  # every row exactly once across output and errors
    assert len(bad) == sum(1 for i in range(n) if i % 97 == 5)
    assert all(bad.column("reason").to_pylist())

    local_out = tmp_path / "local.parquet"
    assert main([str(src), str(local_out), "--model", str(tiny_model_dir), "--id-column", "doc_id",
                 "--workers", "1", "--quiet"]) == 0
    local = pq.read_table(local_out).to_pylist()
    by_id = {r["id"]: r for r in good.to_pylist()}
    assert len(by_id) == len(local)
    for row in local:
        other = by_id[row["id"]]
        assert other["label"] == row["label"]
        for key in row:
            if key.startswith("score_"):
                assert abs(other[key] - row[key]) <= 1e-6, (row["id"], key)
        assert set(other) == set(row) - {"row"}


def test_csv_with_explanations_is_written_as_the_local_engine_writes_it(
    tmp_path: Path, tiny_model_dir: Path, local_ray: None
) -> None:
    """CSV cannot hold the explanation lists as such: both engines write them as JSON text."""
    import csv

    n = 300
    src = _input(tmp_path / "in.parquet", n)
    common = ["--model", str(tiny_model_dir), "--id-column", "doc_id", "--explain", "--quiet"]
    assert main([str(src), str(tmp_path / "ray.csv"), "--engine", "ray", "--window", "100", *common]) == 0
    assert main([str(src), str(tmp_path / "local.csv"), "--workers", "1", *common]) == 0
    ray_rows = []
    for part in sorted((tmp_path / "ray.csv").glob("part-*.csv")):
        with part.open(newline="", encoding="utf-8") as f:
            ray_rows += list(csv.DictReader(f))
    with (tmp_path / "local.csv").open(newline="", encoding="utf-8") as f:
        local_rows = list(csv.DictReader(f))
    assert len(ray_rows) == len(local_rows) == n - sum(1 for i in range(n) if i % 97 == 5)
    by_id = {r["id"]: r for r in ray_rows}
    for row in local_rows:
        other = by_id[row["id"]]
        assert set(other) == set(row) - {"row"}
        assert other["label"] == row["label"]
        for column in ("top_sentences", "top_words"):
            # The engines batch differently, and float32 sums in another order can move the last of a
            # weight's 6 decimals: spans are equal, weights within one unit of it.
            got, expected = json.loads(other[column]), json.loads(row[column])
            assert [{**s, "weight": 0} for s in got] == [{**s, "weight": 0} for s in expected]
            assert [s["weight"] for s in got] == pytest.approx([s["weight"] for s in expected], abs=1.5e-6)


def test_a_csv_input_is_read_as_written_by_both_engines(tmp_path: Path, tiny_model_dir: Path,
                                                        local_ray: None) -> None:
    """Arrow's CSV reader guesses types, as pandas does: an id 00042 became 42, and a review reading "NA"
    a missing text. Both engines read cells as written."""
    import csv

    src = tmp_path / "in.csv"
    with src.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        w.writerows([(f"{k:05d}", "NA" if k == 3 else "null" if k == 4 else f"A fine film, number {k}.")
                     for k in range(12)])
    for engine in ("ray", "local"):
        out = tmp_path / f"{engine}.jsonl"
        extra = ["--engine", "ray"] if engine == "ray" else ["--workers", "1"]
        assert main([str(src), str(out), "--model", str(tiny_model_dir), "--quiet", *extra]) == 0
        files = sorted(out.glob("part-*.jsonl")) if out.is_dir() else [out]
        rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
        assert sorted(r["id"] for r in rows) == [f"{k:05d}" for k in range(12)], engine


def test_an_input_that_repeats_a_whole_batch_is_an_error_not_a_silent_loss(
    tmp_path: Path, tiny_model_dir: Path, local_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two identical batches would share one part file: the job says so instead of reporting them scored."""
    folder = tmp_path / "in"
    folder.mkdir()
    _input(folder / "a.parquet", 100)
    _input(folder / "b.parquet", 100)  # the same ids and texts again
    rc = main([str(folder), str(tmp_path / "o.parquet"), "--engine", "ray", "--input-format", "parquet", "--model",
               str(tiny_model_dir), "--id-column", "doc_id", "--window", "100", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "unique --id-column" in err and len(err.splitlines()) == 1, err


def _actor_pids() -> list[int]:
    import psutil

    pids = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "MapWorker" in cmd and "RayScorer" in cmd:
            pids.append(p.info["pid"])
    return pids


def test_kill_9_of_an_actor_loses_and_duplicates_no_row(tmp_path: Path, tiny_model_dir: Path, local_ray: None) -> None:
    """han-score joins the test's Ray (--address); once its actors score, one is killed with SIGKILL."""
    n = 4000
    src = _input(tmp_path / "in.parquet", n)
    out = tmp_path / "out.jsonl"
    before = set(_actor_pids())
    address = ray.get_runtime_context().gcs_address
    job = subprocess.Popen([sys.executable, "-m", "scoring", str(src), str(out), "--engine", "ray", "--address",
                            address, "--model", str(tiny_model_dir), "--id-column", "doc_id", "--concurrency", "2",
                            "--window", "50", "--quiet"], stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 90
    while killed is None and time.monotonic() < deadline and job.poll() is None:
        pids = [p for p in _actor_pids() if p not in before]
        if len(pids) == 2:
            time.sleep(1.5)  # both actors are up and scoring: rows are flowing when the kill lands
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[0], signal.SIGKILL)
                killed = pids[0]
        time.sleep(0.1)
    _, err = job.communicate(timeout=240)
    assert killed is not None, "no scoring actor was found to kill"
    assert job.returncode == 0, err
    good = _read_folder(out, "json")
    bad = _read_folder(Path(str(out) + ".errors"), "json")
    ids = good.column("id").to_pylist() + bad.column("id").to_pylist()
    assert sorted(ids) == list(range(n))  # nothing lost, nothing twice


def test_missing_column_and_bad_model_stop_in_one_line(
    tmp_path: Path, tiny_model_dir: Path, local_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _input(tmp_path / "in.parquet", 10)
    rc = main([str(src), str(tmp_path / "o.parquet"), "--engine", "ray", "--model", str(tiny_model_dir),
               "--id-column", "doc_id", "--text-column", "body"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "no column 'body'" in err and len(err.splitlines()) == 1
    rc = main([str(src), str(tmp_path / "o.parquet"), "--engine", "ray", "--model", str(tmp_path / "nope"),
               "--id-column", "doc_id"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("han-score: error:") and len(err.splitlines()) == 1
    rc = main([str(src), str(tmp_path / "o.parquet"), "--engine", "ray", "--model", str(tiny_model_dir)])
    assert rc == 2 and "--id-column" in capsys.readouterr().err
    (tmp_path / "done.parquet").mkdir()  # an earlier run's output is never appended to or lost silently
    (tmp_path / "done.parquet" / "part-0.parquet").write_bytes(b"earlier")
    rc = main([str(src), str(tmp_path / "done.parquet"), "--engine", "ray", "--model", str(tiny_model_dir),
               "--id-column", "doc_id"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "already exists" in err and "--overwrite" in err and len(err.splitlines()) == 1
    assert (tmp_path / "done.parquet" / "part-0.parquet").read_bytes() == b"earlier"


def test_the_driver_starts_ray_before_importing_torch_and_spacy() -> None:
    """Ray's start-up and the model's load (torch, spaCy) each take seconds on 2 cores: han-score starts
    Ray first and loads the model while Ray Data samples the input, so starting Ray must not import them."""
    code = (
        "import sys\n"
        "from scoring import ray_engine\n"
        "ray_engine.init_ray(None, 2, True)\n"
        "heavy = sorted(m for m in ('torch', 'spacy') if m in sys.modules)\n"
        "ray_engine.stop_ray()\n"
        "print(','.join(heavy) or 'none')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "none"


def test_ray_workers_run_at_the_drivers_priority(local_ray: None) -> None:
    """Ray's default nice 15 starved the actors beside any other busy process (docs/experiments.md)."""

    @ray.remote(num_cpus=0.1)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote()) == os.nice(0)


def test_a_run_that_starts_ray_stops_every_ray_process_it_started(tmp_path: Path, tiny_model_dir: Path) -> None:
    """han-score on its own local Ray, of one CPU (which hung: the column selection asked for a whole CPU
    beside the actor's half): when it exits (without Python's teardown), its summary is out, Ray's core
    printed no line of its log level, and none of that Ray's processes (found by its temporary folder,
    which every one of them names) is left."""
    import tempfile

    import psutil

    src = _input(tmp_path / "in.parquet", 300)
    ray_tmp = tempfile.mkdtemp(prefix="hr", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes

    def ray_processes() -> list[str]:
        found = []
        for p in psutil.process_iter(["cmdline", "status"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if ray_tmp in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(cmd[:120])
        return found

    seen: list[str] = []
    log = tmp_path / "stderr.txt"  # a file, not a pipe: the progress bars must never block on a full pipe
    with log.open("w") as stderr:
        job = subprocess.Popen([sys.executable, "-m", "scoring", str(src), str(tmp_path / "out.parquet"), "--engine",
                                "ray", "--num-cpus", "1", "--model", str(tiny_model_dir), "--id-column", "doc_id",
                                "--summary-json", str(tmp_path / "summary.json")],
                               stderr=stderr, text=True, env={**os.environ, "RAY_TMPDIR": ray_tmp})
        while job.poll() is None:
            seen = seen or ray_processes()
            time.sleep(0.2)
    err = log.read_text()
    assert job.returncode == 0, err
    assert "han-score (ray): 300 rows" in err.splitlines()[-1]
    assert "RAY_BACKEND_LOG_LEVEL" not in err, err
    assert json.loads((tmp_path / "summary.json").read_text())["rows"] == 300
    assert seen, "the run's Ray processes were never seen: the check below would prove nothing"
    time.sleep(1)  # a worker told to exit may still be on its way out
    assert ray_processes() == []



def test_a_json_lines_column_of_two_types_is_one_line_naming_its_row(
    tmp_path: Path, tiny_model_dir: Path, local_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ray's reader cannot take a text column holding a number; its retry as one JSON document said
    "Extra data: line 2", with its stack trace logged twice. The row is named, in one line."""
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"id": 0, "text": "Fine."}\n{"id": 1, "text": null}\n{"id": 2, "text": 42}\n')
    rc = main([str(mixed), str(tmp_path / "out.jsonl"), "--engine", "ray", "--model", str(tiny_model_dir), "--quiet"])
    assert (rc, capsys.readouterr().err) == (2, (
        f"han-score: error: cannot read {mixed}: column 'text' holds a number in row 2 and a string in row 0: "
        "--engine ray needs one type a column (--engine local reports such rows as errors)\n"))


def test_a_failed_read_is_named_by_its_row(tmp_path: Path) -> None:
    """What --engine ray says when Ray Data cannot read a local file: the row, as the local engine says it."""
    from scoring.read_causes import read_cause

    csv_file, jsonl, good = tmp_path / "a.csv", tmp_path / "a.jsonl", tmp_path / "good.jsonl"
    csv_file.write_text('id,text\n0,"fine, really"\n1,"a\nquoted line break"\n2,ok,extra\n')
    assert read_cause(str(csv_file), "csv") == "row 2 (line 5) has 3 fields where the header has 2"
    jsonl.write_text('{"id": 0, "text": "x"}\n\n{"id": 1, "text": "y"}\n{"id": 2, "text": [1]}\n')
    assert read_cause(str(jsonl), "json").startswith("column 'text' holds a list in row 3 and a string in row 0")
    jsonl.write_text('{"id": 0, "text": "x"}\n{"id": 1, "text": "y"\n')
    assert read_cause(str(jsonl), "json").startswith("row 1 is not JSON (")
    good.write_text('{"id": 0, "text": "x"}\n{"id": 1.5, "text": null}\n')
    assert read_cause(str(good), "json") is None  # numbers of both kinds and nulls are Arrow's to take
    assert read_cause("s3://bucket/a.jsonl", "json") is None and read_cause(str(good), "parquet") is None


@pytest.mark.parametrize("how", ["Ctrl-C", "kill -9"])
def test_an_interrupted_or_killed_job_leaves_no_output_that_looks_finished(
    tmp_path: Path, tiny_model_dir: Path, local_ray: None, how: str
) -> None:
    """The actors write beside OUTPUT (OUTPUT.incomplete/), renamed into place only when the job is done: cut
    short after its first part files, a job leaves no OUTPUT (which pandas would read as whole), Ctrl-C says
    so in one line, and the same command again scores every row once."""
    n = 4000
    src = _input(tmp_path / "in.parquet", n)
    out = tmp_path / "out.parquet"
    cmd = [str(src), str(out), "--engine", "ray", "--model", str(tiny_model_dir), "--id-column", "doc_id",
           "--concurrency", "2", "--window", "50", "--quiet"]
    address = ray.get_runtime_context().gcs_address
    job = subprocess.Popen([sys.executable, "-m", "scoring", *cmd, "--address", address], stderr=subprocess.PIPE,
                           text=True)
    deadline = time.monotonic() + 120
    while not any(tmp_path.rglob("part-*.parquet")):
        assert job.poll() is None and time.monotonic() < deadline, "no part file was written"
        time.sleep(0.05)
    job.send_signal(signal.SIGINT if how == "Ctrl-C" else signal.SIGKILL)
    _, err = job.communicate(timeout=120)
    assert not out.exists() and not Path(f"{out}.errors").exists()
    if how == "Ctrl-C":
        assert job.returncode == 130
        assert err.strip().splitlines()[-1] == "han-score: interrupted; nothing written", err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]
    assert main(cmd) == 0  # what a killed run left is no obstacle
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet", "out.parquet", "out.parquet.errors"]
    ids = _read_folder(out).column("id").to_pylist() + _read_folder(Path(f"{out}.errors"), "json").column(
        "id").to_pylist()
    assert sorted(ids) == list(range(n))


@pytest.mark.parametrize("first", ["local", "ray"])
def test_a_local_job_and_a_ray_job_on_one_output_never_replace_each_other(
    tmp_path: Path, tiny_model_dir: Path, local_ray: None, first: str
) -> None:
    """Two runs, one of each engine, on the same OUTPUT (no --overwrite), the second started once the first
    writes: each engine locked only its own folder (OUTPUT.parts, OUTPUT.incomplete), and the Ray job, having
    found no OUTPUT at its start, replaced the local job's output finished meanwhile, both exiting 0. Now
    OUTPUT.lock is the one lock of both: one job writes OUTPUT, and the other is refused in one line naming it."""
    out = tmp_path / "out.parquet"
    address = ray.get_runtime_context().gcs_address
    cmds = {
        "local": [str(_input(tmp_path / "local.parquet", 2000)), str(out), "--workers", "1", "--chunk-size", "100"],
        "ray": [str(_input(tmp_path / "ray.parquet", 1500)), str(out), "--engine", "ray", "--address", address,
                "--id-column", "doc_id", "--concurrency", "1", "--window", "50"],
    }
    started_writing = {"local": tmp_path / "out.parquet.parts" / "manifest.json",
                       "ray": tmp_path / "out.parquet.incomplete" / "output"}
    jobs = {}
    for engine in (first, "ray" if first == "local" else "local"):
        with (tmp_path / f"{engine}.err").open("w") as log:  # a file: a full pipe never blocks a job
            jobs[engine] = subprocess.Popen([sys.executable, "-m", "scoring", *cmds[engine], "--model",
                                             str(tiny_model_dir), "--quiet"], stderr=log, text=True)
        deadline = time.monotonic() + 120
        while engine == first and not started_writing[engine].exists():
            assert jobs[engine].poll() is None and time.monotonic() < deadline, f"the {engine} job never wrote"
            time.sleep(0.05)
    codes = {engine: job.wait(timeout=240) for engine, job in jobs.items()}
    errs = {engine: (tmp_path / f"{engine}.err").read_text() for engine in jobs}
    winners = [engine for engine, code in codes.items() if code == 0]
    assert len(winners) == 1, f"both jobs exited {codes}: one output silently replaced the other ({errs})"
    loser = "ray" if winners == ["local"] else "local"
    assert codes[loser] == 2 and len(errs[loser].strip().splitlines()) == 1, errs[loser]
    assert errs[loser].startswith(f"han-score: error: {out}"), errs[loser]
    assert "another han-score run is writing this output right now" in errs[loser] or (
        "already exists" in errs[loser] and "--overwrite" in errs[loser]), errs[loser]
    if winners == ["local"]:
        errors = Path(f"{out}.errors.jsonl").read_text().splitlines()
        assert out.is_file() and pq.read_metadata(out).num_rows + len(errors) == 2000
    else:
        ids = _read_folder(out).column("id").to_pylist() + _read_folder(Path(f"{out}.errors"), "json").column(
            "id").to_pylist()
        assert sorted(ids) == list(range(1500))
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".err") == sorted(
        ["local.parquet", "ray.parquet", "out.parquet", "out.parquet.errors.jsonl" if winners == ["local"]
         else "out.parquet.errors"])
