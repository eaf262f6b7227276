"""han-label with a real Label Studio: ``han-label next``'s tasks imported into a Label Studio server
(the PyPI package in a virtual environment of its own, tests/label_studio_server.py), their
pre-annotations read back as an annotator's editor gets them, annotations made through the API,
exported as JSON, JSON-min and CSV, read back by ``han-label import`` and trained on by ``han-train fit``.

Not in ``make test``: ``make test-label-studio``, which .ci/run runs too. The first run installs Label
Studio into ``~/.cache/han-tests/label-studio-1.23.2/`` (1.5 to 3 minutes on 2 cores: pip, and one
migration of its database); after that the module takes about a minute: the server starts in 5 s, the
rest is the session's tiny model, han-label and a two-epoch fit.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from han import SavedModel
from han.environment import apply_defaults
from tests.label_studio_server import LabelStudioServer
from tests.tiny_model import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.label_studio, pytest.mark.timeout(1800)]  # a first install: pip

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "data" / "configs" / "smoke.yaml"
HAN_LABEL = Path(sys.executable).parent / "han-label"
DOC_ID = "doc_id"  # the document's id in a task's data: JSON-min and CSV exports put Label Studio's task number in id
N = 6


@pytest.fixture(scope="module")
def label_studio() -> Iterator[LabelStudioServer]:
    server = LabelStudioServer.start()
    yield server
    server.stop()


def run(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = apply_defaults(dict(os.environ)) | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([str(a) for a in args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def test_han_label_tasks_round_trip_through_label_studio_and_train(
    label_studio: LabelStudioServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    saved = SavedModel.load(tiny_model_dir)
    reviews = read_jsonl("reviews.jsonl")
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in reviews))
    texts = {r["id"]: r["text"] for r in reviews}

    # han-label next: Label Studio tasks and the project's labelling config beside them.
    queue = tmp_path / "queue.json"
    chosen = run(HAN_LABEL, "next", pool, "--n", str(N), "--out", queue, "--model", tiny_model_dir, "--quiet")
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    tasks = json.loads(queue.read_text())
    config = (tmp_path / "queue.label-config.xml").read_text()
    assert len(tasks) == N and len({t["data"][DOC_ID] for t in tasks}) == N
    made = {t["data"][DOC_ID]: t for t in tasks}
    assert all(texts[doc] == t["data"]["text"] for doc, t in made.items())
    marked = {doc for doc, t in made.items() if t["data"].get("split") == "validation"}  # --holdout's tenth
    assert len(marked) == 1

    # Label Studio takes the config and the tasks; it validates every prediction against the config
    # (the server runs with prediction validation raising, so a malformed pre-annotation fails here).
    project = label_studio.create_project("han-label queue", config)
    parsed = label_studio.project(project)["parsed_label_config"]
    assert parsed["label"]["labels"] == saved.labels and parsed["label"]["type"] == "Choices"
    assert parsed["evidence"]["labels"] == ["evidence"] and parsed["evidence"]["type"] == "Labels"
    ids = label_studio.import_tasks(project, tasks)
    assert len(ids) == N

    # What an annotator's editor opens with: each task's prediction, its label chosen and its top
    # sentences highlighted where they are in the text.
    shown = {t["data"][DOC_ID]: t for t in label_studio.tasks(project)}
    assert set(shown) == set(made)
    for doc, task in shown.items():
        (prediction,) = task["predictions"]
        (expected,) = made[doc]["predictions"]
        assert prediction["model_version"] == expected["model_version"] and prediction["model_version"]
        assert prediction["score"] == pytest.approx(expected["score"]) and 0 <= prediction["score"] <= 1
        choices = [r for r in prediction["result"] if r["from_name"] == "label"]
        assert [r["value"]["choices"] for r in choices] == [expected["result"][0]["value"]["choices"]]
        assert set(choices[0]["value"]["choices"]) <= set(saved.labels)
        spans = [r["value"] for r in prediction["result"] if r["from_name"] == "evidence"]
        assert spans, f"{doc}: no sentence highlighted"
        assert spans == [r["value"] for r in expected["result"] if r["from_name"] == "evidence"]
        for span in spans:
            assert task["data"]["text"][span["start"]:span["end"]] == span["text"], span
            assert span["labels"] == ["evidence"]

    # Annotations through the API: one task skipped; one label changed (the one that leaves both labels
    # among the rest, so that the fit below has two classes); the others' predictions accepted as they are.
    order = [t["data"][DOC_ID] for t in tasks]
    skipped, kept = order[0], order[1:]
    predicted = {doc: shown[doc]["predictions"][0]["result"][0]["value"]["choices"][0] for doc in order}
    other = {saved.labels[0]: saved.labels[1], saved.labels[1]: saved.labels[0]}
    changed = next(doc for doc in kept
                   if len({other[predicted[d]] if d == doc else predicted[d] for d in kept}) == 2)
    expected_labels = {doc: other[predicted[doc]] if doc == changed else predicted[doc] for doc in kept}
    label_studio.annotate(shown[skipped]["id"], [], was_cancelled=True)
    for doc in kept:
        prediction = shown[doc]["predictions"][0]
        result = [dict(r) for r in prediction["result"]]
        if doc == changed:
            result[0] = {**result[0], "value": {"choices": [expected_labels[doc]]}}
            label_studio.annotate(shown[doc]["id"], result, lead_time=4.2)
        else:
            label_studio.annotate(shown[doc]["id"], result, parent_prediction=prediction["id"], lead_time=1.5)
    after = {t["data"][DOC_ID]: t for t in label_studio.tasks(project)}
    assert after[skipped]["cancelled_annotations"] == 1 and after[skipped]["total_annotations"] == 0
    assert all(after[doc]["total_annotations"] == 1 for doc in kept)

    # The three exports an annotator downloads. JSON has every annotated task, the skipped one with its
    # cancelled annotation; JSON-min and CSV leave a task whose only annotation was cancelled out.
    exports = {"JSON": tmp_path / "export.json", "JSON_MIN": tmp_path / "export-min.json",
               "CSV": tmp_path / "export.csv"}
    for kind, path in exports.items():
        path.write_bytes(label_studio.export(project, kind))
    full = json.loads(exports["JSON"].read_text())
    assert {t["data"][DOC_ID] for t in full} == set(order)
    assert len(json.loads(exports["JSON_MIN"].read_text())) == len(kept)
    assert len(list(csv.DictReader(io.StringIO(exports["CSV"].read_text())))) == len(kept)

    # han-label import: the annotated documents with their ids and labels; the skipped one left out,
    # and named on one line of stderr where the export still has it (JSON).
    for kind, path in exports.items():
        out = tmp_path / f"labelled-{kind.lower()}.jsonl"
        imported = run(HAN_LABEL, "import", path, out, "--model", tiny_model_dir)
        assert imported.returncode == 0, f"{kind}: {imported.stderr[-3000:]}"
        got = rows(out)
        assert {r["id"]: r["label"] for r in got} == expected_labels, kind
        assert all(r["text"] == texts[r["id"]] for r in got), kind
        assert {r["id"] for r in got if r.get("split") == "validation"} == marked - {skipped}, kind
        about_skipped = [line for line in imported.stderr.splitlines() if skipped in line]
        assert len(about_skipped) == (1 if kind == "JSON" else 0), f"{kind}: {imported.stderr}"

    # han-train fits on what the annotators labelled.
    root = tmp_path / "run"
    fit = run(sys.executable, "-m", "training.cli", "fit", "--config", SMOKE,
              "--data.train", tmp_path / "labelled-json.jsonl", "--data.test", "null",
              "--trainer.max_epochs", "2", "--export.faithfulness", "0",
              "--trainer.default_root_dir", root, "--data.cache_dir", tmp_path / "cache")
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert SavedModel.load(root / "model").labels == saved.labels
