"""han-score (scoring/): formats in and out, bad rows, sharding, kill -9 and --resume, parity.

Most runs call ``main([...])`` in this process with ``--workers 1`` (no worker process, fast);
the parity and kill tests run the real multi-process path, the kill test as a subprocess.
"""

from __future__ import annotations

import csv
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

from han import Pipeline, TopK
from han.environment import apply_defaults
from scoring.cli import main
from tests.tiny_model import read_jsonl

REPO = Path(__file__).resolve().parent.parent
ENV = apply_defaults(dict(os.environ))

# Rows that cannot be scored, and the reason each must be reported with.
BAD_ROWS = {
    3: (None, "missing"),
    7: ("", "empty"),
    11: ("   \n\t ", "empty"),
    17: ("<br /><br />", "no words"),
}


def reviews() -> list[dict]:
    return read_jsonl("reviews.jsonl")


def input_rows(copies: int = 1) -> list[dict]:
    """The fixture reviews (ids and texts), ``copies`` times with varied text, and the bad rows spliced in."""
    rows = []
    for c in range(copies):
        for r in reviews():
            rows.append({"id": f"{r['id']}-{c}", "text": r["text"] if c == 0 else f"{r['text']} Seen {c} times."})
    for index, (text, _) in BAD_ROWS.items():
        rows.insert(index, {"id": f"bad-{index}", "text": text})
    return rows


def write_input(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif path.suffix == ".csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "text"])
            for r in rows:
                writer.writerow([r["id"], r["text"]])  # None is written as an empty cell
    else:
        pq.write_table(pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}), path)
    return path


def read_output(path: Path) -> list[dict]:
    """Output rows as dicts with Python types, whatever the format."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    with open(path, newline="", encoding="utf-8") as f:
        out = []
        for rec in csv.DictReader(f):
            row: dict = {}
            for key, value in rec.items():
                if key == "row":
                    row[key] = int(value)
                elif key.startswith("score_"):
                    row[key] = float(value)
                elif key == "truncated":
                    assert value in ("True", "False")
                    row[key] = value == "True"
                elif key in ("labels", "top_sentences", "top_words", "top_ngrams"):
                    row[key] = json.loads(value)
                else:
                    row[key] = value
            out.append(row)
        return out


def read_errors(output: Path) -> list[dict]:
    path = output.with_name(output.name + ".errors.jsonl")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def score(input_path: Path, output: Path, model: Path, *extra: str) -> int:
    return main([str(input_path), str(output), "--model", str(model), "--quiet", *extra])


# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> dict[str, tuple[str, dict[str, float]]]:
    """What the pipeline itself says about each good input text: (label, scores)."""
    pipeline = Pipeline.from_directory(tiny_model_dir)
    texts = [r["text"] for r in input_rows(copies=2) if not r["id"].startswith("bad")]
    return {t: (p.label, p.scores) for t, p in zip(texts, pipeline(texts), strict=True)}


@pytest.mark.parametrize(
    ("in_suffix", "out_suffix"),
    [(i, o) for i in (".jsonl", ".csv", ".parquet") for o in (".parquet", ".jsonl", ".csv")],
)
def test_every_input_format_to_every_output_format(
    tmp_path: Path, tiny_model_dir: Path, reference: dict, in_suffix: str, out_suffix: str
) -> None:
    rows = input_rows()
    source = write_input(tmp_path / f"in{in_suffix}", rows)
    output = tmp_path / f"out{out_suffix}"
    assert score(source, output, tiny_model_dir, "--id-column", "id", "--workers", "1") == 0

    out = read_output(output)
    good = [(i, r) for i, r in enumerate(rows) if i not in BAD_ROWS]
    assert [o["row"] for o in out] == [i for i, _ in good], "one row per scorable input row, in input order"
    assert [str(o["id"]) for o in out] == [r["id"] for _, r in good]
    assert list(out[0]) == ["row", "id", "label", "score_neg", "score_pos", "truncated"]
    for o, (_, r) in zip(out, good, strict=True):
        label, scores = reference[r["text"]]
        assert o["label"] == label
        assert o["score_neg"] == pytest.approx(scores["neg"], abs=1e-6)
        assert o["score_pos"] == pytest.approx(scores["pos"], abs=1e-6)
        assert o["truncated"] is False

    errors = read_errors(output)
    assert [e["row"] for e in errors] == sorted(BAD_ROWS)
    assert [e["id"] for e in errors] == [f"bad-{i}" for i in sorted(BAD_ROWS)]
    for e in errors:
        expected = BAD_ROWS[e["row"]][1]
        if expected == "missing" and in_suffix == ".csv":
            expected = "empty"  # CSV has no null: a missing text is an empty cell
        assert expected in e["reason"], e


def test_a_column_named_id_is_the_id_unless_another_is_named(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The output's id is the document's id: --id-column's, else the input's column named id, else none."""
    rows = [{"id": f"doc-{i}", "key": i, "text": r["text"]} for i, r in enumerate(reviews()[:4])]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert score(source, tmp_path / "auto.jsonl", tiny_model_dir, "--workers", "1") == 0
    assert [o["id"] for o in read_output(tmp_path / "auto.jsonl")] == [r["id"] for r in rows]
    assert score(source, tmp_path / "key.jsonl", tiny_model_dir, "--id-column", "key", "--workers", "1") == 0
    assert [o["id"] for o in read_output(tmp_path / "key.jsonl")] == [r["key"] for r in rows]
    plain = write_input(tmp_path / "plain.parquet", [{"id": None, "text": r["text"]} for r in rows])
    pq.write_table(pq.read_table(plain).drop_columns(["id"]), plain)
    assert score(plain, tmp_path / "none.jsonl", tiny_model_dir, "--workers", "1") == 0
    assert "id" not in read_output(tmp_path / "none.jsonl")[0]


