"""han-model's way back without a server: ``export-log`` writes one label column for the model (a list
for a multi-label one) that han-train reads, shadow answers are paired with production's by request and
id, and a stored shadow comparison that finds the challenger worse makes ``promote`` refuse it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitoring.feedback_store import Feedback, Prediction, open_store
from registry import loop_commands
from registry.cli import main
from registry.shadow_commands import compare_pairs, paired_interval, shadow_comparison
from tests.service_server import REPO, base_env, register_model
from tests.tiny_model import read_jsonl, train_tiny_model, worse_model

NAME = "han-loop"


def _record(i: int, model: str, labels: list[str], scores: dict[str, float], text: str = "A film.",
            role: str = "production", request: str = "r1", doc: str | None = None) -> dict:
    return {"time": f"2026-11-27T12:{i // 60:02d}:{i % 60:02d}.000Z", "id": doc or f"d{i}", "request_id": request,
            "model": model, "role": role, "text": text, "words": 3, "oov": 0.0,
            "label": labels[0] if labels else max(scores, key=scores.__getitem__), "labels": labels,
            "scores": scores}


def _write_log(home: Path, records: list[dict], file: str = "20261127T120000000000-elsewhere-1") -> None:
    data = home / "deployments" / NAME / "log" / "data"
    data.mkdir(parents=True, exist_ok=True)
    with (data / f"{file}.jsonl").open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def _feedback(home: Path, records: list[dict], truth: dict[str, list[str]]) -> None:
    with open_store(None, home / "deployments" / NAME / "feedback.sqlite3") as store:
        for r in records:
            store.record_predictions(r["request_id"], r["model"], [Prediction(r["id"], r["labels"])], r["role"])
        store.add_feedback([Feedback(i, labels) for i, labels in truth.items()])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path / "bentoml"))
    monkeypatch.delenv(loop_commands.FEEDBACK_STORE_ENV, raising=False)
    return tmp_path / "bentoml"


def _single_label_log(home: Path) -> dict[str, str]:
    """The fixture reviews answered (wrongly every fourth), the first 24 with their labels as feedback: returned."""
    rows = read_jsonl("reviews.jsonl")
    answers = [{"neg": "pos", "pos": "neg"}[r["label"]] if i % 4 == 0 else r["label"] for i, r in enumerate(rows)]
    records = [_record(i, f"{NAME}:v1", [a], {"neg": 0.3, "pos": 0.7} if a == "pos" else {"neg": 0.8, "pos": 0.2},
                       r["text"]) for i, (a, r) in enumerate(zip(answers, rows, strict=True))]
    _write_log(home, records)
    truth = {r["id"]: row["label"] for r, row in list(zip(records, rows, strict=True))[:24]}
    _feedback(home, records, {i: [label] for i, label in truth.items()})
    return truth


def test_export_of_a_single_label_model_is_a_training_file(home: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from training.data import HANDataModule
    from training.sources import load_source

    truth = _single_label_log(home)
    labelled, everything = tmp_path / "labelled.jsonl", tmp_path / "all.parquet"
    assert main(["export-log", NAME, str(labelled), "--labelled-only"]) == 0
    assert main(["export-log", NAME, str(everything)]) == 0
    assert "label column: label" in capsys.readouterr().out
    train = load_source(str(labelled))
    assert "labels" not in train.column_names and len(train) == 24 and set(train["label"]) == {"neg", "pos"}
    # the label is the feedback's, not the model's answer (wrong on 6 of the 24), which stays in "predicted"
    exported = [json.loads(line) for line in labelled.read_text().splitlines()]
    assert {r["id"]: r["label"] for r in exported} == truth
    assert sum(r["predicted"] != r["label"] for r in exported) == 6
    rest = load_source(str(everything))
    assert len(rest) == 32 and rest["label"].count(None) == 8 and "labels" not in rest.column_names
    data = HANDataModule(train=str(labelled), unlabeled=str(everything), min_freq=1, val_fraction=0.25,
                         cache_dir=str(tmp_path / "cache"))
    data.setup()
    assert data.label_names == ["neg", "pos"] and len(data.unlabeled_keys()) == 32


def test_answers_logged_without_text_are_left_out_and_counted(home: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A log written partly with HAN_LOG_TEXT=0 (the setting changed between restarts): the documents with
    text are exported, the others counted in one line (for --labelled-only, those with feedback: the
    others would not be in the file anyway); a log with no text at all is one error."""
    _single_label_log(home)
    textless = {k: v for k, v in _record(40, f"{NAME}:v1", ["pos"], {"neg": 0.1, "pos": 0.9}).items() if k != "text"}
    answers = [textless | {"text_sha256": "0" * 64}, textless | {"id": "d41", "text_sha256": "1" * 64},
               textless | {"id": "d42", "text_sha256": "2" * 64, "request_id": "r2"},
               _record(43, f"{NAME}:v1", ["pos"], {"neg": 0.1, "pos": 0.9}, doc="d42", request="r3")]
    _write_log(home, answers)  # d42: without its text, then again with it
    _feedback(home, [answers[1]], {"d41": ["neg"]})
    out, everything = tmp_path / "labelled.jsonl", tmp_path / "all.jsonl"
    capsys.readouterr()
    assert main(["export-log", NAME, str(out), "--labelled-only"]) == 0
    printed = capsys.readouterr()
    assert len(out.read_text().splitlines()) == 24 and "wrote 24 documents" in printed.out
    assert "left out 1 logged documents with feedback whose text was not logged" in printed.err
    assert main(["export-log", NAME, str(everything)]) == 0
    printed = capsys.readouterr()
    assert "wrote 33 documents" in printed.out and "left out 2 logged documents whose text" in printed.err
    assert main(["export-log", NAME, str(tmp_path / "none.jsonl"), "--since", "2026-11-27T12:00:40Z",
                 "--until", "2026-11-27T12:00:43Z"]) == 1
    assert "no logged document in the window has its text (3 were logged without it" in capsys.readouterr().err
    assert not (tmp_path / "none.jsonl").exists()


