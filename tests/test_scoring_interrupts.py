"""han-score and han-label when a run is cut short: Ctrl-C before the first commit, a full disk (a real one: a
small tmpfs, filled), and --resume of a partial run an earlier release started. Each says in one line what is
true, and leaves nothing half written and nothing that stops the rerun."""

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

from scoring.cli import main
from tests.test_batch import ENV, REPO, input_rows, read_output, reviews, write_input
from tests.test_labeling import _export, han_label


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "fill")


def test_a_summary_json_on_a_full_disk_is_one_line_and_leaves_no_empty_file(
    tmp_path: Path, tiny_model_dir: Path, full_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_input(tmp_path / "in.jsonl", input_rows())
    output, summary = tmp_path / "out.parquet", full_disk / "summary.json"
    rc = main([str(source), str(output), "--model", str(tiny_model_dir), "--quiet", "--workers", "1",
               "--summary-json", str(summary)])
    err = capsys.readouterr().err
    assert (rc, err) == (1, f"han-score: error: --summary-json {summary}: cannot write (No space left on device); "
                            f"the output {output} is complete\n")
    assert leftovers(full_disk) == []
    assert len(read_output(output)) == len(input_rows()) - 4  # the output is whole (4 rows cannot be scored)


def test_scoring_onto_a_full_disk_is_one_line_and_the_rerun_is_not_blocked(
    tmp_path: Path, tiny_model_dir: Path, full_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_input(tmp_path / "in.jsonl", input_rows())
    output = full_disk / "out.jsonl"
    cmd = [str(source), str(output), "--model", str(tiny_model_dir), "--quiet", "--workers", "1"]
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"han-score: error: {full_disk}/out.jsonl.parts/") and err.count("\n") == 1, err
    assert err.endswith(": cannot write (No space left on device)\n"), err
    assert leftovers(full_disk) == []  # no OUTPUT.parts holding nothing, which a plain rerun would refuse
    (full_disk / "fill").unlink()
    assert main(cmd) == 0, capsys.readouterr().err
    assert len(read_output(output)) == len(input_rows()) - 4


def test_a_disk_full_midway_names_the_file_and_resume_finishes(
    tmp_path: Path, tiny_model_dir: Path, full_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = input_rows(copies=10)
    source = write_input(tmp_path / "in.jsonl", rows)
    output = full_disk / "out.jsonl"
    fill = full_disk / "fill"
    os.truncate(fill, fill.stat().st_size - 8 * 4096)  # room for the manifest and a few chunks
    cmd = [str(source), str(output), "--model", str(tiny_model_dir), "--quiet", "--workers", "1", "--chunk-size", "20"]
    assert main(cmd) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"han-score: error: {full_disk}/out.jsonl.parts/") and err.count("\n") == 1, err
    assert ": cannot write (No space left on device); " in err and "rows are committed in" in err, err
    assert not [p for p in (full_disk / "out.jsonl.parts").iterdir() if p.name.endswith(".tmp")]
    fill.unlink()
    assert main([*cmd, "--resume"]) == 0, capsys.readouterr().err
    assert [r["row"] for r in read_output(output)] == [i for i in range(len(rows)) if i not in (3, 7, 11, 17)]


def _interrupted(cmd: list[str], parts: Path, when: str) -> tuple[int, str]:
    """Run han-score and send it Ctrl-C: ``early`` a second in (importing its libraries), ``started`` once
    OUTPUT.parts has its manifest (before any chunk is committed)."""
    proc = subprocess.Popen([sys.executable, "-m", "scoring", *cmd], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        if when == "early":
            time.sleep(1.0)
        else:
            deadline = time.monotonic() + 90
            while not (parts / "manifest.json").exists():
                assert proc.poll() is None and time.monotonic() < deadline, "han-score never started its output"
                time.sleep(0.01)
            assert json.loads((parts / "manifest.json").read_text())["parts"] == []
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


@pytest.mark.parametrize("when", ["early", "started"])
def test_ctrl_c_before_the_first_commit_says_what_is_true(
    tmp_path: Path, tiny_model_dir: Path, when: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = input_rows(copies=100)
    source = write_input(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.jsonl"
    parts = tmp_path / "out.jsonl.parts"
    cmd = [str(source), str(output), "--model", str(tiny_model_dir), "--quiet", "--workers", "1",
           "--chunk-size", str(len(rows)), "--window", "20"]  # one chunk: committed at the very end
    rc, err = _interrupted(cmd, parts, when)
    # 130, or death by SIGINT (a shell's $? is 130 for both): under `python -m`, a Ctrl-C that lands in C code
    # running Python through PyRun_String (an extension's import) makes CPython end by SIGINT whatever the exit
    # status asked (checked: ctypes.pythonapi.PyRun_String("raise KeyboardInterrupt"), caught, then exit 130).
    assert rc in (130, -signal.SIGINT) and err.count("\n") == 1 and "Traceback" not in err, err
    assert err == "han-score: interrupted; " + ("nothing written\n" if when == "early" else
                                                "no chunk was committed; nothing written\n")
    assert not parts.exists() and not output.exists()
    assert main(cmd) == 0, capsys.readouterr().err  # the same command again, no flag needed
    assert [r["row"] for r in read_output(output)] == [i for i in range(len(rows)) if i not in (3, 7, 11, 17)]


def _earlier_partial(source: Path, output: Path, model: Path, texts: list[str]) -> None:
    """What an earlier release left after committing its first chunk of 10 rows, run without --id-column (its
    manifest's keys, as it wrote them)."""
    from han import Pipeline
    from scoring.formats import Chunk, OutputSpec, output_format
    from scoring.partial import PartialOutput
    from scoring.score import ScoringOptions, score_texts

    pipeline = Pipeline.from_directory(model)
    spec = OutputSpec(list(pipeline.labels), False, False, False, False)
    partial = PartialOutput(output, output_format(output, spec))
    stat = source.stat()
    partial.lock()
    partial.start({"input": str(source.resolve()), "input_size": stat.st_size, "input_mtime_ns": stat.st_mtime_ns,
                   "text_column": "text", "id_column": None, "num_shards": 1, "shard_index": 0,
                   "model": str(model.resolve()), "explain": False, "top_sentences": None, "top_words": None,
                   "explain_method": None, "output_format": output.suffix})
    chunk = Chunk(partial.fmt.spec)
    chunk.add(list(range(10)), [None] * 10, score_texts(pipeline, texts[:10], ScoringOptions(None, 3, 5)))
    partial.commit(chunk, 10, 1.0)
    partial.unlock()


def test_resume_finishes_a_partial_run_an_earlier_release_started_without_ids(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An earlier release read ids only with --id-column; this one takes a column named id. Its partial run,
    resumed by the same command, ends as it began: no id column, every row once."""
    texts = [r["text"] for r in reviews()]
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"doc-{k}" for k in range(len(texts))], "text": texts}), source)
    output = tmp_path / "out.parquet"
    _earlier_partial(source, output, tiny_model_dir, texts)
    cmd = [str(source), str(output), "--model", str(tiny_model_dir), "--quiet", "--workers", "1", "--chunk-size", "10"]
    assert main([*cmd, "--resume"]) == 0, capsys.readouterr().err
    assert "started without ids" in capsys.readouterr().err
    out = pq.read_table(output)
    assert "id" not in out.column_names
    assert out.column("row").to_pylist() == list(range(len(texts)))
    clean = tmp_path / "clean.parquet"
    assert main([str(source), str(clean), "--model", str(tiny_model_dir), "--quiet", "--workers", "1"]) == 0
    assert pq.read_table(clean).column("label").to_pylist() == out.column("label").to_pylist()

    # Other settings (here, ids asked for) are refused, naming each with its two values; the partial run is kept.
    output.unlink()
    _earlier_partial(source, output, tiny_model_dir, texts)
    assert main([*cmd, "--resume", "--id-column", "id"]) == 2
    err = capsys.readouterr().err
    assert '(id_column null there, "id" now)' in err and err.count("\n") == 1, err
    assert (tmp_path / "out.parquet.parts" / "manifest.json").exists()


def test_label_next_and_import_on_a_full_disk_are_one_line_and_write_nothing(
    tmp_path: Path, tiny_model_dir: Path, full_disk: Path
) -> None:
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({**r, "label": None}) + "\n" for r in reviews()))
    queue = full_disk / "queue.json"
    done = han_label("next", str(pool), "--n", "6", "--out", str(queue), "--model", str(tiny_model_dir), "--quiet")
    assert (done.returncode, done.stderr) == (2, f"han-label: error: --out {queue}: cannot write in {full_disk} (No "
                                                 "space left on device)\n")  # before scoring the pool
    assert leftovers(full_disk) == []
    fill = full_disk / "fill"
    os.truncate(fill, fill.stat().st_size - 2 * 4096)  # room for the check, not for the queue and its config
    done = han_label("next", str(pool), "--n", "6", "--out", str(queue), "--model", str(tiny_model_dir), "--quiet")
    assert done.returncode == 2 and done.stderr.endswith(": cannot write (No space left on device)\n"), done.stderr
    assert leftovers(full_disk) == [] and "Traceback" not in done.stderr
    with open(fill, "ab") as f, contextlib.suppress(OSError):  # full again (a sparse extension takes no room)
        f.write(bytes(4 * 4096))
        f.flush()
    for name in ("labelled.jsonl", "labelled.parquet"):
        done = han_label("import", str(_export(tmp_path)), str(full_disk / name), "--model", str(tiny_model_dir))
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines()[-1] == f"han-label: error: OUT {full_disk}/{name}: cannot write in " \
                                               f"{full_disk} (No space left on device)", done.stderr
        assert "Traceback" not in done.stderr and leftovers(full_disk) == []