def test_texts_that_are_not_strings_are_reported_not_fatal(tmp_path: Path, tiny_model_dir: Path) -> None:
    source = tmp_path / "mixed.jsonl"
    lines = [
        '{"text": "A wonderful film."}',
        '{"text": 42}',
        '{"other": "no text key"}',
        '{"text": ["a", "b"]}',
        '{"text": "Dull and far too long."}',
    ]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "out.jsonl"
    assert score(source, output, tiny_model_dir, "--workers", "1") == 0
    assert [o["row"] for o in read_output(output)] == [0, 4]
    errors = {e["row"]: e["reason"] for e in read_errors(output)}
    assert errors == {
        1: "the document must be a string, not int",
        2: "the text is missing (null)",
        3: "the document must be a string, not list",
    }


def test_parity_with_the_pipeline_including_explanations(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Worker processes, small windows, other batches: still exactly what the pipeline says."""
    rows = [r for r in input_rows(copies=4) if not r["id"].startswith("bad")]
    source = write_input(tmp_path / "in.parquet", rows)
    output = tmp_path / "out.jsonl"
    assert (
        score(source, output, tiny_model_dir, "--explain", "--workers", "2", "--window", "16") == 0
    )
    out = read_output(output)
    predictions = Pipeline.from_directory(tiny_model_dir)([r["text"] for r in rows], explain=True)
    assert len(out) == len(rows) == len(predictions)
    for o, r, p in zip(out, rows, predictions, strict=True):
        assert o["label"] == p.label
        assert o["score_neg"] == pytest.approx(p.scores["neg"], abs=1e-6)
        assert o["score_pos"] == pytest.approx(p.scores["pos"], abs=1e-6)
        top = sorted(p.sentences, key=lambda s: s.weight, reverse=True)[:3]
        assert [(s["start"], s["end"]) for s in o["top_sentences"]] == [(s.start, s.end) for s in top]
        for s in o["top_sentences"]:
            assert s["text"] == r["text"][s["start"] : s["end"]]
        weights = [s["weight"] for s in o["top_sentences"]]
        assert weights == sorted(weights, reverse=True)
        words = sorted(
            ((s.weight * w.weight, w) for s in p.sentences for w in s.words), key=lambda pair: pair[0], reverse=True
        )[:5]
        assert len(o["top_words"]) == min(5, sum(len(s.words) for s in p.sentences))
        for got, (weight, _) in zip(o["top_words"], words, strict=True):
            # han-score rounds the product (0.5e-6); this product of two rounded weights is off by up to 1e-6.
            assert got["weight"] == pytest.approx(weight, abs=2e-6)
            assert got["text"] == r["text"][got["start"] : got["end"]]
        assert {(w["start"], w["end"]) for w in o["top_words"]} == {(w.start, w.end) for _, w in words}


def test_a_model_with_an_ngram_head_writes_its_ngrams_with_explain(tmp_path: Path, tiny_model_dir: Path) -> None:
    from han import SavedModel
    from tests.tiny_model import with_ngram_head

    model = with_ngram_head(SavedModel.load(tiny_model_dir), 0.3).save(tmp_path / "model")
    rows = input_rows()
    source = write_input(tmp_path / "in.jsonl", rows)
    pipeline = Pipeline.from_directory(model)
    expected = [p for p in pipeline([r["text"] for r in rows], explain=True, errors="return", top=TopK())
                if hasattr(p, "scores")]  # the bad rows go to the errors file
    for suffix in (".jsonl", ".parquet", ".csv"):
        output = tmp_path / f"out{suffix}"
        assert score(source, output, model, "--explain", "--workers", "1") == 0
        out = read_output(output)
        assert [o["score_pos"] for o in out] == pytest.approx([p.scores["pos"] for p in expected], abs=1e-6)
        assert [o["top_ngrams"] for o in out] == [[{"text": n.text, "weight": n.weight} for n in p.top_ngrams]
                                                 for p in expected]
    assert score(source, tmp_path / "plain.parquet", model, "--workers", "1") == 0
    assert "top_ngrams" not in pq.read_table(tmp_path / "plain.parquet").column_names


def test_explanations_are_the_same_in_every_output_format(tmp_path: Path, tiny_model_dir: Path) -> None:
    source = write_input(tmp_path / "in.jsonl", input_rows())
    outputs = {}
    for suffix in (".jsonl", ".parquet", ".csv"):
        output = tmp_path / f"out{suffix}"
        assert score(source, output, tiny_model_dir, "--explain", "--workers", "1", "--top-words", "2") == 0
        outputs[suffix] = read_output(output)
    first = outputs[".jsonl"]
    assert all(len(o["top_words"]) == 2 and 1 <= len(o["top_sentences"]) <= 3 for o in first)
    assert set(first[0]["top_sentences"][0]) == {"text", "start", "end", "weight"}
    for suffix in (".parquet", ".csv"):
        for a, b in zip(first, outputs[suffix], strict=True):
            assert a["top_sentences"] == b["top_sentences"] and a["top_words"] == b["top_words"]


def test_multi_label_model_writes_every_label_over_the_threshold(tmp_path: Path) -> None:
    from tests.tiny_model import train_tiny_model

    saved, _ = train_tiny_model(multi_label=True, steps=80)
    model = saved.save(tmp_path / "topics-model")
    rows = read_jsonl("topics.jsonl")
    source = write_input(tmp_path / "topics.jsonl", rows)
    output = tmp_path / "out.parquet"
    assert score(source, output, model, "--workers", "1", "--summary-json", str(tmp_path / "s.json")) == 0
    out = read_output(output)
    predictions = Pipeline(saved)([r["text"] for r in rows])
    assert [o["labels"] for o in out] == [p.labels for p in predictions]
    assert [o["label"] for o in out] == [p.label for p in predictions]
    assert {k for k in out[0] if k.startswith("score_")} == {f"score_{label}" for label in saved.labels}
    summary = json.loads((tmp_path / "s.json").read_text())
    expected_counts: dict[str, int] = {}
    for p in predictions:
        for label in p.labels:
            expected_counts[label] = expected_counts.get(label, 0) + 1
    assert summary["labels"] == dict(sorted(expected_counts.items()))


def test_shards_together_cover_every_row_exactly_once(tmp_path: Path, tiny_model_dir: Path) -> None:
    rows = input_rows(copies=2)
    source = write_input(tmp_path / "in.jsonl", rows)
    whole = tmp_path / "whole.parquet"
    assert score(source, whole, tiny_model_dir, "--workers", "1") == 0
    shards = 3
    seen_rows: list[int] = []
    seen_errors: list[int] = []
    for k in range(shards):
        out = tmp_path / f"shard-{k}.parquet"
        assert (
            score(
                source,
                out,
                tiny_model_dir,
                "--workers",
                "1",
                "--num-shards",
                str(shards),
                "--shard-index",
                str(k),
                "--chunk-size",
                "7",
            )
            == 0
        )
        got = [o["row"] for o in read_output(out)]
        assert got == sorted(got) and all(r % shards == k for r in got)
        seen_rows += got
        seen_errors += [e["row"] for e in read_errors(out)]
    assert sorted(seen_rows + seen_errors) == list(range(len(rows))), "every row exactly once"
    assert sorted(seen_errors) == sorted(BAD_ROWS)
    merged = sorted(
        (o for k in range(shards) for o in read_output(tmp_path / f"shard-{k}.parquet")), key=lambda o: o["row"]
    )
    assert_same_scores(merged, read_output(whole))


def assert_same_scores(got: list[dict], want: list[dict]) -> None:
    """Same rows, labels and scores (to float noise: batches of other sizes round differently)."""
    assert [o["row"] for o in got] == [o["row"] for o in want]
    for g, w in zip(got, want, strict=True):
        assert g["label"] == w["label"], (g, w)
        assert g["score_neg"] == pytest.approx(w["score_neg"], abs=1e-6)
        assert g["score_pos"] == pytest.approx(w["score_pos"], abs=1e-6)


def test_existing_output_is_never_silently_replaced(tmp_path: Path, tiny_model_dir: Path, capsys) -> None:
    source = write_input(tmp_path / "in.jsonl", input_rows())
    output = tmp_path / "out.csv"
    assert score(source, output, tiny_model_dir, "--workers", "1") == 0
    before = output.read_bytes()
    capsys.readouterr()
    assert score(source, output, tiny_model_dir, "--workers", "1") == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert score(source, output, tiny_model_dir, "--workers", "1", "--resume") == 0  # complete: nothing to do
    assert output.read_bytes() == before
    err = capsys.readouterr().err  # ... and it says that it did not score with this run's settings
    assert "already complete; nothing to resume" in err and "pass --overwrite to score it again" in err, err
    output.write_text("id,label\nnot,scored\n")  # what --overwrite replaces is not what it writes
    assert score(source, output, tiny_model_dir, "--workers", "1", "--overwrite") == 0
    assert output.read_bytes() == before  # a fresh scoring, as the first run wrote it


def test_summary_counts_rows_labels_and_failures(tmp_path: Path, tiny_model_dir: Path, capsys) -> None:
    rows = input_rows()
    source = write_input(tmp_path / "in.parquet", rows)
    output = tmp_path / "out.parquet"
    assert (
        main(
            [
                str(source),
                str(output),
                "--model",
                str(tiny_model_dir),
                "--workers",
                "1",
                "--summary-json",
                str(tmp_path / "s.json"),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    summary = json.loads((tmp_path / "s.json").read_text())
    labels = [o["label"] for o in read_output(output)]
    assert summary["rows_read"] == len(rows)
    assert summary["scored"] == len(rows) - len(BAD_ROWS)
    assert summary["failed"] == len(BAD_ROWS)
    assert summary["labels"] == {label: labels.count(label) for label in sorted(set(labels))}
    assert summary["wall_s"] > 0
    for text in ("rows read", "scored", "failed", "labels", "wall time", f"{len(BAD_ROWS)}"):
        assert text in err


def test_a_registered_bentoml_model_is_found_by_tag(tmp_path: Path, tiny_model_dir: Path, monkeypatch) -> None:
    import model_store
    from han import SavedModel

    tag = model_store.register(SavedModel.load(tiny_model_dir), "han-batch-test")
    source = write_input(tmp_path / "in.jsonl", input_rows())
    assert score(source, tmp_path / "a.jsonl", tag, "--workers", "1") == 0
    monkeypatch.setenv(model_store.production.MODEL_TAG_ENV, tag)  # the default model is $HAN_MODEL_TAG
    assert main([str(source), str(tmp_path / "b.jsonl"), "--quiet", "--workers", "1"]) == 0
    assert read_output(tmp_path / "a.jsonl") == read_output(tmp_path / "b.jsonl")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing input", "no such file"),
        ("not parquet", "cannot read"),
        ("broken json", "cannot read"),
        ("unknown type", "unsupported input type"),
        ("missing text column", "no column 'body'"),
        ("header only without the text column", "no column 'text'"),
        ("missing id column", "no column 'key'"),
        ("unknown model dir", "no model directory or BentoML model named"),
        ("unknown model tag", "no model directory or BentoML model named 'han-nope:latest'"),
        ("broken model dir", "config.json"),
        ("unknown output type", "unsupported output type"),
    ],
)
def test_unusable_input_or_model_stops_with_one_line(
    tmp_path: Path, tiny_model_dir: Path, capsys, case: str, expected: str
) -> None:
    source = write_input(tmp_path / "in.jsonl", input_rows())
    args = [str(source), str(tmp_path / "out.parquet"), "--model", str(tiny_model_dir), "--workers", "1"]
    if case == "missing input":
        args[0] = str(tmp_path / "nope.jsonl")
    elif case == "not parquet":
        (tmp_path / "bad.parquet").write_bytes(b"this is not parquet at all")
        args[0] = str(tmp_path / "bad.parquet")
    elif case == "broken json":
        (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
        args[0] = str(tmp_path / "bad.jsonl")
    elif case == "unknown type":
        (tmp_path / "in.txt").write_text("hello")
        args[0] = str(tmp_path / "in.txt")
    elif case == "missing text column":
        args += ["--text-column", "body"]
    elif case == "header only without the text column":
        (tmp_path / "header.csv").write_text("id,body\n")
        args[0] = str(tmp_path / "header.csv")
    elif case == "missing id column":
        args += ["--id-column", "key"]
    elif case == "unknown model dir":
        args[3] = str(tmp_path / "no-model-here")
    elif case == "unknown model tag":
        args[3] = "han-nope:latest"
    elif case == "broken model dir":
        broken = tmp_path / "broken-model"
        broken.mkdir()
        (broken / "config.json").write_text("{not json")
        args[3] = str(broken)
    elif case == "unknown output type":
        args[1] = str(tmp_path / "out.xlsx")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("han-score: error: "), err
    assert expected in err
    assert not (tmp_path / "out.parquet").exists() and not (tmp_path / "out.parquet.parts").exists()


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_outputs_and_shards_are_checked_before_overwrite_removes_anything(tmp_path: Path, tiny_model_dir: Path, capsys,
                                                               engine: str) -> None:
    """The output, its errors file and the summary are checked against the input before --overwrite removes
    anything (the Ray engine removed an output named as its input, the input with it)."""
    source = write_input(tmp_path / "in.jsonl", input_rows())
    before = source.read_bytes()
    alias = tmp_path / "x.jsonl.errors.jsonl"  # an input named as x.jsonl's errors file
    alias.write_bytes(before)
    cases = [([str(source), str(source)], "the output would overwrite the input"),
             ([str(alias), str(tmp_path / "x.jsonl")], "the output's errors file would overwrite the input"),
             ([str(source), str(tmp_path / "o.jsonl"), "--summary-json", str(source)],
              "--summary-json would overwrite"),
             ([str(source), str(tmp_path / "o.jsonl"), "--summary-json", str(tmp_path / "nope" / "s.json")],
              f"folder {tmp_path / 'nope'} does not exist"),
             ([str(source), str(tmp_path / "o.jsonl"), "--summary-json", str(tmp_path / "o.jsonl")],
              "is the output; writing the summary there would replace it"),
             ([str(source), str(tmp_path / "o.jsonl"), "--summary-json", str(tmp_path / "o.jsonl.errors.jsonl")],
              "is the output's errors file; writing the summary there")]
    cases.append(([str(source), str(tmp_path / "o.jsonl"), "--shard-index", "5"], "--shard-index must be below"))
    if engine == "local":  # the Ray engine writes a folder of parts
        (tmp_path / "dir.jsonl").mkdir()
        cases.append(([str(source), str(tmp_path / "dir.jsonl")], "is a folder; the output is a file"))
    for args, expected in cases:
        assert main([*args, "--model", str(tiny_model_dir), "--engine", engine, "--overwrite", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("han-score: error: ") and expected in err, err
    assert source.read_bytes() == before and alias.read_bytes() == before


def test_the_console_script_fails_without_a_traceback(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("han-score")
    if not script.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but the han-score console script is not installed (pip install -e .)")
        pytest.skip("han-score is not installed in this environment (pip install -e .)")
    source = write_input(tmp_path / "in.csv", input_rows())
    result = subprocess.run(
        [str(script), str(source), str(tmp_path / "o.csv"), "--model", "han-nope:latest"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("han-score: error: no model directory or BentoML model named 'han-nope:latest'")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# kill -9 and --resume


def wait_for_parts(manifest: Path, proc: subprocess.Popen, at_least: int, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "han-score finished before it could be killed: make the input bigger"
        try:
            data = json.loads(manifest.read_text())
        except (FileNotFoundError, ValueError):
            data = None
        if data and len(data["parts"]) >= at_least:
            return data
        time.sleep(0.01)
    raise AssertionError(f"no {at_least} committed parts after {timeout}s")


def kill_mid_run(cmd: list[str], manifest: Path, after_parts: int) -> None:
    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-m", "scoring", *cmd],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_parts(manifest, proc, after_parts)
        children = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"worker processes outlived their killed parent: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_kill_9_mid_run_then_resume_loses_and_duplicates_nothing(tmp_path: Path, tiny_model_dir: Path, capsys) -> None:
    rows = input_rows(copies=100)  # 3,204 rows
    source = write_input(tmp_path / "big.jsonl", rows)
    output = tmp_path / "out.parquet"
    manifest = tmp_path / "out.parquet.parts" / "manifest.json"
    cmd = [
        str(source),
        str(output),
        "--model",
        str(tiny_model_dir),
        "--id-column",
        "id",
        "--quiet",
        "--workers",
        "2",
        "--chunk-size",
        "40",
        "--window",
        "20",
    ]

    kill_mid_run(cmd, manifest, after_parts=3)
    state = json.loads(manifest.read_text())
    assert state["state"] == "running" and 0 < state["next_row"] < len(rows)
    assert not output.exists()

    # Without --resume, the partial output is neither reused nor silently thrown away.
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err and err.count("\n") == 1
    assert json.loads(manifest.read_text())["next_row"] == state["next_row"]

    # Killed again while resuming, then resumed to the end (the worker count is not part of the job).
    kill_mid_run([*cmd, "--resume"], manifest, after_parts=len(state["parts"]) + 3)
    assert main([*cmd, "--resume", "--workers", "1"]) == 0
    assert not manifest.parent.exists()

    out = read_output(output)
    errors = read_errors(output)
    assert [o["row"] for o in out] == [i for i in range(len(rows)) if i not in BAD_ROWS]
    assert [e["row"] for e in errors] == sorted(BAD_ROWS)
    assert [o["id"] for o in out] == [r["id"] for i, r in enumerate(rows) if i not in BAD_ROWS]

    # The same rows and scores as one uninterrupted run.
    clean = tmp_path / "clean.parquet"
    assert score(source, clean, tiny_model_dir, "--id-column", "id", "--workers", "1") == 0
    assert_same_scores(out, read_output(clean))


def test_resume_refuses_a_partial_run_with_other_settings(tmp_path: Path, tiny_model_dir: Path, capsys) -> None:
    source = write_input(tmp_path / "in.jsonl", input_rows(copies=3))
    output = tmp_path / "out.jsonl"
    parts = tmp_path / "out.jsonl.parts"
    # Leave a partial run behind: a manifest committing a chunk, as after a kill.
    from scoring.formats import Chunk, JsonLinesFormat, OutputSpec
    from scoring.partial import PartialOutput
    from scoring.score import ScoringOptions, score_texts

    partial = PartialOutput(output, JsonLinesFormat(OutputSpec(["neg", "pos"], False, False, False, False)))
    partial.lock()
    partial.start({"input": "something else"})
    chunk = Chunk(partial.fmt.spec)
    texts = [r["text"] for r in input_rows()[:2]]
    chunk.add([0, 1], [None, None], score_texts(Pipeline.from_directory(tiny_model_dir), texts,
                                                ScoringOptions(None, 3, 5)))
    partial.commit(chunk, 2, 0.0)
    partial.unlock()
    assert score(source, output, tiny_model_dir, "--workers", "1", "--resume") == 2
    err = capsys.readouterr().err
    assert f'other settings (input "something else" there, "{source.resolve()}" now; ' in err, err
    assert parts.exists()
    assert score(source, output, tiny_model_dir, "--workers", "1", "--overwrite") == 0
    assert not parts.exists() and len(read_output(output)) == 3 * 32


def test_the_scoring_function_is_the_pipeline_as_columns_bad_rows_included(tiny_model_dir: Path) -> None:
    """The one scoring function both engines call: the pipeline's results, as columns, errors apart."""
    from scoring.score import ScoringOptions, score_texts

    texts = ["A wonderful film. Superb acting.", None, "   ", 42, "Awful. I hated it.", "<br /><br />"]
    pipeline = Pipeline.from_directory(tiny_model_dir)
    for method in ("attention", "occlusion"):
        options = ScoringOptions(explain=method, top_sentences=2, top_words=3)
        scored = score_texts(pipeline, texts, options)
        expected = pipeline(texts, explain=method, errors="return", top=TopK(2, 3))
        assert scored.index == [0, 4]
        assert scored.errors == [(i, expected[i].reason) for i in (1, 2, 3, 5)]
        for k, i in enumerate(scored.index):
            r = expected[i]
            assert (scored.label[k], scored.labels[k], scored.truncated[k]) == (r.label, r.labels, r.truncated)
            assert scored.scores[k] == [r.scores[label] for label in pipeline.labels]
            assert scored.method[k] == method
            assert scored.top_sentences[k] == [
                {"text": s.text, "start": s.start, "end": s.end, "weight": s.weight} for s in r.top_sentences
            ]
            assert [(w["start"], w["end"], w["weight"]) for w in scored.top_words[k]] == [
                (w.start, w.end, w.weight) for w in r.top_words
            ]


def test_the_output_columns_are_named_after_the_result_fields() -> None:
    """han-score's columns (scoring.formats, their one declaration) keep the names of the service's
    result fields, so a user reads the same names in a response and in a scored file."""
    from dataclasses import fields

    from han import DocumentResult
    from scoring.formats import OutputSpec, ScoredWindow

    result_fields = [f.name for f in fields(DocumentResult)]
    spec = OutputSpec(["neg", "pos"], multi_label=True, has_id=True, id_is_int=False, explain=True, ngrams=True)
    named = [c for c in spec.columns() if c != "row" and not c.startswith("score_")]
    assert named == [f for f in result_fields if f not in ("scores", "sentences")]  # id first, as in a response
    assert set(named) - {"id"} | {"scores"} <= {f.name for f in fields(ScoredWindow)}  # the id is the input's
    assert [c for c in spec.columns() if c.startswith("score_")] == ["score_neg", "score_pos"]
    plain = OutputSpec(["neg", "pos"], multi_label=False, has_id=False, id_is_int=False, explain=False)
    assert plain.columns() == ["row", "label", "score_neg", "score_pos", "truncated"]


@pytest.mark.parametrize("how", ["a worker is killed", "Ctrl-C"])
def test_a_dead_worker_or_ctrl_c_stops_with_one_line_and_no_process_left(
    tmp_path: Path, tiny_model_dir: Path, how: str
) -> None:
    import psutil

    source = write_input(tmp_path / "big.jsonl", input_rows(copies=100))
    output = tmp_path / "out.parquet"
    cmd = [str(source), str(output), "--model", str(tiny_model_dir), "--quiet", "--workers", "2"]
    cmd += ["--chunk-size", "40", "--window", "20"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "scoring", *cmd],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # As from a terminal: Ctrl-C at its default disposition. An ignored SIGINT is inherited across
        # exec, and the test process's own disposition depends on what ran before it in the session.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_for_parts(tmp_path / "out.parquet.parts" / "manifest.json", proc, 1)
        children = psutil.Process(proc.pid).children(recursive=True)
        if how == "Ctrl-C":
            os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends: to the whole process group
        else:
            (worker,) = [c for c in children if "resource_tracker" not in " ".join(c.cmdline())]
            worker.kill()
        _, err = proc.communicate(timeout=60)
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"processes outlived the job: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if how == "Ctrl-C":
        assert proc.returncode == 130
        assert err.startswith("han-score: interrupted; committed chunks are kept in"), err
    else:
        assert proc.returncode == 1
        assert err.startswith("han-score: error: a scoring worker died"), err
        assert "--resume" in err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_han_score_parses_its_arguments_without_importing_torch_or_spacy() -> None:
    """The workers are spawned before the heavy imports, so that theirs overlap this process's; and
    --help or an early Ctrl-C must not wait for (or interrupt with a traceback) torch's import."""
    heavy = "{'torch', 'spacy', 'han.pipeline', 'han.model'}"  # han.methods (the method names) is light
    code = f"import sys; import scoring.cli as c; c.build_parser(); print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_flags_of_earlier_releases_work_with_a_one_line_warning(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch job written for an earlier release keeps running: --no-explain and --explain-method as
    they meant then, each with one warning line, the output as today's flags give it."""
    source = write_input(tmp_path / "in.jsonl", input_rows())
    cases = [  # (earlier flags, today's)
        (["--no-explain"], []),
        (["--explain", "--explain-method", "occlusion"], ["--explain=occlusion"]),
        (["--explain-method", "occlusion"], []),  # without --explain it explained nothing
    ]
    for k, (old, new) in enumerate(cases):
        capsys.readouterr()
        assert score(source, tmp_path / f"old{k}.jsonl", tiny_model_dir, *old, "--workers", "1", "--quiet") == 0
        warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
        flags = [f for f in old if f.startswith("--") and f != "--explain"]
        assert len(warnings) == len(flags) and all(
            w.startswith(f"han-score: warning: {f} is deprecated") for w, f in zip(warnings, flags, strict=True))
        if "--explain-method" in old:  # the fix it names gives the same output: no --explain, no explanation
            assert ("write --explain=occlusion" in warnings[0]) == ("--explain" in old), warnings[0]
        assert score(source, tmp_path / f"new{k}.jsonl", tiny_model_dir, *new, "--workers", "1", "--quiet") == 0
        assert read_output(tmp_path / f"old{k}.jsonl") == read_output(tmp_path / f"new{k}.jsonl")
    # an old flag beside a new one that says otherwise is an error, not settled silently
    for flags in (["--no-explain", "--explain"], ["--explain-method", "occlusion", "--explain=attention"]):
        with pytest.raises(SystemExit) as stopped:
            score(source, tmp_path / "clash.jsonl", tiny_model_dir, *flags, "--workers", "1", "--quiet")
        assert stopped.value.code == 2 and "contradict each other" in capsys.readouterr().err
        assert not (tmp_path / "clash.jsonl").exists()


def test_ctrl_c_while_waiting_on_the_workers_is_raised_once_the_futures_are_free() -> None:
    """han-score and han-label wait on their workers' futures with Ctrl-C held back: a KeyboardInterrupt
    raised inside concurrent.futures.wait, between two of the futures' locks, left one held and the job
    hung at exit. The signal (SIGALRM standing in for it, with the same handler) still stops the wait
    within its 0.25 s slices, and no future's lock is left held."""
    import threading
    import time
    from concurrent.futures import Future

    from scoring.workers import interrupt, wait_first

    futures: list[Future] = [Future() for _ in range(50)]
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            wait_first(futures, None)
        assert time.monotonic() - started < 1.5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    free: list[bool] = []

    def take_each() -> None:
        for f in futures:
            free.append(f._condition.acquire(timeout=1))
            f._condition.release()

    other = threading.Thread(target=take_each)
    other.start()
    other.join(60)
    assert free == [True] * len(futures)
    futures[0].set_result(1)  # and a result set meanwhile is seen at once
    assert wait_first(futures, None) == {futures[0]}
