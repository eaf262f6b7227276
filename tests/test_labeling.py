"""han-label: the query strategies, `next`'s files, `import`'s reading of Label Studio's exports, and
the one-line errors, run as a user runs them (the command, a real model, real files)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from labeling.strategies import choose, margins
from tests.tiny_model import read_jsonl

REPO = Path(__file__).resolve().parent.parent


def han_label(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"BENTOML_DO_NOT_TRACK": "true", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "labeling.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


# -- strategies --------------------------------------------------------------------------------------
def test_uncertainty_chooses_the_smallest_margins_and_random_is_reproducible() -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet([1, 1, 1], size=500)
    picked = choose("uncertainty", 20, probs)
    m = margins(probs)
    assert sorted(m[picked]) == sorted(np.sort(m)[:20])
    assert list(choose("random", 20, probs, seed=3)) == list(choose("random", 20, probs, seed=3))
    assert list(choose("random", 20, probs, seed=3)) != list(choose("random", 20, probs, seed=4))
    with pytest.raises(ValueError, match="fewer than the 501"):
        choose("uncertainty", 501, probs)
    vectors = rng.normal(size=(500, 4)).astype(np.float32)
    for strategy in ("uncertainty", "diverse", "random"):  # han-label's holdout may leave the strategy none
        assert choose(strategy, 0, probs, vectors).tolist() == []


def test_diverse_chooses_uncertain_documents_from_different_clusters() -> None:
    rng = np.random.default_rng(1)
    # 4 tight clusters of 10 uncertain documents (the 4 x 10 candidates), and certain ones: 4 choices
    # cover the 4 clusters, where the 4 least certain would all come from the first.
    centres = rng.normal(size=(4, 8)) * 10
    vectors = np.concatenate([c + rng.normal(size=(10, 8)) * 0.1 for c in centres] + [rng.normal(size=(300, 8))])
    probs = np.concatenate([np.tile([0.5, 0.5], (10, 1)), np.tile([0.52, 0.48], (30, 1)),
                            np.tile([0.99, 0.01], (300, 1))])
    assert {int(p) // 10 for p in choose("uncertainty", 4, probs)} == {0}
    picked = choose("diverse", 4, probs, vectors.astype(np.float32))
    assert len(set(picked)) == 4 and all(p < 40 for p in picked)
    assert {int(p) // 10 for p in picked} == {0, 1, 2, 3}


def test_multi_label_uncertainty_reads_each_label_against_the_threshold() -> None:
    probs = np.array([[0.9, 0.1], [0.55, 0.02], [0.98, 0.99], [0.4, 0.2]])
    assert list(choose("uncertainty", 2, probs, multi_label=True, threshold=0.5)) == [1, 3]


# -- next ----------------------------------------------------------------------------------------------
@pytest.fixture()
def pool(tmp_path: Path) -> Path:
    rows = read_jsonl("reviews.jsonl")
    for k, row in enumerate(rows):
        if k >= 4:
            row["label"] = None  # the first four are labelled: never chosen
    path = tmp_path / "pool.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_next_writes_label_studio_tasks_with_the_models_label_and_top_sentences(
    pool: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "queue.json"
    done = han_label("next", str(pool), "--n", "6", "--out", str(out), "--model", str(tiny_model_dir),
                     "--holdout", "0")
    assert done.returncode == 0, done.stderr
    tasks = json.loads(out.read_text())
    config = (tmp_path / "queue.label-config.xml").read_text()
    assert '<Choice value="neg"/>' in config and '<Choice value="pos"/>' in config and 'name="evidence"' in config
    assert len(tasks) == 6
    ids = [t["data"]["doc_id"] for t in tasks]
    assert len(set(ids)) == 6 and not {"r00", "r01", "r02", "r03"} & set(ids)
    for t in tasks:
        (prediction,) = t["predictions"]
        assert prediction["model_version"] == str(tiny_model_dir)
        choice = [r for r in prediction["result"] if r["type"] == "choices"]
        assert choice[0]["value"]["choices"][0] in ("neg", "pos")
        spans = [r["value"] for r in prediction["result"] if r["type"] == "labels"]
        assert 1 <= len(spans) <= 3
        for span in spans:  # each highlight is the document's own sentence, where it stands
            assert t["data"]["text"][span["start"]: span["end"]] == span["text"]
    margins_ = [t["data"]["margin"] for t in tasks]
    assert margins_ == sorted(margins_)  # the least certain first
    # The six least certain of the unlabelled: the pool scored by the one inference path, by hand.
    from han import Pipeline

    rows = [r for r in read_jsonl("reviews.jsonl")][4:]
    scored = Pipeline.from_directory(tiny_model_dir)([r["text"] for r in rows])
    by_margin = sorted(range(len(rows)), key=lambda k: abs(scored[k].scores["pos"] - scored[k].scores["neg"]))
    assert set(ids) == {rows[k]["id"] for k in by_margin[:6]}


def test_next_leaves_out_what_is_labelled_and_writes_json_lines(pool: Path, tiny_model_dir: Path,
                                                                tmp_path: Path) -> None:
    labelled = tmp_path / "labelled.jsonl"
    rows = read_jsonl("reviews.jsonl")
    labelled.write_text("".join(json.dumps({"id": f"other-{k}", "text": r["text"], "label": r["label"]}) + "\n"
                                for k, r in enumerate(rows[4:24])))  # known by their text, not their id
    out = tmp_path / "queue.jsonl"
    done = han_label("next", str(pool), "--n", "8", "--out", str(out), "--model", str(tiny_model_dir),
                     "--labelled", str(labelled), "--strategy", "random")
    assert done.returncode == 0, done.stderr
    chosen = [json.loads(line) for line in out.read_text().splitlines()]
    assert {c["id"] for c in chosen} == {r["id"] for r in rows[24:]}
    assert all(c["label"] in ("neg", "pos") and c["top_sentences"] for c in chosen)
    again = han_label("next", str(pool), "--n", "9", "--out", str(out), "--model", str(tiny_model_dir),
                      "--labelled", str(labelled))
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1] == (
        f"han-label: error: {pool}: 8 unlabelled documents, fewer than --n 9")
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()  # as any file the user writes, not mkstemp's 0600
    # an --out that is one of the inputs is refused before anything is read, and the input is kept whole
    for target, what in ((labelled, "a --labelled file"), (pool, "the pool")):
        before = target.read_bytes()
        clash = han_label("next", str(pool), "--n", "2", "--out", str(target), "--model", str(tiny_model_dir),
                          "--labelled", str(labelled))
        assert clash.returncode == 2 and clash.stderr.strip().splitlines()[-1] == (
            f"han-label: error: --out {target}: is {what}; writing there would overwrite it: choose another file")
        assert target.read_bytes() == before
    # an --out no file can be made in is refused before the pool is scored, in one line
    nowhere = han_label("next", str(pool), "--n", "2", "--out", "/proc/queue.jsonl", "--model", str(tiny_model_dir))
    assert nowhere.returncode == 2 and nowhere.stderr.strip().splitlines() == [
        "han-label: error: --out /proc/queue.jsonl: cannot write in /proc (No such file or directory)"]


def test_next_reads_a_labelled_file_by_its_text_column_when_the_pool_has_another(
    pool: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """han-label import writes a text column; a pool read with --text-column body still leaves its rows out
    (and a holdout of all N, 0.9 of 3, leaves the strategy none to choose)."""
    rows = [json.loads(line) for line in pool.read_text().splitlines()]
    body = tmp_path / "body.jsonl"
    body.write_text("".join(json.dumps({"id": r["id"], "body": r["text"]}) + "\n" for r in rows))
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text("".join(json.dumps({"id": r["id"], "text": r["text"], "label": "pos"}) + "\n"
                                for r in rows[:-3]))
    out = tmp_path / "queue.jsonl"
    done = han_label("next", str(body), "--text-column", "body", "--n", "3", "--out", str(out),
                     "--model", str(tiny_model_dir), "--labelled", str(labelled), "--holdout", "0.9")
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == sorted(r["id"] for r in rows[-3:])


def test_next_chooses_each_text_once(pool: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in pool.read_text().splitlines()]
    copies = [dict(rows[5], id=f"copy-{k}") for k in range(2)]  # one unlabelled review, three times
    pooled = tmp_path / "copies.jsonl"
    pooled.write_text("".join(json.dumps(r) + "\n" for r in rows + copies + [{"id": "blank", "text": "   "}]))
    out = tmp_path / "queue.jsonl"
    unique = len(rows) - 4  # the first four are labelled
    done = han_label("next", str(pooled), "--n", str(unique), "--out", str(out), "--model", str(tiny_model_dir),
                     "--strategy", "random", "--holdout", "0")
    assert done.returncode == 0, done.stderr
    assert f"han-label: {pooled}: 2 rows repeat an earlier row's text: left out" in done.stderr
    # rows are numbered from 0, as han-train's and han-score's are (and as row-N ids are)
    assert f"han-label: {pooled}: row {len(rows) + 2} (blank): left out:" in done.stderr
    chosen = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(chosen) == sorted(r["id"] for r in rows[4:])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_next_holds_out_a_random_share_that_import_keeps_and_the_fit_validates_on(
        pool: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    from han import Pipeline
    from training.data import HANDataModule

    queue = tmp_path / "queue.json"
    done = han_label("next", str(pool), "--n", "12", "--holdout", "0.25", "--out", str(queue), "--model",
                     str(tiny_model_dir))
    assert done.returncode == 0, done.stderr
    tasks = json.loads(queue.read_text())
    held = {t["data"]["doc_id"] for t in tasks if t["data"].get("split") == "validation"}
    chosen = {t["data"]["doc_id"] for t in tasks} - held
    assert len(tasks) == 12 and len(held) == 3
    # nine by the strategy (the least certain), three drawn at random from the rest
    rows = read_jsonl("reviews.jsonl")[4:]
    scored = Pipeline.from_directory(tiny_model_dir)([r["text"] for r in rows])
    by_margin = sorted(range(len(rows)), key=lambda k: abs(scored[k].scores["pos"] - scored[k].scores["neg"]))
    assert chosen == {rows[k]["id"] for k in by_margin[:9]}
    # annotated and exported, the mark survives the import, in JSON Lines and in CSV
    truth = {r["id"]: r["label"] for r in rows}
    for t in tasks:
        t["annotations"] = [{"result": _choice(truth[t["data"]["doc_id"]])}]
    export = tmp_path / "export.json"
    export.write_text(json.dumps(tasks))
    labelled, table = tmp_path / "labelled.jsonl", tmp_path / "labelled.csv"
    for out in (labelled, table):
        assert han_label("import", str(export), str(out), "--model", str(tiny_model_dir)).returncode == 0
    got = [json.loads(line) for line in labelled.read_text().splitlines()]
    assert {r["id"] for r in got if r["split"] == "validation"} == held
    with table.open(newline="") as f:
        assert {r["id"] for r in csv.DictReader(f) if r["split"] == "validation"} == held
    # han-train fit's data: the marked rows are the validation split, the others train
    data = HANDataModule(train=str(labelled), cache_dir=str(tmp_path / "cache"))
    data.setup()
    texts = {r["id"]: r["text"] for r in got}
    assert sorted(data.texts("validation")) == sorted(texts[i] for i in held)
    assert sorted(data.texts("train")) == sorted(texts[i] for i in chosen)


@pytest.mark.parametrize(("content", "message"), [
    ("", "the pool is empty (an empty file)"),
    ('{"id": "a", "text": "Good.", "label": "pos"}\n',
     "all 1 of its documents are labelled already: nothing to choose"),
    ('{"id": "a", "body": "Good."}\n', "no column 'text' (columns: id, body): see --text-column"),
])
def test_next_refuses_a_pool_it_cannot_choose_from_in_one_line(content: str, message: str, tiny_model_dir: Path,
                                                                tmp_path: Path) -> None:
    source = tmp_path / "pool.jsonl"
    source.write_text(content)
    out = tmp_path / "queue.json"
    done = han_label("next", str(source), "--n", "1", "--out", str(out), "--model", str(tiny_model_dir))
    assert done.returncode == 2
    assert done.stderr == f"han-label: error: {source}: {message}\n"  # one line, and nothing else
    assert not out.exists() and not list(tmp_path.glob("*.xml"))


@pytest.mark.parametrize("pool", ["han-label's scorers", "han-score's workers"])
def test_workers_stopped_at_once_leave_no_thread_for_the_exit_hook(pool: str, tiny_model_dir: Path) -> None:
    """An error just after the workers start (a pool with nothing to choose) stops them at once. The
    executor's manager thread must be gone when close() returns: Python 3.11's exit hook writes to its
    wake-up pipe without a lock, and a thread closing that pipe meanwhile prints an OSError traceback
    after the one-line error (seen once in CI)."""
    from labeling.pool import Scorers
    from scoring.score import ScoringOptions
    from scoring.workers import Workers

    if pool == "han-label's scorers":
        scorers = Scorers(1)
        manager = scorers.executor._executor_manager_thread
        scorers.close(abandon=True)
    else:
        workers = Workers(1)
        workers.configure(str(tiny_model_dir), ScoringOptions())
        workers.submit(0, ["Good."] * 50)
        manager = workers.executor._executor_manager_thread
        workers.close()
    assert manager is not None and not manager.is_alive()


def test_an_unknown_model_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "pool.jsonl"
    source.write_text('{"id": "a", "text": "Good."}\n')
    out = tmp_path / "queue.json"
    for command in (["next", str(source), "--n", "1", "--out", str(out)],
                    ["import", str(source), str(tmp_path / "labelled.jsonl")]):
        done = han_label(*command, "--model", "han-nope:v1")
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [
            "han-label: error: no model directory or BentoML model named 'han-nope:v1' "
            "(train one with `han-train fit`, or see `bentoml models list`)"]
        assert not out.exists() and not (tmp_path / "labelled.jsonl").exists()


# -- import --------------------------------------------------------------------------------------------
def _choice(*labels: str) -> list[dict]:
    return [{"from_name": "label", "to_name": "text", "type": "choices", "value": {"choices": list(labels)}}]


def _export(tmp_path: Path) -> Path:
    tasks = [
        {"id": 1, "data": {"text": "Great fun.", "doc_id": "d1"}, "annotations": [{"result": _choice("pos")}]},
        {"id": 2, "data": {"text": "Dull.", "doc_id": "d2"}, "annotations": [{"result": _choice("neg")},
                                                                            {"result": _choice("neg")}]},
        {"id": 3, "data": {"text": "Hmm.", "doc_id": "d3"}, "annotations": [{"was_cancelled": True, "result": []}]},
        {"id": 4, "data": {"text": "Mixed.", "doc_id": "d4"}, "annotations": [{"result": _choice("pos")},
                                                                             {"result": _choice("neg")}]},
        {"id": 5, "data": {"text": "So-so.", "doc_id": "d5"}, "annotations": [{"result": _choice("meh")}]},
        {"id": 6, "data": {"text": "Unseen.", "doc_id": "d6"}, "annotations": []},
        # d1 and d2 imported twice: one document each, its tasks' annotations pooled (d2's then disagree)
        {"id": 7, "data": {"text": "Great fun.", "doc_id": "d1"}, "annotations": [{"result": _choice("pos")}]},
        {"id": 8, "data": {"text": "Dull.", "doc_id": "d2"}, "annotations": [{"result": _choice("pos")}]},
    ]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(tasks))
    return path


def test_import_reads_the_json_export_and_reports_each_task_left_out(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "labelled.jsonl"
    export = _export(tmp_path)
    done = han_label("import", str(export), str(out), "--model", str(tiny_model_dir))
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"id": "d1", "text": "Great fun.", "label": "pos"}]
    lines = done.stderr.strip().splitlines()
    assert lines[:5] == [
        f"han-label: {export}: task 2 (document d2): left out: its annotators disagree (neg; pos)",
        f"han-label: {export}: task 3 (document d3): skipped: no annotation (the annotator skipped it)",
        f"han-label: {export}: task 4 (document d4): left out: its annotators disagree (neg; pos)",
        f"han-label: {export}: task 5 (document d5): left out: label 'meh' is not one of the model's",
        f"han-label: {export}: task 6 (document d6): skipped: no annotation",
    ]
    assert lines[5] == f"han-label: 1 labelled documents -> {out}; 5 tasks left out (listed above)"


def test_import_reads_the_choices_of_a_project_with_its_own_labelling_config(tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    """Tasks imported into a project whose Choices tag has another name: its one choices result is the label
    (and the highlighted sentences, a labels result, are not)."""
    own = [{"from_name": "sentiment", "to_name": "text", "type": "choices", "value": {"choices": ["neg"]}},
           {"from_name": "evidence", "to_name": "text", "type": "labels",
            "value": {"start": 0, "end": 5, "labels": ["evidence"]}}]
    two = [{**own[0], "from_name": "tone"}, {**own[0], "from_name": "mood", "value": {"choices": ["pos"]}}]
    export = tmp_path / "export.json"
    export.write_text(json.dumps([
        {"id": 1, "data": {"text": "Dull.", "doc_id": "d1"}, "annotations": [{"result": own}]},
        {"id": 2, "data": {"text": "Odd.", "doc_id": "d2"}, "annotations": [{"result": two}]}]))
    out = tmp_path / "labelled.jsonl"
    done = han_label("import", str(export), str(out), "--model", str(tiny_model_dir))
    assert done.returncode == 0, done.stderr
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert got == [{"id": "d1", "text": "Dull.", "label": "neg"}]
    assert f"han-label: {export}: task 2 (document d2): skipped: no annotation" in done.stderr  # which of two tags?


def test_import_reads_json_min_and_csv_exports(tiny_model_dir: Path, tmp_path: Path) -> None:
    minimal = tmp_path / "min.json"
    minimal.write_text(json.dumps([
        {"id": 7, "text": "Great fun.", "doc_id": "d1", "label": "pos", "annotator": 1},
        {"id": 8, "text": "Dull.", "doc_id": "d2", "label": "neg", "annotator": 1}]))
    table = tmp_path / "export.csv"
    with table.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "text", "doc_id", "label", "annotator"])
        w.writeheader()
        w.writerows([{"id": 7, "text": "Great, fun.\nReally.", "doc_id": "d1", "label": "pos", "annotator": 1},
                     {"id": 8, "text": "Dull.", "doc_id": "d2", "label": "", "annotator": 1}])
    out = tmp_path / "a.jsonl"
    assert han_label("import", str(minimal), str(out), "--model", str(tiny_model_dir)).returncode == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["d1", "d2"]
    csv_out = tmp_path / "b.csv"
    done = han_label("import", str(table), str(csv_out), "--model", str(tiny_model_dir))
    assert done.returncode == 0, done.stderr
    with csv_out.open(newline="") as f:
        assert list(csv.DictReader(f)) == [{"id": "d1", "text": "Great, fun.\nReally.", "label": "pos"}]
    assert f"han-label: {table}: task 8 (document d2): skipped: no annotation" in done.stderr
    # saved again from a spreadsheet or an editor: a byte-order mark before the first column's name
    from labeling.cli import main

    for export in (table, minimal):
        export.write_bytes(b"\xef\xbb\xbf" + export.read_bytes())
        assert main(["import", str(export), str(tmp_path / f"bom-{export.stem}.jsonl"), "--model",
                     str(tiny_model_dir)]) == 0
        assert "d1" in (tmp_path / f"bom-{export.stem}.jsonl").read_text()


def test_import_reads_a_multi_label_annotation_with_no_label_as_labels_none(tiny_model_dir: Path,
                                                                           tmp_path: Path) -> None:
    """An annotator of a multi-label project who submits no choice says "none of these topics": labels [],
    which han-train reads, not "skipped" (the document came back in the next round's queue). The three
    exports as Label Studio writes them (its converter: JSON-min and CSV have a record per annotation, a
    task never annotated has one with annotation_id null, a cancelled one none). A single-label model's
    document needs a label: there it stays left out, one line."""
    from tests.tiny_model import train_tiny_model

    multi = train_tiny_model(multi_label=True, steps=1)[0].save(tmp_path / "multi")
    span = [{"from_name": "evidence", "to_name": "text", "type": "labels",
             "value": {"start": 0, "end": 4, "text": "Oil.", "labels": ["evidence"]}}]
    tasks = [
        {"id": 1, "data": {"text": "Oil.", "doc_id": "d1"}, "annotations": [{"id": 11, "result": []}]},
        {"id": 2, "data": {"text": "Wheat.", "doc_id": "d2"}, "annotations": [{"id": 12, "result": span}]},
        {"id": 3, "data": {"text": "Both.", "doc_id": "d3"}, "annotations": [{"id": 13, "result": _choice(
            "crude", "grain")}]},
        {"id": 4, "data": {"text": "Unseen.", "doc_id": "d4"}, "annotations": []},
        {"id": 5, "data": {"text": "Hmm.", "doc_id": "d5"}, "annotations": [{"id": 15, "result": [],
                                                                            "was_cancelled": True}]},
        {"id": 6, "data": {"text": "Mixed.", "doc_id": "d6"}, "annotations": [{"id": 16, "result": []},
                                                                             {"id": 17, "result": _choice("crude")}]},
    ]
    full = tmp_path / "export.json"
    full.write_text(json.dumps(tasks))
    records = [  # JSON-min: the data flattened, the task's number in id, the choice(s) under label where chosen
        {"id": 1, "text": "Oil.", "doc_id": "d1", "annotator": 1, "annotation_id": 11},
        {"id": 2, "text": "Wheat.", "doc_id": "d2", "evidence": [span[0]["value"]], "annotator": 1,
         "annotation_id": 12},
        {"id": 3, "text": "Both.", "doc_id": "d3", "label": {"choices": ["crude", "grain"]}, "annotator": 1,
         "annotation_id": 13},
        {"id": 4, "text": "Unseen.", "doc_id": "d4", "annotator": None, "annotation_id": None},
        {"id": 6, "text": "Mixed.", "doc_id": "d6", "annotator": 1, "annotation_id": 16},
        {"id": 6, "text": "Mixed.", "doc_id": "d6", "label": "crude", "annotator": 1, "annotation_id": 17}]
    minimal = tmp_path / "export-min.json"
    minimal.write_text(json.dumps(records))
    table = tmp_path / "export.csv"  # CSV: the same, every column in every row, a list as JSON, null empty
    with table.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["annotation_id", "annotator", "doc_id", "evidence", "id", "label", "text"],
                           quoting=csv.QUOTE_NONNUMERIC)
        w.writeheader()
        w.writerows({k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in r.items()} for r in records)
    for export in (full, minimal, table):
        out = tmp_path / f"{export.name}.jsonl"
        done = han_label("import", str(export), str(out), "--model", str(multi))
        assert done.returncode == 0, done.stderr
        assert [json.loads(line) for line in out.read_text().splitlines()] == [
            {"id": "d1", "text": "Oil.", "labels": []}, {"id": "d2", "text": "Wheat.", "labels": []},
            {"id": "d3", "text": "Both.", "labels": ["crude", "grain"]}], export
        skipped = [f"han-label: {export}: task 5 (document d5): skipped: no annotation (the annotator skipped it)"]
        assert done.stderr.splitlines()[:-1] == [
            f"han-label: {export}: task 4 (document d4): skipped: no annotation",
            *(skipped if export == full else []),  # JSON-min and CSV leave a cancelled annotation out
            f"han-label: {export}: task 6 (document d6): left out: its annotators disagree (no label; crude)"]
    # a single-label model: a document with no label cannot be a training row
    single = tmp_path / "single.json"
    single.write_text(json.dumps([{"id": 1, "data": {"text": "Fine.", "doc_id": "s1"},
                                   "annotations": [{"id": 21, "result": _choice("pos")}]},
                                  {"id": 2, "data": {"text": "Odd.", "doc_id": "s2"},
                                   "annotations": [{"id": 22, "result": []}]}]))
    out = tmp_path / "single.jsonl"
    done = han_label("import", str(single), str(out), "--model", str(tiny_model_dir))
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"id": "s1", "text": "Fine.", "label": "pos"}]
    assert done.stderr.splitlines()[0] == f"han-label: {single}: task 2 (document s2): skipped: no annotation"


def test_next_from_a_log_whose_service_keeps_its_feedback_elsewhere_is_one_line(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The service records feedback in PostgreSQL and han-label runs in a shell without the URL: one line
    naming the store (a traceback before), as han-model's commands say it."""
    from model_store.production import note_feedback_store

    monkeypatch.setenv("BENTOML_HOME", str(tmp_path / "bentoml"))
    monkeypatch.delenv("HAN_FEEDBACK_STORE", raising=False)
    from labeling.cli import main

    note_feedback_store("han-elsewhere", "postgresql://svc:***@db:5432/han")
    assert main(["next", "log:han-elsewhere", "--n", "2", "--out", str(tmp_path / "q.jsonl"), "--model",
                 str(tiny_model_dir), "--workers", "1", "--quiet"]) == 2  # in this process: its error is the point
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("han-label: error: log:han-elsewhere: the service records "
                                                    "han-elsewhere's feedback in postgresql://svc:***@db:5432/han")
    assert "--store URL" in err


def test_next_reads_a_csv_pools_cells_as_written(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Ids keep their leading zeros (as han-score's output has them), and a review that reads "NA" or
    "null" is a document, not a missing value."""
    pool = tmp_path / "pool.csv"
    rows = read_jsonl("reviews.jsonl")[:10]
    with pool.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        w.writerows([(f"{k:05d}", r["text"]) for k, r in enumerate(rows)] + [("00010", "NA"), ("00011", "null")])
    out = tmp_path / "queue.jsonl"
    done = han_label("next", str(pool), "--n", "12", "--holdout", "0", "--out", str(out), "--model",
                     str(tiny_model_dir), "--strategy", "random")
    assert done.returncode == 0, done.stderr
    assert "left out" not in done.stderr and "Converting" not in done.stderr, done.stderr
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == [f"{k:05d}" for k in range(12)]


@pytest.mark.parametrize(("content", "message"), [
    ('[{"id": 1,\n "data": }]', "line 2 column 10: not valid JSON (Expecting value)"),
    ('{"tasks": []}', "not a Label Studio export (a JSON list of tasks), but a JSON dict"),
    ('[{"id": 1, "text": "An apple.", "label": "fruit"}]', "its labels (fruit) are none of the model's (neg, pos): "
                                                          "an export of another project?"),
    ('[{"id": 1, "text": "caf\xff"}]', "not UTF-8 text (byte 23: invalid start byte); Label Studio exports UTF-8"),
    ('[{"id": 1, "data": {"body": "x"}, "annotations": []}]', "item 1: a task without data.text: not an export of "
                                                              "han-label's tasks"),
    ('[{"id": 1, "text": "Good.", "sentiment": "pos"}]', "no item has a 'label' field (fields: id, text, sentiment): "
                                                         "nothing is annotated, or the project's Choices tag has "
                                                         "another name (han-label next's label config names it "
                                                         "'label')"),
])
def test_import_refuses_a_bad_export_in_one_line_and_writes_nothing(content: str, message: str,
                                                                    tiny_model_dir: Path, tmp_path: Path) -> None:
    export = tmp_path / "export.json"
    export.write_bytes(content.encode("latin-1"))  # "\xff": a byte no UTF-8 text holds
    out = tmp_path / "labelled.jsonl"
    done = han_label("import", str(export), str(out), "--model", str(tiny_model_dir))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"han-label: error: {export}: {message}"]
    assert not out.exists() and not list(tmp_path.glob(".*tmp"))


def _spawned_workers(parent: int) -> list[str]:
    """The command lines of ``parent``'s live children that are spawned workers, read from /proc (psutil's
    ``children()`` also drops a child whose wall-clock start time reads earlier than its parent's, which
    a clock step between the two reads can cause; a just-forked child shows its parent's command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
            fields = stat[stat.rfind(b")") + 2:].split()
            if int(fields[1]) != parent or fields[0] == b"Z":
                continue
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if "resource_tracker" not in line:
            found.append(line)
    return found


def test_ctrl_c_while_the_workers_start_is_one_line(pool: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group; a scoring worker still importing must not print a
    KeyboardInterrupt traceback of its own (they are born ignoring it, as han-score's are)."""
    import signal
    import time

    env = os.environ | {"BENTOML_DO_NOT_TRACK": "true", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    out, big = tmp_path / "queue.jsonl", tmp_path / "big.jsonl"  # a pool that takes a while to score
    big.write_text("".join(json.dumps({"text": f"{r['text']} ({k})"}) + "\n"
                           for k in range(100) for r in read_jsonl("reviews.jsonl")))
    missed = []
    for _ in range(2):  # a second try only where the job ended (status 0) before this test saw a worker
        proc = subprocess.Popen(
            [sys.executable, "-m", "labeling.cli", "next", str(big), "--n", "2", "--out", str(out),
             "--model", str(tiny_model_dir), "--workers", "3"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a terminal's default disposition
        try:
            started, polls = time.monotonic(), 0
            while not _spawned_workers(proc.pid) and proc.poll() is None:  # the first is still importing
                assert time.monotonic() < started + 60, "no scoring worker within 60 s"
                polls += 1
                time.sleep(0.01)
            seen = proc.poll() is None
            if seen:
                os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends: to the whole process group
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if seen:
            break
        assert proc.returncode == 0, err  # ended by itself before a worker was seen: it must have succeeded
        missed.append(f"status 0 after {time.monotonic() - started:.1f} s, {polls} looks, no worker seen; "
                      f"stderr {err!r}")
        out.unlink(missing_ok=True)
    assert len(missed) < 2, missed
    assert proc.returncode == 130, err
    assert err == "han-label: interrupted; nothing written\n", err
    assert not out.exists()
