"""Text encodings in the user's files, read as the commands read them: a file that is not UTF-8 is one line
naming its row (han-train, han-score, han-label next), a class folder of UTF-16 files is read as text, one
label spelt in two Unicode forms is one class, and integer labels beside their digits are one column."""

from __future__ import annotations

import json
import logging
import unicodedata
from pathlib import Path

import pytest

from han import SavedModel
from tests.tiny_model import read_jsonl
from training.sources import DataError, load_source

REVIEWS = read_jsonl("reviews.jsonl")
NOT_UTF8 = "is not UTF-8"


def write_bad(path: Path, bad_row: int, rows: list[dict] = REVIEWS) -> Path:
    """The reviews as JSON Lines or CSV, row ``bad_row``'s text with a byte that is not UTF-8 (Latin-1's é)."""
    lines = []
    for k, r in enumerate(rows):
        text = r["text"] + (" café" if k == bad_row else "")
        line = f'{r["id"]},"{text}",{r["label"]}' if path.suffix == ".csv" else \
            json.dumps({"id": r["id"], "text": text, "label": r["label"]}, ensure_ascii=False)
        lines.append(line.encode().replace(" café".encode(), b" caf\xe9"))
    header = [b"id,text,label"] if path.suffix == ".csv" else []
    path.write_bytes(b"\r\n".join(header + lines) + b"\r\n")
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_han_train_names_the_row_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 suffix: str) -> None:
    from training.cli import main

    path = write_bad(tmp_path / f"train{suffix}", 7)
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--data.train", str(path), "--data.test", "null", "--trainer.max_epochs", "1",
              "--trainer.default_root_dir", str(tmp_path / "run"), "--data.cache_dir", str(tmp_path / "cache")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    line = 8 + (suffix == ".csv")  # a CSV's header is its line 1
    assert last.startswith(f"han-train: error: {path}: row 7 (line {line}) {NOT_UTF8} (byte 0xe9"), last
    assert "save the file as UTF-8" in last


