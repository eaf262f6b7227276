"""Two han-score runs on one OUTPUT, without Ray: ``OUTPUT.lock``, which both engines hold while they may write
OUTPUT, held by another process (as a run of the other engine holds it), and the Ray engine's output folders
(``scoring.ray_output``, plain files) when OUTPUT is written by someone else while its job runs. The race of
the two engines' real jobs is in tests/test_scoring_ray.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scoring import BatchError
from scoring.ray_output import RayOutput
from tests.test_batch import input_rows, read_output, score, write_input

HOLD = ("import fcntl, sys, time\n"
        "f = open(sys.argv[1], 'a')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n")


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[Path]:
    """``out.parquet.lock`` held by another process (until the test ends), as a running han-score holds it."""
    lock = tmp_path / "out.parquet.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    yield lock
    holder.communicate(timeout=30)


def test_a_local_run_is_refused_while_another_run_holds_the_output(
    tmp_path: Path, tiny_model_dir: Path, held_lock: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local run beside a running Ray job on the same OUTPUT (which holds OUTPUT.lock from its start until its
    folder is in place) is refused in one line naming OUTPUT, and writes nothing, where it wrote OUTPUT and the
    Ray job then replaced it."""
    source = write_input(tmp_path / "in.jsonl", input_rows())
    output = tmp_path / "out.parquet"
    assert score(source, output, tiny_model_dir, "--workers", "1") == 2
    assert capsys.readouterr().err == (f"han-score: error: {output}: another han-score run is writing this output "
                                       f"right now ({held_lock} is held)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.parquet.lock"]


def test_the_lock_a_killed_run_left_is_no_obstacle_and_a_run_leaves_none(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", input_rows())
    output = tmp_path / "out.parquet"
    (tmp_path / "out.parquet.lock").touch()  # what a run killed with kill -9 leaves: held by nobody
    assert score(source, output, tiny_model_dir, "--workers", "1") == 0
    assert len(read_output(output)) == len(input_rows()) - 4  # 4 rows cannot be scored
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.parquet", "out.parquet.errors.jsonl"]


def test_the_input_as_the_lock_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The lock file is removed when the run ends: an input of that name (which --engine ray reads, given
    --input-format) would be lost. Refused before Ray is imported."""
    source = write_input(tmp_path / "out.parquet.lock", input_rows())
    assert score(source, tmp_path / "out.parquet", tmp_path / "no-model", "--engine", "ray", "--input-format",
                 "parquet") == 2
    assert capsys.readouterr().err == (f"han-score: error: {source}: the output's lock file (removed when the run "
                                       "ends) would overwrite the input\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet.lock"] and source.stat().st_size > 0


def test_a_ray_job_starting_beside_another_run_is_refused_and_leaves_nothing(tmp_path: Path, held_lock: Path) -> None:
    out = tmp_path / "out.parquet"
    written = RayOutput(str(out), f"{out}.errors")
    with pytest.raises(BatchError, match="another han-score run is writing this output right now"):
        written.open()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet.lock"]


def test_a_ray_job_never_replaces_an_output_finished_after_its_start(tmp_path: Path) -> None:
    """OUTPUT written once the job had checked that there was none (a local job's, finished meanwhile): the job
    is refused when it takes OUTPUT.lock, or, found only when its folder is put in place (a writer that takes
    no lock), OUTPUT is left as it is and the job's rows are kept beside it, with status 1."""
    out = tmp_path / "out.parquet"
    out.write_bytes(b"a local job's output")
    written = RayOutput(str(out), f"{out}.errors")
    with pytest.raises(BatchError, match="already exists .*pass --overwrite") as refused:
        written.open()
    assert refused.value.code == 2 and out.read_bytes() == b"a local job's output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet"]

    out.unlink()
    written = RayOutput(str(out), f"{out}.errors")
    written.open()
    (Path(written.output) / "part-1.parquet").write_bytes(b"this job's rows")
    out.write_bytes(b"a local job's output")  # finished while this job ran
    with pytest.raises(BatchError, match="appeared while this job ran") as failed:
        written.place()
    assert failed.value.code == 1 and out.read_bytes() == b"a local job's output"
    left = written.discard()
    kept = next(tmp_path.glob("out.parquet.unplaced-*"))
    assert left == f"this job's rows are kept in {kept} (output/ and errors/)"
    assert (kept / "output" / "part-1.parquet").read_bytes() == b"this job's rows"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", kept.name]


def test_with_overwrite_a_ray_job_replaces_the_output_it_found(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    out.write_bytes(b"an earlier output")
    written = RayOutput(str(out), f"{out}.errors", True)
    written.open()
    (Path(written.output) / "part-1.parquet").write_bytes(b"this job's rows")
    written.place()
    assert (out / "part-1.parquet").read_bytes() == b"this job's rows"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet"]  # OUTPUT.lock let go of and removed
