"""han-label and the documents' ids: an id names one document, from the pool ``next`` reads to the export
``import`` reads back (a pool whose ids repeat for different texts is refused; an export whose tasks do is
reported task by task, never merged); ids of mixed JSON types are text. Run as a user runs them: the
command, a real model, real files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_labeling import _choice, han_label
from tests.tiny_model import read_jsonl


def test_next_refuses_a_pool_whose_id_names_two_texts_in_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Integer ids 0, 0, 1, 1, ... (the reviewer's pool): the tasks, the import and --labelled know a document
    by its id, and took one document for the other (60 labelled tasks became 6 rows)."""
    texts = [r["text"] for r in read_jsonl("reviews.jsonl")[:12]]
    pool = tmp_path / "pool.parquet"
    pq.write_table(pa.table({"id": [k // 2 for k in range(len(texts))], "text": texts}), pool)
    out = tmp_path / "queue.json"
    done = han_label("next", str(pool), "--n", "4", "--out", str(out), "--model", str(tiny_model_dir))
    assert done.returncode == 2
    assert done.stderr == (f"han-label: error: {pool}: id '0' names two different texts (rows 0 and 1): each id "
                           "must name one document (see --id-column; without an id column, ids are row-N)\n")
    assert not out.exists() and not list(tmp_path.glob("*.xml")) and not list(tmp_path.glob(".*tmp"))
    # a labelled row counts too: its id would leave the other text out of every round, unseen
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text("".join(json.dumps({"id": f"d{k}", "text": t, **({"label": "pos"} if k == 0 else {})}) + "\n"
                                for k, t in enumerate(texts)) + json.dumps({"id": "d0", "text": "Another."}) + "\n")
    done = han_label("next", str(labelled), "--n", "4", "--out", str(out), "--model", str(tiny_model_dir))
    assert done.returncode == 2 and done.stderr.startswith(
        f"han-label: error: {labelled}: id 'd0' names two different texts (rows 0 and 12): ")
    assert done.stderr.count("\n") == 1 and not out.exists()


def test_next_takes_an_id_repeated_on_the_same_text_as_one_document(tiny_model_dir: Path, tmp_path: Path) -> None:
    texts = [r["text"] for r in read_jsonl("reviews.jsonl")[:6]]
    pool = tmp_path / "pool.jsonl"
    ids = [f"d{k}" for k in range(6)] + ["d0", "d1"]  # d0 and d1 again, on their own texts
    rows = zip(ids, texts + texts[:2], strict=True)
    pool.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows))
    out = tmp_path / "queue.jsonl"
    done = han_label("next", str(pool), "--n", "6", "--holdout", "0", "--out", str(out), "--model",
                     str(tiny_model_dir), "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert f"han-label: {pool}: 2 rows repeat an earlier row's text: left out" in done.stderr
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == [f"d{k}" for k in range(6)]


def test_next_reads_json_lines_ids_of_mixed_types_as_text(tiny_model_dir: Path, tmp_path: Path) -> None:
    """1 and "A-2" in one id column (datasets reads it as Json): a traceback before; the ids as han-score's
    --id-column reads them, and --labelled files alike."""
    rows = read_jsonl("reviews.jsonl")[:6]
    ids = [1, "A-2", 3, "r-4", 5.5, 6]
    pool = tmp_path / "mixed.jsonl"
    pool.write_text("".join(json.dumps({"id": i, "text": r["text"]}) + "\n" for i, r in zip(ids, rows, strict=True)))
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text(json.dumps({"id": 3, "text": "Another text.", "label": "pos"}) + "\n"
                        + json.dumps({"id": "x", "text": "And another.", "label": "neg"}) + "\n")
    out = tmp_path / "queue.json"
    done = han_label("next", str(pool), "--n", "5", "--holdout", "0", "--out", str(out), "--model",
                     str(tiny_model_dir), "--labelled", str(labelled), "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    chosen = sorted(str(t["data"]["doc_id"]) for t in json.loads(out.read_text()))
    assert chosen == sorted(["1", "A-2", "r-4", "5.5", "6"])  # 3 is labelled (by its id, as text)


def test_next_from_a_log_with_an_id_answered_twice_and_documents_without_ids(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inference log: an id answered twice is one document (not two texts for one id), and documents
    the service logged without an id (id "", known by their text) are each a document: the one-text-per-id
    check leaves such a pool alone."""
    from dataclasses import dataclass, field

    from monitoring.inference_log import InferenceLog, LogSettings
    from monitoring.log_files import log_folder

    @dataclass
    class Result:
        label: str
        labels: list[str] = field(default_factory=list)
        scores: dict[str, float] = field(default_factory=dict)

    monkeypatch.setenv("BENTOML_HOME", str(tmp_path / "bentoml"))
    monkeypatch.delenv("HAN_FEEDBACK_STORE", raising=False)
    texts = [r["text"] for r in read_jsonl("reviews.jsonl")[:8]]
    log = InferenceLog("han-ids", LogSettings(), folder=log_folder("han-ids"))
    answer = Result("pos", ["pos"], {"neg": 0.4, "pos": 0.6})

    def write(request: str, ids: list[str], batch: list[str]) -> None:
        log.write(request, "han-ids:v1", "production", ids, batch, [answer] * len(ids), [(3, 0)] * len(ids))

    write("r1", ["a", "b", "c"], texts[:3])
    write("r2", ["a"], texts[:1])  # "a" answered again
    write("r3", ["", "", ""], texts[3:6])  # no ids: three documents known by their texts
    from labeling.cli import main

    out = tmp_path / "queue.jsonl"
    assert main(["next", "log:han-ids", "--n", "6", "--holdout", "0", "--out", str(out), "--model",
                 str(tiny_model_dir), "--workers", "1", "--quiet"]) == 0
    chosen = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(c["text"] for c in chosen) == sorted(texts[:6])
    assert sorted(c["id"] for c in chosen) == ["", "", "", "a", "b", "c"]


def test_import_reports_tasks_whose_id_names_another_text_and_keeps_their_labels(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """A queue made before the check (ids "0", "0", "1", "1"): each task is its own document, its label kept, and
    each task whose id an earlier task's other text has is one line; the same document imported twice
    still pools its annotations (and two that disagree are still reported)."""
    tasks = [
        {"id": 1, "data": {"text": "Great fun.", "doc_id": "0"}, "annotations": [{"result": _choice("pos")}]},
        {"id": 2, "data": {"text": "Dull.", "doc_id": "0"}, "annotations": [{"result": _choice("neg")}]},
        {"id": 3, "data": {"text": "Superb.", "doc_id": "1"}, "annotations": [{"result": _choice("pos")}]},
        {"id": 4, "data": {"text": "Awful.", "doc_id": "1"}, "annotations": [{"result": _choice("neg")}]},
        {"id": 5, "data": {"text": "Great fun.", "doc_id": "0"}, "annotations": [{"result": _choice("pos")}]},
        {"id": 6, "data": {"text": "Superb.", "doc_id": "1"}, "annotations": [{"result": _choice("neg")}]},
    ]
    full = tmp_path / "export.json"
    full.write_text(json.dumps(tasks))
    minimal = tmp_path / "export-min.json"  # JSON-min: a record per annotation, the task's number in id
    minimal.write_text(json.dumps([{"id": t["id"], **t["data"], "label": t["annotations"][0]["result"][0]["value"][
        "choices"][0], "annotation_id": 100 + t["id"]} for t in tasks]))
    for export in (full, minimal):
        out = tmp_path / f"{export.stem}.jsonl"
        done = han_label("import", str(export), str(out), "--model", str(tiny_model_dir))
        assert done.returncode == 0, done.stderr
        assert [json.loads(line) for line in out.read_text().splitlines()] == [
            {"id": "0", "text": "Great fun.", "label": "pos"}, {"id": "0", "text": "Dull.", "label": "neg"},
            {"id": "1", "text": "Awful.", "label": "neg"}]
        assert done.stderr.splitlines() == [
            f"han-label: {export}: task 3 (document 1): left out: its annotators disagree (neg; pos)",
            f"han-label: {export}: task 2 (document 0): its document id 0 is also task 1's, with another text: "
            "imported as a document of its own (each id should name one document: han-label next --labelled "
            "leaves documents out by id)",
            f"han-label: {export}: task 4 (document 1): its document id 1 is also task 3's, with another text: "
            "imported as a document of its own (each id should name one document: han-label next --labelled "
            "leaves documents out by id)",
            f"han-label: 3 labelled documents -> {out}; 1 tasks left out (listed above); 2 tasks share a "
            "document id with another text (listed above)"]