def test_a_reused_ids_feedback_stays_with_the_text_it_labelled(home: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The client labels answer r1 of id "a", then reuses "a" for another review: the export pairs the label
    with r1's text, and the monitor counts one document with feedback, not two."""
    pos, neg = {"neg": 0.1, "pos": 0.9}, {"neg": 0.9, "pos": 0.1}
    first, second = (_record(0, f"{NAME}:v1", ["pos"], pos, "Loved it.", request="r1", doc="a"),
                     _record(1, f"{NAME}:v1", ["neg"], neg, "Hated it.", request="r2", doc="a"))
    _write_log(home, [first, second])
    with open_store(None, home / "deployments" / NAME / "feedback.sqlite3") as store:
        store.record_predictions("r1", f"{NAME}:v1", [Prediction("a", ["pos"])])
        store.add_feedback([Feedback("a", ["pos"])])
        store.record_predictions("r2", f"{NAME}:v1", [Prediction("a", ["neg"])])
    out = tmp_path / "labelled.jsonl"
    assert main(["export-log", NAME, str(out), "--labelled-only"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["text"], r["label"]) for r in rows] == [("a", "Loved it.", "pos")]
    capsys.readouterr()
    assert main(["monitor", NAME]) == 0
    assert "realised accuracy on 1 with feedback: 1.0000" in capsys.readouterr().out
    # the shadow's copy of r1 (same request and id, logged after): --role all still exports production's answer
    _write_log(home, [_record(2, f"{NAME}:v9", ["neg"], neg, "Loved it.", role="shadow", request="r1", doc="a")])
    assert main(["export-log", NAME, str(out), "--labelled-only", "--role", "all", "--overwrite"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["label"], r["predicted"], r["model"]) for r in rows] == [("a", "pos", "pos", f"{NAME}:v1")]


def test_a_multi_label_version_gone_from_the_store_is_judged_as_one(home: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Its config is deleted: the monitor tells multi-label from its answers' scores (one sigmoid a label,
    here one label each), as export-log does, and an empty feedback (no label applies) is a result."""
    scores = {"a": 0.9, "b": 0.2, "c": 0.1}  # sums to 1.2: not one distribution
    records = [_record(i, f"{NAME}:gone", ["a"], scores, request=f"r{i}") for i in range(2)]
    _write_log(home, records)
    _feedback(home, records, {"d0": [], "d1": ["a", "b"]})
    capsys.readouterr()
    assert main(["monitor", NAME, "--json", str(tmp_path / "m.json")]) == 0
    assert "realised accuracy on 2 with feedback: 0.6667" in capsys.readouterr().out  # 2 of 3 labels right, each
    assert main(["export-log", NAME, str(tmp_path / "out.jsonl")]) == 0
    assert "label column: labels" in capsys.readouterr().out


def test_export_of_a_multi_label_model_writes_a_list_in_every_row(home: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from training.data import HANDataModule
    from training.recipe import profile
    from training.sources import load_source

    rows = read_jsonl("topics.jsonl")
    topics = sorted({label for r in rows for label in r["labels"]})
    # one label each, as most answers of a multi-label model are: only the model says it is multi-label
    records = [_record(i, f"{NAME}:v2", r["labels"][:1], {t: 0.9 if t in r["labels"] else 0.1 for t in topics},
                       r["text"]) for i, r in enumerate(rows)]
    _write_log(home, records)
    _feedback(home, records, {r["id"]: row["labels"] for r, row in list(zip(records, rows, strict=True))[:12]})
    for suffix in (".jsonl", ".parquet"):
        out = tmp_path / f"labelled{suffix}"
        assert main(["export-log", NAME, str(out), "--labelled-only"]) == 0
        assert "label column: labels" in capsys.readouterr().out
        train = load_source(str(out))
        assert "label" not in train.column_names and train["labels"] == [r["labels"] for r in rows[:12]]
        assert profile(str(out), "text", "labels", None, 0.25, False, None).multi_label  # han-train's reading
        data = HANDataModule(train=str(out), label_column="labels", multi_label=True, min_freq=1,
                             val_fraction=0.25, cache_dir=str(tmp_path / "cache"))
        data.setup()
        assert set(data.label_names) <= set(topics)
    everything = tmp_path / "all.jsonl"
    assert main(["export-log", NAME, str(everything)]) == 0
    assert load_source(str(everything))["labels"].count(None) == 4  # unlabelled: null, for --data.unlabeled
    capsys.readouterr()
    before = everything.read_bytes()  # an existing file is replaced only when asked
    assert main(["export-log", NAME, str(everything), "--labelled-only"]) == 1
    assert capsys.readouterr().err == f"error: {everything} already exists; pass --overwrite to replace it\n"
    assert everything.read_bytes() == before
    assert main(["export-log", NAME, str(everything), "--labelled-only", "--overwrite"]) == 0
    assert load_source(str(everything))["labels"].count(None) == 0
    capsys.readouterr()
    assert main(["export-log", NAME, str(tmp_path / "labelled.csv")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "multi-label" in error and ".jsonl or .parquet" in error
    assert not (tmp_path / "labelled.csv").exists()


def test_the_model_config_decides_the_label_column(home: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A registered multi-label model whose logged answers all look single-label (one label each, scores
    that sum to 1): its config.json, read from the store, makes the export's label column ``labels``."""
    import model_store

    saved, _ = train_tiny_model(steps=5, multi_label=True)
    assert saved.model.config.multi_label
    tag = model_store.register(saved, NAME)  # in this process: the store the export reads the config from
    labels = saved.labels
    rows = read_jsonl("topics.jsonl")[:8]
    records = [_record(i, tag, [r["labels"][0]], {label: 0.9 if label == r["labels"][0] else 0.1 / (len(labels) - 1)
                                                  for label in labels}, r["text"]) for i, r in enumerate(rows)]
    _write_log(home, records)
    _feedback(home, records, {r["id"]: list(row["labels"]) for r, row in zip(records, rows, strict=True)})
    out = tmp_path / "labelled.jsonl"
    capsys.readouterr()
    assert main(["export-log", NAME, str(out), "--labelled-only"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 8 documents (8 with feedback)" in printed and printed.rstrip().endswith("; label column: labels")
    first = json.loads(out.read_text().splitlines()[0])
    assert first["labels"] == rows[0]["labels"] and "label" not in first
    assert first["predicted"] == [rows[0]["labels"][0]]


def test_bad_input_is_one_line(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _single_label_log(home)
    assert main(["export-log", NAME, str(tmp_path / "x.jsonl"), "--since", "2030-01-01"]) == 1
    assert "no logged document in the window" in capsys.readouterr().err
    for option in ("--since", "--until"):  # a span past what a date holds (an OverflowError traceback before)
        assert main(["monitor", NAME, option, "100000000d"]) == 1
        assert f"{option}: '100000000d' reaches back before the year 1" in capsys.readouterr().err
    typo = tmp_path / "feedbak.sqlite3"  # a mistyped --store: said so, and no empty store made there
    assert main(["monitor", NAME, "--store", str(typo)]) == 1
    assert capsys.readouterr().err.strip().endswith(f"feedback store {typo}: no such file")
    assert not typo.exists()
    data = home / "deployments" / NAME / "log" / "data"
    (data / "unreadable.jsonl").mkdir()  # a name the log reader cannot open as a file
    assert main(["export-log", NAME, str(tmp_path / "x.jsonl")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error:") and "cannot read the inference log" in error and error.count("\n") == 1


def test_shadow_answers_pair_with_the_same_request(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import model_store

    monkeypatch.setattr(model_store, "resolve_tag", lambda ref: ref)
    pos, neg = {"neg": 0.1, "pos": 0.9}, {"neg": 0.9, "pos": 0.1}
    # the client reuses the id "a": production said pos in r1 and neg in r2; the shadow answered r1's copy
    # last, in another worker's file
    _write_log(home, [_record(0, f"{NAME}:v1", ["pos"], pos, request="r1", doc="a"),
                      _record(1, f"{NAME}:v1", ["neg"], neg, request="r2", doc="a")], "w1")
    _write_log(home, [_record(2, f"{NAME}:v2", ["pos"], pos, role="shadow", request="r1", doc="a")], "w2")
    args = argparse.Namespace(since=None, until=None, store=None)
    result = shadow_comparison(f"{NAME}:v2", f"{NAME}:v1", args)
    assert result["paired"] == 1 and result["agreement"] == 1.0 and "verdict" not in result


def test_a_shadow_comparison_pairs_the_old_versions_answers_alone(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Production moved from v1 to v2 while v3 was shadowed: compared with v2 (the verdict is filed against
    it, and the gate trusts it), only v2's answers are paired; v1's are left out, and said so."""
    import model_store

    monkeypatch.setattr(model_store, "resolve_tag", lambda ref: ref)
    pos, neg = {"neg": 0.1, "pos": 0.9}, {"neg": 0.9, "pos": 0.1}
    production = [_record(i, f"{NAME}:v1" if i < 25 else f"{NAME}:v2", ["pos"], pos, request=f"r{i}")
                  for i in range(35)]
    shadow = [_record(40 + i, f"{NAME}:v3", ["neg"], neg, role="shadow", request=f"r{i}", doc=f"d{i}")
              for i in range(35)]
    _write_log(home, production + shadow)
    args = argparse.Namespace(since=None, until=None, store=None)
    result = shadow_comparison(f"{NAME}:v3", f"{NAME}:v2", args)
    assert result["paired"] == 10 and result["production_versions"] == [f"{NAME}:v2"] and result["old"] == f"{NAME}:v2"
    assert f"left out the documents {NAME}:v3 shadowed beside {NAME}:v1" in capsys.readouterr().err
    with pytest.raises(loop_commands.CommandError, match=f"it shadowed {NAME}:v1, {NAME}:v2: compare with that"):
        shadow_comparison(f"{NAME}:v3", f"{NAME}:v0", args)


def test_asking_again_for_a_shadow_that_failed_waits_for_this_requests_answer(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A worker's report still names the last request's load failure for up to its next report (2 s): a
    second ``han-model shadow`` must not take that for its own answer."""
    import threading

    import model_store
    from model_store.production import report_replica
    from monitoring.shadow import read_shadow
    from registry.shadow_commands import shadow

    monkeypatch.setattr(model_store, "resolve_tag", lambda ref: ref)
    tag = f"{NAME}:v3"
    report_replica(NAME, f"{NAME}:v1", None, shadow={"tag": None, "failed": {
        "tag": tag, "reason": "RuntimeError: out of memory", "asked": "an earlier request"}})
    args = argparse.Namespace(tag=tag, fraction=0.5, stop=False, wait=0.6)
    assert shadow(args) == 1
    assert "did not load it within 0.6 s" in capsys.readouterr().out  # not the earlier request's failure

    def answer() -> None:  # the worker tries this request's load and fails again
        time.sleep(0.3)
        report_replica(NAME, f"{NAME}:v1", None, shadow={"tag": None, "failed": {
            "tag": tag, "reason": "RuntimeError: still out of memory", "asked": read_shadow(NAME)["asked"]}})

    worker = threading.Thread(target=answer)
    worker.start()
    args.wait = 10
    assert shadow(args) == 1
    worker.join()
    assert "(RuntimeError: still out of memory)" in capsys.readouterr().out


def test_a_shadow_comparison_has_the_keys_promote_reads() -> None:
    pairs = [({"id": f"d{i}", "request_id": "q", "model": "m:1", "labels": ["pos"]},
              {"id": f"d{i}", "request_id": "q", "model": "m:2", "labels": ["neg" if i < 20 else "pos"]})
             for i in range(30)]
    result = compare_pairs(pairs, {(f"d{i}", "q"): ["pos"] for i in range(30)}, "m:2", "m:1")
    assert result["verdict"] == "worse" and result["metric"] == "accuracy" and result["test"] == "McNemar exact"
    assert (result["new_score"], result["old_score"], result["difference"]) == (0.3333, 1.0, -0.6667)
    low, high = result["interval"]
    assert low < -0.6667 < high < 0
    assert result["data"] == "the shadow log (30 live documents with feedback)" and result["documents"] == 30
    assert paired_interval(0, 0, 10) == [0.0, 0.0] and paired_interval(0, 0, 0) is None


def _han_model(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "registry.cli", *args], cwd=REPO, env=base_env(home),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_promote_refuses_a_challenger_worse_on_the_shadow_feedback(tmp_path: Path) -> None:
    home = tmp_path / "bentoml"
    saved, _ = train_tiny_model(steps=40)
    champion = register_model(saved.save(tmp_path / "champion"), home, NAME)
    challenger = register_model(worse_model(saved).save(tmp_path / "challenger"), home, NAME)
    pos, neg = {"neg": 0.1, "pos": 0.9}, {"neg": 0.9, "pos": 0.1}
    production = [_record(2 * i, champion, ["pos"], pos, request=f"r{i}") for i in range(30)]
    shadow = [_record(2 * i + 1, challenger, ["neg"] if i < 20 else ["pos"], neg if i < 20 else pos,
                      role="shadow", request=f"r{i}", doc=f"d{2 * i}") for i in range(30)]
    _write_log(home, production, "w1")
    _write_log(home, shadow, "w2")
    _feedback(home, production + shadow, {r["id"]: ["pos"] for r in production})
    compared = _han_model(home, "compare", challenger, f"{NAME}:production", "--shadow")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "on 30 with feedback" in compared.stdout and "worse" in compared.stdout
    refused = _han_model(home, "promote", challenger)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.startswith("error: refused:") and refused.stderr.count("\n") == 1, refused.stderr
    assert "the shadow log (30 live documents with feedback)" in refused.stderr
    assert "Traceback" not in refused.stderr
    # a version with other labels in the window: the export says so, naming each set
    relabelled = saved.save(tmp_path / "relabelled")
    (relabelled / "labels.json").write_text(json.dumps(["bad", "good"]))
    other = register_model(relabelled, home, NAME)
    _write_log(home, [_record(90, other, ["good"], {"bad": 0.2, "good": 0.8}, request="r90")], "w3")
    exported = _han_model(home, "export-log", NAME, str(tmp_path / "all.jsonl"))
    assert exported.returncode == 0, exported.stderr
    assert "the window's versions have different labels (" in exported.stderr, exported.stderr
    assert f"{champion}: neg, pos" in exported.stderr and f"{other}: bad, good" in exported.stderr
    assert json.loads((home / "deployments" / NAME / "production.json").read_text())["tag"] == champion


def test_a_name_is_registered_as_the_store_keeps_it(home: Path, tiny_model_dir: Path) -> None:
    """BentoML lowercases a name: a fit exported as Han-Loop found no pointer under that spelling and set
    production back to the name's first version; a name with a version (han-loop:v2) became production
    without promotion. Names are lowercased, and a version in one is refused."""
    import model_store
    from han import SavedModel
    from model_store.production import locked, set_pointer

    saved = SavedModel.load(tiny_model_dir)
    first = model_store.register(saved, NAME)
    second = model_store.register(saved, NAME)
    with locked(NAME):
        set_pointer(second, "promote")
    third = model_store.register(saved, NAME.title())
    assert third.startswith(f"{NAME}:") and model_store.production_version(NAME) == second != first
    with pytest.raises(ValueError, match="export.name 'han-loop:v9': a model's name, without a version"):
        model_store.register(saved, f"{NAME}:v9")
    assert model_store.production_version(NAME) == second


@pytest.mark.parametrize("wait", ["-1", "nan", "abc", "1e9"])
@pytest.mark.parametrize("command", [["promote", "han-x:v1"], ["rollback", "han-x"], ["shadow", "han-x:v1"]])
def test_a_wait_that_is_no_span_of_seconds_is_refused_before_anything_moves(
        command: list[str], wait: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--wait -1` once moved the pointer and said the services "did not follow within -1 s"."""
    with pytest.raises(SystemExit) as stopped:
        main([*command, "--wait", wait])
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and err[-1].startswith(f"han-model {command[0]}: error: argument --wait: ")
    assert wait in err[-1] and "Traceback" not in "\n".join(err)