def test_han_score_names_the_row_past_the_first_batch_and_scores_nothing(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scoring.cli import main

    rows = [dict(r, id=f"{r['id']}-{k}") for k in range(100) for r in REVIEWS][:3000]
    for suffix, line in ((".jsonl", 2501), (".csv", 2502)):
        path = write_bad(tmp_path / f"in{suffix}", 2500, rows)
        out = tmp_path / f"out{suffix}.jsonl"
        assert main([str(path), str(out), "--model", str(tiny_model_dir), "--quiet", "--workers", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"han-score: error: cannot read {path}: row 2500 (line {line}) {NOT_UTF8}"), err
        assert not out.exists() and not out.with_name(out.name + ".parts").exists()


def test_han_label_next_names_the_row_that_is_not_utf8(tmp_path: Path, tiny_model_dir: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from labeling.cli import main

    pool = write_bad(tmp_path / "pool.jsonl", 3)
    out = tmp_path / "queue.json"
    assert main(["next", str(pool), "--n", "4", "--out", str(out), "--model", str(tiny_model_dir), "--workers", "1",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("save the file as UTF-8\n"), err
    assert err.startswith(f"han-label: error: {pool}: row 3 (line 4) {NOT_UTF8} (byte 0xe9 at byte "), err
    assert not out.exists()


def test_a_utf16_or_excel_file_is_named_and_a_byte_split_by_a_block_is_no_error(tmp_path: Path) -> None:
    from scoring import read_causes

    utf16 = tmp_path / "excel.csv"
    utf16.write_bytes("id,text\n1,Grüße\n".encode("utf-16"))  # Excel's "Unicode text": a byte-order mark
    assert read_causes.not_utf8(utf16, "csv").startswith("the file is UTF-16")
    cp1252 = tmp_path / "excel.jsonl"
    cp1252.write_bytes('{"text": "fine"}\n\n{"text": "Grüße"}\n'.encode("cp1252"))
    assert read_causes.not_utf8(cp1252, "json") == \
        "row 1 (line 3) is not UTF-8 (byte 0xfc at byte 13 of the line): save the file as UTF-8"
    # a character of 2, 3 and 4 bytes across the checker's block edge, then a bad byte on the next line
    head = b'{"text": "' + b"a" * (read_causes._BLOCK - 12)
    for char in ("é", "€", "😀"):
        good = tmp_path / "edge.jsonl"
        good.write_bytes(head + char.encode() + b'"}\n')
        assert read_causes.not_utf8(good, "json") is None
        good.write_bytes(head + char.encode() + b'"}\n{"text": "\xff"}\n')
        assert read_causes.not_utf8(good, "json").startswith("row 1 (line 2) is not UTF-8 (byte 0xff at byte 11 ")


def test_a_class_folder_of_utf16_files_is_read_as_text_and_other_bytes_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    texts = {"neg": ["Dreadful, boring film.", "Ужасный фильм."], "pos": ["Wonderful! 😀 Café.", "Superb plot."]}
    encodings = ["utf-16", "utf-8-sig"]  # Windows Notepad's "Unicode" and "UTF-8 with BOM"
    for label, docs in texts.items():
        (folder / label).mkdir(parents=True)
        for k, text in enumerate(docs):
            (folder / label / f"{k}.txt").write_bytes(text.encode(encodings[k]))
    ds = load_source(str(folder))
    assert ds["text"] == texts["neg"] + texts["pos"] and ds["label"] == ["neg", "neg", "pos", "pos"]
    (folder / "pos" / "2.txt").write_bytes("Très bien.\nGrüße.".encode("cp1252"))
    with pytest.raises(DataError) as error:
        load_source(str(folder))
    assert str(error.value).startswith(f"{folder}: pos/2.txt is not UTF-8 (line 1: byte 0xe8)")


def test_a_label_in_two_unicode_forms_is_one_class(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from training.data import HANDataModule

    composed = {"neg": unicodedata.normalize("NFC", "négatif"), "pos": "positif 😀"}
    decomposed = unicodedata.normalize("NFD", composed["neg"])
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps({"text": r["text"], "label": decomposed if k % 3 == 0 and r["label"] == "neg"
                                        else composed[r["label"]]}, ensure_ascii=False) + "\n"
                            for k, r in enumerate(REVIEWS)), encoding="utf-8")
    caplog.set_level(logging.INFO)
    module = HANDataModule(train=str(path), test=None, cache_dir=str(tmp_path / "cache"), min_freq=1)
    module.setup()
    assert module.label_names == [composed["neg"], composed["pos"]]
    note = [m for m in caplog.messages if "another Unicode form" in m]
    assert len(note) == 1 and f"({path}):" in note[0] and "read composed (NFC)" in note[0]
    from training.compare import encode_targets
    from training.recipe import profile

    assert profile(str(path), "text", "label", None, 0.25, False, None).labels == 2  # the recipe's count too
    # han-model compare / promote --data: either form is the model's label, whichever form the model has
    for names in ([composed["neg"], composed["pos"]], [decomposed, composed["pos"]]):
        assert encode_targets([decomposed, composed["neg"], composed["pos"]], names, False, "f").tolist() == [0, 0, 1]


def test_integer_labels_beside_their_digits_are_one_label_column(tmp_path: Path) -> None:
    """A file of integer labels with han-label import's (or han-score's) rows appended: labels "0" and "1"."""
    from training.data import HANDataModule
    from training.recipe import profile

    path = tmp_path / "round2.jsonl"
    original = [json.dumps({"text": r["text"], "label": int(r["label"] == "pos")}) for r in REVIEWS[:20]]
    imported = [json.dumps({"id": r["id"], "text": r["text"], "label": str(int(r["label"] == "pos"))})
                for r in REVIEWS[20:]]
    path.write_text("\n".join(original + imported) + "\n")
    assert profile(str(path), "text", "label", None, 0.25, False, None).labels == 2
    module = HANDataModule(train=str(path), test=None, cache_dir=str(tmp_path / "cache"), min_freq=1)
    module.setup()
    assert module.label_names == ["0", "1"]
    # a list among single labels is still refused, naming its row
    path.write_text(path.read_text() + json.dumps({"text": "Fine.", "label": ["1"]}) + "\n")
    with pytest.raises(DataError, match=f"row {len(REVIEWS)} holds a list where the rows before hold a single"):
        profile(str(path), "text", "label", None, 0.25, False, None)


def test_import_reads_labels_in_the_composed_form_and_says_so(tmp_path: Path, tiny_model_dir: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from labeling.cli import main

    negative = unicodedata.normalize("NFC", "négatif")
    saved = SavedModel.load(tiny_model_dir)
    saved.labels = [negative, "positif"]  # composed, as a fit now reads them
    model = saved.save(tmp_path / "model")
    export = tmp_path / "min.json"
    export.write_text(json.dumps([
        {"id": 1, "text": "Dull.", "doc_id": "d1", "label": unicodedata.normalize("NFD", negative)},
        {"id": 2, "text": "Fun.", "doc_id": "d2", "label": "positif"}], ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "labelled.jsonl"
    assert main(["import", str(export), str(out), "--model", str(model)]) == 0
    assert [json.loads(line)["label"] for line in out.read_text(encoding="utf-8").splitlines()] == \
        [negative, "positif"]
    err = capsys.readouterr().err
    assert "1 annotations' labels are written in another Unicode form" in err and "composed form (NFC)" in err


def test_a_model_saved_with_decomposed_labels_reads_them_composed(tmp_path: Path) -> None:
    """A model registered before fits read labels composed: a retrain on the same file (composed now) must
    warm-start its head, compare and promote against it, which matched labels byte for byte."""
    from han import SavedModel
    from tests.tiny_model import train_tiny_model
    from training.compare import check_labels

    saved = train_tiny_model(seed=0)[0]
    composed = [unicodedata.normalize("NFC", f"négatif {k}") for k in range(len(saved.labels))]
    saved.labels = [unicodedata.normalize("NFD", label) for label in composed]
    loaded = SavedModel.load(saved.save(tmp_path / "old"))
    assert loaded.labels == composed
    check_labels(composed, False, loaded.labels, False, "new", "old")  # no CompareError
